"""Frames of recordings, served from the block cache or decoded on demand.

A request for frames ``[first, end)`` is split into cache blocks.  Blocks
missing from the cache are decoded in contiguous runs, one decode per run,
and stored.  A block already being decoded for another request is waited
for rather than decoded twice.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import trio
from cachetools import LRUCache

from cutfs.codec.errors import CutfsError, ManifestMismatchError
from cutfs.codec.library import Library
from cutfs.codec.pcm import Int16Array
from cutfs.vfs.block_cache import BlockCache, BlockKey
from cutfs.vfs.decode_pool import DecodeDeadlineError, DecodePool
from cutfs.vfs.statistics import Statistics

#: The most frames decoded ahead of a read, in one pass (98 s at 16 kHz).
MAX_READAHEAD_FRAMES = 48 << 15
#: A file read in order (each kernel read where the one before ended: a whole recording
#: read through) has the bytes after each decode fetched ahead once this many decodes in a
#: row, each for such a read, began where the one before ended.  A cut is one read: cuts,
#: even consecutive ones, never read ahead.
SEQUENTIAL_DECODES = 2
#: The window fetched ahead doubles from one decode's length up to this many decodes.
MOST_DECODES_AHEAD = 4
#: Recordings whose order of decodes is followed (the least recently decoded forgotten).
_SEQUENCES_KEPT = 1024
#: Streaks are counted no further than the window grows.
_MOST_STREAK = SEQUENTIAL_DECODES + MOST_DECODES_AHEAD.bit_length()


class FrameSource:
    """Exact frame ranges of the recordings of a shard set."""

    def __init__(
        self,
        library: Library,
        cache: BlockCache,
        pool: DecodePool,
        profile: Statistics | None = None,
    ) -> None:
        self._profile = profile
        self._library = library
        self._cache = cache
        self._pool = pool
        self._in_flight: dict[BlockKey, trio.Event] = {}
        #: recording -> (the block a decode continuing the last one would start at, how
        #: many decodes in a row did)
        self._sequences: LRUCache[int, tuple[int, int]] = LRUCache(maxsize=_SEQUENCES_KEPT)
        self._indexing: dict[int, trio.Event] = {}
        #: The last failure to index a recording, with the event of that attempt.
        self._index_failures: dict[int, tuple[trio.Event, Exception]] = {}

    @property
    def recordings_being_indexed(self) -> int:
        """Recordings a worker is indexing now (first use of a source served in place)."""
        return len(self._indexing)

    @property
    def deadline_seconds(self) -> float:
        """How long one read may take, waiting for workers and indexing included."""
        return self._pool.deadline_seconds

    async def index(self, recording_index: int) -> None:
        """Make the library know a recording's plan, having a worker compute it once.

        The indexing runs in the background: a caller that gives up (its read's
        deadline) does not stop it, and a later call finds the plan made.
        Concurrent calls wait for the same indexing.  A failure is not
        remembered: the callers waiting get it, and a later call tries again.
        """
        while self._library.shape(recording_index) is None:
            done = self._indexing.get(recording_index)
            if done is None:
                done = trio.Event()
                self._indexing[recording_index] = done
                trio.lowlevel.spawn_system_task(self._index, recording_index, done)
            await done.wait()
            failure = self._index_failures.get(recording_index)
            if failure is not None and failure[0] is done:
                raise _fresh(failure[1])

    async def _index(self, recording_index: int, done: trio.Event) -> None:
        try:
            plan = await self._pool.index(recording_index)
            self._library.adopt(recording_index, plan)
            self._index_failures.pop(recording_index, None)
        except Exception as exc:  # handed to the waiting callers, who report it
            self._index_failures[recording_index] = (done, exc)
        finally:
            del self._indexing[recording_index]
            done.set()

    async def frames(
        self,
        recording_index: int,
        first: int,
        end: int,
        readahead_end: int = 0,
        *,
        in_order: bool = False,
    ) -> Int16Array:
        """Frames ``[first, end)`` of a recording as int16 (frames, channels).

        When blocks must be decoded, the decode goes on past ``end`` up to
        ``readahead_end`` (at most ``MAX_READAHEAD_FRAMES``), filling the
        cache for the reads that follow: a cut is decoded in one pass from one
        seek point instead of once per kernel read.  ``in_order`` says that the read
        continues the previous read of its file: once several decodes of a file read in
        order continue each other, the store fetches the frames after each decode in the
        background (:data:`SEQUENTIAL_DECODES`).

        Raises what decoding raises (:class:`cutfs.codec.errors.CorruptDataError`)
        when a block cannot be decoded; the failure is not cached.
        """
        started = time.perf_counter() if self._profile is not None else 0.0
        decoded = False
        recording = _Span(
            self._library.recording_ids[recording_index],
            self._library.frame_limit(recording_index),
        )
        block_frames = self._cache.block_frames
        numbers: Sequence[int] = range(first // block_frames, -(-end // block_frames))
        blocks: dict[int, Int16Array] = {}
        for _attempt in range(3):
            missing = self._collect(recording_index, numbers, blocks)
            if not missing:
                break
            waiting = [
                self._in_flight[(recording_index, n)]
                for n in missing
                if (recording_index, n) in self._in_flight
            ]
            if waiting:
                with trio.move_on_after(self._pool.deadline_seconds):
                    await waiting[0].wait()
                    continue
                raise DecodeDeadlineError(
                    "waited too long for another request's decode", where=recording.recording_id
                )
            decoded = True
            missing += self._readahead(recording_index, recording, missing[-1], readahead_end)
            await self._decode_runs(recording_index, recording, missing, blocks, in_order)
        missing = self._collect(recording_index, numbers, blocks)
        if missing:  # evicted or failed while we waited: decode them ourselves
            decoded = True
            await self._decode_runs(recording_index, recording, missing, blocks, in_order)
        if self._profile is not None:
            phase = "frames.decoded" if decoded else "frames.cached"
            self._profile.observe(phase, time.perf_counter() - started)
        return self._joined(recording_index, numbers, blocks, first, end)

    def cached_frames(self, recording_index: int, first: int, end: int) -> Int16Array | None:
        """Frames ``[first, end)`` if every block of them is in the cache, else ``None``.

        Never waits: callers take this path first and pay for deadlines and
        decoding only when it misses.
        """
        block_frames = self._cache.block_frames
        numbers: Sequence[int] = range(first // block_frames, -(-end // block_frames))
        blocks: dict[int, Int16Array] = {}
        if self._collect(recording_index, numbers, blocks):
            return None
        return self._joined(recording_index, numbers, blocks, first, end)

    def _joined(
        self,
        recording_index: int,
        numbers: Sequence[int],
        blocks: dict[int, Int16Array],
        first: int,
        end: int,
    ) -> Int16Array:
        if not blocks:
            shape = self._library.shape(recording_index)
            return np.zeros((0, shape.channels if shape else 1), dtype=np.int16)
        joined = np.concatenate([blocks[n] for n in numbers])
        offset = numbers[0] * self._cache.block_frames
        result = joined[first - offset : end - offset]
        if len(result) < end - first:
            raise ManifestMismatchError(
                f"frames [{first}, {end}) were asked for, the audio ends at frame "
                f"{offset + len(joined)}, before the length its manifest declares",
                where=self._library.recording_ids[recording_index],
            )
        return result

    def _collect(
        self, recording_index: int, numbers: Sequence[int], blocks: dict[int, Int16Array]
    ) -> list[int]:
        missing = []
        for number in numbers:
            if number in blocks:
                continue
            block = self._cache.get((recording_index, number))
            if block is None:
                missing.append(number)
            else:
                blocks[number] = block
        return missing

    def _readahead(
        self, recording_index: int, recording: _Span, last_missing: int, readahead_end: int
    ) -> list[int]:
        """Blocks after ``last_missing`` worth decoding in the same pass."""
        block_frames = self._cache.block_frames
        stop = min(readahead_end, recording.frame_limit)
        most = max(MAX_READAHEAD_FRAMES // block_frames, 1)
        last = min(-(-stop // block_frames), last_missing + 1 + most)
        extra = []
        for number in range(last_missing + 1, last):
            key = (recording_index, number)
            if key in self._in_flight or self._cache.contains(key):
                break
            extra.append(number)
        return extra

    async def _decode_runs(
        self,
        recording_index: int,
        recording: _Span,
        missing: list[int],
        blocks: dict[int, Int16Array],
        in_order: bool = False,
    ) -> None:
        for run in _runs(missing):
            keys = [(recording_index, number) for number in run]
            done = trio.Event()
            for key in keys:
                self._in_flight.setdefault(key, done)
            try:
                block_frames = self._cache.block_frames
                first = run[0] * block_frames
                end = min((run[-1] + 1) * block_frames, recording.frame_limit)
                ahead = self._frames_ahead(recording_index, run[0], run[-1] + 1, in_order)
                decoded = await self._pool.decode(recording_index, first, end, ahead)
                for number in run:
                    block = decoded[(number - run[0]) * block_frames :][:block_frames].copy()
                    blocks[number] = block
                    self._cache.put((recording_index, number), block)
            finally:
                for key in keys:
                    if self._in_flight.get(key) is done:
                        del self._in_flight[key]
                done.set()

    def _frames_ahead(
        self, recording_index: int, first_block: int, end_block: int, in_order: bool
    ) -> int:
        """How many frames after the decode of blocks ``[first_block, end_block)`` to fetch
        ahead: none unless a file of the recording is being read in order (see
        :data:`SEQUENTIAL_DECODES`), then a window that doubles with every decode."""
        expected, streak = self._sequences.get(recording_index, (-1, 0))
        streak = min(streak + 1, _MOST_STREAK) if in_order and first_block == expected else 0
        self._sequences[recording_index] = (end_block, streak)
        if streak < SEQUENTIAL_DECODES:
            return 0
        decodes = min(1 << (streak - SEQUENTIAL_DECODES), MOST_DECODES_AHEAD)
        return (end_block - first_block) * self._cache.block_frames * decodes


@dataclass(frozen=True, slots=True)
class _Span:
    """What decoding needs to know of a recording: its id (for errors) and where frames end."""

    recording_id: str
    frame_limit: int


def _fresh(error: Exception) -> Exception:
    """A copy of ``error`` for one more caller (one exception object is raised once)."""
    if isinstance(error, CutfsError):
        return type(error)(error.message, where=error.where)
    return CutfsError(f"indexing failed: {error!r}")


def _runs(numbers: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for number in numbers:
        if runs and runs[-1][-1] + 1 == number:
            runs[-1].append(number)
        else:
            runs.append([number])
    return runs
