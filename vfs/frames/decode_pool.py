"""Where decoding runs: off the event loop, in worker processes or threads, with a deadline.

Decoding is CPU-bound and holds the GIL in PyAV, so by default it runs in
worker processes, each of which opens the library itself (the memory maps
share the page cache).  Workers also compute the plans of recordings served
in place (:meth:`DecodePool.index`), which can mean decoding a whole
recording: those requests get a longer deadline.  Each worker is its own process with its own
pipe, not a shared executor: when a worker crashes, hangs or is stuck on
storage that stopped answering, only the request it held fails; the worker
is killed and replaced, and every other request goes on.

Every decode has a deadline.  A request not answered in time fails with
:class:`DecodeDeadlineError` (EIO to the reader) instead of leaving the
reader hanging, as a hung NFS server would.

With ``workers=0`` decoding runs in trio worker threads in this process
(tests, small mounts).  A thread stuck on storage cannot be killed: it is
abandoned at the deadline.

With a :class:`~cutfs.vfs.daemon.request_slot.RequestSlot` (``in_turn``) decoding runs
in the caller itself, a serving process that answers one request at a time
(``--decode-in-turn``): no hand-off at all.  The deadline is then the
daemon's to keep, through the slot: it kills a process past it.
"""

from __future__ import annotations

import logging
import math
import mmap
import multiprocessing
import multiprocessing.reduction
import os
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Final, Protocol

import numpy as np
import trio

from cutfs.codec.audio.decoder import DecodeTrace
from cutfs.codec.audio.pcm import Int16Array
from cutfs.codec.audio.recording import Recording
from cutfs.codec.errors import CutfsError, ShardFormatError
from cutfs.codec.library import Library, LibrarySpec
from cutfs.codec.trust.command_runner import announce_groups_to
from cutfs.codec.trust.source_policy import SourcePolicy
from cutfs.vfs.daemon.process_name import name_process
from cutfs.vfs.daemon.request_slot import DEFAULT_READ_TIMEOUT_SECONDS, RequestSlot
from cutfs.vfs.frames.worker_message import (
    MOST_MESSAGE_BYTES,
    Answer,
    BadMessageError,
    CommandStarted,
    Message,
    Ready,
    Reply,
    SharedFrames,
    StartFailed,
    decode,
    encode,
)
from cutfs.vfs.frames.zygote import Zygote
from cutfs.vfs.sandbox.serving_user import ServingUser, drop_privileges, kill_command_group
from cutfs.vfs.stats.statistics import Statistics

log = logging.getLogger("cutfs.decode_pool")

#: How long a decoder worker may take to start (import its modules, open the library)
#: when the read deadline is shorter.
WORKER_START_SECONDS: Final = 60.0
#: Indexing a recording decodes all of it: a 36-hour MP3 takes minutes.
INDEX_DEADLINE_SECONDS = 1800.0

#: ("frames", recording, first, end, frames to fetch ahead) or ("index", recording, 0, 0, 0)
_Request = tuple[str, int, int, int, int]

#: Each worker's shared buffer for decoded PCM (memory is used only as far as replies
#: reach: 98 s of 16 kHz stereo, the longest decode a read asks for, is 6 MB).  Larger
#: replies go through the pipe.
PCM_BUFFER_BYTES: Final = 32 << 20


class DecodeDeadlineError(CutfsError):
    """A decode did not finish within the deadline (stalled storage or a hung worker)."""


class WorkerDiedError(CutfsError):
    """The worker process decoding a request died."""


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    workers: int
    alive: int
    busy: int
    restarts: int


