"""Extra processes serving one mount (``cutfs mount --serving-processes N``).

The daemon mounts through pyfuse3 but does not run its loop: it answers the
kernel's INIT itself, then starts ``N - 1`` serving processes, handing each a
clone of its ``/dev/fuse`` descriptor.  Each opens the same
source, builds its own :class:`~cutfs.vfs.daemon.serving_stack.ServingStack` (its
share of the decoder workers and of the block cache) and answers requests
through a :class:`~cutfs.vfs.fuse.device_channel.DeviceChannel`, as the daemon
does on a clone of its own.  The kernel gives each request to whichever
process reads it first, so one mountpoint is served by N event loops.

Faults: a serving process that dies fails only the requests it was
answering (the kernel ends them with ``ECONNABORTED`` when its descriptor
closes) and is started again, unless it died before it served (a fault of
its set-up, which would only repeat: the others go on serving).

With ``--decode-in-turn`` the processes decode what they serve, one request
at a time, and the daemon serves nothing after INIT: it keeps a copy of each
process's descriptor and a :class:`~cutfs.vfs.daemon.request_slot.RequestSlot`, kills
a process past its request's deadline and answers that request ``EIO``, as it
does the request of a process that died (see :meth:`ServingProcesses.supervise`).  The
daemon stops the processes when it unmounts; a process whose mount goes
away stops by itself, and one whose daemon dies is ended by the kernel.

Files are immutable and handles are inode numbers, so any process can
answer any request.  The little state there is lives in a private
directory the processes share: the table of time ranges made on lookup
(:class:`~cutfs.vfs.tree.span_table.SharedSpanTable`), the snapshot each open of
``.cutfs/stats`` reads (:class:`~cutfs.vfs.tree.snapshot_store.SnapshotStore`),
and the statistics, which each process counts for itself and publishes
every second for the others to add up (:mod:`cutfs.vfs.stats.statistics_board`).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import multiprocessing
import os
import select
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from multiprocessing import reduction
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Final

import trio

from cutfs.codec.catalogue.mapped_table import release_mapped_pages
from cutfs.codec.opener import open_source
from cutfs.codec.trust.source_policy import SourcePolicy
from cutfs.vfs.daemon.doorbell import Doorbell
from cutfs.vfs.daemon.log_channel import LogChannel, handler
from cutfs.vfs.daemon.request_slot import RequestSlot
from cutfs.vfs.daemon.serving_stack import ProcessShare, ServingStack
from cutfs.vfs.daemon.serving_user import ServingUser, acting_as, as_root, kill_command_group
from cutfs.vfs.fuse.device_channel import DeviceChannel, clone_device, write_reply
from cutfs.vfs.stats.statistics import Statistics
from cutfs.vfs.stats.statistics_board import StatisticsBoard

if TYPE_CHECKING:
    from cutfs.vfs.daemon.mount_options import MountOptions

log = logging.getLogger("cutfs.serving_process")

#: How often the daemon checks that its serving processes are alive.
_WATCH_SECONDS: Final = 1.0
#: What a serving process says when it serves: the one message it sends the daemon,
#: plain bytes (the daemon unpickles nothing a serving process sends).
_READY: Final = b"ready"
_MOST_READY_BYTES: Final = 16
#: How many times in a row a process decoding in turn may die before it serves.
_TRIES_BEFORE_SERVING: Final = 3
#: The longest a serving process may go without running (while it holds no request).
_MOST_SILENT_SECONDS: Final = 10.0


@dataclass(frozen=True)
class ServingSetup:
    """What a serving process needs to open the same mount (pickled to it)."""

    source: str
    mountpoint: str
    options: MountOptions
    cache_dir: str
    policy: SourcePolicy | None
    user: ServingUser | None
    #: The daemon's library identity: a process that opens something else refuses.
    identity: str
    processes: int
    #: What the processes share: the time-range table, statistics and snapshots (see
    #: :func:`shared_spans_path`, :func:`shared_board_path`, :func:`shared_snapshots_path`).
    shared_dir: str
    log_level: int = logging.INFO


def shared_spans_path(shared_dir: str) -> str:
    """The time-range table the serving processes of a mount share."""
    return os.path.join(shared_dir, "time-ranges")


def shared_board_path(shared_dir: str) -> str:
    """Where the serving processes of a mount publish their statistics."""
    return os.path.join(shared_dir, "statistics")


def shared_snapshots_path(shared_dir: str) -> str:
    """Where the serving processes of a mount keep the snapshots of ``.cutfs/stats``."""
    return os.path.join(shared_dir, "snapshots")


def mount_device_fd() -> int:
    """This process's descriptor of /dev/fuse (pyfuse3 does not expose its session's)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "/dev/fuse":
                found.append(int(name))
        except OSError:
            continue
    if len(found) != 1:
        raise OSError(f"expected one /dev/fuse descriptor in the daemon, found {len(found)}")
    return found[0]


