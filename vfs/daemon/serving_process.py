"""A serving process: one of the processes that answer a mount's requests.

The supervisor (:mod:`cutfs.vfs.daemon.supervisor`) mounts, answers the
kernel's INIT and starts N serving processes; it never opens the source.  Each
serving process, in order:

1. imports what it needs (it may be spawned before the mount is set up, see
   :mod:`cutfs.vfs.daemon.spawned_process`), receives its setup and its
   :class:`~cutfs.vfs.daemon.request_slot.RequestSlot` (a memfd) and opens the
   time-range table the processes share (a file of root's);
2. drops every privilege (:func:`~cutfs.vfs.sandbox.serving_user.drop_privileges`):
   the serving user in every id, hence no capability, and ``no_new_privs``;
3. opens the source, builds its :class:`~cutfs.vfs.daemon.serving_stack.ServingStack`
   (its share of the decoder workers and of the block cache) and reports to the
   supervisor in a few checked bytes (:class:`OpenedReport`, or :class:`FailedReport`
   with one line saying why);
4. receives its clone of the mount's ``/dev/fuse`` descriptor, says it is ready
   and answers requests through a :class:`~cutfs.vfs.fuse.device_channel.DeviceChannel`
   until the mount goes away.  The kernel gives each request to whichever process
   reads it first, so one mountpoint is served by N event loops.

Every process beats into its slot while it runs; one that decodes in turn also
writes there the request it answers and its deadline, for the supervisor to
fail it with ``EIO`` if the process dies, hangs or is stopped.  Files are
immutable and handles are inode numbers, so any process can answer any
request.  The little state there is lives in a private directory the
processes share: the table of time ranges made on lookup
(:class:`~cutfs.vfs.tree.span_table.SharedSpanTable`), the snapshot each open of
``.cutfs/stats`` reads (:class:`~cutfs.vfs.tree.snapshot_store.SnapshotStore`),
and the statistics, which each process counts for itself and publishes every
second for the others to add up (:mod:`cutfs.vfs.stats.statistics_board`).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import logging
import os
import signal
import socket
import tempfile
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Final

import trio

from cutfs.codec.catalogue.mapped_table import release_mapped_pages
from cutfs.codec.errors import CutfsError, SourceError
from cutfs.codec.library import Library
from cutfs.codec.opener import open_source
from cutfs.codec.sources.source_index import SourceIndex
from cutfs.codec.storage.object_location import is_remote
from cutfs.codec.trust.private_directory import private_directory
from cutfs.vfs.daemon.doorbell import Doorbell
from cutfs.vfs.daemon.log_channel import handler
from cutfs.vfs.daemon.process_name import name_process
from cutfs.vfs.daemon.request_slot import RequestSlot
from cutfs.vfs.daemon.serving_setup import (
    READY,
    FailedReport,
    OpenedReport,
    ServingSetup,
    shared_board_path,
    shared_scratch_path,
    shared_snapshots_path,
    shared_spans_path,
    shared_supervisor_directory,
    shared_supervisor_path,
    users_shared_paths,
)
from cutfs.vfs.daemon.serving_stack import ProcessShare, ServingStack
from cutfs.vfs.frames.frame_source import FrameSource
from cutfs.vfs.frames.zygote import Zygote
from cutfs.vfs.fuse.device_channel import DeviceChannel
from cutfs.vfs.fuse.read_ahead import ReadAhead
from cutfs.vfs.sandbox.path_confinement import PathConfinement
from cutfs.vfs.sandbox.serving_user import drop_privileges
from cutfs.vfs.sandbox.syscall_filter import SyscallFilter
from cutfs.vfs.stats.statistics_board import StatisticsBoard
from cutfs.vfs.tree.span_table import SharedSpanTable
from cutfs.vfs.tree.view import SPAN_INODE_BASE

if TYPE_CHECKING:
    pass

log = logging.getLogger("cutfs.serving_process")


def serving_main(connection: Connection, index: int, log_writer: socket.socket) -> None:
    """A serving process (see the module's docstring), spawned before its mount was set
    up (:mod:`cutfs.vfs.daemon.spawned_process`): it receives its setup from the
    supervisor first.  Its exit status is 0 once the mount went away, 3 if the source
    could not be opened, 1 for anything else."""
    logging.basicConfig(level=logging.INFO, handlers=[handler(log_writer)], force=True)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    name_process("cutfs-serving")
    _die_with_parent()
    try:
        setup = _received_setup(connection)
        logging.getLogger().setLevel(setup.log_level)
        slot = RequestSlot.open(reduction.recv_handle(connection))
        spans = SharedSpanTable(shared_spans_path(setup.shared_dir), SPAN_INODE_BASE)
        read_ahead = None
        if setup.options.reads_ahead:
            descriptors = [reduction.recv_handle(connection) for _ in range(3)]
            read_ahead = ReadAhead.adopt(descriptors, setup.options.read_ahead_cells)
        # Spills go to the mount's own scratch directory, never a folder others can write.
        tempfile.tempdir = shared_scratch_path(setup.shared_dir)
        syscalls = _syscall_filter(setup)
        paths = _path_confinement(setup)
        zygote = _zygote(setup, syscalls, paths)
        drop_privileges(setup.user)  # before anything of the source is opened
        _make_cache(setup.cache_dir)
        if paths is not None and paths.install() and index == 1:
            log.info("the serving processes and decoders may open only: %s", paths.describe())
        syscalls.install()
        _serve_clone(connection, setup, index, slot, spans, read_ahead, zygote)
    except EOFError:
        raise SystemExit(1) from None  # the supervisor stopped before it gave the mount
    except CutfsError as exc:
        log.error("serving process %d cannot serve %s: %s", index, setup.source, exc)
        _report(connection, FailedReport(at_source=True, message=str(exc)))
        raise SystemExit(3) from None
    except SystemExit:
        raise
    except BaseException as exc:
        # The supervisor's log says why (the traceback would only reach this process's stderr).
        log.exception("serving process %d failed", index)
        _report(connection, FailedReport(at_source=False, message=f"{type(exc).__name__}: {exc}"))
        raise SystemExit(1) from None


def _received_setup(connection: Connection) -> ServingSetup:
    """The setup the supervisor sends (pickled: it comes from the one process above this
    one, never from a user)."""
    setup = connection.recv()
    if not isinstance(setup, ServingSetup):
        raise TypeError(f"expected a serving setup, received {type(setup).__name__}")
    return setup


def _make_cache(cache_dir: str) -> None:
    """Make the index cache now, as the serving user, where it can be: a confinement's
    rule needs it to exist.  One that cannot be made is left to the code that needs it,
    which says why (a source of shards may never need it)."""
    with contextlib.suppress(SourceError):
        private_directory(cache_dir)


def _syscall_filter(setup: ServingSetup) -> SyscallFilter:
    """What this mount's processes that parse data may do (see
    :mod:`cutfs.vfs.sandbox.syscall_filter`): run programs only for the source's commands,
    reach the network only for object storage."""
    objects = setup.policy is not None and bool(setup.policy.allowed_objects)
    return SyscallFilter(
        allow_exec=setup.options.allow_commands,
        allow_network=is_remote(setup.source) or objects,
    )


def _path_confinement(setup: ServingSetup) -> PathConfinement | None:
    """Where this mount's processes that parse data may open files (see
    :mod:`cutfs.vfs.sandbox.path_confinement`): read the source's roots, read and write
    the mount's cache and their own parts of the shared directory.  One that reads
    object storage (credentials, certificates) or follows every path (an owner's private
    mount) may read every path, and write only there.  A mount that runs the source's
    commands is not confined: what a command opens is its author's to say."""
    if setup.options.allow_commands:
        return None
    writable = (setup.cache_dir, *users_shared_paths(setup.shared_dir))
    policy = setup.policy
    if is_remote(setup.source) or policy is None or policy.allowed_objects or policy.any_path:
        return PathConfinement.for_data(None, writable)
    supervisor = shared_supervisor_directory(setup.shared_dir)  # figures for .cutfs/stats
    return PathConfinement.for_data((*policy.allowed_roots, supervisor), writable)


