"""Assembling and running the daemon for one mount.

:func:`serve` opens the shard set, builds the filesystem, mounts it, reports
readiness, answers requests until it is unmounted or gets SIGTERM, SIGINT
or SIGHUP, and then unmounts and releases everything, in that order.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from dataclasses import replace

import pyfuse3
import trio

from cutfs.codec.errors import CutfsError, ShardFormatError, SourceError
from cutfs.codec.library import Library
from cutfs.codec.opener import open_source
from cutfs.codec.sources.source_index import SourceIndex, default_cache_root
from cutfs.codec.storage.object_location import is_remote
from cutfs.codec.trust.clean_start import is_clean
from cutfs.codec.trust.source_policy import SourcePolicy
from cutfs.vfs.daemon import kernel_tuning
from cutfs.vfs.daemon.mount_options import MountOptions
from cutfs.vfs.daemon.serving_process import (
    ServingProcesses,
    ServingSetup,
    mount_device_fd,
    publish_statistics,
    release_catalogue_pages,
    serving_doorbell,
    shared_board_path,
    shared_snapshots_path,
    shared_spans_path,
)
from cutfs.vfs.daemon.serving_stack import ProcessShare, ServingStack
from cutfs.vfs.daemon.serving_user import (
    ServingUser,
    ServingUserError,
    acting_as,
    as_root,
    serving_user,
)
from cutfs.vfs.frames.decode_pool import DecodePool
from cutfs.vfs.frames.frame_source import FrameSource
from cutfs.vfs.fuse.device_channel import DeviceChannel
from cutfs.vfs.stats.statistics_board import StatisticsBoard
from cutfs.vfs.tree.span_table import SharedSpanTable

log = logging.getLogger("cutfs.mount")


class ExitCode:
    """Exit statuses of ``cutfs mount``, one per kind of start-up failure."""

    OK = 0
    ERROR = 1  # unexpected failure
    USAGE = 2  # bad command line
    BAD_SHARDS = 3  # the source (shards, manifests, dataset) is missing, unreadable or inconsistent
    BAD_MOUNTPOINT = 4  # the mountpoint is missing, not a directory, or mounting failed
    NO_FUSE = 5  # /dev/fuse or fusermount3 is missing


class MountError(Exception):
    """A start-up failure, with the exit status it maps to."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


#: The read-ahead a root daemon gives its mount: a whole 10 s cut at 16 kHz (320 KB; 960 KB
#: at 48 kHz) in one read request instead of three of 128 KiB (measured: 3.03 reads per
#: cold cut at the kernel's default, 1.03 at 1024, and a lower median latency).
DEFAULT_READ_AHEAD_KB = 1024


#: The most processes that may serve one mount.
MAX_SERVING_PROCESSES = 64


def _settled(options: MountOptions) -> MountOptions:
    """``options`` checked, and the time every node shows (:attr:`Ownership.time_ns`)
    decided once for all serving processes.  Raises :class:`MountError`."""
    if not 1 <= options.processes <= MAX_SERVING_PROCESSES:
        raise MountError(
            f"--serving-processes must be 1 to {MAX_SERVING_PROCESSES}, not {options.processes}",
            ExitCode.USAGE,
        )
    if options.workers < 0:
        raise MountError(f"--workers must be 0 or more, not {options.workers}", ExitCode.USAGE)
    if options.time_ns is not None:
        return options
    return replace(options, time_ns=time.time_ns())


def _open_library(
    source: str,
    cache_dir: str | None,
    policy: SourcePolicy | None,
    *,
    disk_cache_bytes: int,
    deadline_seconds: float,
) -> Library:
    """:func:`cutfs.codec.opener.open_source`, its refusals logged; raises
    :class:`MountError` with :attr:`ExitCode.BAD_SHARDS` when the source cannot be read."""
    try:
        library = open_source(
            source,
            cache_dir,
            policy,
            disk_cache_bytes=disk_cache_bytes,
            deadline_seconds=deadline_seconds,
        )
    except (ShardFormatError, SourceError) as exc:
        raise MountError(str(exc), ExitCode.BAD_SHARDS) from exc
    if isinstance(library, SourceIndex):
        _log_refusals(library)
    return library


