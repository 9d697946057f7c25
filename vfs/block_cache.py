"""A size-bounded LRU cache of decoded PCM, in blocks of any length.

A block is a run of consecutive frames of one recording (all its channels), as one
decode produced it: a cold cut is decoded exactly, into one block, and a cut that
overlaps it decodes only the frames the cache lacks.  The blocks of a recording never
overlap, so the frames of a read are found by one binary search and served as views of
the blocks that hold them.  The cache counts the bytes of the arrays it holds and
evicts the least recently used blocks beyond its budget.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from cachetools import Cache, LRUCache

from cutfs.codec.pcm import Int16Array

BlockKey = tuple[int, int]  # (recording index, first frame)
#: A cached run of frames: (its first frame in the recording, the frames).
Piece = tuple[int, Int16Array]
#: Frames ``[first, end)`` of a recording.
FrameRange = tuple[int, int]


@dataclass(frozen=True, slots=True)
class BlockCacheStatistics:
    #: Requests that found every frame they asked for cached / that found some missing.
    hits: int
    misses: int
    blocks: int
    bytes: int
    capacity_bytes: int


class _Blocks(LRUCache[BlockKey, Int16Array]):
    """The LRU of blocks; tells its owner which blocks it evicts."""

    def __init__(self, capacity_bytes: int, owner: BlockCache) -> None:
        super().__init__(maxsize=max(capacity_bytes, 1), getsizeof=_block_bytes)
        self._owner = owner

    def peek(self, key: BlockKey) -> Int16Array:
        """The block at ``key``, left where it is in the order of use."""
        block: Int16Array = Cache.__getitem__(self, key)
        return block

    def touch(self, key: BlockKey) -> None:
        """Make the block at ``key`` the most recently used."""
        self.__getitem__(key)

    def popitem(self) -> tuple[BlockKey, Int16Array]:
        key, block = super().popitem()
        self._owner._forget_start(key)
        return key, block


def _block_bytes(block: Int16Array) -> int:
    return max(block.nbytes, 1)


class BlockCache:
    """Decoded blocks of the recordings of a library, by recording and first frame."""

    def __init__(self, capacity_bytes: int) -> None:
        self._capacity_bytes = capacity_bytes
        self._blocks = _Blocks(capacity_bytes, self)
        #: recording -> the first frames of its cached blocks, sorted.
        self._starts: dict[int, list[int]] = {}
        self._hits = 0
        self._misses = 0

    def lookup(self, recording: int, first: int, end: int) -> tuple[list[Piece], list[FrameRange]]:
        """The cached frames of ``[first, end)``, as pieces in order (views clipped to the
        range), and the ranges between them the cache lacks, in order.

        The blocks used become the most recently used; the caller counts the lookup
        (:meth:`count`), once per request however many times it looks.
        """
        pieces: list[Piece] = []
        gaps: list[FrameRange] = []
        position = first
        starts = self._starts.get(recording)
        if starts:
            index = max(bisect.bisect_right(starts, first) - 1, 0)
            while index < len(starts) and starts[index] < end:
                start = starts[index]
                index += 1
                block = self._blocks.peek((recording, start))
                block_end = start + len(block)
                if block_end <= position:
                    continue
                self._blocks.touch((recording, start))
                if start > position:
                    gaps.append((position, start))
                    position = start
                stop = min(block_end, end)
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

    def put(self, recording: int, start: int, block: Int16Array) -> None:
        """Keep ``block`` (frames from ``start`` on) unless it alone exceeds the capacity.

        Blocks it overlaps are dropped: it holds the same frames (decoding is exact), and
        the blocks of a recording must not overlap.  A block that is a view of a larger
        array is copied, so that the cache holds no more memory than it counts.
        """
        if block.nbytes > self._capacity_bytes or len(block) == 0:
            return
        if not block.flags.owndata:
            block = block.copy()
        block.setflags(write=False)
        self._drop_overlapping(recording, start, start + len(block))
        starts = self._starts.setdefault(recording, [])
        bisect.insort(starts, start)
        self._blocks[(recording, start)] = block

    def _drop_overlapping(self, recording: int, first: int, end: int) -> None:
        starts = self._starts.get(recording)
        if not starts:
            return
        index = max(bisect.bisect_right(starts, first) - 1, 0)
        overlapping = []
        while index < len(starts) and starts[index] < end:
            start = starts[index]
            if start + len(self._blocks.peek((recording, start))) > first:
                overlapping.append(start)
            index += 1
        for start in overlapping:
            del self._blocks[(recording, start)]
            self._forget_start((recording, start))

    def _forget_start(self, key: BlockKey) -> None:
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
