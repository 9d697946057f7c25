"""Hints to the kernel about pages of mapped arrays that will be read soon.

``MADV_WILLNEED`` on a file mapping starts reading the pages from storage and returns
without waiting, so several pages can be on their way at once where touching them would
read them one after another.  Python's ``mmap.madvise`` needs the map object; the
catalogue's columns reach their users as numpy views, so this works on an address.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap

import numpy as np
import numpy.typing as npt

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_LIBC.madvise.restype = ctypes.c_int
_WILLNEED = getattr(mmap, "MADV_WILLNEED", None)


def address_of(array: npt.NDArray[np.generic]) -> int | None:
    """Where a one-dimensional contiguous array's first element is in memory (``None`` for
    any other array: its elements are not where their positions say)."""
    if array.ndim != 1 or array.strides != (array.itemsize,):
        return None
    return int(array.__array_interface__["data"][0])


def will_need(address: int) -> None:
    """Ask for the page holding the byte at ``address`` (of a mapping of this process; any
    failure is ignored: it is only a hint)."""
    if _WILLNEED is None:
        return
    page = int(address) - int(address) % mmap.PAGESIZE
    with contextlib.suppress(ctypes.ArgumentError, OverflowError):
        _LIBC.madvise(page, mmap.PAGESIZE, _WILLNEED)