def cache_root_for(explicit: str | None, user: ServingUser | None) -> str:
    """The index cache root of a daemon that reads as ``user`` (``None``: as itself).

    A daemon started by root keeps the indexes of each user it reads as in
    a directory of that user's own, ``<default root>/<uid>`` (mode 0700,
    owned by the user; ``0`` when it reads as root), below a default root
    that only root can write.  An explicit directory that does not exist
    yet is made by the user itself (never created or chowned by root, where
    the user's links could point).  Whether an existing directory is private
    enough is checked as the user, when the index is prepared.
    """
    if os.geteuid() != 0:
        return explicit or default_cache_root()
    if explicit is not None:
        if user is not None:
            with acting_as(user):  # made by the user itself: nothing made or chowned as root
                try:
                    os.makedirs(explicit, mode=0o700, exist_ok=True)
                except OSError as exc:
                    raise MountError(
                        f"cannot create the index cache {explicit} as {user.describe()}: "
                        f"{exc.strerror}",
                        ExitCode.BAD_SHARDS,
                    ) from exc
        return explicit
    parent = default_cache_root()
    os.makedirs(parent, mode=0o755, exist_ok=True)
    status = os.lstat(parent)
    if status.st_uid != 0 or status.st_mode & 0o022 or not stat.S_ISDIR(status.st_mode):
        raise MountError(
            f"the index cache root {parent} must be a directory owned by root and "
            "writable by no one else",
            ExitCode.BAD_SHARDS,
        )
    if status.st_mode & 0o011 != 0o011:  # each user's directory below must be reachable
        log.info("making %s traversable (0755) for the per-user index caches", parent)
        os.chmod(parent, 0o755)
    uid, gid = (user.uid, user.gid) if user is not None else (0, 0)
    root = os.path.join(parent, str(uid))
    if not os.path.lexists(root):
        os.makedirs(root, mode=0o700)
        os.chown(root, uid, gid, follow_symlinks=False)
    return root


#: Refused entries of a source logged one by one at mount; the rest are counted.
_REFUSALS_LOGGED = 20


def _log_refusals(index: SourceIndex) -> None:
    for message in index.refused[:_REFUSALS_LOGGED]:
        log.warning("refused: %s", message)
    if index.refused_count > _REFUSALS_LOGGED:
        log.warning(
            "refused %d more entries of the source (see refused_entries in .cutfs/stats)",
            index.refused_count - _REFUSALS_LOGGED,
        )


def serve(
    shard_dir: str, mountpoint: str, options: MountOptions, on_ready: Callable[[], None]
) -> None:
    """Mount ``shard_dir`` (or a source served in place) at ``mountpoint`` until unmounted.

    Raises :class:`MountError` for start-up failures.  ``on_ready`` is called
    once the mount answers requests.
    """
    mountpoint = os.path.abspath(mountpoint)
    options = _settled(options)
    _check_environment(mountpoint)
    remote = is_remote(shard_dir)
    user = _serving_user(options.user, None if remote else shard_dir)
    if user is not None and options.workers == 0 and not options.decode_in_turn:
        raise MountError(
            f"--workers 0 decodes in the daemon, which keeps root to unmount; reading as "
            f"{user.describe()} needs decoder workers (--workers 1 or more)",
            ExitCode.USAGE,
        )
    policy = (
        None
        if remote
        else SourcePolicy.for_source(
            shard_dir,
            options.allowed_roots,
            allow_commands=options.allow_commands,
            command_limits=options.command_limits,
            cache_quota_bytes=options.cache_quota_bytes,
            allowed_objects=options.allowed_objects,
            input_limits=options.input_limits,
        )
    )
    cache_dir = cache_root_for(options.cache_dir, user)
    with ExitStack() as stack:
        with acting_as(user):
            library = _open_library(
                shard_dir,
                cache_dir,
                policy,
                disk_cache_bytes=options.disk_cache_bytes,
                # The store gives up before the read does: the read fails with the store's
                # reason, and the worker that waited is not killed for missing the deadline.
                deadline_seconds=options.read_timeout_seconds * 0.8,
            )
        stack.callback(library.close)
        kernel: dict[str, str] = {}
        servers: ServingProcesses | None = None
        # In turn, the daemon serves besides the processes only if none of them can.
        processes = options.processes + (1 if options.decode_in_turn else 0)
        shared_dir = _shared_directory(stack, user) if processes > 1 else None
        serving = ServingStack.open(
            stack,
            library,
            mountpoint,
            options,
            ProcessShare.of_daemon(options, processes),
            policy=policy,
            user=user,
            kernel=kernel,
            extra_status=lambda: {"serving": servers.describe()} if servers else {},
            board=(
                StatisticsBoard(shared_board_path(shared_dir), 0, processes) if shared_dir else None
            ),
            shared_spans=shared_spans_path(shared_dir) if shared_dir else None,
            snapshot_dir=shared_snapshots_path(shared_dir) if shared_dir else None,
        )
        pool, frames, operations = serving.pool, serving.frames, serving.operations
        if shared_dir is not None:
            servers = ServingProcesses(
                ServingSetup(
                    shard_dir,
                    mountpoint,
                    options,
                    cache_dir,
                    policy,
                    user,
                    library.identity,
                    processes,
                    shared_dir,
                    logging.getLogger().getEffectiveLevel(),
                ),
                serving.statistics,
            )
            stack.callback(servers.close)
        try:
            pool.wait_ready()
        except CutfsError as exc:
            raise MountError(str(exc), ExitCode.BAD_SHARDS) from exc
        try:
            pyfuse3.init(operations, mountpoint, _fuse_options(options))
        except RuntimeError as exc:
            raise MountError(
                f"cannot mount at {mountpoint}: {exc}", ExitCode.BAD_MOUNTPOINT
            ) from exc

        async def tune_kernel(init_answered: trio.Event) -> None:
            # Only once the kernel's INIT exchange is over: its reply resets read-ahead.
            # (Not by a statvfs of the mount, which waited for an answer from the serving
            # processes: a daemon whose mount was detached before they served hung in it.)
            await init_answered.wait()
            if _read_ahead_kb(options, user) is None and options.max_background is None:
                return
            with as_root(user):
                kernel.update(
                    kernel_tuning.apply(
                        mountpoint, _read_ahead_kb(options, user), options.max_background
                    )
                )
            for setting, outcome in kernel.items():
                log.info("kernel setting %s: %s", setting, outcome)

        log.info(
            "mounted %s at %s: %d recordings, %d cuts",
            shard_dir,
            mountpoint,
            len(library.recording_ids),
            library.num_cuts,
        )
        if user is not None:
            log.info("reading %s as %s", shard_dir, user.describe())
        if library.describe().get("format_version") == 1:
            log.warning(
                "%s is of shard format 1: its file trees were built for this mount; "
                "'cutfs upgrade %s' writes them once (the shards do not change)",
                shard_dir,
                shard_dir,
            )
        try:
            with acting_as(user):  # root again only to tune the kernel and to unmount
                trio.run(
                    _run,
                    on_ready,
                    pool,
                    tune_kernel,
                    _indexing_reporter(frames, library),
                    servers,
                    serving,
                    user,
                )
        finally:
            pyfuse3.close(unmount=True)  # also on errors: never leave a stale mount
            log.info("unmounted %s", mountpoint)


