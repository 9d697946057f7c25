"""A piece cache in front of a remote store: aligned pieces on local disk and in memory.

Objects are cached in aligned *pieces* (64 KiB by default).  A read asks for
the pieces covering it; those neither in memory nor on disk are fetched from
the inner store in one :meth:`read_many` (consecutive pieces are one range, and
the inner store merges ranges that are close), so a cut whose header and span
are near each other costs one GET, and its pieces are never fetched again.

On disk each object version has two files in the cache directory, named by a
digest of the store's namespace, the object's name and its pinned version (so
a changed object never meets its old pieces):

* ``<digest>.data``: a sparse file, each piece at its own offset;
* ``<digest>.map``: 8 bytes per piece, the piece's CRC-32 and the minute it was
  last used (0: absent).  A piece is written before its map entry, and checked
  against its CRC when read, so a piece torn by a crash, or evicted by another
  process between the map read and the data read, is fetched again instead of
  served.

Processes of one mount (the decoder workers) share the directory: what one
fetched, the others read.  The disk use is bounded: when a process has written
enough to pass ``disk_bytes``, it sweeps (under a lock file) the least recently
used pieces of every object until 80% of the bound, punching holes in the data
files.  Memory is bounded by ``memory_bytes`` (an LRU of pieces per process).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import hashlib
import os
import struct
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Final

import numpy as np
from cachetools import LRUCache

from cutfs.codec.byte_store import ByteStore
from cutfs.codec.errors import ShardFormatError
from cutfs.codec.private_directory import private_directory

PIECE_BYTES: Final = 64 << 10
DEFAULT_DISK_BYTES: Final = 20 << 30
DEFAULT_MEMORY_BYTES: Final = 64 << 20
_ENTRY: Final = struct.Struct("<II")  # crc32, minute last used (0: absent)
#: A hit rewrites a piece's minute only when it is older than this (a coarse LRU).
_TOUCH_MINUTES: Final = 10
_MAX_OPEN_OBJECTS: Final = 256
_SWEEP_TARGET: Final = 0.8
_FALLOC_PUNCH_HOLE: Final = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE


class CachingStore:
    """A :class:`ByteStore` that keeps what it fetched from ``inner`` (see the module docstring)."""

    def __init__(
        self,
        inner: ByteStore,
        directory: str,
        namespace: str,
        *,
        piece_bytes: int = PIECE_BYTES,
        disk_bytes: int = DEFAULT_DISK_BYTES,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
    ) -> None:
        """``namespace`` names where ``inner``'s objects live (its URI): two stores with the
        same directory and namespace share pieces.  Raises :class:`SourceError` when the
        directory is not private to this user."""
        if piece_bytes <= 0 or disk_bytes < 0 or memory_bytes < 0:
            raise ValueError("piece size must be positive, cache sizes not negative")
        private_directory(directory)
        self._inner = inner
        self._directory = directory
        self._namespace = namespace
        self._piece_bytes = piece_bytes
        self._disk_bytes = disk_bytes
        self._memory: LRUCache[tuple[str, int], bytes] = LRUCache(
            maxsize=memory_bytes, getsizeof=len
        )
        self._lock = threading.Lock()
        self._files: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._disk_estimate: int | None = None
        self._counts = {"memory_hits": 0, "disk_hits": 0, "misses": 0, "corrupt_pieces": 0}
        self._counts |= {"evicted_pieces": 0, "sweeps": 0}

    # --- ByteStore ---

    def size(self, name: str) -> int:
        return self._inner.size(name)

    def version(self, name: str) -> str:
        return self._inner.version(name)

    def check_unchanged(self, name: str) -> None:
        self._inner.check_unchanged(name)

    def read(self, name: str, start: int, stop: int) -> memoryview:
        size = self.size(name)
        if not 0 <= start <= stop <= size:
            raise ShardFormatError(
                f"range [{start}, {stop}) is outside the object's {size} bytes", where=name
            )
        if start == stop:
            return memoryview(b"")
        first, last = start // self._piece_bytes, (stop - 1) // self._piece_bytes
        pieces = self._pieces(name, range(first, last + 1))
        base = first * self._piece_bytes
        if first == last:
            return memoryview(pieces[first])[start - base : stop - base]
        joined = b"".join(pieces[number] for number in range(first, last + 1))
        return memoryview(joined)[start - base : stop - base]

    def read_many(self, name: str, ranges: Sequence[tuple[int, int]]) -> list[memoryview]:
        self.prefetch(name, ranges)
        return [self.read(name, start, stop) for start, stop in ranges]

    def prefetch(self, name: str, ranges: Sequence[tuple[int, int]]) -> None:
        numbers: set[int] = set()
        for start, stop in ranges:
            if stop > start:
                numbers.update(
                    range(start // self._piece_bytes, (stop - 1) // self._piece_bytes + 1)
                )
        if numbers:
            self._pieces(name, sorted(numbers))

    def counters(self) -> dict[str, int]:
        with self._lock:
            own = dict(self._counts)
        return self._inner.counters() | own

    def close(self) -> None:
        with self._lock:
            for data, entries in self._files.values():
                os.close(data)
                os.close(entries)
            self._files.clear()
            self._memory.clear()
        self._inner.close()

    # --- pieces ---

    def _pieces(self, name: str, numbers: Iterable[int]) -> dict[int, bytes]:
        """The pieces ``numbers`` of an object, fetching those not cached in one request."""
        key = self._object_key(name)
        found: dict[int, bytes] = {}
        missing: list[int] = []
        for number in numbers:
            piece = self._cached(key, number)
            if piece is None:
                missing.append(number)
            else:
                found[number] = piece
        if missing:
            found |= self._fetch(name, key, missing)
        return found

    def _cached(self, key: str, number: int) -> bytes | None:
        with self._lock:
            piece = self._memory.get((key, number))
            if piece is not None:
                self._counts["memory_hits"] += 1
                return piece
        piece = self._from_disk(key, number)
        with self._lock:
            if piece is not None:
                self._counts["disk_hits"] += 1
                self._remember(key, number, piece)
        return piece

    def _remember(self, key: str, number: int, piece: bytes) -> None:
        """Keep a piece in memory (caller holds the lock), if it fits at all."""
        if len(piece) <= self._memory.maxsize:
            self._memory[(key, number)] = piece

    def _fetch(self, name: str, key: str, numbers: list[int]) -> dict[int, bytes]:
        size = self.size(name)
        runs: list[list[int]] = []
        for number in numbers:
            if runs and number == runs[-1][1]:
                runs[-1][1] = number + 1
            else:
                runs.append([number, number + 1])
        ranges = [
            (first * self._piece_bytes, min(end * self._piece_bytes, size)) for first, end in runs
        ]
        fetched = self._inner.read_many(name, ranges)
        pieces: dict[int, bytes] = {}
        for (first, end), data in zip(runs, fetched, strict=True):
            for number in range(first, end):
                offset = (number - first) * self._piece_bytes
                pieces[number] = bytes(data[offset : offset + self._piece_bytes])
        with self._lock:
            self._counts["misses"] += len(pieces)
            for number, piece in pieces.items():
                self._remember(key, number, piece)
        for number, piece in pieces.items():
            self._to_disk(key, number, piece)
        return pieces

    def _object_key(self, name: str) -> str:
        identity = f"{self._namespace}\0{name}\0{self.version(name)}"
        return hashlib.sha256(identity.encode()).hexdigest()[:40]

    # --- disk ---

    def _files_of(self, key: str) -> tuple[int, int]:
        """(data, map) descriptors of an object's cache files, opened (or made) once."""
        with self._lock:
            files = self._files.get(key)
            if files is not None:
                self._files.move_to_end(key)
                return files
            base = os.path.join(self._directory, key)
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
            data = os.open(base + ".data", flags, 0o600)
            try:
                entries = os.open(base + ".map", flags, 0o600)
            except OSError:
                os.close(data)
                raise
            self._files[key] = (data, entries)
            while len(self._files) > _MAX_OPEN_OBJECTS:
                _, (old_data, old_entries) = self._files.popitem(last=False)
                os.close(old_data)
                os.close(old_entries)
            return data, entries

    def _from_disk(self, key: str, number: int) -> bytes | None:
        try:
            data, entries = self._files_of(key)
            entry = os.pread(entries, _ENTRY.size, number * _ENTRY.size)
            if len(entry) != _ENTRY.size:
                return None
            checksum, minute = _ENTRY.unpack(entry)
            if minute == 0:
                return None
            piece = os.pread(data, self._piece_bytes, number * self._piece_bytes)
            if zlib.crc32(piece) != checksum:
                with self._lock:
                    self._counts["corrupt_pieces"] += 1
                return None
            now = _minute()
            if now - minute > _TOUCH_MINUTES:
                os.pwrite(entries, _ENTRY.pack(checksum, now), number * _ENTRY.size)
            return piece
        except OSError:
            return None  # an unreadable cache is a cache miss, never a failed read

    def _to_disk(self, key: str, number: int, piece: bytes) -> None:
        if self._disk_bytes == 0:
            return
        try:
            data, entries = self._files_of(key)
            os.pwrite(data, piece, number * self._piece_bytes)
            os.pwrite(entries, _ENTRY.pack(zlib.crc32(piece), _minute()), number * _ENTRY.size)
        except OSError:
            return  # a full or failing cache disk costs fetches, not reads
        with self._lock:
            if self._disk_estimate is None:
                self._disk_estimate = self._present_bytes()
            self._disk_estimate += len(piece)
            over = self._disk_estimate > self._disk_bytes
        if over:
            self.sweep()

    def _present_bytes(self) -> int:
        total = 0
        for path in self._map_files():
            total += int(np.count_nonzero(_read_entries(path)[:, 1])) * self._piece_bytes
        return total

    def _map_files(self) -> list[str]:
        with os.scandir(self._directory) as entries:
            return [e.path for e in entries if e.name.endswith(".map") and e.is_file()]

    def sweep(self) -> None:
        """Evict the least recently used pieces of every object in the directory until the
        cache holds at most 80% of ``disk_bytes`` (one process at a time)."""
        lock_path = os.path.join(self._directory, "sweep.lock")
        lock = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            paths = self._map_files()
            tables = [_read_entries(path) for path in paths]
            minutes = np.concatenate([t[:, 1] for t in tables] or [np.zeros(0, np.uint32)])
            owners = np.concatenate(
                [np.full(len(t), i, np.int64) for i, t in enumerate(tables)]
                or [np.zeros(0, np.int64)]
            )
            numbers = np.concatenate(
                [np.arange(len(t), dtype=np.int64) for t in tables] or [np.zeros(0, np.int64)]
            )
            present = np.flatnonzero(minutes)
            keep = int(self._disk_bytes * _SWEEP_TARGET) // self._piece_bytes
            evict = max(len(present) - keep, 0)
            victims = present[np.argsort(minutes[present], kind="stable")[:evict]]
            for owner in np.unique(owners[victims]):
                chosen = numbers[victims[owners[victims] == owner]]
                self._evict(paths[int(owner)], chosen)
            with self._lock:
                self._disk_estimate = (len(present) - evict) * self._piece_bytes
                self._counts["sweeps"] += 1
                self._counts["evicted_pieces"] += evict
        finally:
            os.close(lock)

    def _evict(self, map_path: str, numbers: np.ndarray) -> None:
        data_path = map_path[: -len(".map")] + ".data"
        with contextlib.suppress(OSError):
            entries = os.open(map_path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                data = os.open(data_path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
            except OSError:
                os.close(entries)
                raise
            try:
                for number in numbers.tolist():
                    os.pwrite(entries, _ENTRY.pack(0, 0), number * _ENTRY.size)
                    _punch(data, number * self._piece_bytes, self._piece_bytes)
            finally:
                os.close(data)
                os.close(entries)


def _read_entries(path: str) -> np.ndarray:
    """A map file as an (N, 2) uint32 array; empty when it cannot be read."""
    try:
        raw = np.fromfile(path, dtype="<u4")
    except (OSError, ValueError):
        return np.zeros((0, 2), dtype=np.uint32)
    return raw[: len(raw) - len(raw) % 2].reshape(-1, 2)


def _minute() -> int:
    return max(int(time.time() // 60), 1)


_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


def _punch(descriptor: int, offset: int, length: int) -> None:
    """Free a range of a file's blocks (it reads as zeros, which fail the piece's CRC)."""
    result = _libc.fallocate(
        descriptor, _FALLOC_PUNCH_HOLE, ctypes.c_int64(offset), ctypes.c_int64(length)
    )
    if result != 0:
        error = ctypes.get_errno()
        if error not in (errno.EOPNOTSUPP, errno.ENOSYS):
            raise OSError(error, os.strerror(error))
        os.pwrite(descriptor, bytes(length), offset)  # no holes here: at least never stale
