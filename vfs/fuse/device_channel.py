"""Serving a mount's requests from its /dev/fuse descriptor or a clone of it.

Every mount is served through a :class:`DeviceChannel`: pyfuse3 mounts and
unmounts, but its loop never runs.  The channel speaks the kernel's protocol
itself: the supervisor answers INIT (:func:`answer_init`, once, on the
mount's own descriptor), then the channel of each serving process reads each request, calls the
:class:`Operations` method pyfuse3 would call, and writes the reply, so errors
become errno values in one place, ``Operations``.  Two things need the
channel rather than pyfuse3's loop:

- reads name their file by inode.  pyfuse3 hands a read only its file handle,
  which is 0 for every file once the kernel opens files without asking
  (``Operations.open`` answers ``ENOSYS``);
- one mount can be served by several processes.  A process opens
  ``/dev/fuse`` and clones the mount's descriptor onto it
  (``FUSE_DEV_IOC_CLONE``); from then on every request of the mount goes to
  whichever descriptor reads it first, and its reply must be written to the
  same descriptor.  libfuse cannot drive a clone in another process (its
  session state, INIT included, lives in the process that mounted).

Only what a read-only mount is asked is understood (lookup, getattr, open,
read, release, opendir, readdir, readdirplus, releasedir, statfs, forget,
batch forget, interrupt); anything else, flush included, is answered
``ENOSYS``, which makes the kernel stop asking for most of it.  The descriptor
is non-blocking: when several processes wake for one request, the ones that
lose the race go back to waiting instead of blocking their event loop.

The wire layouts follow ``include/uapi/linux/fuse.h`` at protocol 7.31, the
version the channel negotiates (kernels since 5.2 offer it or later).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import logging
import os
import select
import struct
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import pyfuse3
import trio

from cutfs.vfs.daemon import kernel_tuning
from cutfs.vfs.daemon.doorbell import Doorbell
from cutfs.vfs.daemon.request_slot import (
    DEFAULT_READ_TIMEOUT_SECONDS,
    READ_AHEAD_UNIQUE,
    RequestSlot,
)
from cutfs.vfs.fuse.page_pusher import MOST_PUSH_BYTES, PagePusher
from cutfs.vfs.fuse.read_ahead import PAGE_BYTES, CellFile, Claim, Job, ReadAhead

if TYPE_CHECKING:  # the supervisor uses this module's device functions without them
    from cutfs.vfs.fuse.operations import Operations
    from cutfs.vfs.tree.filesystem import ReadBuffers

log = logging.getLogger("cutfs.device_channel")

#: ``_IOR(229, 0, uint32_t)``: make this descriptor serve the mount of the given one.
FUSE_DEV_IOC_CLONE: Final = 0x8004E500

_IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, extlen, pad
_OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
_ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # ino size blocks atime mtime ctime, nsecs, mode...
_ENTRY_OUT = struct.Struct("<QQQQII")  # nodeid, generation, entry_valid, attr_valid, nsecs
_ATTR_OUT = struct.Struct("<QII")  # attr_valid, attr_valid_nsec, dummy
_OPEN_OUT = struct.Struct("<QIi")  # fh, open_flags, backing id
_OPEN_IN = struct.Struct("<II")  # flags, open_flags
_READ_IN = struct.Struct("<QQII")  # fh, offset, size, read_flags (then lock owner, flags)
_RELEASE_IN = struct.Struct("<Q")  # fh (then flags, release flags, lock owner)
_FORGET_IN = struct.Struct("<Q")  # nlookup
_BATCH_FORGET_IN = struct.Struct("<II")  # count, dummy
_FORGET_ONE = struct.Struct("<QQ")  # nodeid, nlookup
_DIRENT = struct.Struct("<QQII")  # ino, off, namelen, type
_STATFS_OUT = struct.Struct("<QQQQQIIII24x")  # blocks bfree bavail files ffree bsize namelen frsize
_INIT_IN = struct.Struct("<IIII")  # major, minor, max_readahead, flags
_XATTR_IN = struct.Struct("<II")  # size (0: only ask how large), padding (then a name)
_XATTR_OUT = struct.Struct("<II")  # size, padding
# major minor max_readahead flags max_background congestion_threshold max_write time_gran
# max_pages map_alignment flags2, unused
_INIT_OUT = struct.Struct("<IIIIHHIIHHI28x")

_LOOKUP, _FORGET, _GETATTR = 1, 2, 3
_OPEN, _READ, _STATFS, _RELEASE = 14, 15, 17, 18
_GETXATTR, _LISTXATTR = 22, 23
_INIT, _OPENDIR, _READDIR, _RELEASEDIR = 26, 27, 28, 29
_INTERRUPT, _BATCH_FORGET, _READDIRPLUS = 36, 42, 44
#: Requests the kernel sends without waiting for a reply.
_NO_REPLY: Final = frozenset({_FORGET, _BATCH_FORGET, _INTERRUPT})
#: Requests answered ENOSYS that ``.cutfs/stats`` counts by name (the rest as
#: ``requests.other``).  The kernel asks some again each time: every ``ioctl`` on a file
#: (Python's ``open`` asks whether it is a terminal) costs a round trip.
_UNSUPPORTED: Final = {
    25: "flush",
    34: "access",
    39: "ioctl",
    40: "poll",
    46: "lseek",
}

#: How long a process serving in turn waits for a request before it lets its event loop
#: run its other tasks (publishing statistics, releasing catalogue pages).
_TURN_SECONDS: Final = 1.0
#: The share of the daemon's deadline for a request that what it decodes may take (the
#: rest: replying, and the daemon's watch interval).
_DEADLINE_SHARE: Final = 0.9
#: How often a read waiting for another process to fill a read-ahead cell looks again.
_CELL_POLL_SECONDS: Final = 0.001
#: The longest a read's reply waits for the push of the file's rest, when decoding in turn.
_PUSH_WAIT_SECONDS: Final = 0.05

_FOPEN_DIRECT_IO, _FOPEN_KEEP_CACHE, _FOPEN_NONSEEKABLE = 1, 2, 4

#: The protocol version this channel speaks: 7.31 (every layout here is that version's).
_MAJOR, _MINOR = 7, 31
#: What a channel asks the kernel for at INIT, where it offers them: the capabilities
#: libfuse 3 asks for by default with pyfuse3's choices (READDIRPLUS always, not "auto";
#: lookups of "." and ".."), and reads of up to 256 pages (1 MiB).
_INIT_FLAGS: Final = (
    (1 << 0)  # ASYNC_READ: several reads of one file at once
    | (1 << 4)  # EXPORT_SUPPORT
    | (1 << 12)  # AUTO_INVAL_DATA
    | (1 << 13)  # DO_READDIRPLUS
    | (1 << 15)  # ASYNC_DIO
    | (1 << 18)  # PARALLEL_DIROPS
    | (1 << 22)  # MAX_PAGES
)
_MAX_PAGES: Final = 256
_MAX_WRITE_BYTES: Final = 1 << 20
#: A directory entry with a name of one byte takes at least this much of a reply.
_SMALLEST_DIRENT_BYTES: Final = _DIRENT.size + 8
_SMALLEST_DIRENTPLUS_BYTES: Final = _ENTRY_OUT.size + _ATTR.size + _SMALLEST_DIRENT_BYTES
#: Room for the largest request the kernel may send (a write of max_pages, never sent here).
_READ_BUFFER_BYTES: Final = (1 << 20) + 4096


@dataclass(frozen=True)
class _Context:
    """What :class:`Operations` reads of pyfuse3's RequestContext."""

    uid: int
    gid: int
    pid: int
    umask: int = 0


