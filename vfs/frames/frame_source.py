"""Frames of recordings, served from the block cache or decoded on demand.

A request for frames ``[first, end)`` takes what the cache holds of them and
decodes what it lacks in one decode, from its first missing frame to its last
(on through a readahead, and back to a shortest decode), stored as one block.
Frames already being decoded for another request are waited for rather than
decoded twice.
"""

from __future__ import annotations

import time

import numpy as np
import trio
from cachetools import LRUCache

from cutfs.codec.audio.pcm import Int16Array
from cutfs.codec.errors import CutfsError, ManifestMismatchError
from cutfs.codec.library import Library
from cutfs.vfs.frames.block_cache import BlockCache, FrameRange, Piece
from cutfs.vfs.frames.decode_pool import DecodeDeadlineError, DecodePool
from cutfs.vfs.stats.statistics import Statistics

#: The most frames decoded ahead of a read, in one pass (98 s at 16 kHz); and no decode
#: longer than a quarter of the block cache, so that what it decodes stays cached.
MAX_READAHEAD_FRAMES = 48 << 15
#: The fewest frames one decode makes, where the cache leaves room (0.5 s at 16 kHz): a
#: tool reading a file in small pieces, or backwards, gets blocks, not a decode per read.
MIN_DECODE_FRAMES = 1 << 13
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
        #: recording -> the ranges being decoded, each with the event set when it is done.
        self._in_flight: dict[int, list[tuple[int, int, trio.Event]]] = {}
        #: recording -> (the frame a decode continuing the last one would start at, how
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

        What the cache lacks is decoded exactly, in one decode from the seek point before
        the first missing frame to the last missing one (see :meth:`_decoded`), which goes
        on past ``end`` up to ``readahead_end`` (at most ``MAX_READAHEAD_FRAMES`` further,
        and not into frames cached or being decoded), filling the cache for the reads that
        follow: a cut is decoded in one pass instead of once per kernel read.
        ``in_order`` says that the read continues the previous read of its file: once
        several decodes of a file read in order continue each other, the store fetches the
        frames after each decode in the background (:data:`SEQUENTIAL_DECODES`).  Frames
        another request is decoding are waited for rather than decoded twice.

        Raises what decoding raises (:class:`cutfs.codec.errors.CorruptDataError`)
        when frames cannot be decoded; the failure is not cached.
        """
        started = time.perf_counter() if self._profile is not None else 0.0
        pieces, gaps = self._cache.lookup(recording_index, first, end)
        self._cache.count(hit=not gaps)
        decoded = bool(gaps)
        if gaps:
            pieces, gaps = await self._after_decodes_under_way(
                recording_index, first, end, pieces, gaps
            )
        if gaps:  # missing, or still missing after the waits (evicted, or that decode failed)
            pieces = await self._decoded(recording_index, pieces, gaps, readahead_end, in_order)
        if self._profile is not None:
            phase = "frames.decoded" if decoded else "frames.cached"
            self._profile.observe(phase, time.perf_counter() - started)
        return self._joined(recording_index, pieces, first, end)

    async def _after_decodes_under_way(
        self,
        recording_index: int,
        first: int,
        end: int,
        pieces: list[Piece],
        gaps: list[FrameRange],
    ) -> tuple[list[Piece], list[FrameRange]]:
        """``pieces`` and ``gaps`` of ``[first, end)`` (see :meth:`BlockCache.lookup`) once
        no decode under way overlaps the gaps: every such decode is waited for, all of
        them within one read deadline, and the cache looked up again after each."""
        with trio.move_on_after(self._pool.deadline_seconds):
            while gaps:
                waiting = self._in_flight_over(recording_index, _hull(gaps))
                if waiting is None:
                    return pieces, gaps
                await waiting.wait()
                pieces, gaps = self._cache.lookup(recording_index, first, end)
            return pieces, gaps
        raise DecodeDeadlineError(
            "waited too long for another request's decode",
            where=self._library.recording_ids[recording_index],
        )

    async def _decoded(
        self,
        recording_index: int,
        pieces: list[Piece],
        gaps: list[FrameRange],
        readahead_end: int,
        in_order: bool,
    ) -> list[Piece]:
        """``pieces`` completed by one decode from the first frame of ``gaps`` to the last
        (and on to ``readahead_end``, see :meth:`_span`).

        Frames cached between the gaps are decoded again: a second decode would cost
        another seek, worker round trip and, over object storage, GET, all dearer than
        decoding a few seconds through (a cold cut is one GET).  The pieces the decode
        covers are dropped (the cache drops their blocks too, see :meth:`BlockCache.put`).
        """
        span_first, span_end = self._span(recording_index, _hull(gaps), readahead_end)
        kept = [piece for piece in pieces if not span_first <= piece[0] < span_end]
        return [*kept, await self._decode(recording_index, span_first, span_end, in_order)]

    def cached_frames(
        self, recording_index: int, first: int, end: int, *, for_read: bool = True
    ) -> Int16Array | None:
        """Frames ``[first, end)`` if all of them are in the cache, else ``None``.

        Never waits: callers take this path first and pay for deadlines and
        decoding only when it misses (and :meth:`frames` counts the miss).  A hit
        counts as one unless ``for_read`` is False (frames pushed ahead of reads).
        """
        pieces, gaps = self._cache.lookup(recording_index, first, end)
        if gaps:
            return None
        if for_read:
            self._cache.count(hit=True)
        return self._joined(recording_index, pieces, first, end)

    def _joined(
        self, recording_index: int, pieces: list[Piece], first: int, end: int
    ) -> Int16Array:
        """Frames ``[first, end)`` from pieces that cover them without overlapping: a view
        of the one piece that holds them all, else the pieces joined.  Raises
        :class:`ManifestMismatchError` where they stop short of ``end`` (the audio ended
        before the length its manifest declares)."""
        parts: list[Int16Array] = []
        position = first
        for start, frames in sorted(pieces, key=_piece_start):
            if start > position or position >= end:
                break
            part = frames[position - start : end - start]
            if len(part):
                parts.append(part)
                position += len(part)
        if position < end:
            raise ManifestMismatchError(
                f"frames [{first}, {end}) were asked for, the audio ends at frame "
                f"{position}, before the length its manifest declares",
                where=self._library.recording_ids[recording_index],
            )
        if not parts:
            shape = self._library.shape(recording_index)
            return np.zeros((0, shape.channels if shape else 1), dtype=np.int16)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _in_flight_over(self, recording_index: int, span: FrameRange) -> trio.Event | None:
        """The event of a decode under way that overlaps ``span``, if any."""
        span_first, span_end = span
        for flight_first, flight_end, done in self._in_flight.get(recording_index, ()):
            if flight_first < span_end and span_first < flight_end:
                return done
        return None

    def _span(self, recording_index: int, needed: FrameRange, readahead_end: int) -> FrameRange:
        """What to decode for the ``needed`` frames: on to ``readahead_end`` (at most
        :data:`MAX_READAHEAD_FRAMES` further, and a quarter of the cache in all), and
        back towards :data:`MIN_DECODE_FRAMES` if it is still shorter; never past the
        recording, nor into frames cached or being decoded."""
        needed_first, needed_end = needed
        shape = self._library.shape(recording_index)
        frame_bytes = 2 * (shape.channels if shape is not None else 1)
        longest = max(self._cache.capacity_bytes // 4 // frame_bytes, MIN_DECODE_FRAMES)
        stop = min(
            readahead_end,
            self._library.frame_limit(recording_index),
            needed_end + MAX_READAHEAD_FRAMES,
            needed_first + longest,
        )
        cached_after = self._cache.next_start(recording_index, needed_end)
        if cached_after is not None:
            stop = min(stop, cached_after)
        start = needed_first - max(MIN_DECODE_FRAMES - (max(stop, needed_end) - needed_first), 0)
        cached_before = self._cache.previous_end(recording_index, needed_first)
        start = max(start, 0, cached_before if cached_before is not None else 0)
        for flight_first, flight_end, _ in self._in_flight.get(recording_index, ()):
            if flight_end > needed_end:
                stop = min(stop, max(flight_first, needed_end))
            if flight_first < needed_first:
                start = max(start, min(flight_end, needed_first))
        return min(start, needed_first), max(stop, needed_end)

    async def _decode(self, recording_index: int, first: int, end: int, in_order: bool) -> Piece:
        """Frames ``[first, end)``, decoded into the cache (fewer where the audio ends
        early); the array returned may be the pool's own, not the copy the cache keeps."""
        flights = self._in_flight.setdefault(recording_index, [])
        flight = (first, end, trio.Event())
        flights.append(flight)
        try:
            ahead = self._frames_ahead(recording_index, first, end, in_order)
            decoded = await self._pool.decode(recording_index, first, end, ahead)
            self._cache.put(recording_index, first, decoded)
            return first, decoded
        finally:
            flights.remove(flight)
            if not flights:
                del self._in_flight[recording_index]
            flight[2].set()

    def _frames_ahead(self, recording_index: int, first: int, end: int, in_order: bool) -> int:
        """How many frames after the decode of ``[first, end)`` to fetch ahead: none unless
        a file of the recording is being read in order (see :data:`SEQUENTIAL_DECODES`),
        then a window that doubles with every decode."""
        expected, streak = self._sequences.get(recording_index, (-1, 0))
        streak = min(streak + 1, _MOST_STREAK) if in_order and first == expected else 0
        self._sequences[recording_index] = (end, streak)
        if streak < SEQUENTIAL_DECODES:
            return 0
        decodes = min(1 << (streak - SEQUENTIAL_DECODES), MOST_DECODES_AHEAD)
        return (end - first) * decodes


def _piece_start(piece: Piece) -> int:
    return piece[0]


def _hull(ranges: list[FrameRange]) -> FrameRange:
    """From the first frame of the first of ``ranges`` (in order) to the end of the last."""
    return ranges[0][0], ranges[-1][1]


def _fresh(error: Exception) -> Exception:
    """A copy of ``error`` for one more caller (one exception object is raised once)."""
    if isinstance(error, CutfsError):
        return type(error)(error.message, where=error.where)
    return CutfsError(f"indexing failed: {error!r}")