async def _run(
    on_ready: Callable[[], None],
    pool: DecodePool,
    tune_kernel: Callable[[trio.Event], Awaitable[None]],
    report_indexing: Callable[[], Awaitable[None]],
    servers: ServingProcesses | None,
    serving: ServingStack,
    user: ServingUser | None,
) -> None:
    serving_scope = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_on_signal, serving_scope.cancel)
        if servers is not None:
            if not servers.in_turn:
                nursery.start_soon(servers.watch)  # in turn, _serve supervises them
            nursery.start_soon(_publish_statistics, serving)
        nursery.start_soon(pool.watch)
        init_answered = trio.Event()
        nursery.start_soon(tune_kernel, init_answered)
        nursery.start_soon(report_indexing)
        nursery.start_soon(release_catalogue_pages)

        def ready() -> None:
            on_ready()
            _notify_systemd("READY=1")

        with serving_scope:
            await _serve(servers, serving, user, ready, init_answered)
        pool.retire()  # what is still running is cancelled now, here and in system tasks
        nursery.cancel_scope.cancel()


async def _publish_statistics(serving: ServingStack) -> None:
    with serving_doorbell(serving) as doorbell:
        await publish_statistics(serving, doorbell)


async def _serve(
    servers: ServingProcesses | None,
    serving: ServingStack,
    user: ServingUser | None,
    ready: Callable[[], None],
    init_answered: trio.Event,
) -> None:
    """Serve through the mount's descriptor with a :class:`DeviceChannel`, and through
    clones of it in the serving processes, if any; ``ready`` is called once requests are
    answered (when the processes decode in turn, once they serve), ``init_answered`` is
    set once the kernel has the daemon's answer to its INIT.

    pyfuse3 mounted and will unmount, but its loop never runs (see
    :mod:`cutfs.vfs.fuse.device_channel` for why): the daemon answers the kernel's INIT
    itself, before any clone exists.
    """
    mount_fd = mount_device_fd()
    channel = DeviceChannel(mount_fd, serving.operations, serving.mountpoint)
    if servers is None or not servers.in_turn:
        ready()  # requests wait for the INIT answer, which comes next
    await channel.answer_init()
    init_answered.set()  # the kernel handled the reply as the daemon wrote it
    if servers is not None:
        with as_root(user):
            servers.start(mount_fd)
        if servers.in_turn:
            await servers.wait_ready(serving.pool.deadline_seconds)
            ready()
            if await servers.supervise(mount_fd):
                return
            log.error(
                "no serving process is left (each died before it served): the daemon "
                "serves the mount itself from now on, with one decoder worker"
            )
    await channel.serve()


