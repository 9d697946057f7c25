"""Where decoding runs: off the event loop, in worker processes or threads.

Decoding is CPU-bound and holds the GIL in PyAV, so by default it runs in a
pool of worker processes, each of which opens the shard directory itself
(the memory maps share the page cache).  With ``workers=0`` it runs in trio
worker threads instead, in this process: useful for tests and small mounts.
Either way, at most ``limit`` decodes run at once and the event loop keeps
answering other requests meanwhile.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import trio

from codec.errors import CutfsError
from codec.pcm import Int16Array
from codec.shard_set import ShardSet

_worker_shards: ShardSet | None = None


class DecodePool:
    """Decodes frame ranges of recordings of one shard directory."""

    def __init__(self, shard_set: ShardSet, workers: int) -> None:
        self._shard_set = shard_set
        self._workers = workers
        self._executor: ProcessPoolExecutor | None = None
        self._limiter = trio.CapacityLimiter(max(workers, 1) * 2 if workers else 2)
        if workers > 0:
            self._executor = self._new_executor()

    async def decode(self, recording_index: int, first: int, end: int) -> Int16Array:
        """Frames ``[first, end)`` of a recording, as int16 (frames, channels)."""
        async with self._limiter:
            if self._executor is None:
                return await trio.to_thread.run_sync(
                    self._shard_set.read_frames, recording_index, first, end
                )
            return await self._in_process(recording_index, first, end)

    def start(self) -> None:
        """Start every worker process now, so that the first reads do not wait for them."""
        if self._executor is not None:
            for future in [self._executor.submit(_ready) for _ in range(self._workers)]:
                future.result()

    def close(self) -> None:

        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    async def _in_process(self, recording_index: int, first: int, end: int) -> Int16Array:
        assert self._executor is not None
        executor = self._executor
        try:
            future: Future[Int16Array] = executor.submit(
                _decode_in_worker, recording_index, first, end
            )
            return await trio.to_thread.run_sync(future.result)
        except BrokenProcessPool as exc:
            if self._executor is executor:  # replace the pool once, for later reads
                self._executor = self._new_executor()
                executor.shutdown(wait=False, cancel_futures=True)
            raise CutfsError(f"a decoder worker died: {exc}") from exc

    def _new_executor(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=self._workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_open_in_worker,
            initargs=(self._shard_set.directory,),
        )


def _open_in_worker(directory: str) -> None:
    global _worker_shards  # noqa: PLW0603 - one shard set per worker process
    _worker_shards = ShardSet(directory)


def _ready() -> bool:
    return _worker_shards is not None


def _decode_in_worker(recording_index: int, first: int, end: int) -> Any:
    assert _worker_shards is not None
    return _worker_shards.read_frames(recording_index, first, end)
