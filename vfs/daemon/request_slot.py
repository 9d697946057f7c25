"""The request a serving process that decodes in turn is answering, for the daemon to see.

With ``--decode-in-turn`` each serving process answers one request at a time
and decodes it itself (see :meth:`DeviceChannel.serve_in_turn`).  The daemon
keeps the deadline for it, as it does for decoder workers: the process writes
the request it is answering into a :class:`RequestSlot`, a few bytes of memory
the two share, and the daemon, which holds a copy of the process's /dev/fuse
descriptor, reads the slot.  A process past the slot's deadline is killed and
its request answered ``EIO`` by the daemon; so is the request of a process that
died (a decoder crash), instead of the ``ECONNABORTED`` the kernel would give.

The slot holds the request's unique number, its inode, a deadline on the
system's monotonic clock (the same in every process), the time the process last ran its
loop (so that one stopped or hung between requests is replaced too), and the process group of
a source's command the request started, if any: the daemon kills that group
with a process it kills (the command would outlive it), with the serving
user's ids only, since the number comes from a process that parses others'
media (see :func:`~cutfs.vfs.sandbox.serving_user.kill_command_group`).  Writes are not atomic
as a whole: the daemon acts only on a request it saw past its deadline twice,
one watch interval apart, so a half-written slot is never acted on.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
import time
from typing import Final

#: unique, inode, deadline (monotonic seconds), a command's process group (0: none), the
#: process's last beat (monotonic seconds; 0: none yet)
#: How long a read may wait for its data unless told (``--read-timeout``): the deadline
#: a request gets, and a decode.
DEFAULT_READ_TIMEOUT_SECONDS: Final = 30.0

#: The "request" a process answers while it reads a cell ahead (see
#: :mod:`cutfs.vfs.fuse.read_ahead`): no request of the kernel's, so none to fail when
#: the process is killed past its deadline (the kernel numbers requests from 1 up).
READ_AHEAD_UNIQUE: Final = 1 << 63
_LAYOUT: Final = struct.Struct("<QQdqd")
_REQUEST: Final = struct.Struct("<QQd")
_UNIQUE: Final = struct.Struct("<Q")
_GROUP: Final = struct.Struct("<q")
_DEADLINE_OFFSET: Final = 16
_GROUP_OFFSET: Final = 24
_BEAT: Final = struct.Struct("<d")
_BEAT_OFFSET: Final = 32


class RequestSlot:
    """A few shared bytes: which request one serving process is answering, and until when.

    Made by the daemon (:meth:`create`), handed to the process as a descriptor
    (:meth:`descriptor`) and opened there (:meth:`open`).
    """

    def __init__(self, memory: mmap.mmap, descriptor: int | None = None) -> None:
        self._memory = memory
        self._descriptor = descriptor

    @classmethod
    def create(cls) -> RequestSlot:
        """A new slot, between requests; :attr:`descriptor` is what to send the process."""
        descriptor = os.memfd_create("cutfs-request", os.MFD_CLOEXEC)
        try:
            os.ftruncate(descriptor, _LAYOUT.size)
            return cls(mmap.mmap(descriptor, _LAYOUT.size), descriptor)
        except OSError:
            os.close(descriptor)
            raise

    @classmethod
    def open(cls, descriptor: int) -> RequestSlot:
        """The slot behind a descriptor the daemon sent (closed here: the mapping stays)."""
        try:
            return cls(mmap.mmap(descriptor, _LAYOUT.size))
        finally:
            os.close(descriptor)

    @property
    def descriptor(self) -> int:
        """The descriptor of the slot's memory, to send to the process (the slot's own)."""
        if self._descriptor is None:
            raise ValueError("only the slot the daemon created has a descriptor to send")
        return self._descriptor

    def begin(self, unique: int, inode: int, seconds: float) -> None:
        """The process answers request ``unique`` (about ``inode``) within ``seconds``."""
        # The deadline first: a reader that sees the new unique number sees its deadline.
        struct.pack_into("<d", self._memory, _DEADLINE_OFFSET, time.monotonic() + seconds)
        struct.pack_into("<QQ", self._memory, 0, unique, inode)

    def allow(self, seconds: float) -> None:
        """The current request may take ``seconds`` from now (indexing a recording)."""
        struct.pack_into("<d", self._memory, _DEADLINE_OFFSET, time.monotonic() + seconds)

    def command_started(self, group: int) -> None:
        """The current request started a command in process group ``group``."""
        _GROUP.pack_into(self._memory, _GROUP_OFFSET, group)

    def end(self) -> None:
        """The request is answered (and any command it started is over)."""
        _UNIQUE.pack_into(self._memory, 0, 0)
        _GROUP.pack_into(self._memory, _GROUP_OFFSET, 0)

    def beat(self) -> None:
        """The process runs: its loop writes this between requests, at least every second
        or so, so that a process stopped (SIGSTOP) or hung while it holds no request is
        seen by the daemon too."""
        _BEAT.pack_into(self._memory, _BEAT_OFFSET, time.monotonic())

    def silent_seconds(self) -> float:
        """How long since the process's last beat (0 before its first: still starting)."""
        (last,) = _BEAT.unpack_from(self._memory, _BEAT_OFFSET)
        if not math.isfinite(last) or last <= 0:
            return 0.0
        return max(time.monotonic() - float(last), 0.0)

    def command_group(self) -> int:
        """The process group of the command the current request started; 0 if none."""
        (group,) = _GROUP.unpack_from(self._memory, _GROUP_OFFSET)
        return int(group)

    def current(self) -> tuple[int, int, float] | None:
        """The request being answered, its inode and its deadline; None between requests."""
        unique, inode, deadline = _REQUEST.unpack_from(self._memory)
        if unique == 0 or not math.isfinite(deadline):
            return None
        return unique, inode, deadline

    def close(self) -> None:
        self._memory.close()
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None