class DecodePool:
    """Decodes frame ranges of the recordings of one library, and indexes them."""

    def __init__(
        self,
        library: Library,
        workers: int,
        deadline_seconds: float = DEFAULT_READ_TIMEOUT_SECONDS,
        statistics: Statistics | None = None,
        profile: bool = False,
        *,
        policy: SourcePolicy | None = None,
        user: ServingUser | None = None,
        in_turn: RequestSlot | None = None,
        zygote: Zygote | None = None,
    ) -> None:
        """``policy`` is what the library was opened with; ``user``, when given, is
        whom the worker processes become before they open it (see
        :mod:`cutfs.vfs.sandbox.serving_user`).  ``in_turn``: decode in the caller, and give
        indexing its longer deadline through this slot (``workers`` must be 0).
        ``zygote``: fork the workers from it instead of spawning them (a caller that
        dropped its privileges, see :mod:`cutfs.vfs.frames.zygote`)."""
        if in_turn is not None and workers:
            raise ValueError("a pool decoding in the caller has no workers")
        self._in_turn = in_turn
        if in_turn is not None:  # a command it starts is killed with this process
            announce_groups_to(in_turn.command_started)
        self._library = library
        self._deadline_seconds = deadline_seconds
        self._statistics = statistics or Statistics()
        self._profile = profile
        self._user = user
        setup = _WorkerSetup(library.spec, library.identity, profile, policy, user)
        self._store_counts: dict[str, int] = {}
        self._workers = [_Worker(setup, zygote) for _ in range(workers)]
        self._idle = list(self._workers)
        self._available = trio.Semaphore(len(self._workers)) if workers else None
        self._threads = trio.CapacityLimiter(2)
        self._restarts = 0
        self._notes: set[str] = set()
        #: Set once the mount stops serving: a worker stopped from then on is not replaced.
        self._retired = False

    @property
    def deadline_seconds(self) -> float:
        return self._deadline_seconds

    def start(self) -> None:
        """Start the worker processes; they open the shards while the caller goes on."""
        for worker in self._workers:
            worker.start()

    def wait_ready(self) -> None:
        """Wait until every worker has opened the shards; raise what one failed with.

        A worker may take :data:`WORKER_START_SECONDS` to start, or the read deadline if
        that is longer: starting is not a read, and a busy node takes seconds to start an
        interpreter (a mount with ``--read-timeout 3`` failed to start under load)."""
        start_seconds = max(self._deadline_seconds, WORKER_START_SECONDS)
        for worker in self._workers:
            worker.wait_ready(start_seconds)

    async def watch(self, interval_seconds: float = 1.0) -> None:
        """Replace idle workers that died (busy ones are seen by their request); runs forever."""
        while True:
            await trio.sleep(interval_seconds)
            for worker in list(self._idle):
                if not worker.alive():
                    self._replace(worker, "died while idle")

    def retire(self) -> None:
        """Replace no worker from now on: the mount stopped serving, and the requests still
        running (indexing in the background) are being cancelled.  A worker they
        interrupt is stopped, not started again only to be killed by :meth:`close`."""
        self._retired = True

    def close(self) -> None:
        for worker in self._workers:
            worker.stop()

    def store_counters(self) -> dict[str, int]:
        """What the store did for every decode so far (requests, bytes, cache hits), summed
        over the workers (or read from the library, when decoding runs in threads)."""
        if not self._workers:
            return self._library.counters()
        return dict(self._store_counts)

    def statistics(self) -> PoolStatistics:
        alive = sum(1 for worker in self._workers if worker.alive())
        busy = len(self._workers) - len(self._idle)
        return PoolStatistics(len(self._workers), alive, busy, self._restarts)

    async def decode(
        self, recording_index: int, first: int, end: int, ahead_frames: int = 0
    ) -> Int16Array:
        """Frames ``[first, end)`` of a recording, as int16 (frames, channels); the store is
        asked for ``ahead_frames`` more in the background (see :meth:`Library.read_frames`).

        Raises :class:`cutfs.codec.errors.CorruptDataError` for undecodable data,
        :class:`DecodeDeadlineError` past the deadline and
        :class:`WorkerDiedError` when the worker dies.
        """
        started = time.perf_counter()
        request = ("frames", recording_index, first, end, ahead_frames)
        frames, trace = await self._run(request, self._deadline_seconds)
        if not isinstance(frames, np.ndarray) or not 0 <= len(frames) <= end - first:
            raise WorkerDiedError(
                f"the decoder worker answered {_describe(request)} with something else",
                where=self._recording_id(request),
            )
        self._statistics.observe("decode", time.perf_counter() - started)
        self._statistics.count("decodes")
        self._statistics.count("frames_fetched_ahead", ahead_frames)
        self._statistics.count("frames_decoded", trace.frames_decoded)
        self._statistics.count("storage_bytes_read", trace.bytes_read)
        for phase, seconds in trace.phase_seconds.items():
            self._statistics.observe(f"phase.{phase}", seconds)
        for note in trace.notes:
            # Each worker notes it once: log it once (a worker's notes are bounded by the
            # recordings that disagree with their manifests; the set, by _MOST_NOTES).
            if note not in self._notes and len(self._notes) < _MOST_NOTES:
                self._notes.add(note)
                self._statistics.count("manifest_mismatches")
                log.warning("%s", note)
        return frames

    async def index(self, recording_index: int) -> Recording:
        """The plan of a recording, computed by a worker (or read from the index cache).

        The caller adopts it into its own library.  Raises what indexing
        raises (:class:`cutfs.codec.errors.SourceError`, ``CorruptDataError``), and
        the pool's own errors past :data:`INDEX_DEADLINE_SECONDS`.
        """
        started = time.perf_counter()
        request = ("index", recording_index, 0, 0, 0)
        deadline = max(self._deadline_seconds, INDEX_DEADLINE_SECONDS)
        recording, trace = await self._run(request, deadline)
        if not isinstance(recording, Recording) or recording.recording_id != self._recording_id(
            request
        ):
            raise WorkerDiedError(
                "the decoder worker answered the indexing with something else",
                where=self._recording_id(request),
            )
        self._statistics.observe("index", time.perf_counter() - started)
        # A plan another serving process computed is read from the index cache: counted
        # apart, so that the figures say how often the media itself was indexed.
        self._statistics.count("plans_loaded" if trace.plans_loaded else "recordings_indexed")
        return recording

    async def _run(self, request: _Request, deadline_seconds: float) -> tuple[Answer, DecodeTrace]:
        if self._in_turn is not None:
            if deadline_seconds > self._deadline_seconds:
                self._in_turn.allow(deadline_seconds)
            return _answer(self._library, request, self._profile)
        if self._available is None:
            return await self._in_thread(request, deadline_seconds)
        return await self._in_worker(request, deadline_seconds)

    async def _in_thread(
        self, request: _Request, deadline_seconds: float
    ) -> tuple[Answer, DecodeTrace]:
        async with self._threads:
            with trio.move_on_after(deadline_seconds):
                return await trio.to_thread.run_sync(
                    _answer, self._library, request, self._profile, abandon_on_cancel=True
                )
        raise DecodeDeadlineError(
            f"{_describe(request)} took longer than {deadline_seconds:g} s "
            "(storage not answering?)",
            where=self._recording_id(request),
        )

    async def _in_worker(
        self, request: _Request, deadline_seconds: float
    ) -> tuple[Answer, DecodeTrace]:
        """Ask a worker; the wait for a free worker counts against the deadline too."""
        assert self._available is not None
        started = trio.current_time()
        with trio.move_on_after(deadline_seconds) as waiting:
            await self._available.acquire()
        if waiting.cancelled_caught:
            raise DecodeDeadlineError(
                f"{_describe(request)}: no decoder worker was free within "
                f"{deadline_seconds:g} s (all busy)",
                where=self._recording_id(request),
            )
        deadline_seconds -= trio.current_time() - started
        try:
            worker = self._idle.pop()
            try:
                if not worker.alive():
                    self._replace(worker, "was found dead")
                return await self._ask(worker, request, deadline_seconds)
            except CutfsError:
                raise
            except BaseException:
                # Cancelled or broken mid-request: the worker's state is unknown.
                self._replace(worker, "was interrupted")
                raise
            finally:
                self._idle.append(worker)
        finally:
            self._available.release()

    async def _ask(
        self, worker: _Worker, request: _Request, deadline_seconds: float
    ) -> tuple[Answer, DecodeTrace]:
        where = self._recording_id(request)
        frames = _describe(request)
        try:
            worker.connection().send(request)
        except OSError:
            # A replacement that could not open the library says why, then ends.
            words = self._replace(worker, "could not be reached")
            raise words or WorkerDiedError("the decoder worker died", where=where) from None
        with trio.move_on_after(deadline_seconds):
            while True:
                await trio.lowlevel.wait_readable(worker.connection().fileno())
                try:
                    reply = worker.receive()
                except (EOFError, OSError):
                    self._replace(worker, f"died {frames}")
                    raise WorkerDiedError(
                        f"the decoder worker died {frames}", where=where
                    ) from None
                except BadMessageError as exc:
                    self._replace(worker, f"sent what is not a message {frames} ({exc})")
                    raise WorkerDiedError(
                        f"the decoder worker failed {frames}", where=where
                    ) from None
                if isinstance(reply, Ready):
                    continue  # a replacement worker announcing itself
                if isinstance(reply, CommandStarted):
                    worker.command_groups.add(reply.group)  # killed with the worker
                    continue
                if isinstance(reply, StartFailed):
                    raise reply.error  # a replacement worker that could not open the library
                worker.command_groups.clear()  # the worker reaped them
                self._add_store_counts(reply.store_grown)
                if isinstance(reply.result, CutfsError):
                    raise reply.result
                answer, trace = reply.result
                if isinstance(answer, SharedFrames):
                    return worker.shared_frames(answer), trace
                return answer, trace
        self._replace(worker, f"missed the {deadline_seconds:g} s deadline")
        raise DecodeDeadlineError(
            f"{frames} took longer than {deadline_seconds:g} s (storage not answering?)",
            where=where,
        )

    def _add_store_counts(self, grown: dict[str, int]) -> None:
        """Add what a worker's store counted; a name beyond the first
        :data:`_MOST_STORE_COUNTERS` is left out (a store has a handful)."""
        for name, count in grown.items():
            if name in self._store_counts or len(self._store_counts) < _MOST_STORE_COUNTERS:
                self._store_counts[name] = self._store_counts.get(name, 0) + count

    def _replace(self, worker: _Worker, reason: str) -> CutfsError | None:
        """Stop ``worker`` and start another in its place; returns what the stopped one
        said before it ended, if it said why (it could not open the library)."""
        words = worker.last_words()
        because = f" ({words})" if words is not None else ""
        if self._retired:
            log.info("decoder worker %s %s as the mount stopped%s", worker.pid, reason, because)
            worker.stop()
            return words
        log.warning("decoder worker %s %s: replacing it%s", worker.pid, reason, because)
        self._restarts += 1
        worker.stop()
        worker.start()
        return words

    def _recording_id(self, request: _Request) -> str:
        return self._library.recording_ids[request[1]]


