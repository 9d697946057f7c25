"""Hints to the kernel about pages of mapped arrays that will be read soon.

``MADV_WILLNEED`` on a file mapping starts reading the pages from storage and returns
without waiting, so several pages can be on their way at once where touching them would
read them one after another.  Python's ``mmap.madvise`` needs the map object; the
catalogue's columns reach their users as numpy views, so this works on an address.
"""

from __future__ import annotations

import ctypes
import mmap

import numpy as np
import numpy.typing as npt

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_LIBC.madvise.restype = ctypes.c_int
_WILLNEED = getattr(mmap, "MADV_WILLNEED", None)


def will_need(array: npt.NDArray[np.generic], position: int) -> None:
    """Ask for the page that holds element ``position`` of ``array`` (contiguous memory;
    anything else is ignored, as is any failure: it is only a hint)."""
    if _WILLNEED is None or array.ndim != 1 or array.strides != (array.itemsize,):
        return
    if not 0 <= position < len(array):
        return
    address = int(array.__array_interface__["data"][0]) + position * array.itemsize
    page = address - address % mmap.PAGESIZE
    _LIBC.madvise(page, mmap.PAGESIZE, _WILLNEED)
