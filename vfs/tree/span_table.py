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
import fcntl
import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import numpy as np

from cutfs.vfs.fuse.fs_error import FsError

#: Ranges held at once by default (about 200 bytes each).
DEFAULT_CAPACITY: Final = 100_000
#: The share of the capacity one user may hold.
_SHARE_PER_USER: Final = 4
#: Serial numbers of :class:`SharedSpanTable` slots wrap here (inodes stay below 2**48).
_SERIALS: Final = 1 << 24

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


_RECORD = np.dtype(
    [
        ("recording", "<i8"),
        ("first", "<i8"),
        ("end", "<i8"),
        ("references", "<i8"),
        ("owner", "<i8"),
        ("serial", "<i8"),
    ]
)
_HEADER_BYTES: Final = 64  # the next serial number, then room


class SharedSpanTable:
    """The same table, shared by the processes that serve one mount.

    A range looked up through one serving process may be opened and read
    through any other, so they must agree on its inode.  The table is a file
    of fixed-size records, mapped by every process and changed under an
    exclusive ``flock`` (lookups and forgets of time ranges are rare next to
    reads).  A slot is reused once free; its inode carries a serial number,
    so an inode of a range that is gone never names the next range of its
    slot.  Behaviour, capacity and per-user shares are those of
    :class:`SpanTable`.
    """

    def __init__(self, path: str, base: int, capacity: int = DEFAULT_CAPACITY) -> None:
        """Open the table at ``path``, which :meth:`create` made."""
        self._base = base
        self._capacity = capacity
        self._slot_bits = capacity.bit_length()
        self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        size = _HEADER_BYTES + capacity * _RECORD.itemsize
        if os.fstat(self._fd).st_size != size:
            os.close(self._fd)
            raise ValueError(f"{path} is not a table of {capacity} time ranges")
        self._map = mmap.mmap(self._fd, size)
        self._header = np.frombuffer(self._map, dtype="<i8", count=1)
        self._records = np.frombuffer(self._map, dtype=_RECORD, offset=_HEADER_BYTES)

    @staticmethod
    def create(path: str, capacity: int = DEFAULT_CAPACITY) -> None:
        """Make an empty table file (mode 0600) at ``path``, which must not exist."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, _HEADER_BYTES + capacity * _RECORD.itemsize)
        finally:
            os.close(fd)

    def close(self) -> None:
        del self._header, self._records
        self._map.close()
        os.close(self._fd)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def __len__(self) -> int:
        return int(np.count_nonzero(self._records["references"] > 0))

    def acquire(self, span: _Span, user: int = 0) -> int:
        """The inode of ``span``, with one more kernel reference (a lookup reply by ``user``)."""
        records = self._records
        with self._locked():
            live = records["references"] > 0
            same = np.flatnonzero(
                live
                & (records["recording"] == span[0])
                & (records["first"] == span[1])
                & (records["end"] == span[2])
            )
            slot = int(same[0]) if len(same) else self._new_slot(span, user, live)
            records["references"][slot] += 1
            return self._base + (int(records["serial"][slot]) << self._slot_bits | slot)

    def _new_slot(self, span: _Span, user: int, live: np.ndarray) -> int:
        in_use = int(np.count_nonzero(live))
        if in_use >= self._capacity:
            raise FsError(
                errno.ENFILE,
                f"{self._capacity} time ranges are in use: the kernel must forget some",
            )
        held = int(np.count_nonzero(live & (self._records["owner"] == user)))
        if held >= self._capacity // _SHARE_PER_USER:
            raise FsError(
                errno.ENFILE,
                f"uid {user} holds {held} time ranges, its share of {self._capacity}: "
                "the kernel must forget some",
            )
        slot = int(np.flatnonzero(~live)[0])
        serial = int(self._header[0]) % _SERIALS
        self._header[0] = serial + 1
        self._records[slot] = (span[0], span[1], span[2], 0, user, serial)
        return slot

    def _slot(self, inode: int) -> int | None:
        """The slot ``inode`` names, if its range is still there."""
        offset = inode - self._base
        slot, serial = offset & ((1 << self._slot_bits) - 1), offset >> self._slot_bits
        if offset < 0 or slot >= self._capacity:
            return None
        record = self._records[slot]
        if record["references"] <= 0 or record["serial"] != serial:
            return None
        return slot

    def get(self, inode: int) -> _Span | None:
        with self._locked():
            slot = self._slot(inode)
            if slot is None:
                return None
            record = self._records[slot]
            return int(record["recording"]), int(record["first"]), int(record["end"])

    def forget(self, inode: int, references: int) -> None:
        """The kernel dropped ``references`` of ``inode``; at none left it is removed."""
        with self._locked():
            slot = self._slot(inode)
            if slot is not None:
                left = int(self._records["references"][slot]) - references
                self._records["references"][slot] = max(left, 0)
