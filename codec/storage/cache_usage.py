"""The bytes a piece cache directory holds: one count, shared by every process that uses it.

The processes of a mount (its decoder workers, its serving processes) and the piece
caches of one process (one per bucket) write into one cache directory under one bound,
``--disk-cache-size``.  Each kept its own count of what the directory held before, so N
writers could fill it to nearly N times the bound between their sweeps.  They now count
in one 8-byte file of the directory, read and changed under ``flock``: a writer reserves
the bytes it is about to write, and the reservation fails when it would pass the bound
(the writer then sweeps, see :meth:`cutfs.codec.storage.caching_store.CachingStore.sweep`).

The count errs high rather than low: a piece written again over itself is counted again,
and a write that failed after its reservation gives the bytes back.  Each sweep makes the
count again from what the maps mark present (:meth:`CacheUsage.settle`), plus what was
reserved while it ran; a write reserved before the sweep began and marked in its map
only after the sweep read that map is missed until the next sweep (at most one write,
1 MiB, per writing thread, so the directory may pass the bound by that much for a
while).  Writers holding a shared ``flock`` on the sweep's lock file from reserving to
marking would close that gap (the kernel drops the lock of a process that dies), at the
price of every sweep waiting for the writes in flight; not done.  A count file that is new,
short, or holds a value out of range (torn, or written by someone else) is counted again
from the maps.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final

_COUNT: Final = struct.Struct("<q")
#: No cache holds more (an exabyte): a larger count is not one this code wrote.
_MOST_BYTES: Final = 1 << 60
FILE_NAME: Final = "usage.count"
#: The bound of a piece cache directory unless one is given (``--disk-cache-size``).
DEFAULT_DISK_BYTES: Final = 20 << 30


class CacheUsage:
    """The shared count of bytes in the cache directory ``directory``;
    ``count_present`` counts them from the maps when the count is missing or bad."""

    def __init__(self, directory: str, count_present: Callable[[], int]) -> None:
        """Nothing is opened yet: every method may raise ``OSError`` (a full or failing
        cache disk), which costs the caller its disk cache, never a read."""
        self._path = os.path.join(directory, FILE_NAME)
        self._count_present = count_present
        self._fd: int | None = None
        self._closed = False
        # flock excludes other open files of the count, not threads sharing this one.
        self._thread_lock = threading.Lock()

    def close(self) -> None:
        """Close the count; later calls raise ``OSError`` (EBADF), never touch another
        file that took its descriptor's number."""
        with self._thread_lock:
            self._closed = True
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def bytes(self) -> int:
        """What the directory holds, as the processes have counted it."""
        with self._locked() as held:
            return held

    def reserve(self, size_bytes: int, limit_bytes: int) -> bool:
        """Count ``size_bytes`` about to be written, unless the count would then pass
        ``limit_bytes``; whether they were counted."""
        with self._locked() as held:
            if held + size_bytes > limit_bytes:
                return False
            self._write(held + size_bytes)
            return True

    def reserve_some(self, size_bytes: int, limit_bytes: int, unit_bytes: int) -> int:
        """Count as much of ``size_bytes`` as fits under ``limit_bytes``, in whole
        ``unit_bytes`` (all of it when it fits); how much was counted."""
        with self._locked() as held:
            room = max(limit_bytes - held, 0) // unit_bytes * unit_bytes
            granted = min(size_bytes, room)
            if granted > 0:
                self._write(held + granted)
            return granted

    def add(self, size_bytes: int) -> None:
        """Count ``size_bytes`` more (fewer, when negative: a reservation given back)."""
        with self._locked() as held:
            self._write(max(held + size_bytes, 0))

    def settle(self, counted_before: int, present_bytes: int) -> None:
        """After a sweep that began when the count was ``counted_before`` and left
        ``present_bytes`` marked in the maps: the count becomes that, plus what the
        other writers counted while the sweep ran."""
        with self._locked() as held:
            self._write(max(present_bytes + held - counted_before, 0))

    @contextmanager
    def _locked(self) -> Iterator[int]:
        """The count, with the file locked for as long as the caller holds it."""
        with self._thread_lock:
            if self._closed:
                raise OSError(errno.EBADF, "the cache's usage count is closed")
            if self._fd is None:
                flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
                self._fd = os.open(self._path, flags, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                data = os.pread(self._fd, _COUNT.size, 0)
                held = _COUNT.unpack(data)[0] if len(data) == _COUNT.size else -1
                if not 0 <= held <= _MOST_BYTES:
                    held = self._count_present()
                    self._write(held)
                yield held
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _write(self, count_bytes: int) -> None:
        """Called with the file locked (open)."""
        assert self._fd is not None
        os.pwrite(self._fd, _COUNT.pack(min(count_bytes, _MOST_BYTES)), 0)
