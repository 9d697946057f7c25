"""The unprivileged user a root daemon reads its source as.

Mounting needs root (or the setuid fusermount3); reading a source does not.
A daemon started as root therefore reads everything that comes from the
source with the rights of one user: the owner of SOURCE, or ``--user``.
Every process that reads what comes from the source (serving processes, the
zygote, decoder workers) becomes that user entirely (real, effective and saved
ids, and its groups) and sets ``no_new_privs`` before it opens anything
(:func:`drop_privileges`); only the supervisor keeps root, and it opens
nothing of the source (see :mod:`cutfs.vfs.daemon.supervisor`).

A source owned by root is read as root (it is the administrator's own), by
processes that keep root's ids but drop every capability, unless ``--user``
names someone else; a source that users besides its owner can write
(a group- or world-writable directory, like ``/tmp``) is refused unless ``--user``
says whom to read it as.  A command never runs in a process that has root in
any of its ids (see :mod:`cutfs.codec.trust.source_policy`).  See "Security model"
in docs/operations.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import grp
import logging
import os
import pwd
import signal
import stat
from dataclasses import dataclass
from multiprocessing import resource_tracker
from pathlib import Path
from typing import Any

from cutfs.codec.trust.command_runner import kill_group

log = logging.getLogger("cutfs.serving_user")

#: The exit status of a killing child that failed without an errno (errnos are below it).
_KILL_CHILD_FAILED = 255


class ServingUserError(Exception):
    """``--user`` names no user, or a user was asked for without root."""


@dataclass(frozen=True, slots=True)
class ServingUser:
    """A user and its groups, as the daemon's workers and reads run."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]

    @classmethod
    def named(cls, name: str) -> ServingUser:
        """The user called ``name`` (or with that number)."""
        try:
            entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
        except (KeyError, ValueError):
            raise ServingUserError(f"no such user: {name!r}") from None
        return cls._of(entry)

    @classmethod
    def owner_of(cls, path: str) -> ServingUser:
        """The user that owns ``path`` itself, a link not followed (a numeric user with no
        entry keeps its own group)."""
        status = os.lstat(path)
        try:
            return cls._of(pwd.getpwuid(status.st_uid))
        except KeyError:
            return cls(str(status.st_uid), status.st_uid, status.st_gid, (status.st_gid,))

    @classmethod
    def _of(cls, entry: pwd.struct_passwd) -> ServingUser:
        groups = os.getgrouplist(entry.pw_name, entry.pw_gid)
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, tuple(sorted(set(groups))))

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    def become(self) -> None:
        """Become this user for good (a serving process or a decoder worker, before it
        opens anything): real, effective and saved ids and groups, which leaves the
        process no capability.  Nothing to do in a process that is this user already
        (a decoder worker started by a serving process); else it needs root.
        """
        if self.is_current():
            return
        preload_modules()
        os.setgroups(list(self.groups))
        os.setresgid(self.gid, self.gid, self.gid)
        os.setresuid(self.uid, self.uid, self.uid)

    def is_current(self) -> bool:
        """Whether this process is this user in every id (and has its groups)."""
        return (
            os.getresuid() == (self.uid,) * 3
            and os.getresgid() == (self.gid,) * 3
            and set(os.getgroups()) <= set(self.groups)
        )

    def kill_group(self, group: int) -> bool:
        """SIGKILL process group ``group`` from a child process with only this user's ids
        (see :func:`kill_command_group`); waits for that child.  False: no such group.

        Raises :class:`OSError` with the child's errno when it could not take the user's
        ids or send the signal.
        """
        child = os.fork()
        if child == 0:  # nothing here logs or takes a lock another thread may hold
            status = _KILL_CHILD_FAILED
            try:
                os.setresgid(self.gid, self.gid, self.gid)
                os.setresuid(self.uid, self.uid, self.uid)
                os.killpg(group, signal.SIGKILL)
                status = 0
            except OSError as exc:
                code = exc.errno or 0
                status = code if 0 < code < _KILL_CHILD_FAILED else status
            finally:
                os._exit(status)
        _, wait_status = os.waitpid(child, 0)
        code = os.waitstatus_to_exitcode(wait_status)
        if code == errno.ESRCH:
            return False
        if code != 0:
            reason = os.strerror(code) if 0 < code < _KILL_CHILD_FAILED else f"status {code}"
            raise OSError(code, f"the killing process as {self.name} failed: {reason}")
        return True

    def describe(self) -> str:
        try:
            group = grp.getgrgid(self.gid).gr_name
        except KeyError:
            group = str(self.gid)
        return f"{self.name} (uid {self.uid}, group {group})"


def preload_modules() -> None:
    """Import, while still root, what serving imports lazily.

    Once a process is the serving user, it may not be able to read Python's
    own files (an interpreter installed under root's home directory is the
    common case): everything it will import must be imported before.
    """
    import datetime  # noqa: F401, PLC0415 - pandas' C code imports it by name
    import decimal  # noqa: F401, PLC0415

    import pyarrow as pa  # noqa: PLC0415

    import cutfs.codec.opener  # noqa: F401, PLC0415 - imports every kind of library

    with contextlib.suppress(ImportError):
        import pandas  # noqa: F401, PLC0415 - pyarrow imports it on first use when installed
    pa.schema([("preload", pa.int8())]).empty_table()