def _shared_directory(stack: ExitStack, user: ServingUser | None) -> str:
    """A private directory of what the serving processes share, removed at exit.

    The directory and the time-range table are root's (every process opens the
    table before it acts as the user): its numbers name recordings and frames.  The
    statistics and the snapshots are written as the user the daemon reads as, into
    subdirectories of that user's: that user could alter the figures
    ``.cutfs/stats`` shows, which are only parsed, bounded and shown.
    """
    directory = tempfile.mkdtemp(prefix="cutfs-serving-")
    stack.callback(shutil.rmtree, directory, ignore_errors=True)
    SharedSpanTable.create(shared_spans_path(directory))
    for subdirectory in (shared_board_path(directory), shared_snapshots_path(directory)):
        os.mkdir(subdirectory, mode=0o700)
        if user is not None:
            os.chown(subdirectory, user.uid, user.gid)
    if user is not None:
        os.chmod(directory, 0o711)  # the user reaches its subdirectories, lists nothing
    return directory


#: How often the first indexing of a source served in place is reported in the log.
_INDEXING_REPORT_SECONDS = 10.0


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


async def _stop_on_signal(stop_serving: Callable[[], None]) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signal_number in signals:
            log.info("received %s: unmounting", signal.Signals(signal_number).name)
            _notify_systemd("STOPPING=1")
            stop_serving()
            return


def _fuse_options(options: MountOptions) -> set[str]:
    fuse_options = set(pyfuse3.default_options)  # default_permissions: the kernel checks modes
    fuse_options |= {"fsname=cutfs", "subtype=cutfs", "ro", "nosuid", "nodev"}
    if options.allow_other:
        fuse_options.add("allow_other")
    return fuse_options


def _read_ahead_kb(options: MountOptions, user: ServingUser | None) -> int | None:
    """The read-ahead to set: the one asked for, else :data:`DEFAULT_READ_AHEAD_KB` for a
    daemon started as root (only root can write it; one serving a ``user`` was), else
    none."""
    if options.read_ahead_kb is None and (os.geteuid() == 0 or user is not None):
        return DEFAULT_READ_AHEAD_KB
    return options.read_ahead_kb


def _serving_user(requested: str | None, source: str | None) -> ServingUser | None:
    try:
        return serving_user(requested, source)
    except ServingUserError as exc:
        raise MountError(str(exc), ExitCode.USAGE) from exc
    except OSError as exc:
        raise MountError(f"{source}: {exc.strerror}", ExitCode.BAD_SHARDS) from exc


def _check_environment(mountpoint: str) -> None:
    if os.geteuid() == 0 and not is_clean():
        raise MountError(
            "a daemon that runs as root must be a clean start (an isolated interpreter, "
            "from /): run it as the cutfs command",
            ExitCode.USAGE,
        )
    if not os.path.exists("/dev/fuse"):
        raise MountError(
            "/dev/fuse is missing: load the fuse module or install fuse3", ExitCode.NO_FUSE
        )
    # statvfs, not stat: the kernel may still answer stat for a dead FUSE mount
    # from its attribute cache, while statvfs reaches the (missing) daemon.
    try:
        os.statvfs(mountpoint)
    except OSError as exc:
        if exc.errno != errno.ENOTCONN:
            raise MountError(
                f"mountpoint {mountpoint}: {exc.strerror}", ExitCode.BAD_MOUNTPOINT
            ) from exc
        clear_stale_mount(mountpoint)
    else:
        if _is_fuse_mount(mountpoint):
            raise MountError(
                f"{mountpoint} is already a mounted FUSE filesystem", ExitCode.BAD_MOUNTPOINT
            )
    if not os.path.isdir(mountpoint):
        raise MountError(f"mountpoint {mountpoint} is not a directory", ExitCode.BAD_MOUNTPOINT)


def _is_fuse_mount(mountpoint: str) -> bool:
    try:
        with open("/proc/self/mounts", encoding="utf-8") as mounts:
            return any(
                fields[1] == mountpoint and fields[2].startswith("fuse")
                for fields in (line.split() for line in mounts)
            )
    except OSError:
        return False


def clear_stale_mount(mountpoint: str) -> None:
    """Unmount what a dead daemon left ("Transport endpoint is not connected")."""
    log.warning("clearing the stale mount at %s left by a daemon that died", mountpoint)
    try:
        subprocess.run(["fusermount3", "-u", "-z", mountpoint], check=True, capture_output=True)
    except FileNotFoundError as exc:
        raise MountError("fusermount3 is missing: install fuse3", ExitCode.NO_FUSE) from exc
    except subprocess.CalledProcessError as exc:
        raise MountError(
            f"cannot clear the stale mount at {mountpoint}: {exc.stderr.decode().strip()}",
            ExitCode.BAD_MOUNTPOINT,
        ) from exc


def _notify_systemd(message: str) -> None:
    """Tell systemd (Type=notify) about our state, if it asked to be told."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
            notify.connect(address)
            notify.sendall(message.encode())
    except OSError as exc:
        log.warning("cannot notify systemd: %s", exc)