def _zygote(
    setup: ServingSetup, syscalls: SyscallFilter, paths: PathConfinement | None
) -> Zygote | None:
    """The zygote that forks this process's decoder workers, started while this process
    may still execute the interpreter (see :mod:`cutfs.vfs.frames.zygote`); None when it
    has no workers."""
    options = setup.options
    if options.decode_in_turn or ProcessShare.of(options, setup.processes - 1).workers == 0:
        return None
    return Zygote.start(
        setup.user,
        syscalls,
        paths,
        preload=("cutfs.vfs.frames.decode_pool", "av"),
        scratch_dir=shared_scratch_path(setup.shared_dir),
    )


def _import_in_background(module: str) -> None:
    """Import ``module`` in a thread: the process serves meanwhile, and a request that
    needs the module waits for the import (Python's import lock) instead of starting it."""
    threading.Thread(
        target=importlib.import_module, args=(module,), name=f"import-{module}", daemon=True
    ).start()


def _report(connection: Connection, report: OpenedReport | FailedReport) -> None:
    with contextlib.suppress(OSError):
        connection.send_bytes(report.encode())


def _serve_clone(
    connection: Connection,
    setup: ServingSetup,
    index: int,
    slot: RequestSlot,
    spans: SharedSpanTable,
    read_ahead: ReadAhead | None,
    zygote: Zygote | None,
) -> None:
    options = setup.options
    with ExitStack() as stack:
        stack.callback(spans.close)
        if read_ahead is not None:
            stack.callback(read_ahead.close)
        if zygote is not None:
            stack.callback(zygote.close)
        library = open_source(
            setup.source,
            setup.cache_dir,
            setup.policy,
            disk_cache_bytes=options.disk_cache_bytes,
            # The store gives up before the read does: the read fails with the store's
            # reason, and the worker that waited is not killed for missing the deadline.
            deadline_seconds=options.read_timeout_seconds * 0.8,
        )
        stack.callback(library.close)
        first = setup.identity is None
        if not first and library.identity != setup.identity:
            raise CutfsError(
                f"{setup.source} changed since it was mounted (another one put in its "
                "place?): a serving process refuses to serve it; remount to serve the new one"
            )
        if first and isinstance(library, SourceIndex):
            _log_refusals(library)
        serving = ServingStack.open(
            stack,
            library,
            setup.mountpoint,
            options,
            ProcessShare.of(options, setup.processes - 1),
            policy=setup.policy,
            user=setup.user,
            kernel={},
            board=StatisticsBoard(
                shared_board_path(setup.shared_dir),
                index,
                setup.processes,
                shared_supervisor_path(setup.shared_dir),
            ),
            shared_spans=spans,
            snapshot_dir=shared_snapshots_path(setup.shared_dir),
            in_turn=slot if options.decode_in_turn else None,
            zygote=zygote,
        )
        serving.pool.wait_ready()
        connection.send_bytes(
            OpenedReport(
                len(library.recording_ids),
                library.num_cuts,
                int(library.describe().get("format_version") or 0),
                library.identity,
            ).encode()
        )
        device = reduction.recv_handle(connection)
        channel = DeviceChannel(device, serving.operations, setup.mountpoint, read_ahead)
        connection.send_bytes(READY)
        _import_in_background("av")  # decoding's, left out of the start (see decoder.py)
        reporter = _indexing_reporter(serving.frames, library) if index == 1 else None
        if options.decode_in_turn:
            trio.run(_serve_in_turn, channel, serving, slot, options.read_timeout_seconds, reporter)
        else:
            trio.run(_serve, channel, serving, slot, reporter)
        log.info("the mount went away: serving process %d stops", index)