#: The most manifest mismatches the pool remembers having logged.
_MOST_NOTES: Final = 10_000
#: The most store counters the pool sums over its workers.
_MOST_STORE_COUNTERS: Final = 64
#: The most messages a stopped worker's pipe is read for its last words (a worker that
#: sent more than a few unread messages is not saying why it ended).
_MOST_LAST_MESSAGES: Final = 4


@dataclass(frozen=True, slots=True)
class _WorkerSetup:
    """What a worker process needs to open the library (pickled to it)."""

    library: LibrarySpec
    #: The daemon's :attr:`Library.identity`: a worker opening something else refuses.
    identity: str
    profile: bool
    policy: SourcePolicy | None
    user: ServingUser | None


class _WorkerProcess(Protocol):
    """A decoder process: a child spawned by ``multiprocessing``, or forked by a zygote."""

    @property
    def pid(self) -> int | None: ...

    def is_alive(self) -> bool: ...

    def kill(self) -> None: ...

    def release(self) -> bool:
        """Free what is kept of the process once it has ended; whether it has."""
        ...


class _SpawnedProcess:
    """A decoder process this process spawned (and reaps)."""

    def __init__(self, process: BaseProcess) -> None:
        self._process = process

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def is_alive(self) -> bool:
        return self._process.is_alive()

    def kill(self) -> None:
        self._process.kill()

    def release(self) -> bool:
        self._process.join(timeout=0)
        if self._process.exitcode is None:
            return False
        self._process.close()
        return True