class _Server:
    """One extra serving process, seen from the daemon."""

    def __init__(self, index: int, setup: ServingSetup) -> None:
        self.index = index
        self._setup = setup
        self.process: BaseProcess | None = None
        self.started = 0.0
        self._connection: Connection | None = None
        self._ready = False
        #: In turn (``--decode-in-turn``): the process's descriptor, kept to answer its
        #: request if it dies or is killed, and the slot saying which request that is.
        self._device: int | None = None
        self._slot: RequestSlot | None = None
        #: A request seen past its deadline at the last check (acted on at the second).
        self._overdue: int | None = None
        #: Whether the process was seen silent at the last check (acted on at the second).
        self._silent = False
        #: How many times in a row the process died before it said it serves.
        self.deaths_before_serving = 0
        #: Processes killed and not reaped yet.
        self._exited: list[BaseProcess] = []

    def start(self, mount_fd: int, log_writer: socket.socket) -> None:
        self._reap()
        context = multiprocessing.get_context("spawn")
        parent_end, child_end = context.Pipe()
        in_turn = self._setup.options.decode_in_turn
        clone = clone_device(mount_fd)
        slot: RequestSlot | None = None
        try:
            slot = RequestSlot.create() if in_turn else None
            self.process = context.Process(
                target=_serving_main,
                args=(child_end, self._setup, self.index, log_writer),
                daemon=False,  # it starts decoder workers; it dies with the daemon instead
                name=f"cutfs-serving-{self.index}",
            )
            self.process.start()
            child_end.close()
            reduction.send_handle(parent_end, clone, self.process.pid)
            if slot is not None:
                reduction.send_handle(parent_end, slot.descriptor, self.process.pid)
        except BaseException:
            os.close(clone)
            if slot is not None:
                slot.close()
            raise
        if slot is None:
            os.close(clone)  # the child has its own copy
        else:
            self._device, self._slot = clone, slot
        self.started = time.monotonic()
        self._connection = parent_end
        self._ready = False
        self._overdue = None
        self._silent = False

    def silent(self, seconds: float) -> float | None:
        """How long this process has not run, if it holds no request and has not beaten
        for more than ``seconds``, seen so at this check and the one before; None else."""
        if self._slot is None or self._slot.current() is not None:
            self._silent = False
            return None
        silent_seconds = self._slot.silent_seconds()
        seen_before, self._silent = self._silent, silent_seconds > seconds
        return silent_seconds if seen_before and self._silent else None

    def overdue(self) -> tuple[int, int] | None:
        """The request (unique number, inode) this process has answered past its deadline,
        seen so at this check and the one before; None if there is none."""
        current = self._slot.current() if self._slot is not None else None
        if current is None or time.monotonic() < current[2]:
            self._overdue = None
            return None
        unique, inode, _ = current
        seen_before, self._overdue = self._overdue == unique, unique
        return (unique, inode) if seen_before else None

    def fail_current(self) -> tuple[int, int] | None:
        """Answer ``EIO`` to the request a dead process was answering, if any (its
        descriptor is then closed: the kernel ends what else it had read); the request's
        unique number and inode, or None."""
        current = self._slot.current() if self._slot is not None else None
        if self._slot is not None:
            kill_command_group(self._setup.user, self._slot.command_group())
        if self._device is not None:
            if current is not None:
                write_reply(self._device, current[0], -errno.EIO, [])
            os.close(self._device)
            self._device = None
        if self._slot is not None:
            self._slot.close()
            self._slot = None
        return None if current is None else (current[0], current[1])

    def ready(self) -> bool:
        """Whether the process has said it serves, since it was last started (no waiting)."""
        try:
            while self._connection is not None and self._connection.poll():
                self._ready |= self._connection.recv_bytes(_MOST_READY_BYTES) == _READY
        except (EOFError, OSError):
            pass
        return self._ready

    def stop(self, wait: bool = True) -> None:
        """End the process: asked to (SIGTERM) and waited for a few seconds, killed if
        it does not end; with ``wait`` False, killed at once and reaped later (one stuck
        in the kernel on storage ends only when the kernel lets go of it)."""
        process = self.process
        if process is None:
            return
        if process.is_alive() and wait:
            process.terminate()
            process.join(5)
        if process.is_alive():
            process.kill()
            if wait:
                process.join(5)
        self._exited.append(process)
        self._reap()
        if self._connection is not None:
            self._connection.close()
        self._connection = None
        self.process = None
        self.fail_current()

    def _reap(self) -> None:
        for process in list(self._exited):
            if process.exitcode is not None:
                process.close()
                self._exited.remove(process)