def clone_device(mount_fd: int) -> int:
    """A new descriptor serving the same mount as ``mount_fd`` (close it when done)."""
    clone = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(clone, FUSE_DEV_IOC_CLONE, struct.pack("<I", mount_fd))
    except OSError:
        os.close(clone)
        raise
    return clone


def write_reply(device_fd: int, unique: int, error: int, pieces: ReadBuffers) -> None:
    """Answer request ``unique`` on ``device_fd`` (the descriptor that read it, or a copy
    of it) with ``error`` (0, or minus an errno) and ``pieces``, gathered by one
    ``writev``.  A request that is gone (interrupted, so its caller saw EINTR, or
    answered already) or a mount that is gone is not an error; anything else raises."""
    size = sum(len(piece) for piece in pieces)
    try:
        os.writev(device_fd, [_OUT_HEADER.pack(_OUT_HEADER.size + size, error, unique), *pieces])
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENODEV):
            raise


async def answer_init(device_fd: int) -> None:
    """Wait for the kernel's INIT request on ``device_fd`` and answer it.

    Called by the supervisor on the mount's own descriptor before any clone
    exists (a clone could read INIT too).  What it reads comes from the kernel,
    never from a user.  Raises :class:`OSError` if the mount went away first, if the
    first request is not INIT, or if the kernel's protocol is older than 7.31.
    """
    os.set_blocking(device_fd, False)
    buffer = bytearray(_READ_BUFFER_BYTES)
    while True:
        await trio.lowlevel.wait_readable(device_fd)
        try:
            size = os.readv(device_fd, [buffer])
        except (BlockingIOError, InterruptedError):
            continue
        if size >= _IN_HEADER.size:
            break
    request = _Request.parse(bytes(memoryview(buffer)[:size]))
    if request.opcode != _INIT:
        raise OSError(errno.EPROTO, "the kernel's first request was not INIT")
    major, minor, max_readahead, offered = _INIT_IN.unpack_from(request.body)
    if (major, minor) < (_MAJOR, _MINOR):
        write_reply(device_fd, request.unique, -errno.EPROTO, [])
        raise OSError(errno.EPROTO, f"FUSE protocol {major}.{minor} is older than 7.31")
    reply = _INIT_OUT.pack(
        _MAJOR,
        _MINOR,
        max_readahead,
        offered & _INIT_FLAGS,
        0,  # max_background and congestion threshold: the kernel's defaults
        0,
        _MAX_WRITE_BYTES,
        1,  # time granularity: nanoseconds
        _MAX_PAGES,
        0,
        0,
    )
    write_reply(device_fd, request.unique, 0, [reply])
    log.debug("answered INIT of FUSE %d.%d: flags %#x", major, minor, offered & _INIT_FLAGS)


