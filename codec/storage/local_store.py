"""Shard files of a local or network file system as a
:class:`cutfs.codec.storage.byte_store.ByteStore`: memory maps, read by slicing (no copy)."""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence

from cutfs.codec.errors import ShardFormatError


class LocalStore:
    """Objects as memory-mapped files in one directory (names may also be absolute paths).

    Maps are advised ``MADV_RANDOM``: a cut touches a few hundred kilobytes of
    a shard of a gigabyte, and the kernel's default read-ahead on a fault
    would pull megabytes per cut from slow storage; :meth:`prefetch` asks for
    the span a decode will read instead, in one request.

    A file is pinned by its (inode, size, modification time) when first used,
    taken from the descriptor it is mapped from; :meth:`check_unchanged`
    compares them again (one ``stat``), and a file opened again after its map was
    closed must match them, so a shard rewritten or replaced under a mount is
    refused rather than served.
    """

    def __init__(
        self,
        directory: str,
        max_open_maps: int = 1024,
        opener: Callable[[str], int] | None = None,
    ) -> None:
        """``opener`` opens a path for reading and returns a descriptor; the default
        refuses anything but a regular file (see
        :class:`cutfs.codec.trust.source_policy.SourcePolicy` for one that also confines
        paths)."""
        self._directory = directory
        self._max_open_maps = max_open_maps
        self._opener = opener or _open_regular_file
        self._maps: OrderedDict[str, mmap.mmap] = OrderedDict()
        self._stamps: dict[str, tuple[int, int, int, int]] = {}
        self._reads = 0
        self._requests = 0

    def path(self, name: str) -> str:
        return os.path.join(self._directory, name)

    def size(self, name: str) -> int:
        return len(self._map(name))

    def version(self, name: str) -> str:
        """The file's pin as text (see :func:`file_version`): of the descriptor mapped, or,
        before the file is mapped, of its path now (the map must then match it)."""
        stamp = self._stamps.get(name)
        if stamp is None:
            stamp = self._stamps.setdefault(name, file_stamp(self.path(name)))
        return _version_text(stamp)

    def check_unchanged(self, name: str) -> None:
        pinned = self.version(name)
        if file_version(self.path(name)) != pinned:
            raise ShardFormatError(
                "the file changed since it was opened (rewritten or replaced?): "
                "remount to serve the new one",
                where=name,
            )

    def read(self, name: str, start: int, stop: int) -> memoryview:
        mapped = self._map(name)
        if not 0 <= start <= stop <= len(mapped):
            raise ShardFormatError(
                f"range [{start}, {stop}) is outside the file's {len(mapped)} bytes", where=name
            )
        self._reads += 1
        self._requests += 1
        return memoryview(mapped)[start:stop]

    def read_many(self, name: str, ranges: Sequence[tuple[int, int]]) -> list[memoryview]:
        views = [self.read(name, start, stop) for start, stop in ranges]
        self._requests += 1 - len(ranges)
        return views

    def stream(self, name: str, start: int, stop: int, chunk_bytes: int) -> Iterator[memoryview]:
        whole = self.read(name, start, stop)  # a view of the map: counted, nothing read yet
        return (whole[at : at + chunk_bytes] for at in range(0, len(whole), chunk_bytes))

    def prefetch(self, name: str, ranges: Sequence[tuple[int, int]]) -> bool:
        mapped = self._map(name)
        if not hasattr(mmap, "MADV_WILLNEED"):
            return True
        for offset, stop in ranges:
            start = offset - offset % mmap.PAGESIZE
            length = min(stop - start, len(mapped) - start)
            if length > 0 and start >= 0:
                mapped.madvise(mmap.MADV_WILLNEED, start, length)
        return True

    def counters(self) -> dict[str, int]:
        """``reads``: ranges read; ``requests``: calls (a :meth:`read_many` is one)."""
        return {"reads": self._reads, "requests": self._requests}

    def close(self) -> None:
        for mapped in self._maps.values():
            # A map still exported to a live view goes away with the last view.
            with contextlib.suppress(BufferError):
                mapped.close()
        self._maps.clear()

    def _pin(self, name: str, descriptor: int) -> None:
        """Pin the file by the descriptor about to be mapped (not by its path: a file
        renamed into place between the open and a ``stat`` would be pinned for the one
        mapped); a file pinned before, and opened again once its map was closed, must
        be the same unchanged file."""
        status = os.fstat(descriptor)
        stamp = _stamp_of(status)
        if self._stamps.setdefault(name, stamp) != stamp:
            raise ShardFormatError(
                "the file changed since it was first opened (rewritten or replaced?): "
                "remount to serve the new one",
                where=name,
            )

    def _map(self, name: str) -> mmap.mmap:
        """The file's map, made on first use; the least recently used maps beyond
        ``max_open_maps`` are closed, so serving many small files in place stays
        within the kernel's limit on maps per process.  Raises :class:`ShardFormatError`."""
        mapped = self._maps.get(name)
        if mapped is not None:
            self._maps.move_to_end(name)
            return mapped
        try:
            descriptor = self._opener(self.path(name))
            try:
                self._pin(name, descriptor)
                mapped = mmap.mmap(descriptor, 0, access=mmap.ACCESS_READ)
            finally:
                os.close(descriptor)
        except (OSError, ValueError) as exc:  # ValueError: an empty file cannot be mapped
            raise ShardFormatError(f"cannot open: {exc}", where=name) from exc
        if hasattr(mmap, "MADV_RANDOM"):
            mapped.madvise(mmap.MADV_RANDOM)
        self._maps[name] = mapped
        while len(self._maps) > self._max_open_maps:
            _, oldest = self._maps.popitem(last=False)
            with contextlib.suppress(BufferError):  # a live view keeps it until released
                oldest.close()
        return mapped


def _open_regular_file(path: str) -> int:
    """A read-only descriptor of a regular file; never blocks on a FIFO."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise OSError(errno.EINVAL, "not a regular file", path)
    return descriptor


def file_stamp(path: str) -> tuple[int, int, int, int]:
    """(inode, size, modification time, change time) of a file, all -1 when it cannot be
    read.

    Two equal stamps mean, for cutfs's purposes, the same unchanged file: a file replaced
    by another gets a new inode, one rewritten in place a new modification time, and one
    whose modification time was put back (``touch -d``, ``os.utime``) a new change time,
    which no user can set.
    """
    try:
        status = os.stat(path)
    except OSError:
        return (-1, -1, -1, -1)
    return _stamp_of(status)


def _stamp_of(status: os.stat_result) -> tuple[int, int, int, int]:
    return (status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)


def file_version(path: str) -> str:
    """:func:`file_stamp` as the text :meth:`LocalStore.version` gives."""
    return _version_text(file_stamp(path))


def _version_text(stamp: tuple[int, int, int, int]) -> str:
    return "{}:{}:{}:{}".format(*stamp)
