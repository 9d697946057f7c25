"""What a source served in place may make cutfs read and run.

A mount serves sources that other people wrote, often from a daemon started
as root.  The policy confines what their contents can reach:

* **Files** are read only beneath the allowed roots: the source itself (its
  directory, or the directory of a manifest file) and the roots an
  administrator adds (``--allow-root``), plus the mount's own index cache.
  A path is checked when the catalogue is built and again on every open,
  on the file actually opened (``/proc/self/fd``), so a link swapped in
  between cannot redirect a read.  Only regular files are opened, without
  blocking: a FIFO or a device is refused, not read.  A private mount (no
  ``allow_other``) by a daemon that is not root and reads its own source follows
  every path (:attr:`SourcePolicy.any_path`): it shows nobody else anything, and
  Lhotse keeps manifests apart from their audio.
* **Commands** (Kaldi ``cmd |`` lines, Lhotse ``command`` sources) never run
  unless allowed.  When allowed, the file that defines them must belong to
  the user the daemon runs as, be writable by nobody else, and not belong
  to root; the command runs as that user with the limits of
  :class:`cutfs.codec.trust.command_runner.CommandLimits`.
* **Objects** in object storage (Lhotse ``url`` sources) are fetched, with the
  daemon's credentials and endpoint, only beneath the prefixes an administrator
  allows (``--allow-objects s3://bucket/prefix/``); none by default.

``cutfs pack`` is an explicit action of the user who runs it and reads with
that user's rights: it uses :meth:`SourcePolicy.unrestricted`.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field, replace
from typing import Final

from cutfs.codec.errors import SourceError
from cutfs.codec.storage.object_location import split_object_url
from cutfs.codec.trust.command_runner import CommandLimits
from cutfs.codec.trust.limits import InputLimits

#: Default of ``--index-cache-size``.
DEFAULT_CACHE_QUOTA_BYTES: Final = 8 << 30


@dataclass(frozen=True, slots=True)
class SourcePolicy:
    """Roots that may be read and whether commands may run (see the module docstring).

    ``allowed_roots`` are resolved, absolute paths; an empty tuple with
    ``unrestricted`` set allows every path.
    """

    allowed_roots: tuple[str, ...] = ()
    allow_commands: bool = False
    command_limits: CommandLimits = field(default_factory=CommandLimits)
    unrestricted: bool = False
    #: The most bytes of audio copies (command output, Parquet rows, transcodes) a
    #: source may make the index cache hold.
    cache_quota_bytes: int = DEFAULT_CACHE_QUOTA_BYTES
    #: URL prefixes (``s3://bucket/prefix/``) under which objects may be fetched.
    allowed_objects: tuple[str, ...] = ()
    #: How much the source's text files may make cutfs read.
    input_limits: InputLimits = field(default_factory=InputLimits)
    #: Follow every path the reading user can read (``allowed_roots`` only say where the
    #: source is): a private mount by the source's owner, which shows nobody else
    #: anything that owner could not read already.  Commands and objects still need
    #: their own permission.
    any_path: bool = False

    @classmethod
    def for_source(
        cls,
        source: str,
        extra_roots: tuple[str, ...] = (),
        *,
        allow_commands: bool = False,
        command_limits: CommandLimits | None = None,
        cache_quota_bytes: int = DEFAULT_CACHE_QUOTA_BYTES,
        allowed_objects: tuple[str, ...] = (),
        input_limits: InputLimits | None = None,
        any_path: bool = False,
    ) -> SourcePolicy:
        """The default policy for serving ``source``: its own location and ``extra_roots``
        (and the objects beneath ``allowed_objects``); with ``any_path``, every path (see
        :attr:`any_path`)."""
        source = os.path.realpath(source)
        own = source if os.path.isdir(source) else os.path.dirname(source)
        roots = tuple(dict.fromkeys([own, *(os.path.realpath(r) for r in extra_roots)]))
        return cls(
            roots,
            allow_commands,
            command_limits or CommandLimits(),
            False,
            cache_quota_bytes,
            tuple(allowed_objects),
            input_limits or InputLimits(),
            any_path,
        )

    @classmethod
    def everything(cls, command_limits: CommandLimits | None = None) -> SourcePolicy:
        """Read anything and run commands (``cutfs pack``, run by the user it serves)."""
        return cls((), True, command_limits or CommandLimits(), unrestricted=True)

    def with_root(self, root: str) -> SourcePolicy:
        """This policy, also allowing ``root`` (the index cache of the mount)."""
        roots = tuple(dict.fromkeys([*self.allowed_roots, os.path.realpath(root)]))
        return replace(self, allowed_roots=roots)

    def is_allowed(self, path: str) -> bool:
        """Whether ``path``, links resolved, lies beneath an allowed root."""
        if self.unrestricted or self.any_path:
            return True
        resolved = os.path.realpath(path)
        return any(_beneath(resolved, root) for root in self.allowed_roots)

    def check_file(self, path: str, where: str) -> None:
        """Raise :class:`SourceError` unless ``path`` is a regular file beneath an allowed root."""
        if not self.is_allowed(path):
            raise SourceError(
                f"{path} lies outside the source and the allowed roots "
                f"({', '.join(self.allowed_roots)}); an administrator can allow it with "
                "--allow-root (a private mount by the source's owner, without --allow-other, "
                "follows it)",
                where=where,
            )
        try:
            status = os.stat(path)
        except OSError as exc:
            raise SourceError(f"cannot read {path}: {exc.strerror}", where=where) from exc
        if not stat.S_ISREG(status.st_mode):
            raise SourceError(f"{path} is not a regular file", where=where)

    def check_object(self, url: str, where: str) -> None:
        """Raise :class:`SourceError` unless ``url`` names an object beneath an allowed
        prefix (and carries no parameters: see :func:`split_object_url`)."""
        split_object_url(url)
        if self.unrestricted or any(url.startswith(prefix) for prefix in self.allowed_objects):
            return
        allowed = ", ".join(self.allowed_objects) or "none"
        raise SourceError(
            f"{url} is not beneath the object prefixes allowed ({allowed}); an administrator "
            "can allow it with --allow-objects",
            where=where,
        )

    def open_file(self, path: str) -> int:
        """A read-only descriptor of ``path``, checked on the file actually opened.

        Raises ``OSError`` (``EACCES`` outside the allowed roots, or for a process with
        root's rights, a file that another user owns or that its group or others can write;
        ``EINVAL`` for anything but a regular file); the open never blocks on a FIFO.
        """
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        try:
            status = os.fstat(descriptor)
            if not stat.S_ISREG(status.st_mode):
                raise OSError(errno.EINVAL, "not a regular file", path)
            if not self.unrestricted and os.geteuid() == 0 and _others_control(status):
                raise OSError(
                    errno.EACCES,
                    f"belongs to uid {status.st_uid} or is writable by its group or others: a "
                    "mount reading as root decodes only root's files (give it --user)",
                    path,
                )
            if not self.unrestricted and not self.any_path:
                opened = os.readlink(f"/proc/self/fd/{descriptor}")
                if not any(_beneath(opened, root) for root in self.allowed_roots):
                    raise OSError(errno.EACCES, "outside the allowed roots", path)
        except BaseException:
            os.close(descriptor)
            raise
        return descriptor

    def check_command_file(self, path: str, where: str) -> None:
        """Refuse a command unless commands are allowed and ``path`` (which defines it) is trusted.

        Trusted means: owned by the user this process runs as, that user is
        not root, and neither group nor others may write the file.
        """
        if not self.allow_commands:
            raise SourceError(
                "runs a command; commands from sources run only when the mount is given "
                "--allow-commands (see the security model in docs/operations.md)",
                where=where,
            )
        if self.unrestricted:
            return
        try:
            status = os.stat(path)
        except OSError as exc:
            raise SourceError(f"cannot check {path}: {exc.strerror}", where=where) from exc
        user = os.geteuid()
        if status.st_uid == 0 or user == 0:
            raise SourceError(
                f"commands never run as root: {path} belongs to uid {status.st_uid} and the "
                f"daemon runs as uid {user} (mount with --user, or chown the source)",
                where=where,
            )
        if status.st_uid != user:
            raise SourceError(
                f"{path} belongs to uid {status.st_uid}, not to the daemon's user {user}: "
                "its commands are not run",
                where=where,
            )
        if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise SourceError(
                f"{path} is writable by its group or others: its commands are not run",
                where=where,
            )


def check_may_run_commands_here(where: str) -> None:
    """Refuse to start a command from a process that holds root in any of its ids.

    A daemon serving as another user keeps root as its real and saved ids (to
    unmount); a shell started from it could take root back.  Commands run
    in decoder workers, which are that user entirely.
    """
    if 0 in os.getresuid() and os.geteuid() != 0:
        raise SourceError(
            "commands never run in a process that holds root in any of its ids (the daemon "
            "itself, with --workers 0): they run in decoder workers",
            where=where,
        )


def _beneath(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _others_control(status: os.stat_result) -> bool:
    """Whether a user besides root may have written the file: it is theirs, or writable by
    its group or others."""
    return status.st_uid != 0 or bool(status.st_mode & (stat.S_IWGRP | stat.S_IWOTH))
