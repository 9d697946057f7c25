"""A piece cache in front of a remote store: aligned pieces on local disk and in memory.

Objects are cached in aligned *pieces* (16 KiB by default: small enough that rounding a
cut's span out to pieces adds little to what is fetched).  A read asks for
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

Each process maps the map files of the objects it has open (shared, so every process
sees every entry as soon as it is written).  Reading or writing an entry is then a
memory access: with ``pread`` and ``pwrite`` a cold cut paid a disk read of the map's
page before its request went out, and another before its first piece was handed on (a
write of a few bytes into a page that is not in memory reads the page first).

Processes of one mount (the decoder workers) share the directory: what one
fetched, the others read.  The disk use is bounded: every process counts what it
writes, before writing it, in one count of the directory
(:mod:`cutfs.codec.storage.cache_usage`), and one whose pieces would pass ``disk_bytes`` first
sweeps (under a lock file) the least recently used pieces of every object until 80% of
the bound, punching holes in the data files.  Memory is bounded by ``memory_bytes`` (an
LRU of pieces per process), and the maps of the objects a process has open by
:data:`_MAPPED_MAPS_BYTES`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import mmap
import os
import struct
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Final

import numpy as np
from cachetools import LRUCache

from cutfs.codec.errors import CutfsError, ShardFormatError
from cutfs.codec.storage.byte_store import ByteStore
from cutfs.codec.storage.cache_usage import DEFAULT_DISK_BYTES, CacheUsage
from cutfs.codec.storage.object_service import ObjectStoreError
from cutfs.codec.trust.private_directory import private_directory

PIECE_BYTES: Final = 16 << 10
DEFAULT_MEMORY_BYTES: Final = 64 << 20
_ENTRY: Final = struct.Struct("<II")  # crc32, minute last used (0: absent)
#: A hit rewrites a piece's minute only when it is older than this (a coarse LRU).
_TOUCH_MINUTES: Final = 10
#: Objects whose files a process keeps open: three descriptors each (data, map, and the
#: mapping's own copy), within a default limit of 1 024 with room for the rest.
_MAX_OPEN_OBJECTS: Final = 160
#: The most memory the maps of a process's open objects take (8 bytes per piece: 64 MiB
#: maps 128 GiB of objects); past it the least recently used objects are closed (one
#: object's map, however large, always fits).
_MAPPED_MAPS_BYTES: Final = 64 << 20
_SWEEP_TARGET: Final = 0.8
#: How much of a streamed response is read from the network at a time.
_STREAM_CHUNK_BYTES: Final = 64 << 10
#: Fetched pieces are written to disk this much at a time (after they are handed on).
_WRITE_BATCH_BYTES: Final = 1 << 20
#: How long closing waits for the fetches under way to finish writing their pieces.
_CLOSE_WAIT_SECONDS: Final = 2.0
#: Runs of missing pieces closer than this are fetched by one request, the cached pieces
#: between them again: a round trip to object storage (S3 answers its first byte in
#: 10-30 ms) costs more than a few hundred kilobytes more of one.  A cut whose middle is
#: cached (by the cuts around it) is then one GET too.
_MERGE_GAP_BYTES: Final = 256 << 10
#: The longest a read waits for a piece another request is fetching (the fetch itself
#: gives up at the store's deadline, sooner).
_AWAIT_SECONDS: Final = 300.0
_FALLOC_PUNCH_HOLE: Final = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
_MADV_POPULATE_READ: Final = getattr(mmap, "MADV_POPULATE_READ", 22)


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
        # Network reads of 64 KiB (smaller ones cost more per byte than they save in
        # waiting), whole pieces each, handed on piece by piece.
        self._chunk_bytes = piece_bytes * max(_STREAM_CHUNK_BYTES // piece_bytes, 1)
        # A bound smaller than a piece keeps nothing on disk (each write would sweep all).
        self._disk_bytes = disk_bytes if disk_bytes >= piece_bytes else 0
        self._memory: LRUCache[tuple[str, int], bytes] = LRUCache(
            maxsize=memory_bytes, getsizeof=len
        )
        self._lock = threading.Lock()
        self._files: OrderedDict[str, _ObjectFiles] = OrderedDict()
        self._closed = False
        self._mapped_bytes = 0
        #: What the directory holds, counted with every other process that uses it.
        self._usage = CacheUsage(directory, self._present_bytes)
        self._counts = {"memory_hits": 0, "disk_hits": 0, "misses": 0, "corrupt_pieces": 0}
        self._counts |= {"evicted_pieces": 0, "sweeps": 0}
        self._in_flight: dict[tuple[str, int], _Fetch] = {}
        self._keys: LRUCache[tuple[str, str], str] = LRUCache(maxsize=_MAX_OPEN_OBJECTS * 4)
        self._fetchers = ThreadPoolExecutor(max_workers=8, thread_name_prefix="cutfs-piece")

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

    def stream(self, name: str, start: int, stop: int, chunk_bytes: int) -> Iterator[memoryview]:
        self.prefetch(name, [(start, stop)])  # asked for now (see ByteStore.stream)
        return (
            self.read(name, offset, min(offset + chunk_bytes, stop))
            for offset in range(start, stop, chunk_bytes)
        )

    def prefetch(self, name: str, ranges: Sequence[tuple[int, int]]) -> bool:
        """Start fetching the pieces of ``ranges`` that are neither in memory nor on disk, in
        the background, and return whether there were none: reads of those pieces wait
        for them (and only for them), so decoding starts while the rest of a span is
        still arriving."""
        numbers: set[int] = set()
        for start, stop in ranges:
            if stop > start:
                numbers.update(
                    range(start // self._piece_bytes, (stop - 1) // self._piece_bytes + 1)
                )
        if not numbers:
            return True
        key = self._object_key(name)
        absent = self._from_memory(key, sorted(numbers), {})
        if not absent:
            return True
        with self._lock:
            arriving = any((key, number) in self._in_flight for number in absent)
        missing = self._read_ahead_on_disk(name, key, absent)
        if missing:
            self._start_fetch(name, key, missing)
        return not missing and not arriving

    def _read_ahead_on_disk(self, name: str, key: str, numbers: list[int]) -> list[int]:
        """Ask the kernel to read the pieces the map marks present (it does so while the
        caller goes on; they are checked when read); the numbers of the others."""
        with self._lock:
            numbers = [n for n in numbers if (key, n) not in self._in_flight]
        missing: list[int] = []
        try:
            files = self._files_of(name, key)
            runs = _runs(numbers)
            # Before the map is read, not after it: the two reads then overlap on a cold
            # disk (holes, pieces never fetched, cost the kernel no I/O).
            for first, end in runs:
                length = (end - first) * self._piece_bytes
                os.posix_fadvise(
                    files.data, first * self._piece_bytes, length, os.POSIX_FADV_WILLNEED
                )
            for first, end in runs:
                marked = [minute != 0 for _, minute in files.entries(first, end)]
                missing += [first + i for i, present in enumerate(marked) if not present]
        except (OSError, ValueError):  # ValueError: the files closed meanwhile
            return numbers
        return missing

    def wait_for_fetches(self, timeout_seconds: float) -> bool:
        """Wait until the fetches under way now have ended, their pieces on disk (or the
        fetch failed); whether all ended within ``timeout_seconds``.

        A read is answered as soon as its pieces arrive, before they are written: after
        this, the directory (and the other processes sharing it) holds what was read.
        """
        deadline = time.monotonic() + timeout_seconds
        return all(fetch.wait(deadline - time.monotonic()) for fetch in self._fetches_under_way())

    def _fetches_under_way(self) -> list[_Fetch]:
        with self._lock:
            return list({id(fetch): fetch for fetch in self._in_flight.values()}.values())

    def counters(self) -> dict[str, int]:
        with self._lock:
            own = dict(self._counts)
        return self._inner.counters() | own

    def close(self) -> None:
        """Close the store: fetches not started are dropped, those under way get up to
        :data:`_CLOSE_WAIT_SECONDS` to put their pieces on disk (so that the next
        mount finds them), and whoever still waits for a piece gets an error."""
        self._fetchers.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + _CLOSE_WAIT_SECONDS
        for fetch in self._fetches_under_way():
            if not fetch.started or not fetch.wait(deadline - time.monotonic()):
                fetch.finish(ObjectStoreError("the piece cache was closed"))
        with self._lock:
            self._closed = True  # a fetch still under way keeps no file open
            for files in self._files.values():
                files.close()
            self._files.clear()
            self._mapped_bytes = 0
            self._memory.clear()
        self._usage.close()
        self._inner.close()

    # --- pieces ---

    def _pieces(self, name: str, numbers: Iterable[int]) -> dict[int, bytes]:
        """The pieces ``numbers`` of an object: from memory, else from disk (each run of
        consecutive pieces in one read), else from a fetch (one already under way, or
        started now for all that are missing)."""
        key = self._object_key(name)
        found: dict[int, bytes] = {}
        absent = self._from_memory(key, numbers, found)
        if not absent:  # the common case of a decoder's small reads: return at once
            return found
        absent = self._from_disk_into(name, key, absent, found)
        if absent:
            # Waited on by their fetches, not looked up again: a piece the caches could
            # not keep (a cache smaller than the read) is still handed to this reader.
            fetches = self._start_fetch(name, key, absent)
            for number in absent:
                found[number] = fetches[number].piece(number, _AWAIT_SECONDS)
        return found

    def _from_memory(self, key: str, numbers: Iterable[int], found: dict[int, bytes]) -> list[int]:
        """Add the pieces in memory to ``found``; the numbers of the others."""
        absent: list[int] = []
        with self._lock:
            for number in numbers:
                piece = self._memory.get((key, number))
                if piece is None:
                    absent.append(number)
                else:
                    found[number] = piece
                    self._counts["memory_hits"] += 1
        return absent

    def _from_disk_into(
        self, name: str, key: str, numbers: list[int], found: dict[int, bytes]
    ) -> list[int]:
        """Add the pieces intact on disk to ``found`` (and to memory); the numbers of the
        others.  Pieces being fetched are not looked for (they are among the others)."""
        with self._lock:
            settled = [n for n in numbers if (key, n) not in self._in_flight]
        from_disk: dict[int, bytes] = {}
        for first, end in _runs(settled):
            from_disk |= self._from_disk(name, key, first, end)
        with self._lock:
            self._counts["disk_hits"] += len(from_disk)
            for number, piece in from_disk.items():
                self._remember(key, number, piece)
        found |= from_disk
        return [number for number in numbers if number not in from_disk]

    def _start_fetch(self, name: str, key: str, numbers: list[int]) -> dict[int, _Fetch]:
        """Fetch the pieces ``numbers`` not already being fetched: each run of them (runs
        closer than :data:`_MERGE_GAP_BYTES` joined) streamed by one request, the runs at
        once, in the background.  Returns the fetch that brings each of ``numbers``."""
        with self._lock:
            bringing = {
                n: self._in_flight[(key, n)] for n in numbers if (key, n) in self._in_flight
            }
            numbers = [n for n in numbers if n not in bringing]
            if not numbers:
                return bringing
            runs = _runs(numbers, gap=max(_MERGE_GAP_BYTES // self._piece_bytes, 0))
            fetches = []
            for first, end in runs:
                fetch = _Fetch()
                for number in range(first, end):
                    self._in_flight[(key, number)] = fetch
                    bringing[number] = fetch
                fetches.append((first, end, fetch))
        for first, end, fetch in fetches:
            try:
                stop = min(end * self._piece_bytes, self.size(name))
                # Asked for in the caller's thread, sent from a fetching one: the request
                # counts as the caller's even when it goes out after the caller is answered
                # (a decode that needs none of the margin pieces it asked for).
                start = first * self._piece_bytes
                chunks = self._inner.stream(name, start, stop, self._chunk_bytes)
            except Exception as exc:
                fetch.finish(exc)
                self._forget_fetch(key, first, end, fetch)
                continue
            try:
                self._fetchers.submit(self._stream_run, name, key, (first, end), fetch, chunks)
            except RuntimeError:  # closed meanwhile: no thread will fetch it
                fetch.finish(ObjectStoreError("the piece cache was closed"))
                self._forget_fetch(key, first, end, fetch)
        return bringing

    def _forget_fetch(self, key: str, first: int, end: int, fetch: _Fetch) -> None:
        with self._lock:
            for done in range(first, end):
                if self._in_flight.get((key, done)) is fetch:
                    del self._in_flight[(key, done)]

    def _stream_run(
        self,
        name: str,
        key: str,
        run: tuple[int, int],
        fetch: _Fetch,
        chunks: Iterator[memoryview],
    ) -> None:
        """Stream pieces ``run`` (first, end) from the inner store's ``chunks`` into memory
        and ``fetch`` (whose waiters each take theirs as soon as it is there), and onto disk.

        Pieces are handed on before they are written: the first write into a part of
        the data file not in memory waits for the file system (0.6 ms measured, as long
        as the rest of the cut's transfer), so they are written :data:`_WRITE_BATCH_BYTES`
        at a time, and the fetch is finished only once all are on disk (a reader that
        finds neither the fetch nor the piece in memory looks on disk)."""
        first, end = run
        number = first
        fetch.started = True
        try:
            unwritten: list[memoryview] = []
            unwritten_from = first
            for chunk in chunks:
                for offset in range(0, len(chunk), self._piece_bytes):
                    piece = bytes(chunk[offset : offset + self._piece_bytes])
                    with self._lock:
                        self._counts["misses"] += 1
                        self._remember(key, number, piece)
                    fetch.deliver(number, piece)
                    number += 1
                unwritten.append(chunk)
                if len(unwritten) * self._chunk_bytes >= _WRITE_BATCH_BYTES:
                    self._to_disk(name, key, unwritten_from, b"".join(unwritten))
                    unwritten, unwritten_from = [], number
            if unwritten:
                self._to_disk(name, key, unwritten_from, b"".join(unwritten))
            fetch.finish(None)
        except BaseException as exc:
            fetch.finish(exc)
        finally:
            self._forget_fetch(key, first, end, fetch)

    def _remember(self, key: str, number: int, piece: bytes) -> None:
        """Keep a piece in memory (caller holds the lock), if it fits at all."""
        if len(piece) <= self._memory.maxsize:
            self._memory[(key, number)] = piece

    def _object_key(self, name: str) -> str:
        """The name of an object version's cache files (and of its pieces in memory)."""
        version = self.version(name)
        with self._lock:
            key = self._keys.get((name, version))
        if key is None:
            identity = f"{self._namespace}\0{name}\0{version}"
            key = hashlib.sha256(identity.encode()).hexdigest()[:40]
            with self._lock:
                self._keys[(name, version)] = key
        return key

    # --- disk ---

    def _files_of(self, name: str, key: str) -> _ObjectFiles:
        """An object's cache files, opened (or made) once and kept open for the most
        recently used objects (at most :data:`_MAX_OPEN_OBJECTS`, their maps within
        :data:`_MAPPED_MAPS_BYTES`).  Raises ``OSError``."""
        with self._lock:
            files = self._files.get(key)
            if files is not None:
                self._files.move_to_end(key)
                return files
            if self._closed:
                raise OSError(errno.EBADF, "the piece cache is closed")
            pieces = -(-self.size(name) // self._piece_bytes)
            # Room is made before the new map is made, so that the bound holds at every
            # moment, not only once the new object is in.
            map_bytes = _ObjectFiles.map_bytes_for(pieces)
            while self._files and (
                len(self._files) >= _MAX_OPEN_OBJECTS
                or self._mapped_bytes + map_bytes > _MAPPED_MAPS_BYTES
            ):
                _, old = self._files.popitem(last=False)
                self._mapped_bytes -= old.map_bytes
                old.close()
            files = _ObjectFiles(os.path.join(self._directory, key), pieces)
            self._files[key] = files
            self._mapped_bytes += files.map_bytes
            return files

    def _from_disk(self, name: str, key: str, first: int, end: int) -> dict[int, bytes]:
        """The pieces ``[first, end)`` found intact on disk (their map entries, then one
        read of their data); a piece whose CRC does not match is left out (fetched again)."""
        found: dict[int, bytes] = {}
        try:
            files = self._files_of(name, key)
            table = files.entries(first, end)
            if not any(minute for _, minute in table):
                return found
            block = os.pread(
                files.data, (end - first) * self._piece_bytes, first * self._piece_bytes
            )
            now = _minute()
            for offset, (checksum, minute) in enumerate(table):
                if minute == 0:
                    continue
                start = offset * self._piece_bytes
                piece = block[start : start + self._piece_bytes]
                if zlib.crc32(piece) != checksum:
                    with self._lock:
                        self._counts["corrupt_pieces"] += 1
                    files.set_entries(first + offset, _ENTRY.pack(0, 0))
                    continue
                found[first + offset] = piece
                if now - minute > _TOUCH_MINUTES:
                    files.set_entries(first + offset, _ENTRY.pack(checksum, now))
        except (OSError, ValueError):
            pass  # an unreadable cache is a cache miss, never a failed read
        return found

    def _to_disk(self, name: str, key: str, first: int, data: bytes | memoryview) -> None:
        """Write the pieces from ``first`` on that ``data`` holds: the data in one write,
        then their map entries (a piece is never marked before it is there).

        The bytes are counted (:class:`CacheUsage`) before they are written, and room is
        made first where they would pass ``disk_bytes``, so that the directory holds no
        more whatever the number of processes writing into it and wherever one is killed
        (but for writes under way while a sweep counts, see :mod:`cutfs.codec.storage.cache_usage`);
        as many leading pieces as there is room for are written."""
        if self._disk_bytes == 0:
            return
        try:
            granted = self._reserved(len(data))
        except OSError:
            return  # a failing cache disk costs fetches, not reads
        if granted == 0:
            return
        data = data[:granted]
        piece_bytes = self._piece_bytes
        table = b"".join(
            _ENTRY.pack(zlib.crc32(data[start : start + piece_bytes]), _minute())
            for start in range(0, len(data), piece_bytes)
        )
        files = None
        try:
            files = self._files_of(name, key)
            os.pwrite(files.data, data, first * piece_bytes)
            files.set_entries(first, table)
        except (OSError, ValueError):  # a full or failing cache disk costs fetches, not reads
            if files is not None:  # pieces left unmarked are freed: no sweep would find them
                with contextlib.suppress(OSError, ValueError):
                    _punch(files.data, first * piece_bytes, len(data))
            with contextlib.suppress(OSError):
                self._usage.add(-granted)

    def _reserved(self, size_bytes: int) -> int:
        """How many of ``size_bytes`` (whole pieces) may be written: counted, after a sweep
        where all of them would pass the bound."""
        if self._usage.reserve(size_bytes, self._disk_bytes):
            return size_bytes
        self._sweep(needed_bytes=size_bytes)
        return self._usage.reserve_some(size_bytes, self._disk_bytes, self._piece_bytes)

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
        self._sweep(needed_bytes=None)

    def _sweep(self, needed_bytes: int | None) -> None:
        """:meth:`sweep`; with ``needed_bytes``, only if they still do not fit once this
        process has the sweep lock (another may have swept meanwhile)."""
        lock_path = os.path.join(self._directory, "sweep.lock")
        lock = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            counted_before = self._usage.bytes()
            if needed_bytes is not None and counted_before + needed_bytes <= self._disk_bytes:
                return
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
            evicted = 0
            for owner in np.unique(owners[victims]):
                chosen = numbers[victims[owners[victims] == owner]]
                evicted += self._evict(paths[int(owner)], chosen)
            self._usage.settle(counted_before, (len(present) - evicted) * self._piece_bytes)
            with self._lock:
                self._counts["sweeps"] += 1
                self._counts["evicted_pieces"] += evicted
        finally:
            os.close(lock)

    def _evict(self, map_path: str, numbers: np.ndarray) -> int:
        """Unmark pieces ``numbers`` of an object and free their bytes; how many were
        unmarked (a piece whose entry could not be cleared still counts as present)."""
        data_path = map_path[: -len(".map")] + ".data"
        evicted = 0
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
                    evicted += 1
                    _punch(data, number * self._piece_bytes, self._piece_bytes)
            finally:
                os.close(data)
                os.close(entries)
        return evicted


class _ObjectFiles:
    """An object's data file and its map, the map mapped into memory (shared).

    The map is made as long as the object's pieces need, as a sparse file (the pages of
    entries never written take no disk), and never shortened, so the mapping stays within
    the file (a map shortened behind cutfs's back would fault the process that touches
    it: a decoder worker, whose request fails and which the pool replaces).  Before
    entries are written, the blocks of their pages are allocated: a write into a mapped
    hole on a full disk would kill the process (SIGBUS) where the allocation returns
    ENOSPC, and a full cache disk must cost fetches, not reads.
    """

    def __init__(self, base: str, pieces: int) -> None:
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        self.data = os.open(base + ".data", flags, 0o600)
        try:
            self._entries = os.open(base + ".map", flags, 0o600)
            try:
                length = self.map_bytes_for(pieces)
                if os.fstat(self._entries).st_size < length:
                    os.ftruncate(self._entries, length)
                self._map = mmap.mmap(self._entries, length, mmap.MAP_SHARED)
                try:
                    _populate(self._map, self._entries, length)
                except BaseException:
                    self._map.close()
                    raise
            except BaseException:
                os.close(self._entries)
                raise
        except BaseException:
            os.close(self.data)
            raise
        self.map_bytes = length
        self._pieces = pieces

    @staticmethod
    def map_bytes_for(pieces: int) -> int:
        """How long the map of an object of ``pieces`` pieces is (and how much it maps)."""
        return max(pieces, 1) * _ENTRY.size

    def entries(self, first: int, end: int) -> list[tuple[int, int]]:
        """(CRC-32, minute last used) of pieces ``[first, end)`` as every process sees them
        now.  Raises ``ValueError`` for pieces past the object's end."""
        if not 0 <= first <= end <= self._pieces:
            raise ValueError(f"pieces [{first}, {end}) of {self._pieces}")
        return list(_ENTRY.iter_unpack(self._map[first * _ENTRY.size : end * _ENTRY.size]))

    def set_entries(self, first: int, table: bytes) -> None:
        """Write map entries from piece ``first`` on (``table``: packed entries)."""
        low = first * _ENTRY.size
        if low < 0 or low + len(table) > self._pieces * _ENTRY.size:
            raise ValueError(f"map entries past the object's {self._pieces} pieces")
        page = low - low % mmap.PAGESIZE
        os.posix_fallocate(self._entries, page, low + len(table) - page)  # OSError: ENOSPC
        self._map[low : low + len(table)] = table

    def close(self) -> None:
        self._map.close()
        os.close(self._entries)
        os.close(self.data)


def _populate(mapping: mmap.mmap, descriptor: int, length: int) -> None:
    """Bring a map into memory at once, one read of the whole file, as a map read whole
    on first use was before it was mapped: each cut would otherwise fault in its own page
    of it from disk (entries never written are holes and cost no I/O).  Raises
    ``OSError`` when that fails (a file system that cannot even give pages for holes,
    such as a full tmpfs: touching them would kill the process)."""
    try:
        mapping.madvise(_MADV_POPULATE_READ)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        # Before Linux 5.14: read it, then touch every page of the mapping.
        os.pread(descriptor, length, 0)
        for offset in range(0, length, mmap.PAGESIZE):
            mapping[offset]


class _Fetch:
    """Pieces of one request as they arrive, for the readers waiting on them."""

    def __init__(self) -> None:
        self._arrived = threading.Condition()
        self._pieces: dict[int, bytes] = {}
        self._done = False
        self._error: BaseException | None = None
        #: Set by the thread that runs the fetch, when it begins.
        self.started = False

    def deliver(self, number: int, piece: bytes) -> None:
        with self._arrived:
            self._pieces[number] = piece
            self._arrived.notify_all()

    def finish(self, error: BaseException | None) -> None:
        with self._arrived:
            if not self._done:
                self._done, self._error = True, error
            self._arrived.notify_all()

    def wait(self, timeout_seconds: float) -> bool:
        """Wait until the fetch has finished; whether it has."""
        with self._arrived:
            return self._arrived.wait_for(lambda: self._done, max(timeout_seconds, 0.0))

    def piece(self, number: int, timeout_seconds: float) -> bytes:
        with self._arrived:
            self._arrived.wait_for(lambda: number in self._pieces or self._done, timeout_seconds)
            piece = self._pieces.get(number)
            if piece is not None:
                return piece
            if isinstance(self._error, CutfsError):
                raise self._error
            raise ObjectStoreError(f"fetching a piece failed: {self._error or 'timed out'}")


def _runs(numbers: Iterable[int], gap: int = 0) -> list[tuple[int, int]]:
    """Sorted piece numbers as runs ``[first, end)`` of consecutive ones (joined across at
    most ``gap`` missing numbers)."""
    runs: list[list[int]] = []
    for number in numbers:
        if runs and number <= runs[-1][1] + gap:
            runs[-1][1] = number + 1
        else:
            runs.append([number, number + 1])
    return [(first, end) for first, end in runs]


def _read_entries(path: str) -> np.ndarray:
    """A map file as an (N, 2) uint32 array; empty when it cannot be read."""
    try:
        raw = np.fromfile(path, dtype="<u4")
    except (OSError, ValueError):
        return np.zeros((0, 2), dtype=np.uint32)
    return raw[: len(raw) - len(raw) % 2].reshape(-1, 2)


def _minute() -> int:
    return max(int(time.time() // 60), 1)


_libc = ctypes.CDLL(None, use_errno=True)  # libc, as linked: find_library would run ldconfig


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
