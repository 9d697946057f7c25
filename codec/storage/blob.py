"""A recording's stored bytes: a byte range of one object in a store, or a buffer.

Decoders read a :class:`Blob` by bounded, blob-relative ranges; they never
see where it lives.  Over a local store a read is a slice of a memory map
(no copy); over a remote one it is served by the piece cache, so what the
decoder asks for beyond what was prefetched costs a request, which the
request counters make visible.
"""

from __future__ import annotations

from collections.abc import Sequence

from cutfs.codec.storage.byte_store import ByteStore


class Blob:
    """Bytes ``[start, stop)`` of object ``name`` of ``store``; or a buffer (:meth:`of`)."""

    __slots__ = ("_buffer", "_name", "_start", "_stop", "_store")

    def __init__(self, store: ByteStore, name: str, start: int, stop: int) -> None:
        if not 0 <= start <= stop:
            raise ValueError(f"invalid blob range [{start}, {stop})")
        self._store: ByteStore | None = store
        self._buffer: memoryview | None = None
        self._name = name
        self._start = start
        self._stop = stop

    @classmethod
    def of(cls, buffer: memoryview | bytes) -> Blob:
        """A blob of bytes already in memory (packing, tests)."""
        blob = cls.__new__(cls)
        blob._store = None
        blob._buffer = memoryview(buffer).cast("B")
        blob._name = "<memory>"
        blob._start = 0
        blob._stop = len(blob._buffer)
        return blob

    def __len__(self) -> int:
        return self._stop - self._start

    def read(self, start: int, stop: int) -> memoryview:
        """Bytes ``[start, stop)`` of the blob, clipped to its length (like a slice)."""
        start = min(max(start, 0), len(self))
        stop = min(max(stop, start), len(self))
        if self._buffer is not None:
            return self._buffer[start:stop]
        assert self._store is not None
        if start == stop:
            return memoryview(b"")
        return self._store.read(self._name, self._start + start, self._start + stop)

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> bool:
        """Ask the store for these blob-relative ranges in one go (clipped to the blob);
        whether they are all at hand (see :meth:`ByteStore.prefetch`)."""
        if self._store is None:
            return True
        size = len(self)
        spans = [
            (self._start + min(max(a, 0), size), self._start + min(max(b, 0), size))
            for a, b in ranges
        ]
        return self._store.prefetch(self._name, [(a, b) for a, b in spans if b > a])
