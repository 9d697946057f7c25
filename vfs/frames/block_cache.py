"""A size-bounded LRU cache of decoded PCM, in blocks of any length.

A block is a run of consecutive frames of one recording (all its channels), as one
decode produced it: a cold cut is decoded exactly, into one block, and a cut that
overlaps it decodes only the frames the cache lacks.  The blocks of a recording never
overlap, so the frames of a read are found by one binary search and served as views of
the blocks that hold them.  The cache counts the bytes of the arrays it holds, plus
:data:`BLOCK_OVERHEAD_BYTES` for each, and evicts the least recently used blocks beyond
its budget.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from cachetools import Cache, LRUCache

from cutfs.codec.audio.pcm import Int16Array

BlockKey = tuple[int, int]  # (recording index, first frame)
#: A cached run of frames: (its first frame in the recording, the frames).
Piece = tuple[int, Int16Array]
#: Frames ``[first, end)`` of a recording.
FrameRange = tuple[int, int]

#: What a block costs besides its samples (the array object, its key, its place in the
#: index and in the LRU): counted, so that a cache of tiny blocks holds no more memory
#: than its budget.
BLOCK_OVERHEAD_BYTES: Final = 512


@dataclass(frozen=True, slots=True)
class BlockCacheStatistics:
    #: Requests that found every frame they asked for cached / that found some missing.
    hits: int
    misses: int
    blocks: int
    bytes: int
    capacity_bytes: int


class _Blocks(LRUCache[BlockKey, Int16Array]):
    """The LRU of blocks, calling ``on_evict`` with the key of each block it evicts."""

    def __init__(self, capacity_bytes: int, on_evict: Callable[[BlockKey], None]) -> None:
        super().__init__(maxsize=max(capacity_bytes, 1), getsizeof=block_bytes)
        self._on_evict = on_evict

    def peek(self, key: BlockKey) -> Int16Array:
        """The block at ``key``, left where it is in the order of use."""
        block: Int16Array = Cache.__getitem__(self, key)
        return block

    def touch(self, key: BlockKey) -> None:
        """Make the block at ``key`` the most recently used."""
        self[key]

    def popitem(self) -> tuple[BlockKey, Int16Array]:
        key, block = super().popitem()
        self._on_evict(key)
        return key, block


def block_bytes(block: Int16Array) -> int:
    """What a block counts against the cache's budget."""
    return block.nbytes + BLOCK_OVERHEAD_BYTES


class BlockCache:
    """Decoded blocks of the recordings of a library, by recording and first frame."""

    def __init__(self, capacity_bytes: int) -> None:
        self._capacity_bytes = capacity_bytes
        self._blocks = _Blocks(capacity_bytes, self._forget_start)
        #: recording -> the first frames of its cached blocks, sorted.
        self._starts: dict[int, list[int]] = {}
        self._hits = 0
        self._misses = 0

    @property
    def capacity_bytes(self) -> int:
        return self._capacity_bytes

    def lookup(self, recording: int, first: int, end: int) -> tuple[list[Piece], list[FrameRange]]:
        """The cached frames of ``[first, end)``, as pieces in order (views clipped to the
        range), and the ranges between them the cache lacks, in order.

        The blocks used become the most recently used; the caller counts the lookup
        (:meth:`count`), once per request however many times it looks.
        """
        pieces: list[Piece] = []
        gaps: list[FrameRange] = []
        position = first
        for start, block in self._overlapping(recording, first, end):
            self._blocks.touch((recording, start))
            if start > position:
                gaps.append((position, start))
                position = start
            stop = min(start + len(block), end)
            pieces.append((position, block[position - start : stop - start]))
            position = stop
        if position < end:
            gaps.append((position, end))
        return pieces, gaps

    def count(self, *, hit: bool) -> None:
        """Count a request that found all its frames cached (``hit``) or not."""
        if hit:
            self._hits += 1
        else:
            self._misses += 1

    def next_start(self, recording: int, frame: int) -> int | None:
        """The first frame of the first cached block starting at or after ``frame``."""
        starts = self._starts.get(recording)
        if not starts:
            return None
        index = bisect.bisect_left(starts, frame)
        return starts[index] if index < len(starts) else None

    def previous_end(self, recording: int, frame: int) -> int | None:
        """Where the last cached block starting before ``frame`` ends."""
        starts = self._starts.get(recording)
        if not starts:
            return None
        index = bisect.bisect_left(starts, frame) - 1
        if index < 0:
            return None
        start = starts[index]
        return start + len(self._blocks.peek((recording, start)))

    def put(self, recording: int, start: int, block: Int16Array) -> None:
        """Keep ``block`` (frames from ``start`` on) unless it alone exceeds the capacity or
        the cache already holds all its frames.

        Blocks it overlaps are dropped: it holds the same frames (decoding is exact), and
        the blocks of a recording must not overlap.  A block that is a view of a larger
        array is copied, so that the cache holds no more memory than it counts.
        """
        end = start + len(block)
        if block_bytes(block) > self._capacity_bytes or end == start:
            return
        if not self.lookup(recording, start, end)[1]:
            return
        if not block.flags.owndata:
            block = block.copy()
        block.setflags(write=False)
        for overlapped, _ in list(self._overlapping(recording, start, end)):
            del self._blocks[(recording, overlapped)]
            self._forget_start((recording, overlapped))
        self._blocks[(recording, start)] = block
        bisect.insort(self._starts.setdefault(recording, []), start)

    def _overlapping(self, recording: int, first: int, end: int) -> Iterator[Piece]:
        """The cached blocks of ``recording`` that hold frames of ``[first, end)``, in
        order (whole, with their first frames), left where they are in the order of use."""
        starts = self._starts.get(recording)
        if not starts:
            return
        index = max(bisect.bisect_right(starts, first) - 1, 0)
        while index < len(starts) and starts[index] < end:
            start = starts[index]
            index += 1
            block = self._blocks.peek((recording, start))
            if start + len(block) > first:
                yield start, block

    def _forget_start(self, key: BlockKey) -> None:
        """Take an evicted or dropped block out of its recording's index."""
        recording, start = key
        starts = self._starts[recording]
        del starts[bisect.bisect_left(starts, start)]
        if not starts:
            del self._starts[recording]

    def statistics(self) -> BlockCacheStatistics:
        return BlockCacheStatistics(
            self._hits,
            self._misses,
            len(self._blocks),
            int(self._blocks.currsize),
            self._capacity_bytes,
        )