class ServingProcesses:
    """The daemon's extra serving processes: started after INIT, watched, stopped."""

    def __init__(self, setup: ServingSetup, statistics: Statistics | None = None) -> None:
        """``statistics``: where the daemon counts the requests it failed for processes
        that decode in turn (missed deadlines, deaths)."""
        self._setup = setup
        self._servers = [_Server(index, setup) for index in range(1, setup.processes)]
        self._mount_fd: int | None = None
        self._statistics = statistics or Statistics()
        self.restarts = 0
        # The processes log through the daemon's handlers (syslog, a file, the journal).
        self._log_channel = LogChannel()

    @property
    def in_turn(self) -> bool:
        """Whether the processes decode in turn (the daemon then supervises them with
        :meth:`supervise` instead of :meth:`watch`, and serves nothing itself)."""
        return self._setup.options.decode_in_turn

    def start(self, mount_fd: int) -> None:
        """Start every process with a clone of ``mount_fd``; call once the kernel's INIT
        exchange is over (a clone could otherwise read the INIT request)."""
        self._mount_fd = mount_fd
        self._log_channel.start()
        for server in self._servers:
            server.start(self._mount_fd, self._log_channel.writer)
        log.info("started %d serving processes besides the daemon", len(self._servers))

    async def wait_ready(self, seconds: float) -> None:
        """Wait until every process serves, for at most ``seconds`` (then go on: the
        ones that serve answer, and the rest are watched as usual)."""
        with trio.move_on_after(seconds):
            while not all(server.ready() for server in self._servers):
                await trio.sleep(0.02)
            return
        log.warning("not every serving process was ready within %g s", seconds)

    def describe(self) -> dict[str, object]:
        return {
            "processes": self._setup.processes,
            "running": 1 + sum(1 for s in self._servers if s.process and s.process.is_alive()),
            "ready": 1
            + sum(1 for s in self._servers if s.ready() and s.process and s.process.is_alive()),
            "restarts": self.restarts,
            "pids": [os.getpid()] + [s.process.pid for s in self._servers if s.process],
        }

    async def watch(self) -> None:
        """Restart a process that died, unless it died young (it would only die again)."""
        while True:
            await trio.sleep(_WATCH_SECONDS)
            self._check()

    async def supervise(self, mount_fd: int) -> bool:
        """Watch processes that decode in turn until the mount goes away (True) or none is
        left to serve (False: every one died before it served).

        They are watched four times as often as :meth:`watch` does: one past its
        request's deadline is killed, and the request of one that died or was killed is
        answered ``EIO``.  The daemon serves nothing itself meanwhile, so it learns of
        the unmount from its own descriptor, which then polls as an error.
        """
        device = select.poll()
        device.register(mount_fd, 0)  # only errors: requests are the processes' to take
        while True:
            await trio.sleep(_WATCH_SECONDS / 4)
            if any(events & select.POLLERR for _, events in device.poll(0)):
                return True
            self._check()
            if not any(server.process is not None for server in self._servers):
                return False

    def _check(self) -> None:
        for server in self._servers:
            process = server.process
            if process is None or self._mount_fd is None:
                continue
            if process.is_alive() and not self._killed_overdue(server, process):
                continue
            failed = server.fail_current()
            if failed is not None:
                self._statistics.error("worker_died")
                log.error(
                    "serving process %d died answering a request about inode %d: "
                    "that request fails with EIO",
                    server.index,
                    failed[1],
                )
            served = server.ready()  # before stop(): it reads the process's last words
            log.error(
                "serving process %d (pid %s) %s after %.0f s",
                server.index,
                process.pid,
                "was killed"
                if process.exitcode is None
                else f"exited with status {process.exitcode}",
                time.monotonic() - server.started,
            )
            server.stop(wait=False)  # dead or killed: the watch must not wait on it
            server.deaths_before_serving = 0 if served else server.deaths_before_serving + 1
            # A process that died before it served would likely only die again; in turn,
            # the daemon serves nothing itself, so it is tried a few times first.
            tries = _TRIES_BEFORE_SERVING if self.in_turn else 1
            if server.deaths_before_serving >= tries:
                log.error(
                    "serving process %d is not started again: it died before serving",
                    server.index,
                )
                continue
            self.restarts += 1
            # As at mount: a daemon acting as its user starts processes as root (they
            # clone the device and open what the user may not), and they drop by
            # themselves.  Only for the call: the daemon's other tasks go on as the user.
            with as_root(self._setup.user if os.geteuid() != 0 else None):
                server.start(self._mount_fd, self._log_channel.writer)

    def _killed_overdue(self, server: _Server, process: BaseProcess) -> bool:
        """Kill ``process`` if it is past its request's deadline, or has not run for as
        long while it holds none (stopped by its user, hung); whether it was."""
        overdue = server.overdue()
        if overdue is None:
            return self._killed_silent(server, process)
        log.error(
            "serving process %d (pid %s) answered a request about inode %d for longer than "
            "its deadline (storage not answering?): killing it; the request fails with EIO",
            server.index,
            process.pid,
            overdue[1],
        )
        process.kill()  # it runs no more code: its request can be answered now
        failed = server.fail_current()
        if failed is not None and failed[0] == overdue[0]:
            self._statistics.error("deadline")
        elif failed is not None:  # it had just gone on to another, which fails with it
            self._statistics.error("worker_died")
        return True

    def _killed_silent(self, server: _Server, process: BaseProcess) -> bool:
        """Kill ``process`` if it has not run for :func:`_silence_limit` while it holds no
        request: requests wait in the kernel for a process to read them, so one stopped
        (by the source's owner, whom it runs as) must be replaced, not waited for."""
        silent = server.silent(_silence_limit(self._setup.options.read_timeout_seconds))
        if silent is None:
            return False
        log.error(
            "serving process %d (pid %s) has not run for %.1f s (stopped or hung): killing "
            "it; another takes its place",
            server.index,
            process.pid,
            silent,
        )
        process.kill()
        return True

    def close(self) -> None:
        for server in self._servers:
            server.stop()
        self._log_channel.stop()


