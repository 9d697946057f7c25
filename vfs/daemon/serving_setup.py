"""What the supervisor and its serving processes tell each other: the setup a serving
process starts from, its report on the source (a few checked bytes: the supervisor
unpickles nothing a serving process sends), and the places of the mount's shared
directory.

Kept apart from :mod:`cutfs.vfs.daemon.serving_process` so that the supervisor, which
never opens the source, imports none of what serving needs (pyarrow, av, numpy).
"""

from __future__ import annotations

import logging
import os
import re
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from cutfs.codec.trust.source_policy import SourcePolicy
    from cutfs.vfs.daemon.mount_options import MountOptions
    from cutfs.vfs.sandbox.serving_user import ServingUser

#: What a serving process says once it has its descriptor and serves: plain bytes (the
#: supervisor unpickles nothing a serving process sends).
READY: Final = b"ready"


@dataclass(frozen=True)
class ServingSetup:
    """What a serving process needs to open the mount's source (pickled to it)."""

    source: str
    mountpoint: str
    options: MountOptions
    cache_dir: str
    policy: SourcePolicy | None
    user: ServingUser | None
    #: The library identity the first serving process reported: a process that opens
    #: something else refuses to serve.  None for the first.
    identity: str | None
    #: Publishers of statistics: the supervisor (0) and the serving processes (1 to N).
    processes: int
    #: What the processes share: the time-range table, statistics and snapshots (see
    #: :func:`shared_spans_path`, :func:`shared_board_path`, :func:`shared_snapshots_path`),
    #: and the supervisor's figures (:func:`shared_supervisor_path`).
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


def shared_scratch_path(shared_dir: str) -> str:
    """The serving processes' temporary files (``tempfile``'s directory in them)."""
    return os.path.join(shared_dir, "scratch")


def users_shared_paths(shared_dir: str) -> tuple[str, str, str]:
    """The subdirectories of ``shared_dir`` the serving processes write, as the serving
    user: statistics, snapshots and scratch files."""
    return (
        shared_board_path(shared_dir),
        shared_snapshots_path(shared_dir),
        shared_scratch_path(shared_dir),
    )


def shared_supervisor_directory(shared_dir: str) -> str:
    """Root's directory of the supervisor's published figures (a directory, so that the
    serving processes may be confined to read it whatever file replaces the figures)."""
    return os.path.join(shared_dir, "supervisor")


def shared_supervisor_path(shared_dir: str) -> str:
    """The supervisor's published figures (root's file, in root's directory)."""
    return os.path.join(shared_supervisor_directory(shared_dir), "figures.json")


@dataclass(frozen=True)
class OpenedReport:
    """What a serving process reports once it opened the source and can serve."""

    recordings: int
    cuts: int
    #: The shard format of a packed source (0 for a source served in place).
    format_version: int
    #: The library's identity (:attr:`cutfs.codec.library.Library.identity`), hex digits.
    identity: str

    def encode(self) -> bytes:
        counts = _COUNTS.pack(self.recordings, self.cuts, self.format_version)
        return _OPENED + counts + self.identity.encode("ascii")

    @classmethod
    def decode(cls, message: bytes) -> OpenedReport:
        """The report in ``message``; ValueError unless it is one, counts in range."""
        if not message.startswith(_OPENED) or len(message) < len(_OPENED) + _COUNTS.size:
            raise ValueError("not a report of an opened source")
        recordings, cuts, format_version = _COUNTS.unpack_from(message, len(_OPENED))
        identity = message[len(_OPENED) + _COUNTS.size :]
        if not all(0 <= count < 1 << 62 for count in (recordings, cuts, format_version)):
            raise ValueError("a count out of range")
        if _IDENTITY.fullmatch(identity) is None:
            raise ValueError("an identity of other than 16 to 128 hex digits")
        return cls(recordings, cuts, format_version, identity.decode("ascii"))


@dataclass(frozen=True)
class FailedReport:
    """Why a serving process could not open the source, in one line."""

    #: Whether the source is at fault (missing, unreadable, inconsistent) rather than
    #: the process.
    at_source: bool
    message: str

    def encode(self) -> bytes:
        line = " ".join(self.message.split())[:_MOST_MESSAGE_CHARACTERS]
        return _FAILED + (b"s" if self.at_source else b"p") + line.encode("utf-8", "replace")

    @classmethod
    def decode(cls, message: bytes) -> FailedReport:
        """The report in ``message``, its text made printable; ValueError unless it is one."""
        if not message.startswith(_FAILED) or len(message) <= len(_FAILED):
            raise ValueError("not a report of a failure")
        kind = message[len(_FAILED) : len(_FAILED) + 1]
        text = message[len(_FAILED) + 1 :].decode("utf-8", "replace")
        shown = "".join(c if c.isprintable() else "?" for c in text)
        return cls(kind == b"s", shown[:_MOST_MESSAGE_CHARACTERS])


def decode_report(message: bytes) -> OpenedReport | FailedReport:
    """A serving process's report; ValueError for anything else."""
    if message.startswith(_FAILED):
        return FailedReport.decode(message)
    return OpenedReport.decode(message)


_OPENED: Final = b"opened:"
_FAILED: Final = b"failed:"
_COUNTS: Final = struct.Struct("<qqq")
_IDENTITY: Final = re.compile(rb"[0-9a-f]{16,128}")
_MOST_MESSAGE_CHARACTERS: Final = 1000
#: The longest message a serving process sends the supervisor.
MOST_MESSAGE_BYTES: Final = 4096
