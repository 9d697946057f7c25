"""The seam between cutfs and where stored bytes live: named objects read by bounded range.

Everything that decodes reads through a :class:`ByteStore`: shard files on a
local or network file system (:class:`cutfs.codec.storage.local_store.LocalStore`),
objects in S3-compatible storage (:class:`cutfs.codec.storage.object_store.ObjectStore`),
and a piece cache in front of either
(:class:`cutfs.codec.storage.caching_store.CachingStore`).  A recording's bytes are a
:class:`cutfs.codec.storage.blob.Blob`: a range of one object.

Contracts every store keeps:

* Ranges are always bounded: ``read(name, start, stop)`` returns exactly
  ``stop - start`` bytes or raises; nothing reads "to the end".
* An object is *pinned* the first time it is used (or when the store is made
  with its version): :meth:`ByteStore.version` names that version, and a read
  of an object that changed since raises instead of returning other bytes.
* Errors are :class:`cutfs.codec.errors.CutfsError` subclasses naming the object.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol


class ByteStore(Protocol):
    """Named objects (shard files), read by bounded byte ranges."""

    def size(self, name: str) -> int:
        """The object's size in bytes (of its pinned version)."""
        ...

    def version(self, name: str) -> str:
        """A token naming the pinned version (an ETag, or a file's inode, size and time)."""
        ...

    def read(self, name: str, start: int, stop: int) -> memoryview:
        """Bytes ``[start, stop)`` of the object; a view of a mapped file where possible."""
        ...

    def read_many(self, name: str, ranges: Sequence[tuple[int, int]]) -> list[memoryview]:
        """Each range's bytes, fetched together (merged and concurrent where remote)."""
        ...

    def stream(self, name: str, start: int, stop: int, chunk_bytes: int) -> Iterator[memoryview]:
        """Bytes ``[start, stop)`` in chunks of ``chunk_bytes`` (the last may be shorter), each
        yielded as soon as it is there: one request, consumed while it arrives.

        The request is counted (:meth:`counters`) when the stream is asked for, and sent
        when it is first iterated: a caller that hands the stream to another thread has
        its statistics hold the request it started, even one sent after it is answered."""
        ...

    def prefetch(self, name: str, ranges: Sequence[tuple[int, int]]) -> bool:
        """Make the next reads of ``ranges`` cheap: one request for all of them, now.

        Returns whether every byte of them is at hand (in memory or on local storage),
        so that reads will not wait for the network; ``False`` when some are still to
        arrive (decoders that can start on the first bytes should then stream them)."""
        ...

    def check_unchanged(self, name: str) -> None:
        """Raise if the object is no longer its pinned version (where that is cheap to
        know ahead of a read; remote stores check on every read instead)."""
        ...

    def counters(self) -> dict[str, int]:
        """Running totals of the store's work (requests, bytes, hits), for statistics."""
        ...

    def close(self) -> None:
        """Release maps, handles and connections; no view handed out may be used after."""
        ...