#: Refused entries of a source logged one by one; the rest are counted.
_REFUSALS_LOGGED: Final = 20


def _log_refusals(index: SourceIndex) -> None:
    for message in index.refused[:_REFUSALS_LOGGED]:
        log.warning("refused: %s", message)
    if index.refused_count > _REFUSALS_LOGGED:
        log.warning(
            "refused %d more entries of the source (see refused_entries in .cutfs/stats)",
            index.refused_count - _REFUSALS_LOGGED,
        )


#: How often the first indexing of a source served in place is reported in the log.
_INDEXING_REPORT_SECONDS: Final = 10.0


def _indexing_reporter(frames: FrameSource, library: Library) -> Callable[[], Awaitable[None]]:
    """A task that logs indexing progress every 10 s while recordings are being indexed
    (the first ``ls -l`` of a large source served in place indexes every recording)."""

    async def report() -> None:
        started: float | None = None
        while True:
            await trio.sleep(_INDEXING_REPORT_SECONDS)
            busy = frames.recordings_being_indexed
            if not busy:
                started = None
                continue
            started = started if started is not None else trio.current_time()
            described = library.describe()
            log.info(
                "indexing: %s of %d recordings indexed, %d in progress (%.0f s)",
                described.get("recordings_indexed", "?"),
                len(library.recording_ids),
                busy,
                trio.current_time() - started + _INDEXING_REPORT_SECONDS,
            )

    return report


#: How often a process that hands decoding to workers beats into its slot.
_BEAT_SECONDS: Final = 0.5


async def _beat(slot: RequestSlot) -> None:
    while True:
        slot.beat()
        await trio.sleep(_BEAT_SECONDS)


async def _serve(
    channel: DeviceChannel,
    serving: ServingStack,
    slot: RequestSlot,
    reporter: Callable[[], Awaitable[None]] | None,
) -> None:
    with serving_doorbell(serving) as doorbell:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_beat, slot)
            if reporter is not None:
                nursery.start_soon(reporter)
            nursery.start_soon(serving.pool.watch)
            nursery.start_soon(release_catalogue_pages)
            nursery.start_soon(publish_statistics, serving, doorbell)
            await channel.serve()
            serving.pool.retire()
            nursery.cancel_scope.cancel()


async def _serve_in_turn(
    channel: DeviceChannel,
    serving: ServingStack,
    slot: RequestSlot,
    deadline_seconds: float,
    reporter: Callable[[], Awaitable[None]] | None,
) -> None:
    with serving_doorbell(serving) as doorbell:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(release_catalogue_pages)
            if reporter is not None:
                nursery.start_soon(reporter)
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
