"""Assembling and running the daemon for one mount.

:func:`serve` makes this process the mount's supervisor: it starts the serving
processes (which open the source as the serving user), mounts, answers the
kernel's INIT, hands them the mount, reports readiness, supervises them until
the mount is unmounted or it gets SIGTERM, SIGINT or SIGHUP, and then unmounts
and releases everything, in that order.  It never opens the source itself.
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
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from typing import TYPE_CHECKING

from cutfs.codec.cache_root import default_cache_root
from cutfs.codec.storage.object_location import is_remote
from cutfs.codec.trust.clean_start import is_clean
from cutfs.codec.trust.source_policy import SourcePolicy
from cutfs.vfs.daemon import kernel_tuning
from cutfs.vfs.daemon.exit_status import ExitCode
from cutfs.vfs.daemon.log_channel import LogChannel
from cutfs.vfs.daemon.mount_options import MountOptions
from cutfs.vfs.daemon.serving_setup import (
    OpenedReport,
    ServingSetup,
    shared_spans_path,
    shared_supervisor_directory,
    users_shared_paths,
)
from cutfs.vfs.daemon.spawned_process import SpawnedProcess
from cutfs.vfs.sandbox.serving_user import (
    ServingUser,
    ServingUserError,
    serving_user,
)

if TYPE_CHECKING:
    from cutfs.vfs.daemon.supervisor import Supervisor

log = logging.getLogger("cutfs.mount")


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


def cache_root_for(explicit: str | None, user: ServingUser | None) -> str:
    """The index cache root of a daemon that reads as ``user`` (``None``: as itself).

    A daemon started by root keeps the indexes of each user it reads as in
    a directory of that user's own, ``<default root>/<uid>`` (mode 0700,
    owned by the user; ``0`` when it reads as root), below a default root
    that only root can write.  An explicit directory is left to the serving
    processes, which make it (or check that it is private) as the user,
    never as root, where the user's links could point.
    """
    if os.geteuid() != 0 or explicit is not None:
        return os.path.abspath(explicit or default_cache_root())
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


def serve(
    shard_dir: str, mountpoint: str, options: MountOptions, on_ready: Callable[[], None]
) -> None:
    """Mount ``shard_dir`` (or a source served in place) at ``mountpoint`` until unmounted.

    This process is the mount's supervisor (:mod:`cutfs.vfs.daemon.supervisor`): it never
    opens the source; its serving processes do, as the serving user.  Raises
    :class:`MountError` for start-up failures.  ``on_ready`` is called once the mount
    answers requests.
    """
    mountpoint = os.path.abspath(mountpoint)
    options = _settled(options)
    _check_environment(mountpoint)
    with ExitStack() as stack:
        # The serving processes log through this process's handlers (syslog, a file,
        # the journal), and the first one imports while this one goes on (see
        # :mod:`cutfs.vfs.daemon.spawned_process`).
        log_channel = LogChannel()
        log_channel.start()
        stack.callback(log_channel.stop)
        first = SpawnedProcess(1, log_channel.writer)
        stack.callback(first.close)  # if no supervisor takes it
        _serve_with(stack, shard_dir, mountpoint, options, on_ready, log_channel, first)


def _serve_with(
    stack: ExitStack,
    shard_dir: str,
    mountpoint: str,
    options: MountOptions,
    on_ready: Callable[[], None],
    log_channel: LogChannel,
    first: SpawnedProcess,
) -> None:
    """:func:`serve`, once serving process 1 is on its way: what needs this process's
    heavier modules (pyfuse3, trio: 0.2 s to import) imports them now, beside it."""
    import pyfuse3
    import trio

    from cutfs.vfs.daemon.supervisor import ServingFailedError, Supervisor

    remote = is_remote(shard_dir)
    user = _serving_user(options.user, None if remote else shard_dir)
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
            any_path=_is_owners_private_mount(shard_dir, options),
        )
    )
    cache_dir = cache_root_for(options.cache_dir, user)
    setup = ServingSetup(
        shard_dir,
        mountpoint,
        options,
        cache_dir,
        policy,
        user,
        None,
        options.processes + 1,
        _shared_directory(stack, user),
        logging.getLogger().getEffectiveLevel(),
    )
    supervisor = Supervisor(setup, log_channel, first)
    stack.callback(supervisor.close)
    try:
        opened = supervisor.open_source()
    except ServingFailedError as exc:
        code = ExitCode.BAD_SHARDS if exc.at_source else ExitCode.ERROR
        raise MountError(str(exc), code) from exc
    try:
        pyfuse3.init(pyfuse3.Operations(), mountpoint, _fuse_options(options))
    except RuntimeError as exc:
        raise MountError(f"cannot mount at {mountpoint}: {exc}", ExitCode.BAD_MOUNTPOINT) from exc
    _log_mounted(shard_dir, mountpoint, opened, user)
    try:
        served = trio.run(_run, on_ready, supervisor, mountpoint, options, user)
    finally:
        pyfuse3.close(unmount=True)  # also on errors: never leave a stale mount
        log.info("unmounted %s", mountpoint)
    if not served:
        raise MountError(
            "no serving process is left (each died before it served): the mount was "
            "taken down; see the log for why",
            ExitCode.ERROR,
        )


def _is_owners_private_mount(source: str, options: MountOptions) -> bool:
    """Whether this mount only shows ``source``'s owner what that owner may read anyway:
    a daemon that is not root, started by the owner, without ``allow_other``.  Such a
    mount follows every path its manifests name (see
    :attr:`~cutfs.codec.trust.source_policy.SourcePolicy.any_path`); root daemons and
    shared mounts keep to the source and ``--allow-root``."""
    if os.geteuid() == 0 or options.allow_other:
        return False
    try:
        return os.lstat(source).st_uid == os.geteuid()
    except OSError:
        return False  # the serving process says why it cannot open the source


def _log_mounted(
    source: str, mountpoint: str, opened: OpenedReport, user: ServingUser | None
) -> None:
    log.info(
        "mounted %s at %s: %d recordings, %d cuts",
        source,
        mountpoint,
        opened.recordings,
        opened.cuts,
    )
    if user is not None:
        log.info("reading %s as %s", source, user.describe())
    if opened.format_version == 1:
        log.warning(
            "%s is of shard format 1: its file trees were built for this mount; "
            "'cutfs upgrade %s' writes them once (the shards do not change)",
            source,
            source,
        )


async def _run(
    on_ready: Callable[[], None],
    supervisor: Supervisor,
    mountpoint: str,
    options: MountOptions,
    user: ServingUser | None,
) -> bool:
    """Answer INIT, tune the kernel, hand the mount to the serving processes and supervise
    them until unmounted or told to stop (True), or until none is left (False)."""
    import trio

    from cutfs.vfs.daemon.supervisor import mount_device_fd
    from cutfs.vfs.fuse.device_channel import answer_init

    stop = trio.CancelScope()
    served = True
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stop_on_signal, stop.cancel)
        nursery.start_soon(supervisor.publish)
        with stop:
            mount_fd = mount_device_fd()
            # Its own descriptor, and before any clone exists: a clone could read INIT.
            await answer_init(mount_fd)
            # Only once the INIT exchange is over: the kernel's reply handling resets
            # read-ahead.  (Never by a statvfs of the mount, which waits for a serving
            # process to answer: a supervisor whose mount was detached would hang in it.)
            _tune_kernel(supervisor.kernel, mountpoint, options, user)
            supervisor.hand_mount(mount_fd)
            await supervisor.wait_ready(options.read_timeout_seconds)
            supervisor.publish_now()  # .cutfs/stats shows it ready as the mount is
            on_ready()
            _notify_systemd("READY=1")
            supervisor.start_others()
            served = await supervisor.supervise(mount_fd)
        nursery.cancel_scope.cancel()
    return served


def _tune_kernel(
    outcomes: dict[str, str], mountpoint: str, options: MountOptions, user: ServingUser | None
) -> None:
    """Apply the read-ahead and background limits to the mount; ``outcomes`` gets what
    each setting came to."""
    read_ahead_kb = _read_ahead_kb(options, user)
    if read_ahead_kb is None and options.max_background is None:
        return
    outcomes.update(kernel_tuning.apply(mountpoint, read_ahead_kb, options.max_background))
    for setting, outcome in outcomes.items():
        log.info("kernel setting %s: %s", setting, outcome)


def _shared_directory(stack: ExitStack, user: ServingUser | None) -> str:
    """A private directory of what the serving processes share, removed at exit.

    The directory, the time-range table and the supervisor's figures are root's
    (every serving process opens the table before it drops its privileges): the
    table's numbers name recordings and frames.  The statistics, the snapshots and
    the scratch files (what spills to disk while a catalogue or a manifest is built)
    are written by the serving processes, as the user the mount reads as, into
    subdirectories of that user's, which the supervisor never opens.
    """
    directory = tempfile.mkdtemp(prefix="cutfs-serving-")
    stack.callback(shutil.rmtree, directory, ignore_errors=True)
    from cutfs.vfs.tree.span_table import SharedSpanTable  # numpy: only here

    SharedSpanTable.create(shared_spans_path(directory))
    os.mkdir(shared_supervisor_directory(directory), mode=0o755)
    for subdirectory in users_shared_paths(directory):
        os.mkdir(subdirectory, mode=0o700)
        if user is not None:
            os.chown(subdirectory, user.uid, user.gid)
    if user is not None:
        os.chmod(directory, 0o711)  # the user reaches its subdirectories, lists nothing
    return directory


async def _stop_on_signal(stop_serving: Callable[[], None]) -> None:
    import trio

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async for signal_number in signals:
            log.info("received %s: unmounting", signal.Signals(signal_number).name)
            _notify_systemd("STOPPING=1")
            stop_serving()
            return


def _fuse_options(options: MountOptions) -> set[str]:
    import pyfuse3

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