def _seconds_split(seconds: float) -> tuple[int, int]:
    whole = int(seconds)
    return whole, int((seconds - whole) * 1e9)


def _attr(entry: pyfuse3.EntryAttributes) -> bytes:
    atime, mtime, ctime = entry.st_atime_ns, entry.st_mtime_ns, entry.st_ctime_ns
    return _ATTR.pack(
        entry.st_ino,
        entry.st_size,
        entry.st_blocks,
        atime // 10**9,
        mtime // 10**9,
        ctime // 10**9,
        atime % 10**9,
        mtime % 10**9,
        ctime % 10**9,
        entry.st_mode,
        entry.st_nlink,
        entry.st_uid,
        entry.st_gid,
        entry.st_rdev,
        entry.st_blksize,
        0,
    )


def _entry_out(entry: pyfuse3.EntryAttributes) -> bytes:
    entry_seconds, entry_nanoseconds = _seconds_split(entry.entry_timeout)
    attr_seconds, attr_nanoseconds = _seconds_split(entry.attr_timeout)
    return _ENTRY_OUT.pack(
        entry.st_ino,
        entry.generation,
        entry_seconds,
        attr_seconds,
        entry_nanoseconds,
        attr_nanoseconds,
    ) + _attr(entry)


def _attr_out(entry: pyfuse3.EntryAttributes) -> bytes:
    seconds, nanoseconds = _seconds_split(entry.attr_timeout)
    return _ATTR_OUT.pack(seconds, nanoseconds, 0) + _attr(entry)


def _open_out(info: pyfuse3.FileInfo) -> bytes:
    flags = (
        (_FOPEN_DIRECT_IO if info.direct_io else 0)
        | (_FOPEN_KEEP_CACHE if info.keep_cache else 0)
        | (_FOPEN_NONSEEKABLE if info.nonseekable else 0)
    )
    return _OPEN_OUT.pack(info.fh, flags, 0)


