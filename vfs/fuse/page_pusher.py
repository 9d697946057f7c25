"""Putting the rest of a file into the kernel's page cache before it is asked for.

A reader such as soundfile reads a 10 s cut in about four kernel reads (the
readahead window grows 16 KB, 64 KB, 256 KB), while the first of them already
decodes the whole cut into the block cache.  After answering it, the channel
hands the cached rest of the file to a :class:`PagePusher`, which writes it to
the FUSE device as a ``FUSE_NOTIFY_STORE`` notification: the kernel copies it
into the file's pages, and the reads that would have asked for them find them
there.  With several serving processes this also keeps a cut's later reads from
reaching a process whose cache does not hold it.

The kernel locks each page it stores into, and waits for a page locked by a
read in flight, which only a serving loop can answer: so the pusher is a thread
of its own, which may wait, and the loop never waits for it without a bound (a
process decoding in turn has a read's reply wait for its push, briefly: see
:meth:`cutfs.vfs.fuse.device_channel.DeviceChannel.serve_in_turn`).  At the end, a
pusher still waiting so has the connection aborted (see :meth:`PagePusher.close`).  A push that
cannot be queued (the queue is full) is dropped: the kernel then reads as
usual.  Memory is bounded by the queue: four pushes of at most 8 MiB of frames
each (taken from the cache when queued, converted to the file's bytes in the
thread), 32 MiB per serving process at most.

A push is best effort: its pages are clean page cache, which the kernel may
reclaim before they are read (memory pressure, ``drop_caches``, or a DAMON
thread paging out by physical region); a page gone is read again as usual.
"""

from __future__ import annotations

import errno
import logging
import os
import queue
import struct
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from cutfs.vfs.stats.statistics import Statistics

if TYPE_CHECKING:  # the supervisor imports this module's neighbours; the tree brings pyarrow
    from cutfs.vfs.tree.filesystem import ReadBuffers

log = logging.getLogger("cutfs.page_pusher")

#: An inode, the offset its bytes start at, what makes them, and what is set once the
#: push is over (written, refused or dropped).
_Push = tuple[int, int, "Callable[[], ReadBuffers]", threading.Event]

_OUT_HEADER = struct.Struct("<IiQ")  # len, notify code, unique (0: a notification)
_STORE_OUT = struct.Struct("<QQII")  # nodeid, offset, size, padding
_NOTIFY_STORE: Final = 4
#: Pushes waiting to be written, at most (each holds at most MOST_PUSH_BYTES of frames).
_QUEUE_LENGTH: Final = 4
#: The most bytes one push puts into a file's pages.
MOST_PUSH_BYTES: Final = 8 << 20


class PagePusher:
    """A thread writing ``FUSE_NOTIFY_STORE`` notifications to one device descriptor.

    It counts in ``statistics`` the pushes written (``pages_pushed``, and their
    ``pushed_bytes``) and those left out: ``pushes_dropped`` when the queue was full
    (counted by the loop's thread), ``pushes_refused`` when the kernel refused one
    (it had forgotten the inode) or its bytes could not be made (counted by the
    pusher's; each counter has one writer, so no increment is lost).
    """

    def __init__(self, device_fd: int, statistics: Statistics) -> None:
        self._fd = device_fd
        self._queue: queue.Queue[_Push | None] = queue.Queue(_QUEUE_LENGTH)
        self._statistics = statistics
        # Counted from this thread while the loop's thread reads the counters: their
        # keys exist from the start, so that a reader never sees the dictionary grow.
        for name in ("pages_pushed", "pushed_bytes", "pushes_dropped", "pushes_refused"):
            statistics.count(name, 0)
        self._thread = threading.Thread(target=self._run, name="cutfs-page-pusher", daemon=True)
        self._thread.start()

    def push(
        self, inode: int, offset: int, make: Callable[[], ReadBuffers]
    ) -> threading.Event | None:
        """Have the bytes ``make`` returns (called in the thread) stored as those of
        ``inode`` from ``offset`` on; never waits.

        Returns an event set once the push is over (written, refused, or dropped at the
        end), which a caller may wait for with a timeout, never without one (see the
        module's docstring); ``None`` if the push was dropped at once (the queue is full).
        """
        done = threading.Event()
        try:
            self._queue.put_nowait((inode, offset, make, done))
        except queue.Full:
            self._statistics.count("pushes_dropped")
            return None
        return done

    def close(self, timeout_seconds: float = 2.0) -> bool:
        """Drop the pushes not yet written and stop the thread; whether it stopped within
        ``timeout_seconds``.

        It may not: a push waiting on a page that a read in flight holds waits until
        that read is answered, and once the loop has stopped, nothing in this process
        answers it.  The kernel then ends neither (the thread's write keeps the
        descriptor open, and with it the connection, past the unmount): the caller
        must abort the connection (:func:`cutfs.vfs.daemon.kernel_tuning.abort_connection`).
        """
        while True:
            try:
                dropped = self._queue.get_nowait()
            except queue.Empty:
                break
            if dropped is not None:
                dropped[3].set()
        self._queue.put_nowait(None)  # only the loop's thread puts: there is room now
        self._thread.join(timeout_seconds)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            inode, offset, make, done = item
            try:
                self._store(inode, offset, make)
            finally:
                done.set()

    def _store(self, inode: int, offset: int, make: Callable[[], ReadBuffers]) -> None:
        try:
            buffers = make()
        except Exception:  # a bug: the kernel reads as usual
            log.exception("cannot make the pages of inode %d", inode)
            self._statistics.count("pushes_refused")
            return
        size = sum(len(buffer) for buffer in buffers)
        header = _OUT_HEADER.pack(_OUT_HEADER.size + _STORE_OUT.size + size, _NOTIFY_STORE, 0)
        try:
            os.writev(self._fd, [header, _STORE_OUT.pack(inode, offset, size, 0), *buffers])
        except OSError as exc:
            self._statistics.count("pushes_refused")
            # ENOENT: the kernel forgot the inode; ENODEV: unmounted.
            if exc.errno not in (errno.ENOENT, errno.ENODEV):
                log.warning("cannot store pages of inode %d in the kernel: %s", inode, exc)
            return
        self._statistics.count("pages_pushed")
        self._statistics.count("pushed_bytes", size)