def _silence_limit(read_timeout_seconds: float) -> float:
    """How long a serving process may go without running before it is replaced: the read
    timeout, at most 10 s (its loop beats about every second when idle)."""
    return min(read_timeout_seconds, _MOST_SILENT_SECONDS)


def _serving_main(
    connection: Connection, setup: ServingSetup, index: int, log_writer: socket.socket
) -> None:
    """A serving process: open the source, build the stack, answer requests until unmount."""
    logging.basicConfig(level=setup.log_level, handlers=[handler(log_writer)], force=True)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent()
    device = reduction.recv_handle(connection)
    slot = (
        RequestSlot.open(reduction.recv_handle(connection))
        if setup.options.decode_in_turn
        else None
    )
    try:
        _serve_clone(connection, setup, index, device, slot)
    except SystemExit:
        raise
    except BaseException:
        # The daemon's log says why (the traceback would only reach this process's stderr).
        log.exception("serving process %d failed", index)
        raise SystemExit(1) from None


def _serve_clone(
    connection: Connection,
    setup: ServingSetup,
    index: int,
    device: int,
    slot: RequestSlot | None,
) -> None:
    options = setup.options
    with ExitStack() as stack:
        with acting_as(setup.user):
            library = open_source(
                setup.source,
                setup.cache_dir,
                setup.policy,
                disk_cache_bytes=options.disk_cache_bytes,
                deadline_seconds=options.read_timeout_seconds * 0.8,
            )
        stack.callback(library.close)
        if library.identity != setup.identity:
            log.error("%s changed since the daemon opened it: not serving", setup.source)
            raise SystemExit(3)
        serving = ServingStack.open(
            stack,
            library,
            setup.mountpoint,
            options,
            ProcessShare.of(options, setup.processes),
            policy=setup.policy,
            user=setup.user,
            kernel={},
            board=StatisticsBoard(shared_board_path(setup.shared_dir), index, setup.processes),
            shared_spans=shared_spans_path(setup.shared_dir),
            snapshot_dir=shared_snapshots_path(setup.shared_dir),
            in_turn=slot,
        )
        serving.pool.wait_ready()
        channel = DeviceChannel(device, serving.operations, setup.mountpoint)
        if slot is not None:
            # It decodes what it serves, so it keeps no id of root: the daemon unmounts.
            if setup.user is not None:
                setup.user.become()
            connection.send_bytes(_READY)
            trio.run(_serve_in_turn, channel, serving, slot, options.read_timeout_seconds)
        else:
            connection.send_bytes(_READY)
            with acting_as(setup.user):
                trio.run(_serve, channel, serving)
        log.info("the mount went away: serving process %d stops", index)