def _dirent(name: bytes, entry: pyfuse3.EntryAttributes, next_offset: int) -> bytes:
    record = _DIRENT.pack(entry.st_ino, next_offset, len(name), (entry.st_mode >> 12) & 0o17)
    return record + name + b"\0" * (-(len(record) + len(name)) % 8)


def _direntplus(name: bytes, entry: pyfuse3.EntryAttributes, next_offset: int) -> bytes:
    return _entry_out(entry) + _dirent(name, entry, next_offset)


class DeviceChannel:
    """Answers the requests that reach one cloned /dev/fuse descriptor.

    The requests it answers are counted by ``Operations``; those it does not
    (``ENOSYS``) by the channel, in the same statistics.
    """

    def __init__(
        self,
        device_fd: int,
        operations: Operations,
        mountpoint: str | None = None,
        read_ahead: ReadAhead | None = None,
    ) -> None:
        """``mountpoint``: where the mount is, to abort its connection if its page pusher
        is stuck when the channel stops (see :meth:`PagePusher.close`); without it the
        channel pushes no pages.  ``read_ahead``: the mount's read-ahead board, whose jobs
        :meth:`serve_in_turn` takes between requests (see :mod:`cutfs.vfs.fuse.read_ahead`)."""
        self._fd = device_fd
        self._read_ahead = read_ahead
        #: How long a read may take (the daemon's deadline when decoding in turn).
        self._deadline_seconds = DEFAULT_READ_TIMEOUT_SECONDS
        self._operations = operations
        self._mountpoint = mountpoint
        self._buffer = bytearray(_READ_BUFFER_BYTES)
        #: Stores what a read's decode left cached past it in the kernel's page cache,
        #: while the channel serves (see :mod:`cutfs.vfs.fuse.page_pusher`).
        self._pusher: PagePusher | None = None
        #: How long a read's reply waits for the push of the file's rest (0: not at all;
        #: see :meth:`serve_in_turn`).
        self._push_wait_seconds = 0.0
        os.set_blocking(device_fd, False)
        self._handlers: dict[int, Callable[[_Request], Awaitable[bytes | ReadBuffers]]] = {
            _LOOKUP: self._lookup,
            _GETATTR: self._getattr,
            _OPEN: self._open,
            _READ: self._read,
            _RELEASE: self._release,
            _OPENDIR: self._opendir,
            _READDIR: self._readdir,
            _READDIRPLUS: self._readdirplus,
            _RELEASEDIR: self._releasedir,
            _STATFS: self._statfs,
            _GETXATTR: self._getxattr,
            _LISTXATTR: self._listxattr,
        }

    async def serve(self) -> None:
        """Serve until the mount goes away (the device then reads ``ENODEV``)."""
        with self._pushing():
            async with trio.open_nursery() as nursery:
                while True:
                    request = await self._next_request()
                    if request is None:
                        break
                    nursery.start_soon(self._answer, request)
                nursery.cancel_scope.cancel()

    def _seen_as(self) -> str:
        """The mountpoint as the mount table shows it (symbolic links resolved), found
        without a ``stat`` of the mountpoint itself, which would ask this process."""
        assert self._mountpoint is not None
        parent, name = os.path.split(os.path.abspath(self._mountpoint))
        return os.path.join(os.path.realpath(parent), name)

    @contextlib.contextmanager
    def _pushing(self) -> Iterator[None]:
        device = None if self._mountpoint is None else kernel_tuning.device_of(self._seen_as())
        if device is None:  # no way out for a stuck pusher: no pusher
            yield
            return
        pusher = self._pusher = PagePusher(self._fd, self._operations.statistics)
        try:
            yield
        finally:
            self._pusher = None
            if not pusher.close():
                aborted = kernel_tuning.abort_connection(device)
                log.error(
                    "pages were still being stored in the kernel as the mount stopped serving: %s",
                    "its connection was aborted"
                    if aborted
                    else "the connection could not be aborted (is /sys/fs/fuse/connections "
                    "mounted?): abort it there to free the mount",
                )

    async def serve_in_turn(
        self, slot: RequestSlot, deadline_seconds: float, doorbell: Doorbell | None = None
    ) -> None:
        """Serve until the mount goes away, one request at a time, each to its end.

        For a process that decodes what it serves (``--decode-in-turn``): a handler
        that does not wait on anything runs straight through, so a request costs no
        task, no hand-off and no wake-up of the event loop.  The process waits for the
        device with an exclusive epoll, so that one request wakes one of the processes
        waiting, and between requests (at least every second) lets the loop run its
        other tasks.  ``slot`` tells the daemon which request is being answered, and
        that it should be answered within ``deadline_seconds``.  ``doorbell`` is
        answered between requests, and wakes the process when it waits.
        """
        self._deadline_seconds = deadline_seconds
        waiting = select.epoll()
        waiting.register(self._fd, select.EPOLLIN | select.EPOLLEXCLUSIVE)
        if doorbell is not None:
            waiting.register(doorbell.fileno(), select.EPOLLIN)
        if self._read_ahead is not None:  # a job wakes one idle process
            waiting.register(self._read_ahead.fileno(), select.EPOLLIN | select.EPOLLEXCLUSIVE)
        next_turn = trio.current_time() + _TURN_SECONDS
        # The reply to a read waits (briefly) for the push of the file's rest: otherwise
        # the reader's next read, made as soon as it has the reply, most often comes
        # before the pages are stored, and may reach another process, which decodes the
        # cut again.  A push can wait on a page that a read in flight holds (see
        # :mod:`cutfs.vfs.fuse.page_pusher`), which another process, or this one after the
        # timeout, answers: so the wait is bounded.
        self._push_wait_seconds = _PUSH_WAIT_SECONDS
        with self._pushing(), contextlib.closing(waiting):
            while True:
                slot.beat()
                try:
                    request = self._request_now()
                except EOFError:
                    return
                job = None
                if request is None and self._read_ahead is not None:
                    job = self._read_ahead.take()
                if job is not None:  # no request waits: decode a cell ahead of a reader
                    slot.begin(READ_AHEAD_UNIQUE, job.inode, deadline_seconds)
                    try:
                        deadline = trio.current_time() + deadline_seconds * _DEADLINE_SHARE
                        await self._read_cell_ahead(job, deadline)
                    except Exception:  # a bug, or a board another process spoiled
                        self._operations.statistics.error("internal")
                        log.exception("reading a cell ahead failed")
                    finally:
                        slot.end()
                elif request is None:
                    woken_by = {fd for fd, _ in waiting.poll(_TURN_SECONDS)}
                    if woken_by == {self._fd} and trio.current_time() < next_turn:
                        # Only a request woke the process: it is read before anything
                        # else (the doorbell and the loop's other tasks cost a cold
                        # process 0.1-0.2 ms, which the reader waited for).
                        continue
                elif request.opcode in _NO_REPLY:
                    await self._answer(request)
                else:
                    slot.begin(request.unique, request.nodeid, deadline_seconds)
                    try:
                        await self._answer(request)
                    finally:
                        slot.end()
                if doorbell is not None:
                    doorbell.answer()
                if request is None or trio.current_time() >= next_turn:
                    await trio.lowlevel.checkpoint()
                    next_turn = trio.current_time() + _TURN_SECONDS

    def _request_now(self) -> _Request | None:
        """The next request if one is queued, None if not (another process took it, or
        it was interrupted); EOFError once unmounted."""
        try:
            size = os.readv(self._fd, [self._buffer])
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            if exc.errno == errno.ENOENT:  # the request was interrupted
                return None
            if exc.errno == errno.ENODEV:
                raise EOFError from None
            raise
        if size < _IN_HEADER.size:
            log.error("short request of %d bytes from the FUSE device", size)
            return None
        return _Request.parse(bytes(memoryview(self._buffer)[:size]))

    async def _next_request(self) -> _Request | None:
        """The next request, waited for on the event loop; None once unmounted."""
        while True:
            await trio.lowlevel.wait_readable(self._fd)
            try:
                request = self._request_now()
            except EOFError:
                return None
            if request is not None:
                return request

    async def _answer(self, request: _Request) -> None:
        if request.opcode in _NO_REPLY:
            await self._forget(request)
            return
        handler = self._handlers.get(request.opcode)
        try:
            if handler is None:
                name = _UNSUPPORTED.get(request.opcode, "other")
                self._operations.statistics.count(f"requests.{name}")
                raise pyfuse3.FUSEError(errno.ENOSYS)
            body = await handler(request)
        except pyfuse3.FUSEError as exc:
            self._reply(request.unique, -exc.errno, b"")
            return
        except Exception:  # Operations guards every handler; this is a bug of the channel
            log.exception("request %d failed in the device channel", request.opcode)
            self._reply(request.unique, -errno.EIO, b"")
            return
        self._reply(request.unique, 0, body)

    def _reply(self, unique: int, error: int, body: bytes | ReadBuffers) -> None:
        """Answer a request; ``body`` in pieces is gathered by the one ``writev``."""
        try:
            write_reply(self._fd, unique, error, body if isinstance(body, list) else [body])
        except OSError as exc:
            log.error("cannot reply to the kernel: %s", exc)

    async def _forget(self, request: _Request) -> None:
        if request.opcode == _FORGET:
            (references,) = _FORGET_IN.unpack_from(request.body)
            forgotten = [(request.nodeid, references)]
        elif request.opcode == _BATCH_FORGET:
            count, _ = _BATCH_FORGET_IN.unpack_from(request.body)
            start = _BATCH_FORGET_IN.size
            count = min(count, (len(request.body) - start) // _FORGET_ONE.size)
            forgotten = [
                _FORGET_ONE.unpack_from(request.body, start + i * _FORGET_ONE.size)
                for i in range(count)
            ]
        else:
            return  # INTERRUPT: handlers run to the end; the kernel has told the caller
        await self._operations.forget(forgotten)  # logs and swallows its own failures

    async def _lookup(self, request: _Request) -> bytes:
        name = request.body.split(b"\0", 1)[0]
        return _entry_out(await self._operations.lookup(request.nodeid, name, request.context()))

    async def _getattr(self, request: _Request) -> bytes:
        return _attr_out(await self._operations.getattr(request.nodeid, request.context()))

    async def _open(self, request: _Request) -> bytes:
        flags, _ = _OPEN_IN.unpack_from(request.body)
        return _open_out(await self._operations.open(request.nodeid, flags, request.context()))

    async def _read(self, request: _Request) -> ReadBuffers:
        _, offset, size, _ = _READ_IN.unpack_from(request.body)
        inode = request.nodeid
        # Whatever this read decodes (its bytes, a cell, a job taken while it waits) ends
        # before the daemon's deadline for it, which began as the request was read.
        deadline = trio.current_time() + self._deadline_seconds * _DEADLINE_SHARE
        # Cells are decoded ahead of a reader of a long file (see read_ahead.py): a read
        # in a cell may be answered from the board, a read of a tripwire needs no decode
        # past it, and pushes stop before the next tripwire.
        file = None
        if self._read_ahead is not None and self._pusher is not None:
            file = self._operations.read_ahead_file(inode)
        size_bytes = None if file is None else file.size_bytes
        buffers = None
        if file is not None:
            buffers = await self._from_cell(file, offset, size, deadline)
        # A cell's pages are pushed by the process that filled it.
        from_cell = buffers is not None
        if buffers is None:
            # Where cells may be read ahead, a read decodes nothing past its cell (a
            # tripwire: nothing past itself), which a job may decode in parallel.
            decode_until = None
            if size_bytes is not None:
                decode_until = offset + size
                if not ReadAhead.is_tripwire(offset, size_bytes):
                    decode_until = max(decode_until, ReadAhead.push_end(offset, size_bytes))
            # By inode, not by file handle: a file the kernel opened without asking
            # (Operations.open answered ENOSYS) has handle 0, and the handles of opens
            # that were answered are inodes.
            buffers = await self._operations.read(
                inode, offset, size, decode_until=decode_until, deadline=deadline
            )
        if self._read_ahead is not None and size_bytes is not None:
            self._read_ahead.on_read(inode, offset, size, size_bytes)
            self._count_read_ahead()
        complete = sum(len(buffer) for buffer in buffers) == size
        if self._pusher is not None and complete and not from_cell:
            # Queued before the reply goes out: the reader's next read of the file
            # then most likely finds its pages stored already.
            after = offset + size
            most_bytes = MOST_PUSH_BYTES
            if size_bytes is not None:
                most_bytes = min(most_bytes, ReadAhead.push_end(after, size_bytes) - after)
            rest = None
            if most_bytes > 0:
                rest = self._operations.continuation(inode, after, most_bytes)
            if rest is not None:
                pushed = self._pusher.push(inode, after, rest)
                if pushed is not None and self._push_wait_seconds > 0:
                    pushed.wait(self._push_wait_seconds)
        return buffers

    async def _from_cell(
        self, file: CellFile, offset: int, size: int, deadline: float
    ) -> ReadBuffers | None:
        """The bytes of a read from the read-ahead board: a cell's slot holds them, or
        will once the process filling it is done (waited for, within the read's
        deadline), or the cell was posted and nobody took it yet (then decoded whole here,
        as its job would); None where the read must decode as usual."""
        assert self._read_ahead is not None
        cell = ReadAhead.cell_of(offset, size, file.size_bytes)
        if cell is None:
            return None
        start, end = ReadAhead.cell_span(cell, file.size_bytes)
        # Half the time left at most, so that a read given up on has time to decode.
        give_up = trio.current_time() + (deadline - trio.current_time()) / 2
        statistics = self._operations.statistics
        while True:
            held = self._read_ahead.cell_read(file, cell, offset - start, size)
            if isinstance(held, bytes):
                statistics.count("read_ahead.cell_reads")
                statistics.count("reads")
                statistics.count("read_bytes", len(held))
                return [held]
            if held is None:  # nobody holds or fills the cell
                claim = None
                if self._read_ahead.is_posted(file.inode, cell):
                    claim = self._read_ahead.claim(file, cell)
                if claim is None:
                    return None  # not read ahead (or no slot free): decoded as usual
                answering = (offset, offset + size)
                data = await self._fill_cell(claim, start, end, deadline, answering)
                if data is None:
                    return None
                statistics.count("read_ahead.cells_decoded_for_reads")
                return [data[offset - start : offset - start + size]]
            if trio.current_time() > give_up:
                statistics.count("read_ahead.cell_waits_given_up")
                return None
            # Another process fills the cell: meanwhile this one decodes a cell after it,
            # if one is posted (else the two would take turns, not decode side by side).
            job = self._read_ahead.take()
            if job is not None:
                await self._read_cell_ahead(job, give_up)
            else:
                await trio.sleep(_CELL_POLL_SECONDS)

    async def _read_cell_ahead(self, job: Job, deadline: float) -> None:
        """Decode a cell of a file read in order into the board and the page cache, by
        ``deadline``."""
        assert self._read_ahead is not None
        self._count_read_ahead()
        file = self._operations.read_ahead_file(job.inode)
        if file is None or self._pusher is None:
            return  # forgotten, not indexed here yet, or not a file read ahead
        start, end = ReadAhead.cell_span(job.cell, file.size_bytes)
        if end <= start:
            return
        claim = self._read_ahead.claim(file, job.cell)
        if claim is not None:  # else held or being filled already
            await self._fill_cell(claim, start, end, deadline)

    async def _fill_cell(
        self,
        claim: Claim,
        start: int,
        end: int,
        deadline: float,
        answering: tuple[int, int] | None = None,
    ) -> bytes | None:
        """Decode the bytes ``[start, end)`` of a claimed cell, fill its slot and push
        them into the page cache, but for the bytes ``answering`` (those of the read this
        process answers with them: their pages wait for its reply).  The bytes, or None
        if they could not be decoded (the slot is given back)."""
        assert self._read_ahead is not None and self._pusher is not None
        started = time.perf_counter()
        inode = claim.file.inode
        buffers = await self._operations.read_ahead(inode, start, end - start, deadline)
        log.debug(
            "cell %d of inode %d decoded in %.1f ms",
            claim.cell,
            inode,
            (time.perf_counter() - started) * 1000,
        )
        data = b"".join(buffers) if buffers is not None else b""
        if len(data) != end - start:
            self._read_ahead.abandon(claim)
            return None
        self._read_ahead.fill(claim, data)
        first, last = answering if answering is not None else (end, end)
        # Pages from the end of the answered read on first: the reader goes on there.
        after = min(end, -(-last // PAGE_BYTES) * PAGE_BYTES)
        for piece_start, piece_end in ((after, end), (start, first - first % PAGE_BYTES)):
            if piece_end > piece_start:
                piece = memoryview(data)[piece_start - start : piece_end - start]
                self._pusher.push(inode, piece_start, functools.partial(_as_is, [piece]))
        return data

    def _count_read_ahead(self) -> None:
        """Move the board's counts into the statistics (``read_ahead.jobs_*``)."""
        assert self._read_ahead is not None
        for name, count in self._read_ahead.counts.items():
            if count:
                self._operations.statistics.count(f"read_ahead.jobs_{name}", count)
                self._read_ahead.counts[name] = 0

    async def _release(self, request: _Request) -> bytes:
        (fh,) = _RELEASE_IN.unpack_from(request.body)
        await self._operations.release(fh)
        return b""

    async def _opendir(self, request: _Request) -> bytes:
        fh = await self._operations.opendir(request.nodeid, request.context())
        return _OPEN_OUT.pack(fh, 0, 0)

    async def _readdirplus(self, request: _Request) -> bytes:
        return await self._directory(request, _direntplus, _SMALLEST_DIRENTPLUS_BYTES)

    async def _readdir(self, request: _Request) -> bytes:
        return await self._directory(request, _dirent, _SMALLEST_DIRENT_BYTES)

    async def _directory(
        self,
        request: _Request,
        record_of: Callable[[bytes, pyfuse3.EntryAttributes, int], bytes],
        smallest_bytes: int,
    ) -> bytes:
        fh, offset, size, _ = _READ_IN.unpack_from(request.body)
        records: list[bytes] = []
        used = 0
        most = size // smallest_bytes + 1  # attributes are made only for what can fit
        for name, entry, next_offset in await self._operations.directory_entries(fh, offset, most):
            record = record_of(name, entry, next_offset)
            if used + len(record) > size:
                break
            records.append(record)
            used += len(record)
        return b"".join(records)

    async def _releasedir(self, request: _Request) -> bytes:
        (fh,) = _RELEASE_IN.unpack_from(request.body)
        await self._operations.releasedir(fh)
        return b""

    async def _getxattr(self, request: _Request) -> bytes:
        size, _ = _XATTR_IN.unpack_from(request.body)
        name = request.body[_XATTR_IN.size :].split(b"\0", 1)[0]
        value = await self._operations.getxattr(request.nodeid, name, request.context())
        return _sized(value, size)

    async def _listxattr(self, request: _Request) -> bytes:
        size, _ = _XATTR_IN.unpack_from(request.body)
        names = await self._operations.listxattr(request.nodeid, request.context())
        return _sized(b"".join(name + b"\0" for name in names), size)

    async def _statfs(self, request: _Request) -> bytes:
        stats = await self._operations.statfs(request.context())
        return _STATFS_OUT.pack(
            stats.f_blocks,
            stats.f_bfree,
            stats.f_bavail,
            stats.f_files,
            stats.f_ffree,
            stats.f_bsize,
            stats.f_namemax,
            stats.f_frsize,
            0,
        )


def _as_is(buffers: ReadBuffers) -> ReadBuffers:
    return buffers


def _sized(value: bytes, size: int) -> bytes:
    """An xattr reply: only ``value``'s size when asked with ``size`` 0, ``value`` when it
    fits, ERANGE when it does not."""
    if size == 0:
        return _XATTR_OUT.pack(len(value), 0)
    if len(value) > size:
        raise pyfuse3.FUSEError(errno.ERANGE)
    return value


@dataclass(frozen=True)
class _Request:
    opcode: int
    unique: int
    nodeid: int
    uid: int
    gid: int
    pid: int
    body: bytes

    @classmethod
    def parse(cls, message: bytes) -> _Request:
        length, opcode, unique, nodeid, uid, gid, pid, _, _ = _IN_HEADER.unpack_from(message)
        return cls(opcode, unique, nodeid, uid, gid, pid, message[_IN_HEADER.size : length])

    def context(self) -> Any:
        """Stands in for pyfuse3.RequestContext, which only pyfuse3 can make."""
        return _Context(self.uid, self.gid, self.pid)
