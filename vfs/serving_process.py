"""Extra processes serving one mount (``cutfs mount --serving-processes N``).

The daemon mounts through pyfuse3 but does not run its loop: it answers the
kernel's INIT itself, then starts ``N - 1`` serving processes, handing each a
clone of its ``/dev/fuse`` descriptor.  Each opens the same
source, builds its own :class:`~cutfs.vfs.serving_stack.ServingStack` (its
share of the decoder workers and of the block cache) and answers requests
through a :class:`~cutfs.vfs.device_channel.DeviceChannel`, as the daemon
does on a clone of its own.  The kernel gives each request to whichever
process reads it first, so one mountpoint is served by N event loops.

Faults: a serving process that dies fails only the requests it was
answering (the kernel ends them with ``ECONNABORTED`` when its descriptor
closes) and is started again, unless it died before it served (a fault of
its set-up, which would only repeat: the others go on serving).  The
daemon stops the processes when it unmounts; a process whose mount goes
away stops by itself, and one whose daemon dies is ended by the kernel.

Files are immutable and handles are inode numbers, so any process can
answer any request.  The little state there is lives in a private
directory the processes share: the table of time ranges made on lookup
(:class:`~cutfs.vfs.span_table.SharedSpanTable`), the snapshot each open of
``.cutfs/stats`` reads (:class:`~cutfs.vfs.snapshot_store.SnapshotStore`),
and the statistics, which each process counts for itself and publishes
every second for the others to add up (:mod:`cutfs.vfs.statistics_board`).
"""

from __future__ import annotations

import ctypes
import logging
import logging.handlers
import multiprocessing
import os
import signal
import time
from contextlib import ExitStack
from dataclasses import dataclass
from multiprocessing import reduction
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from typing import TYPE_CHECKING, Final

import trio

from cutfs.codec.mapped_table import release_mapped_pages
from cutfs.codec.source_policy import SourcePolicy
from cutfs.vfs.device_channel import DeviceChannel, clone_device
from cutfs.vfs.serving_stack import ProcessShare, ServingStack
from cutfs.vfs.serving_user import ServingUser, acting_as
from cutfs.vfs.statistics_board import StatisticsBoard

if TYPE_CHECKING:
    from cutfs.vfs.mount import MountOptions

log = logging.getLogger("cutfs.serving_process")

#: How often the daemon checks that its serving processes are alive.
_WATCH_SECONDS: Final = 1.0


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

    def start(self, mount_fd: int, log_queue: Queue[logging.LogRecord]) -> None:
        context = multiprocessing.get_context("spawn")
        parent_end, child_end = context.Pipe()
        clone = clone_device(mount_fd)
        try:
            self.process = context.Process(
                target=_serving_main,
                args=(child_end, self._setup, self.index, log_queue),
                daemon=False,  # it starts decoder workers; it dies with the daemon instead
                name=f"cutfs-serving-{self.index}",
            )
            self.process.start()
            child_end.close()
            reduction.send_handle(parent_end, clone, self.process.pid)
        finally:
            os.close(clone)  # the child has its own copy
        self.started = time.monotonic()
        self._connection = parent_end
        self._ready = False

    def ready(self) -> bool:
        """Whether the process has said it serves, since it was last started (no waiting)."""
        try:
            while self._connection is not None and self._connection.poll():
                self._ready |= self._connection.recv() == "ready"
        except (EOFError, OSError):
            pass
        return self._ready

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
            if self.process.is_alive():
                self.process.kill()
                self.process.join(5)
        if self._connection is not None:
            self._connection.close()
        self._connection = None
        self.process = None


class ServingProcesses:
    """The daemon's extra serving processes: started after INIT, watched, stopped."""

    def __init__(self, setup: ServingSetup) -> None:
        self._setup = setup
        self._servers = [_Server(index, setup) for index in range(1, setup.processes)]
        self._mount_fd: int | None = None
        self.restarts = 0
        context = multiprocessing.get_context("spawn")
        # The processes log through the daemon's handlers (syslog, a file, the journal).
        self._log_queue: Queue[logging.LogRecord] = context.Queue()
        self._log_listener = logging.handlers.QueueListener(
            self._log_queue, *logging.getLogger().handlers, respect_handler_level=True
        )

    def start(self, mount_fd: int) -> None:
        """Start every process with a clone of ``mount_fd``; call once the kernel's INIT
        exchange is over (a clone could otherwise read the INIT request)."""
        self._mount_fd = mount_fd
        self._log_listener.start()
        for server in self._servers:
            server.start(self._mount_fd, self._log_queue)
        log.info("started %d serving processes besides the daemon", len(self._servers))

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
            for server in self._servers:
                process = server.process
                if process is None or process.is_alive() or self._mount_fd is None:
                    continue
                served = server.ready()  # before stop(): it reads the process's last words
                log.error(
                    "serving process %d (pid %s) exited with status %s after %.0f s",
                    server.index,
                    process.pid,
                    process.exitcode,
                    time.monotonic() - server.started,
                )
                server.stop()
                if not served:
                    log.error(
                        "serving process %d is not started again: it died before serving "
                        "(the daemon goes on serving with the others)",
                        server.index,
                    )
                    continue
                self.restarts += 1
                server.start(self._mount_fd, self._log_queue)

    def close(self) -> None:
        for server in self._servers:
            server.stop()
        if self._mount_fd is not None:
            self._log_listener.stop()
        self._log_queue.close()


def _serving_main(
    connection: Connection, setup: ServingSetup, index: int, log_queue: Queue[logging.LogRecord]
) -> None:
    """A serving process: open the source, build the stack, answer requests until unmount."""
    logging.basicConfig(
        level=setup.log_level, handlers=[logging.handlers.QueueHandler(log_queue)], force=True
    )
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent()
    device = reduction.recv_handle(connection)
    try:
        _serve_clone(connection, setup, index, device)
    except SystemExit:
        raise
    except BaseException:
        # The daemon's log says why (the traceback would only reach this process's stderr).
        log.exception("serving process %d failed", index)
        raise SystemExit(1) from None


def _serve_clone(connection: Connection, setup: ServingSetup, index: int, device: int) -> None:
    # Imported here, not at the top: the mount module imports this one to start the processes.
    from cutfs.vfs.mount import open_source  # noqa: PLC0415

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
        )
        serving.pool.wait_ready()
        channel = DeviceChannel(device, serving.operations)
        connection.send("ready")
        with acting_as(setup.user):
            trio.run(_serve, channel, serving)
        log.info("the mount went away: serving process %d stops", index)


async def _serve(channel: DeviceChannel, serving: ServingStack) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serving.pool.watch)
        nursery.start_soon(release_catalogue_pages)
        nursery.start_soon(publish_statistics, serving)
        await channel.serve()
        nursery.cancel_scope.cancel()


#: How often each serving process publishes its statistics for the others.
_PUBLISH_SECONDS: Final = 1.0


async def publish_statistics(serving: ServingStack) -> None:
    """Publish this process's statistics every second (a few KiB written and renamed)."""
    while True:
        try:
            serving.publish()
        except Exception:  # statistics must never take the mount down
            log.exception("cannot publish the statistics of this process")
        await trio.sleep(_PUBLISH_SECONDS)


#: How often the catalogue's mapped pages are dropped from a process's page tables.
_RELEASE_PAGES_SECONDS: Final = 10.0


async def release_catalogue_pages() -> None:
    """Every 10 s, release the catalogue pages this process mapped (see
    :func:`cutfs.codec.mapped_table.release_mapped_pages`): its memory then stays what it
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
