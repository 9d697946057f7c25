"""The unprivileged user a root daemon reads its source as.

Mounting needs root (or the setuid fusermount3); reading a source does not.
A daemon started as root therefore reads everything that comes from the
source with the rights of one user: the owner of SOURCE, or ``--user``.

* Decoder workers become that user entirely (real, effective and saved ids,
  and its groups) before they open anything: they parse media from other
  people, and nothing they do needs root.
* The daemon process itself switches only its *effective* ids to that user
  while it reads the source and while it serves; it keeps root as its saved
  id, which it takes back for the few things that need it (mounting, kernel
  tuning through sysfs, unmounting at exit).

A source owned by root is read as root (it is the administrator's own), unless
``--user`` names someone else; a source that users besides its owner can write
(a group- or world-writable directory, like ``/tmp``) is refused unless ``--user``
says whom to read it as.  A command never runs in a process that has root in
any of its ids (see :mod:`cutfs.codec.trust.source_policy`), so ``--workers 0`` (decoding
in the daemon, which keeps root to unmount) is refused for a serving user.  See
"Security model" in docs/operations.md.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import logging
import os
import pwd
import signal
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from cutfs.codec.trust.command_runner import kill_group

log = logging.getLogger("cutfs.serving_user")

#: Root's groups when the daemon started, given back with root.
_ROOT_GROUPS = tuple(os.getgroups())

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
        """Become this user for good (a decoder worker, before it opens anything).

        Needs root as the real or effective user (a worker started while the
        daemon acts as the user has root as its real id); afterwards no id of
        the process is root.
        """
        if os.geteuid() != 0 and os.getuid() == 0:
            os.seteuid(0)
        preload_modules()
        os.setgroups(list(self.groups))
        os.setresgid(self.gid, self.gid, self.gid)
        os.setresuid(self.uid, self.uid, self.uid)

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

    def act_as(self) -> None:
        """Switch the effective ids (and groups) to this user; :func:`act_as_root` undoes it."""
        os.setgroups(list(self.groups))
        os.setegid(self.gid)
        os.seteuid(self.uid)

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


def act_as_root() -> None:
    """Take root back as the effective user (the saved id must be root)."""
    os.seteuid(0)
    os.setegid(0)
    os.setgroups(list(_ROOT_GROUPS))


@contextmanager
def acting_as(user: ServingUser | None) -> Iterator[None]:
    """Run a block with ``user``'s effective ids (nothing changes for ``None``)."""
    if user is None:
        yield
        return
    preload_modules()
    user.act_as()
    try:
        yield
    finally:
        act_as_root()


@contextmanager
def as_root(user: ServingUser | None) -> Iterator[None]:
    """Run a block as root in a daemon that otherwise acts as ``user``."""
    if user is None:
        yield
        return
    act_as_root()
    try:
        yield
    finally:
        user.act_as()


def kill_command_group(user: ServingUser | None, group: int) -> None:
    """Kill the process group of a command that a decoder announced it started, once the
    decoder is gone (the command would outlive it).

    The number comes from a process that parses other people's media, so it is not
    trusted: it could name any group on the machine.  A daemon acting as ``user`` keeps
    root as its real id, and the kernel lets a process whose real id is root signal
    any of root's processes; so the signal is sent from a short-lived process with only
    ``user``'s ids, which can reach nothing that the decoder (running as ``user``)
    could not kill itself.  Without a serving user the decoders run as the daemon's own
    user and the signal is sent directly.  Group numbers below 2, and the daemon's own
    group, are never signalled.
    """
    if group < 2 or group == os.getpgrp():
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