async def _serve(channel: DeviceChannel, serving: ServingStack) -> None:
    with serving_doorbell(serving) as doorbell:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serving.pool.watch)
            nursery.start_soon(release_catalogue_pages)
            nursery.start_soon(publish_statistics, serving, doorbell)
            await channel.serve()
            serving.pool.retire()
            nursery.cancel_scope.cancel()


async def _serve_in_turn(
    channel: DeviceChannel, serving: ServingStack, slot: RequestSlot, deadline_seconds: float
) -> None:
    with serving_doorbell(serving) as doorbell:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(release_catalogue_pages)
            # Started, not just spawned: the loop below yields to trio about once a second,
            # and the first figures must be there for the others before the first request.
            await nursery.start(publish_statistics, serving, None)  # the channel answers rings
            await channel.serve_in_turn(slot, deadline_seconds, doorbell)
            nursery.cancel_scope.cancel()


@contextmanager
def serving_doorbell(serving: ServingStack) -> Iterator[Doorbell | None]:
    """This process's doorbell for the time it serves (None if it cannot have one: then
    the others show its figures as it last published them)."""
    try:
        doorbell = serving.open_doorbell()
    except OSError as exc:
        log.warning("no doorbell for fresh statistics: %s", exc)
        doorbell = None
    try:
        yield doorbell
    finally:
        if doorbell is not None:
            doorbell.close()


#: How often each serving process publishes its statistics for the others.
_PUBLISH_SECONDS: Final = 1.0


async def publish_statistics(
    serving: ServingStack,
    doorbell: Doorbell | None,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Publish this process's statistics every second (a few KiB written and renamed),
    and whenever its doorbell rings; started once the first figures are published."""
    _publish(serving)
    task_status.started()
    while True:
        with trio.move_on_after(_PUBLISH_SECONDS):
            while doorbell is not None:
                await trio.lowlevel.wait_readable(doorbell.fileno())
                doorbell.answer()
            await trio.sleep_forever()
        _publish(serving)


def _publish(serving: ServingStack) -> None:
    try:
        serving.publish()
    except Exception:  # statistics must never take the mount down
        log.exception("cannot publish the statistics of this process")


#: How often the catalogue's mapped pages are dropped from a process's page tables.
_RELEASE_PAGES_SECONDS: Final = 10.0


async def release_catalogue_pages() -> None:
    """Every 10 s, release the catalogue pages this process mapped (see
    :func:`cutfs.codec.catalogue.mapped_table.release_mapped_pages`): its memory then stays what it
    holds, not what a scan of millions of rows once touched."""
    while True:
        await trio.sleep(_RELEASE_PAGES_SECONDS)
        release_mapped_pages()


_PR_SET_PDEATHSIG: Final = 1


def _die_with_parent() -> None:
    """Have the kernel end this process when the daemon ends, however it ends: a mount
    whose daemon was killed must not go on being served by half of its processes."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        log.warning("cannot tie this process to the daemon: %s", os.strerror(ctypes.get_errno()))
    if os.getppid() == 1:  # the daemon died before the call
        raise SystemExit(1)