class _Worker:
    """One decoder process and the parent's end of its pipe."""

    def __init__(self, setup: _WorkerSetup, zygote: Zygote | None) -> None:
        self._setup = setup
        self._zygote = zygote
        #: Process groups of the commands the current request started.
        self.command_groups: set[int] = set()
        self._process: _WorkerProcess | None = None
        self._connection: Connection | None = None
        self._exited: list[_WorkerProcess] = []
        #: The PCM buffer shared with the current process (a memfd, mapped on both sides).
        self._pcm: mmap.mmap | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def connection(self) -> Connection:
        if self._connection is None:
            raise OSError("the worker is not running")
        return self._connection

    def start(self) -> None:
        if self._zygote is not None:
            parent_end, forked = self._zygote.fork(_worker_main, (self._setup,))
            self._process = forked
        else:
            context = multiprocessing.get_context("spawn")
            parent_end, child_end = context.Pipe()
            spawned = context.Process(
                target=_worker_main,
                args=(child_end, self._setup),
                daemon=True,
                name="cutfs-decoder",
            )
            spawned.start()
            child_end.close()
            self._process = _SpawnedProcess(spawned)
        self._connection = parent_end
        # The buffer goes to the worker as a descriptor over the pipe (a socket pair):
        # no name in a file system, nothing to clean up, and it works whoever the worker
        # becomes.
        descriptor = os.memfd_create("cutfs-pcm", os.MFD_CLOEXEC)
        try:
            os.ftruncate(descriptor, PCM_BUFFER_BYTES)
            self._pcm = mmap.mmap(descriptor, PCM_BUFFER_BYTES)
            multiprocessing.reduction.send_handle(parent_end, descriptor, self._process.pid)
        finally:
            os.close(descriptor)

    def receive(self) -> Message:
        """The worker's next message, checked (see :mod:`cutfs.vfs.frames.worker_message`).

        Raises EOFError or OSError when the worker is gone (or sent more than a message
        may hold) and :class:`BadMessageError` when what it sent is not a message."""
        return decode(self.connection().recv_bytes(MOST_MESSAGE_BYTES))

    def shared_frames(self, reply: SharedFrames) -> Int16Array:
        """The frames a reply left in the shared buffer, copied out (the buffer is the
        worker's again for its next request)."""
        count = math.prod(reply.shape)  # numpy's prod costs microseconds on a tuple
        if self._pcm is None or not 0 <= count * 2 <= len(self._pcm):
            raise WorkerDiedError("a decoder worker replied with frames it cannot have")
        shared = np.frombuffer(self._pcm, dtype=np.int16, count=count).reshape(reply.shape)
        frames: Int16Array = shared.copy()
        return frames

    def wait_ready(self, timeout_seconds: float) -> None:
        connection = self.connection()
        if not connection.poll(timeout_seconds):
            raise CutfsError("a decoder worker did not start", where=self._setup.library.where)
        try:
            ready = self.receive()
        except (EOFError, OSError, BadMessageError) as exc:
            raise CutfsError(
                f"a decoder worker failed as it started ({exc or type(exc).__name__})",
                where=self._setup.library.where,
            ) from None
        if isinstance(ready, StartFailed):
            raise ready.error

    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def last_words(self) -> CutfsError | None:
        """The error a worker sent before it ended and nobody read (why it could not open
        the library), if there is one; never waits."""
        try:
            for _ in range(_MOST_LAST_MESSAGES):
                if self._connection is None or not self._connection.poll(0):
                    return None
                message = self.receive()
                if isinstance(message, StartFailed):
                    return message.error
        except (EOFError, OSError, BadMessageError):
            pass
        return None

    def stop(self) -> None:
        """Kill the process without waiting for it.

        A process stuck in the kernel (on storage that stopped answering) dies
        when the kernel lets go of it; it is reaped on a later stop.
        """
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        process = self._process
        if process is not None and process.is_alive():
            process.kill()
        for group in self.command_groups:  # they would outlive the worker
            kill_command_group(self._setup.user, group)
        self.command_groups.clear()
        if self._process is not None:
            self._exited.append(self._process)
            self._process = None
        if self._pcm is not None:
            self._pcm.close()
            self._pcm = None
        for process in list(self._exited):
            if process.release():
                self._exited.remove(process)


