"""Long files read in order decoded ahead of their reader, by every serving process.

A reader that goes through a whole recording (``cat``, ``open().read()``, pyannote's
``Audio()(path)``) would otherwise have it decoded one span per cache miss, in turn,
on one core.  Instead the serving processes of a mount share a :class:`ReadAhead`
board, which the supervisor makes and hands to each of them as descriptors (nothing
is opened by name): a queue of *cells* to decode (a pipe of fixed-size jobs, each
written atomically), a table of the files being read in order, and the decoded cells
themselves, in shared memory.

**Cells and tripwires.**  Every file of two cells or more is cut into cells of
:data:`CELL_BYTES`, and the last page of each cell but the file's last is a
*tripwire*: pushes of a file's cached rest (:mod:`cutfs.vfs.fuse.page_pusher`) stop
before it, so a reader going on in order asks for it, and that request tells the
mount where the reader is, although the pages before it were never asked for.  The
process answering a tripwire posts jobs for the cells after it: one cell ahead the
first time, then twice as many at each tripwire passed in order, up to
``most_cells`` (``--read-ahead-cells``).

**Decoding ahead.**  A serving process with no request to answer takes a job, claims
a cell slot of the shared memory, decodes the cell (exactly its bytes: nothing past
it), copies it into the slot and pushes it into the kernel's page cache, where the
reader finds it.  So the cells ahead are decoded in parallel, by as many processes as
are idle.  A reader that catches up with the decoding (reading pages is faster than
any decoder) asks for pages of a cell being decoded: the process that gets the request
waits for the cell's slot to be filled by the other process, instead of decoding the
same frames again, and answers from the slot; where a cell was posted but nobody took
it yet, the process claims it and decodes it whole itself.  A cell's pages pushed
while the reader's request for some of them is in flight wait for that request, which
the slot answers: no process waits for another that waits for it.

**Bounds.**  A file gets jobs only as its tripwires are read: one cell ahead of a
tripwire read alone (a scattered reader crossing one), at most ``most_cells`` cells past
the last one read while they are read in order; a job is dropped when it is older than
:data:`JOB_SECONDS` or its reader has passed it, and the queue drops what does not
fit in its pipe.  The shared memory holds ``2 * most_cells + 2`` cells (40 MiB for the
default 4, 520 MiB for the most, 64), allocated when the board is made and sealed against
resizing; a slot is reused oldest first.  Everything a read decodes for the board (its
cell, a job it takes while it waits for one) ends by that read's own deadline.

**Trust.**  Only serving processes read and write the board (the supervisor makes it
and never reads it).  A job names an inode and a cell, checked against the file found
(nothing past its end is decoded); a slot is named by inode, the file's identity (an
inode of a time range may name another range later), cell and a generation number,
taken and filled under a lock (``lockf``, tried for at most 50 ms: a stopped holder
must not stop the others), and its bytes are what a read of them returns: the serving
processes trust each other's decodes as they trust their own.  Numbers read from the
board are bounded before use (a filler's process id, the generation).  A slot being
filled by a process that is gone (killed, crashed) is taken back at once, one filled
for longer than :data:`STALE_SECONDS` (a hung filler) too; a reader waits for a slot at
most half the time its read has left, then decodes the bytes itself.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import struct
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final

#: The unit of read-ahead, in bytes of a file (131 s of 16 kHz mono 16-bit audio).
CELL_BYTES: Final = 4 << 20
#: Files shorter than this (two cells: every cut) are not read ahead.
SHORTEST_FILE_BYTES: Final = 2 * CELL_BYTES
#: The kernel's page: a tripwire is the last one of a cell.
PAGE_BYTES: Final = 4096
#: Cells decoded ahead of the last tripwire a reader passed, at most, unless told.
MOST_CELLS_AHEAD: Final = 4
#: A job not taken within this long is dropped (its reader has gone on or stopped).
JOB_SECONDS: Final = 5.0
#: A slot being filled for this long is taken back (its process died or hangs).
STALE_SECONDS: Final = 60.0
#: Files followed at once (a slot each, by inode; a clash only costs a restart).
_STREAMS: Final = 1024
_JOB: Final = struct.Struct("<QQd")  # inode, cell, monotonic seconds when posted
#: A file followed: inode, the last cell whose tripwire was read, how many were read in
#: order, the last cell posted.
_STREAM: Final = struct.Struct("<Qqqq")
#: A cell slot: inode, cell, state, the process filling it, generation, bytes held,
#: monotonic seconds of the last change, and the identity of the file the inode named
#: (inodes of time ranges are reused once the kernel forgets them).
_SLOT: Final = struct.Struct("<QqIIQQdQ")
#: Process ids are below this (the kernel's ``pid_max`` at most); a filler outside is
#: not one.
_PID_LIMIT: Final = 1 << 22
#: How long a process tries for the board's lock before it does without the board.
_LOCK_SECONDS: Final = 0.05
_EMPTY, _FILLING, _READY = 0, 1, 2


@dataclass(frozen=True)
class Job:
    """Decode cell ``cell`` of the file ``inode`` and push it into the page cache."""

    inode: int
    cell: int


@dataclass(frozen=True)
class CellFile:
    """The file a cell belongs to: its inode, its size and an identity that tells it from
    another file the same inode may name later (see :meth:`Operations.read_ahead_file`)."""

    inode: int
    size_bytes: int
    identity: int


@dataclass(frozen=True)
class Claim:
    """A cell slot this process fills (see :meth:`ReadAhead.claim`)."""

    slot: int
    generation: int
    file: CellFile
    cell: int


class Waiting:
    """What :meth:`ReadAhead.cell_read` returns while another process fills the cell."""


WAITING: Final = Waiting()


class ReadAhead:
    """One process's view of its mount's read-ahead board (see the module docstring).

    The supervisor :meth:`create`\\ s the board and sends its :attr:`descriptors` to each
    serving process, which :meth:`adopt`\\ s them.
    """

    def __init__(self, descriptors: Sequence[int], most_cells: int) -> None:
        self._jobs_read, self._jobs_write, self._memory_fd = descriptors
        self._most_cells = most_cells
        self._cells = _cell_slots(most_cells)
        self._map = mmap.mmap(self._memory_fd, _memory_bytes(most_cells))
        self._slots_at = _STREAMS * _STREAM.size
        self._data_at = self._slots_at + self._cells * _SLOT.size
        #: Jobs posted, taken, and dropped (the queue full, expired, or passed by their
        #: reader), for the statistics (``read_ahead.jobs_*``).
        self.counts = {"posted": 0, "taken": 0, "dropped": 0}

    @classmethod
    def create(cls, most_cells: int) -> ReadAhead:
        """A new, empty board (the supervisor's, once per mount)."""
        jobs_read, jobs_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        memory = os.memfd_create("cutfs-read-ahead", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            # Allocated now, not under the lock at the first fill; sealed, so that no
            # serving process can shrink it under the others' maps (SIGBUS).
            os.posix_fallocate(memory, 0, _memory_bytes(most_cells))
            seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
            fcntl.fcntl(memory, fcntl.F_ADD_SEALS, seals)
            return cls((jobs_read, jobs_write, memory), most_cells)
        except BaseException:
            for fd in (jobs_read, jobs_write, memory):
                os.close(fd)
            raise

    @classmethod
    def adopt(cls, descriptors: Sequence[int], most_cells: int) -> ReadAhead:
        """The board behind the descriptors the supervisor sent (this process's now)."""
        if len(descriptors) != 3:
            raise ValueError(f"a read-ahead board is 3 descriptors, not {len(descriptors)}")
        return cls(descriptors, most_cells)

    @property
    def descriptors(self) -> list[int]:
        """What to send a serving process: the job queue's two ends and the memory."""
        return [self._jobs_read, self._jobs_write, self._memory_fd]

    def fileno(self) -> int:
        """The queue's descriptor, readable when a job may be waiting."""
        return self._jobs_read

    def close(self) -> None:
        self._map.close()
        for fd in self.descriptors:
            os.close(fd)

    # -- where pushes stop, and which reads are tripwires --------------------------------

    @staticmethod
    def push_end(offset: int, size_bytes: int) -> int:
        """Where a push of a file of ``size_bytes`` starting at ``offset`` must stop: before
        the next tripwire (the file's end when it has none)."""
        if size_bytes < SHORTEST_FILE_BYTES:
            return size_bytes
        tripwire = (offset // CELL_BYTES + 1) * CELL_BYTES - PAGE_BYTES
        if offset > tripwire:  # within the tripwire page: the next one
            tripwire += CELL_BYTES
        return tripwire if tripwire + PAGE_BYTES < size_bytes else size_bytes

    @staticmethod
    def is_tripwire(offset: int, size_bytes: int) -> bool:
        """Whether a read at ``offset`` starts on a tripwire (it needs no decode ahead)."""
        return (
            size_bytes >= SHORTEST_FILE_BYTES
            and offset % CELL_BYTES == CELL_BYTES - PAGE_BYTES
            and offset + PAGE_BYTES < size_bytes
        )

    @staticmethod
    def cell_span(cell: int, size_bytes: int) -> tuple[int, int]:
        """The bytes ``[start, end)`` of ``cell`` that it pushes and its slot holds: the
        cell but its tripwire (all of it for the file's last cell); empty past the end."""
        start = min(cell * CELL_BYTES, size_bytes)
        return start, ReadAhead.push_end(start, size_bytes) if start < size_bytes else start

    @staticmethod
    def cell_of(offset: int, size: int, size_bytes: int) -> int | None:
        """The cell whose slot may answer a read of ``[offset, offset + size)``: the one it
        lies in, tripwires excluded; None for a short file or a read across cells."""
        if size_bytes < SHORTEST_FILE_BYTES or size <= 0:
            return None
        cell = offset // CELL_BYTES
        start, end = ReadAhead.cell_span(cell, size_bytes)
        return cell if start <= offset and offset + size <= end else None

    # -- jobs ------------------------------------------------------------------------------

    def on_read(self, inode: int, offset: int, size: int, size_bytes: int) -> None:
        """A read of ``[offset, offset + size)`` was answered: post the jobs its tripwires
        call for."""
        if size_bytes < SHORTEST_FILE_BYTES or size <= 0:
            return
        end = min(offset + size, size_bytes)
        for cell in range(offset // CELL_BYTES, (end - 1) // CELL_BYTES + 1):
            tripwire = (cell + 1) * CELL_BYTES - PAGE_BYTES
            touched = offset < tripwire + PAGE_BYTES and tripwire < end
            if touched and tripwire + PAGE_BYTES < size_bytes:
                self._tripped(inode, cell, (size_bytes - 1) // CELL_BYTES)

    def is_posted(self, inode: int, cell: int) -> bool:
        """Whether ``cell`` of ``inode`` is one of the cells posted ahead of its reader's
        last tripwire (its job taken or not); not a cell behind it, which a scattered
        reader may ask for long after."""
        followed, tripped, _, posted = self._stream(inode)
        return followed == inode and tripped < cell <= posted

    def take(self) -> Job | None:
        """The next job worth doing, if any is queued (never waits)."""
        while True:
            try:
                message = os.read(self._jobs_read, _JOB.size)
            except (BlockingIOError, InterruptedError):
                return None
            if len(message) != _JOB.size:  # not written by a board: ignored
                continue
            inode, cell, posted = _JOB.unpack(message)
            followed, tripped, _, _ = self._stream(inode)
            passed = followed == inode and tripped >= cell
            if passed or not time.monotonic() - posted < JOB_SECONDS:
                self.counts["dropped"] += 1
                continue
            self.counts["taken"] += 1
            return Job(inode, cell)

    def _tripped(self, inode: int, cell: int, last_cell: int) -> None:
        """The reader of ``inode`` passed the end of ``cell``: post the cells ahead."""
        with self._locked() as locked:
            if not locked:
                return
            followed, tripped, streak, posted = self._stream(inode)
            if followed != inode or cell < tripped:  # another file, or a pass over again
                tripped, streak, posted = -1, 0, -1
            if tripped >= cell:
                return  # told already
            streak = min(streak + 1 if tripped == cell - 1 else 1, 64)
            window = min(1 << (streak - 1), self._most_cells)
            last = min(cell + window, last_cell)
            first = max(cell + 1, posted + 1)
            _STREAM.pack_into(
                self._map, self._stream_at(inode), inode, cell, streak, max(last, posted)
            )
        for ahead in range(first, last + 1):
            self._post(inode, ahead)

    def _stream(self, inode: int) -> tuple[int, int, int, int]:
        """The table's entry for ``inode``: (the inode it follows, tripped, streak, posted)."""
        entry: tuple[int, int, int, int] = _STREAM.unpack_from(self._map, self._stream_at(inode))
        return entry

    @staticmethod
    def _stream_at(inode: int) -> int:
        return ((inode * 0x9E3779B97F4A7C15) >> 20) % _STREAMS * _STREAM.size

    def _post(self, inode: int, cell: int) -> None:
        try:
            os.write(self._jobs_write, _JOB.pack(inode, cell, time.monotonic()))
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                raise
            self.counts["dropped"] += 1  # the queue is full: that cell is read as usual
            return
        self.counts["posted"] += 1

    # -- cells -----------------------------------------------------------------------------

    def claim(self, file: CellFile, cell: int) -> Claim | None:
        """A slot to fill with ``cell`` of ``file``; None if one holds it or is being
        filled with it already, or every slot is being filled (or the board is locked
        for too long)."""
        now = time.monotonic()
        with self._locked() as locked:
            if not locked:
                return None
            victim = None
            victim_stamp = now
            for slot in range(self._cells):
                held_inode, held_cell, state, filler, _, _, stamp, identity = self._slot(slot)
                stale = state == _FILLING and _abandoned(filler, now - stamp)
                same = (held_inode, identity) == (file.inode, file.identity)
                if same and held_cell == cell and state != _EMPTY:
                    if not stale:
                        return None
                    victim = slot  # taken back: a cell is never in two slots
                    break
                if state == _EMPTY:
                    victim, victim_stamp = slot, -1.0
                elif (state == _READY or stale) and stamp < victim_stamp:
                    victim, victim_stamp = slot, stamp
            if victim is None:
                return None
            generation = (self._slot(victim)[4] + 1) % (1 << 64)
            self._set_slot(victim, file, cell, _FILLING, os.getpid(), generation, 0, now)
        return Claim(victim, generation, file, cell)

    def fill(self, claim: Claim, data: bytes | memoryview) -> bool:
        """Copy a claimed cell's bytes into its slot, making it ready; False if the slot
        was taken back meanwhile (nothing copied)."""
        if len(data) > CELL_BYTES:
            raise ValueError(f"{len(data)} bytes do not fit a cell")
        with self._locked() as locked:
            if not locked or self._slot(claim.slot)[4] != claim.generation:
                return False
            start = self._data_at + claim.slot * CELL_BYTES
            self._map[start : start + len(data)] = data
            self._set_slot(
                claim.slot,
                claim.file,
                claim.cell,
                _READY,
                0,
                claim.generation,
                len(data),
                time.monotonic(),
            )
        return True

    def abandon(self, claim: Claim) -> None:
        """Give a claimed slot back unfilled (its decode failed)."""
        with self._locked() as locked:
            if locked and self._slot(claim.slot)[4] == claim.generation:
                nobody = CellFile(0, 0, 0)
                self._set_slot(
                    claim.slot, nobody, -1, _EMPTY, 0, claim.generation, 0, time.monotonic()
                )

    def cell_read(self, file: CellFile, cell: int, start: int, size: int) -> bytes | Waiting | None:
        """``size`` bytes from byte ``start`` of a cell of ``file`` (counted from the
        cell's first byte), if a slot holds them; :data:`WAITING` while a process fills
        the cell; None if no slot holds or fills it (or the board is locked too long)."""
        with self._locked() as locked:
            if not locked:
                return None
            for slot in range(self._cells):
                held_inode, held_cell, state, filler, _, held, stamp, identity = self._slot(slot)
                if (held_inode, identity, held_cell) != (file.inode, file.identity, cell):
                    continue
                if state == _READY and start + size <= held:
                    at = self._data_at + slot * CELL_BYTES + start
                    return self._map[at : at + size]
                if state == _FILLING and not _abandoned(filler, time.monotonic() - stamp):
                    return WAITING
        return None

    def _slot(self, slot: int) -> tuple[int, int, int, int, int, int, float, int]:
        values: tuple[int, int, int, int, int, int, float, int] = _SLOT.unpack_from(
            self._map, self._slots_at + slot * _SLOT.size
        )
        return values

    def _set_slot(
        self,
        slot: int,
        file: CellFile,
        cell: int,
        state: int,
        filler: int,
        generation: int,
        held: int,
        stamp: float,
    ) -> None:
        _SLOT.pack_into(
            self._map,
            self._slots_at + slot * _SLOT.size,
            file.inode,
            cell,
            state,
            filler,
            generation,
            held,
            stamp,
            file.identity,
        )

    @contextmanager
    def _locked(self) -> Iterator[bool]:
        """The board's lock: a record lock on the memory (per process, so that processes
        sharing the descriptor still exclude each other; released if the holder dies).
        Yields whether it was had within :data:`_LOCK_SECONDS`: a holder stopped or
        stalled must not stop the others, who then do without the board."""
        deadline = time.monotonic() + _LOCK_SECONDS
        while True:
            try:
                fcntl.lockf(self._memory_fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    yield False
                    return
                time.sleep(0.0005)
        try:
            yield True
        finally:
            fcntl.lockf(self._memory_fd, fcntl.LOCK_UN, 1)


def _abandoned(filler: int, seconds: float) -> bool:
    """Whether a slot that process ``filler`` has been filling for ``seconds`` is to be
    taken back: it has been too long, or that process is gone (killed, crashed)."""
    if seconds > STALE_SECONDS or not 0 < filler < _PID_LIMIT:
        return True
    try:
        os.kill(filler, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, as another user
        return False
    return False


def _cell_slots(most_cells: int) -> int:
    return 2 * most_cells + 2


def _memory_bytes(most_cells: int) -> int:
    cells = _cell_slots(most_cells)
    return _STREAMS * _STREAM.size + cells * _SLOT.size + cells * CELL_BYTES
