"""Time-range files made on lookup, numbered while the kernel remembers them.

``recordings/<id>/<start>-<end>.wav`` names any range of a recording, so the
files cannot be numbered ahead.  Each range looked up gets an inode from
this table, and keeps it while the kernel holds a reference: every reply to
a lookup adds one, and the kernel's ``forget`` gives them back.  When the
last is given back the range leaves the table, so the table holds what the
kernel remembers, and never more than its capacity: past it, a new range is
refused (``ENFILE``) until the kernel forgets some (it does under memory
pressure, or at once with ``echo 2 > /proc/sys/vm/drop_caches``).  Each user
may hold at most a quarter of the capacity, so that one user looking up
ranges in a loop cannot take them all from the others.
"""

from __future__ import annotations

import errno
from typing import Final

from cutfs.vfs.fs_error import FsError

#: Ranges held at once by default (about 200 bytes each).
DEFAULT_CAPACITY: Final = 100_000
#: The share of the capacity one user may hold.
_SHARE_PER_USER: Final = 4

_Span = tuple[int, int, int]  # (recording, first frame, end frame)


class SpanTable:
    """Inodes of time ranges, from ``base`` up, counted by kernel references."""

    def __init__(self, base: int, capacity: int = DEFAULT_CAPACITY) -> None:
        self._base = base
        self._capacity = capacity
        self._next = base
        self._spans: dict[int, _Span] = {}
        self._inodes: dict[_Span, int] = {}
        self._references: dict[int, int] = {}
        self._owners: dict[int, int] = {}  # inode -> the user who looked it up first
        self._held: dict[int, int] = {}  # user -> ranges held

    def __len__(self) -> int:
        return len(self._spans)

    def acquire(self, span: _Span, user: int = 0) -> int:
        """The inode of ``span``, with one more kernel reference (a lookup reply by ``user``)."""
        inode = self._inodes.get(span)
        if inode is None:
            if len(self._spans) >= self._capacity:
                raise FsError(
                    errno.ENFILE,
                    f"{self._capacity} time ranges are in use: the kernel must forget some",
                )
            if self._held.get(user, 0) >= self._capacity // _SHARE_PER_USER:
                raise FsError(
                    errno.ENFILE,
                    f"uid {user} holds {self._held[user]} time ranges, its share of "
                    f"{self._capacity}: the kernel must forget some",
                )
            inode = self._next
            self._next += 1
            self._spans[inode] = span
            self._inodes[span] = inode
            self._references[inode] = 0
            self._owners[inode] = user
            self._held[user] = self._held.get(user, 0) + 1
        self._references[inode] += 1
        return inode

    def get(self, inode: int) -> _Span | None:
        return self._spans.get(inode)

    def forget(self, inode: int, references: int) -> None:
        """The kernel dropped ``references`` of ``inode``; at none left it is removed."""
        left = self._references.get(inode)
        if left is None:
            return
        left -= references
        if left > 0:
            self._references[inode] = left
            return
        span = self._spans.pop(inode)
        del self._inodes[span]
        del self._references[inode]
        owner = self._owners.pop(inode)
        self._held[owner] -= 1
        if not self._held[owner]:
            del self._held[owner]