def drop_privileges(user: ServingUser | None) -> None:
    """Make this process one that may never gain a privilege: ``user`` in every id (see
    :meth:`ServingUser.become`; ``None``: it stays who it is, and if that is root it loses
    every capability), and ``no_new_privs``, so
    that nothing it starts gains rights by executing a setuid program or a file with
    capabilities.  Every process that reads what a source holds calls it first.

    It also leaves the resource tracker of whoever spawned it: ``multiprocessing``
    hands every process it spawns a pipe to that tracker, a process of root's in a
    mount, which acts on the lines it reads (it unlinks what they name at exit).  If
    the process ever needs a tracker, ``multiprocessing`` starts one of its own."""
    _leave_resource_tracker()
    if user is not None:
        user.become()
    elif os.geteuid() == 0:
        _drop_capabilities()
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot set no_new_privs")


def _drop_capabilities() -> None:
    """Leave a process that stays root (it reads root's own source) with no capability:
    none in its bounding set (so that executing a program gives none back, root's rule),
    none ambient, permitted, effective or inheritable.  It keeps what root owns (root's
    files, by their owner bits) and loses the rest: other users' files, signalling or
    tracing their processes, the kernel's privileged calls."""
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for capability in range(last + 1):
        if _libc.prctl(_PR_CAPBSET_READ, capability, 0, 0, 0) == 0:
            continue  # dropped already (a decoder forked from a process without any)
        if _libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"cannot drop capability {capability}")
    if _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot clear the ambient capabilities")
    header = _CapabilityHeader(_CAPABILITY_VERSION_3, 0)
    nothing = (_CapabilityData * 2)()
    if _libc.capset(ctypes.byref(header), nothing) != 0:
        raise OSError(ctypes.get_errno(), "cannot drop the capabilities")


class _CapabilityHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapabilityData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


_CAPABILITY_VERSION_3 = 0x20080522
_PR_CAPBSET_READ = 23
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4


def _leave_resource_tracker() -> None:
    tracker: Any = resource_tracker._resource_tracker  # no public way to leave it
    if tracker._fd is not None:
        os.close(tracker._fd)
        tracker._fd = None
        tracker._pid = None


_PR_SET_NO_NEW_PRIVS = 38
_libc = ctypes.CDLL(None, use_errno=True)


def kill_command_group(user: ServingUser | None, group: int) -> None:
    """Kill the process group of a command that a decoder announced it started, once the
    decoder is gone (the command would outlive it).

    The number comes from a process that parses other people's media, so it is not
    trusted: it could name any group on the machine.  The supervisor, which calls this
    for decoders that died, is root and may signal any process; so the signal is sent
    from a short-lived process with only ``user``'s ids, which can reach nothing that the
    decoder (running as ``user``) could not kill itself.  Without a serving user, a
    process that is not root signals directly (its decoders are itself); one that is root
    signals nothing, since commands never run as root and a number named then can only
    be forged.  Group numbers below 2, and the caller's own group, are never signalled.
    """
    if group < 2 or group == os.getpgrp():
        return
    if user is None and os.geteuid() == 0:
        log.warning("ignored the process group %d a decoder named: no command runs as root", group)
        return
    try:
        killed = kill_group(group) if user is None else user.kill_group(group)
    except OSError as exc:
        log.warning("cannot kill the process group %d of a command: %s", group, exc)
        return
    if killed:
        log.info("killed the process group %d of a command its decoder left", group)


def serving_user(requested: str | None, source: str | None) -> ServingUser | None:
    """Whom a daemon started by this process reads ``source`` as; ``None``: as itself.

    Root reads as ``requested``, else as the owner of ``source`` unless that
    is root (a source with no owner, ``None``, such as object storage: as
    root).  Anyone else reads as itself, and may not ask for another user.
    """
    if os.geteuid() != 0:
        if requested is not None:
            raise ServingUserError("--user needs the daemon to be started as root")
        return None
    if requested is not None:
        user = ServingUser.named(requested)
        return None if user.is_root else user
    if source is None:
        return None
    user = ServingUser.owner_of(source)
    writers = _other_writers(source)
    if writers:
        raise ServingUserError(
            f"{source} {writers}, so its owner is not the only one who decides what it holds: "
            "say whom to read it as with --user (--user root to read it as root)"
        )
    return None if user.is_root else user


def _other_writers(source: str) -> str:
    """Why users besides the owner may change what ``source`` holds ('' if they cannot)."""
    status = os.lstat(source)
    directory = source if stat.S_ISDIR(status.st_mode) else os.path.dirname(source)
    for path in dict.fromkeys([source, directory]):
        mode = os.lstat(path).st_mode
        if mode & (stat.S_IWGRP | stat.S_IWOTH):
            where = "is" if path == source else f"lies in {path}, which is"
            return f"{where} writable by its group or others"
    return ""
