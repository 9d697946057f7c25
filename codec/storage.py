"""Access to the bytes of shard files, behind a narrow interface.

The rest of cutfs asks a :class:`Storage` for a shard by name and gets a
buffer it can slice without copying.  :class:`LocalStorage` memory-maps files
of a local or network file system; a store for objects in the cloud can be
added by implementing the same two methods.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol


class Storage(Protocol):
    """Where shards live."""

    def open_shard(self, name: str) -> memoryview:
        """The whole shard as a read-only buffer; slicing it must not copy."""
        ...

    def prefetch(self, name: str, offset: int, length: int) -> None:
        """Hint that ``[offset, offset + length)`` of a shard is about to be read."""
        ...

    def close(self) -> None:
        """Release every buffer handed out; none may be used afterwards."""
        ...


class LocalStorage:
    """Shards as memory-mapped files in one directory.

    Maps are advised ``MADV_RANDOM``: a cut touches a few hundred kilobytes of
    a shard of a gigabyte, and the kernel's default read-ahead on a fault
    would pull megabytes per cut from slow storage.
    """

    def __init__(
        self,
        directory: str,
        max_open_maps: int = 1024,
        opener: Callable[[str], int] | None = None,
    ) -> None:
        """``opener`` opens a path for reading and returns a descriptor; the default
        refuses anything but a regular file (see :class:`cutfs.codec.source_policy.SourcePolicy`
        for one that also confines paths)."""
        self._directory = directory
        self._max_open_maps = max_open_maps
        self._opener = opener or _open_regular_file
        self._maps: OrderedDict[str, mmap.mmap] = OrderedDict()

    def open_shard(self, name: str) -> memoryview:
        """Map a file (names may be absolute); the least recently used maps beyond
        ``max_open_maps`` are closed, so serving many small files in place stays
        within the kernel's limit on maps per process."""
        mapped = self._maps.get(name)
        if mapped is None:
            descriptor = self._opener(os.path.join(self._directory, name))
            try:
                mapped = mmap.mmap(descriptor, 0, access=mmap.ACCESS_READ)
            finally:
                os.close(descriptor)
            if hasattr(mmap, "MADV_RANDOM"):
                mapped.madvise(mmap.MADV_RANDOM)
            self._maps[name] = mapped
            while len(self._maps) > self._max_open_maps:
                _, oldest = self._maps.popitem(last=False)
                with contextlib.suppress(BufferError):  # a live view keeps it until released
                    oldest.close()
        else:
            self._maps.move_to_end(name)
        return memoryview(mapped)

    def prefetch(self, name: str, offset: int, length: int) -> None:
        mapped = self._maps.get(name)
        if mapped is None or length <= 0 or not hasattr(mmap, "MADV_WILLNEED"):
            return
        start = offset - offset % mmap.PAGESIZE
        length = min(length + offset - start, len(mapped) - start)
        if length > 0:
            mapped.madvise(mmap.MADV_WILLNEED, start, length)

    def close(self) -> None:
        for mapped in self._maps.values():
            # A map still exported to a live view goes away with the last view.
            with contextlib.suppress(BufferError):
                mapped.close()
        self._maps.clear()


def _open_regular_file(path: str) -> int:
    """A read-only descriptor of a regular file; never blocks on a FIFO."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return descriptor


def file_stamp(path: str) -> tuple[int, int, int]:
    """(inode, size, modification time) of a file, all -1 when it cannot be read.

    Two equal stamps mean, for cutfs's purposes, the same unchanged file: a
    file replaced by another gets a new inode, one rewritten in place a new
    modification time.
    """
    try:
        status = os.stat(path)
    except OSError:
        return (-1, -1, -1)
    return (status.st_ino, status.st_size, status.st_mtime_ns)
