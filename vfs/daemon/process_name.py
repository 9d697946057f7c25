"""The names a mount's processes go by in ``ps``, ``top`` and ``/proc/PID/comm``.

Every process of a mount runs the same interpreter with the same command line
(``python -I -c 'from multiprocessing.spawn import spawn_main; ...'``); its
name says what it is: ``cutfs-serving``, ``cutfs-zygote``, ``cutfs-decoder``.
"""

from __future__ import annotations

import ctypes
from typing import Final

_PR_SET_NAME: Final = 15
#: The kernel keeps 15 bytes of a name.
_MOST_NAME_BYTES: Final = 15
_libc = ctypes.CDLL(None, use_errno=True)


def name_process(name: str) -> None:
    """Name this process (its main thread) ``name``, cut to 15 bytes; failures ignored."""
    _libc.prctl(_PR_SET_NAME, name.encode()[:_MOST_NAME_BYTES], 0, 0, 0)