def _describe(request: _Request) -> str:
    kind, _, first, end, _ = request
    return "indexing the recording" if kind == "index" else f"decoding frames [{first}, {end})"


def _answer(library: Library, request: _Request, profile: bool) -> tuple[Answer, DecodeTrace]:
    kind, recording_index, first, end, ahead_frames = request
    trace = DecodeTrace(profile=profile)
    if kind == "index":
        return library.index(recording_index, trace), trace
    frames = library.read_frames(recording_index, first, end, trace, ahead_frames=ahead_frames)
    return frames, trace


def _worker_main(connection: Connection, setup: _WorkerSetup) -> None:
    """A decoder process: open the library, then answer requests until the pipe closes.

    The first message says whether the library opened (ready, or the error).
    Decoding errors are sent back as exceptions; anything else ends the process,
    which the pool sees as a dead worker.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the daemon decides when workers stop
    name_process("cutfs-decoder")
    profile = setup.profile
    descriptor = multiprocessing.reduction.recv_handle(connection)
    pcm = mmap.mmap(descriptor, PCM_BUFFER_BYTES)
    os.close(descriptor)
    try:
        drop_privileges(setup.user)
        library = setup.library.open(setup.policy)  # recordings only: no cuts
        if library.identity != setup.identity:
            raise ShardFormatError(
                "the directory changed since it was mounted (another one put in its place?): "
                "a worker refuses to serve it; remount to serve the new one",
                where=setup.library.where,
            )
        announce_groups_to(lambda group: connection.send_bytes(encode(CommandStarted(group))))
    except OSError as exc:
        error = CutfsError(f"cannot become the serving user: {exc}")
        connection.send_bytes(encode(StartFailed(error)))
        return
    except CutfsError as exc:
        connection.send_bytes(encode(StartFailed(exc)))
        return
    connection.send_bytes(encode(Ready()))
    reported = library.counters()
    while True:
        try:
            request = connection.recv()
        except (EOFError, OSError):
            return
        result: tuple[Answer, DecodeTrace] | CutfsError
        try:
            result = _shared(_answer(library, request, profile), pcm)
        except CutfsError as exc:
            result = exc
        counts = library.counters()
        grown = {name: value - reported.get(name, 0) for name, value in counts.items()}
        reported = counts
        connection.send_bytes(encode(Reply(result, grown)))


def _shared(reply: tuple[Answer, DecodeTrace], pcm: mmap.mmap) -> tuple[Answer, DecodeTrace]:
    """A reply whose frames fit the shared buffer, with the frames written there: only
    their shape goes through the pipe, so the daemon's event loop never waits on a large
    message (a pipe carries 64 KiB at a time)."""
    frames, trace = reply
    if not isinstance(frames, np.ndarray) or frames.dtype != np.int16 or frames.nbytes > len(pcm):
        return reply
    shared = np.frombuffer(pcm, dtype=np.int16, count=frames.size).reshape(frames.shape)
    shared[...] = frames
    return SharedFrames((frames.shape[0], frames.shape[1])), trace
