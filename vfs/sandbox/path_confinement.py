"""Landlock: the paths a process that parses other people's data may open.

The system call filter (:mod:`cutfs.vfs.sandbox.syscall_filter`) takes away
programs, the network and the kernel's larger surfaces; it cannot say which
files may be opened.  Landlock can, for an unprivileged process and everything
it forks: after :meth:`PathConfinement.install`, the kernel refuses
(``EACCES``) to open a file or list a directory outside the readable roots, and
to create, write, truncate, rename or remove anything outside the writable
ones.  A decoder taken over by crafted media then cannot plant a file in its
user's home (a ``.bashrc`` run at their next login), overwrite the source,
read the user's keys or the other sources the user can read; it reads what the
mount serves and writes only the mount's cache.

Descriptors opened before (the shards' maps, the mount's device, the request
slot) keep working: Landlock checks opens, not descriptors.  The kernel has
Landlock since 5.13; where it is missing or disabled nothing is confined, and
:meth:`install` says so (the seccomp filter still applies).  The rules are of
Landlock's first three ABI versions (reads and writes of files and
directories, links and renames across directories, truncation).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import stat
import struct
import sys
from dataclasses import dataclass
from typing import Final

log = logging.getLogger("cutfs.path_confinement")

_CREATE_RULESET: Final = 444
_ADD_RULE: Final = 445
_RESTRICT_SELF: Final = 446
_CREATE_RULESET_VERSION: Final = 1
_RULE_PATH_BENEATH: Final = 1

# The access rights of files and directories (linux/landlock.h).
_EXECUTE: Final = 1 << 0
_WRITE_FILE: Final = 1 << 1
_READ_FILE: Final = 1 << 2
_READ_DIR: Final = 1 << 3
_REMOVE_DIR: Final = 1 << 4
_REMOVE_FILE: Final = 1 << 5
_MAKE_CHAR: Final = 1 << 6
_MAKE_DIR: Final = 1 << 7
_MAKE_REG: Final = 1 << 8
_MAKE_SOCK: Final = 1 << 9
_MAKE_FIFO: Final = 1 << 10
_MAKE_BLOCK: Final = 1 << 11
_MAKE_SYM: Final = 1 << 12
_REFER: Final = 1 << 13  # ABI 2
_TRUNCATE: Final = 1 << 14  # ABI 3

#: The rights a rule on a file (not a directory) may grant.
_FILE_RIGHTS: Final = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE
_READ: Final = _READ_FILE | _READ_DIR
_WRITE: Final = (
    _WRITE_FILE
    | _REMOVE_DIR
    | _REMOVE_FILE
    | _MAKE_DIR
    | _MAKE_REG
    | _MAKE_SOCK
    | _MAKE_FIFO
    | _MAKE_SYM
)
#: What is handled, by ABI version: anything handled and not allowed by a rule is refused.
_HANDLED_BY_ABI: Final = {
    1: _EXECUTE | _READ | _WRITE | _MAKE_CHAR | _MAKE_BLOCK,
    2: _EXECUTE | _READ | _WRITE | _MAKE_CHAR | _MAKE_BLOCK | _REFER,
    3: _EXECUTE | _READ | _WRITE | _MAKE_CHAR | _MAKE_BLOCK | _REFER | _TRUNCATE,
}
#: Where a process of ours reads what is not data: the system's libraries and
#: settings (CA certificates, time zones), and the kernel's views of itself.
SYSTEM_READABLE: Final = ("/usr", "/lib", "/lib64", "/etc", "/proc", "/sys")

_RULESET_ATTRIBUTE: Final = struct.Struct("=Q")  # handled_access_fs (ABI 1-3)
_PATH_BENEATH: Final = struct.Struct("=Qi")  # allowed_access, parent_fd (packed)
_PR_SET_NO_NEW_PRIVS: Final = 38

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def landlock_version() -> int:
    """The Landlock ABI version the kernel offers; 0 where it has none (or it is off)."""
    version = _libc.syscall(
        ctypes.c_long(_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint(1)
    )
    return max(0, int(version))


@dataclass(frozen=True)
class PathConfinement:
    """The roots beneath which a process may read, and those beneath which it may also
    create, write and remove (absolute paths; those that do not exist are left out)."""

    readable: tuple[str, ...]
    writable: tuple[str, ...] = ()

    @classmethod
    def for_data(
        cls, data_roots: tuple[str, ...] | None, writable: tuple[str, ...]
    ) -> PathConfinement:
        """What a process that parses data needs: ``data_roots`` (``None``: every path,
        read only), ``writable``, Python's own files (the interpreter, its library and
        every entry of ``sys.path``, which the clean start keeps to root's places; cutfs's
        own packages) and
        :data:`SYSTEM_READABLE`; ``/dev`` may be read and written (``/dev/null``,
        ``/dev/shm``), never have devices made in it."""
        if data_roots is None:
            return cls(("/",), (*writable, "/dev"))
        python = (sys.prefix, sys.base_prefix, sys.exec_prefix, *sys.path, *_our_packages())
        readable = (*data_roots, *python, *SYSTEM_READABLE)
        return cls(readable, (*writable, "/dev"))

    def describe(self) -> str:
        """The roots, for the log: readable ones, then writable ones."""
        return f"read {', '.join(self.readable)}; write {', '.join(self.writable)}"

    def install(self) -> bool:
        """Confine this process and what it starts from now on; False (logged) where the
        kernel has no Landlock.  The process must have ``no_new_privs`` set.  Raises
        OSError if the kernel refuses a rule or the confinement."""
        version = landlock_version()
        if version == 0:
            log.warning("the kernel has no Landlock: paths are not confined")
            return False
        handled = _HANDLED_BY_ABI[min(version, 3)]
        attribute = ctypes.create_string_buffer(_RULESET_ATTRIBUTE.pack(handled))
        ruleset = _libc.syscall(
            ctypes.c_long(_CREATE_RULESET),
            attribute,
            ctypes.c_size_t(_RULESET_ATTRIBUTE.size),
            ctypes.c_uint(0),
        )
        if ruleset < 0:
            raise _error("create a Landlock ruleset")
        try:
            for path, access in self._rules(handled).items():
                _add_rule(int(ruleset), path, access)
            if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                raise _error("set no_new_privs")
            if _libc.syscall(ctypes.c_long(_RESTRICT_SELF), ctypes.c_int(ruleset), 0) != 0:
                raise _error("confine this process with Landlock")
        finally:
            os.close(int(ruleset))
        return True

    def _rules(self, handled: int) -> dict[str, int]:
        """Each existing path (resolved) and the rights granted beneath it."""
        rules: dict[str, int] = {}
        granted = (
            (self.readable, _READ),
            (self.writable, _READ | _WRITE | _REFER | _TRUNCATE),
        )
        for paths, access in granted:
            for path in paths:
                if not os.path.isabs(path) or not os.path.exists(path):
                    continue
                resolved = os.path.realpath(path)
                rules[resolved] = rules.get(resolved, 0) | (access & handled)
        return rules


def _our_packages() -> tuple[str, ...]:
    """Where cutfs's own packages lie, links resolved (an editable install finds them
    through an import hook, not ``sys.path``)."""
    import cutfs  # noqa: PLC0415 - the package that holds this module
    import cutfs.codec  # noqa: PLC0415
    import cutfs.vfs  # noqa: PLC0415

    packages = (cutfs, cutfs.codec, cutfs.vfs)
    return tuple(os.path.realpath(path) for package in packages for path in package.__path__)


def _add_rule(ruleset: int, path: str, access: int) -> None:
    """Allow ``access`` beneath ``path`` (only a file's own rights, if it is a file)."""
    try:
        descriptor = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        log.warning("cannot open %s for a Landlock rule: %s", path, exc.strerror)
        return
    try:
        if not stat.S_ISDIR(os.fstat(descriptor).st_mode):
            access &= _FILE_RIGHTS
        rule = ctypes.create_string_buffer(_PATH_BENEATH.pack(access, descriptor))
        result = _libc.syscall(
            ctypes.c_long(_ADD_RULE),
            ctypes.c_int(ruleset),
            ctypes.c_uint(_RULE_PATH_BENEATH),
            rule,
            ctypes.c_uint(0),
        )
        if result != 0:
            raise _error(f"allow {path} in a Landlock ruleset")
    finally:
        os.close(descriptor)


def _error(what: str) -> OSError:
    code = ctypes.get_errno() or errno.EINVAL
    return OSError(code, f"cannot {what}: {os.strerror(code)}")
