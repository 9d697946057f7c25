"""Frames of recordings, served from the block cache or decoded on demand.

A request for frames ``[first, end)`` is split into cache blocks.  Blocks
missing from the cache are decoded in contiguous runs, one decode per run,
and stored.  A block already being decoded for another request is waited
for rather than decoded twice.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import trio

from codec.pcm import Int16Array
from codec.recording import Recording
from vfs.block_cache import BlockCache, BlockKey
from vfs.decode_pool import DecodeDeadlineError, DecodePool


class FrameSource:
    """Exact frame ranges of the recordings of a shard set."""

    def __init__(self, recordings: list[Recording], cache: BlockCache, pool: DecodePool) -> None:
        self._recordings = recordings
        self._cache = cache
        self._pool = pool
        self._in_flight: dict[BlockKey, trio.Event] = {}

    async def frames(self, recording_index: int, first: int, end: int) -> Int16Array:
        """Frames ``[first, end)`` of a recording as int16 (frames, channels).

        Raises what decoding raises (:class:`codec.errors.CorruptDataError`)
        when a block cannot be decoded; the failure is not cached.
        """
        recording = self._recordings[recording_index]
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
            await self._decode_runs(recording_index, recording, missing, blocks)
        missing = self._collect(recording_index, numbers, blocks)
        if missing:  # evicted or failed while we waited: decode them ourselves
            await self._decode_runs(recording_index, recording, missing, blocks)
        if not blocks:
            return np.zeros((0, recording.channels), dtype=np.int16)
        joined = np.concatenate([blocks[n] for n in numbers])
        offset = numbers[0] * block_frames
        return joined[first - offset : end - offset]

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

    async def _decode_runs(
        self,
        recording_index: int,
        recording: Recording,
        missing: list[int],
        blocks: dict[int, Int16Array],
    ) -> None:
        for run in _runs(missing):
            keys = [(recording_index, number) for number in run]
            done = trio.Event()
            for key in keys:
                self._in_flight.setdefault(key, done)
            try:
                block_frames = self._cache.block_frames
                first = run[0] * block_frames
                end = min((run[-1] + 1) * block_frames, recording.num_frames)
                decoded = await self._pool.decode(recording_index, first, end)
                for number in run:
                    block = decoded[(number - run[0]) * block_frames :][:block_frames].copy()
                    blocks[number] = block
                    self._cache.put((recording_index, number), block)
            finally:
                for key in keys:
                    if self._in_flight.get(key) is done:
                        del self._in_flight[key]
                done.set()


def _runs(numbers: list[int]) -> list[list[int]]:
    runs: list[list[int]] = []
    for number in numbers:
        if runs and runs[-1][-1] + 1 == number:
            runs[-1].append(number)
        else:
            runs.append([number])
    return runs
