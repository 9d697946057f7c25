"""A named pipe that another serving process rings to have this one publish now.

``.cutfs/stats`` adds up the figures of every process serving a mount (see
:mod:`cutfs.vfs.stats.statistics_board`).  Each process publishes its own every
second; so that a read of the file shows what every process has counted up to
that moment, the process answering it rings the others' doorbells and waits a
moment for their figures.  A doorbell is a FIFO in the board's private
directory: ringing writes one byte without blocking, and answering drains what
is queued, so many rings cost one publication.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from collections.abc import Callable

log = logging.getLogger("cutfs.doorbell")

#: Read at once when draining (rings are one byte each; more only means more rang).
_DRAIN_BYTES = 4096


class Doorbell:
    """This process's doorbell: ``answer`` calls ``on_ring`` if someone rang since."""

    def __init__(self, fd: int, on_ring: Callable[[], None]) -> None:
        self._fd = fd
        self._on_ring = on_ring

    @classmethod
    def open(cls, path: str, on_ring: Callable[[], None]) -> Doorbell:
        """Make the FIFO at ``path`` (or reuse the one a previous process there left) and
        keep it open for reading and writing, so that it never reads end-of-file."""
        with contextlib.suppress(FileExistsError):
            os.mkfifo(path, 0o600)
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not a FIFO", path)
        return cls(fd, on_ring)

    def fileno(self) -> int:
        return self._fd

    def answer(self) -> bool:
        """Drain the rings queued, and if there were any, call ``on_ring`` (what it raises is
        logged); whether it rang."""
        rang = False
        while True:
            try:
                if not os.read(self._fd, _DRAIN_BYTES):
                    break
                rang = True
            except (BlockingIOError, InterruptedError):
                break
        if rang:
            try:
                self._on_ring()
            except Exception:  # statistics must never take the mount down
                log.exception("cannot answer the doorbell")
        return rang

    def close(self) -> None:
        os.close(self._fd)

    @staticmethod
    def ring(path: str) -> bool:
        """Ring the doorbell at ``path``; False if no process keeps it open (none serves
        there now), so there is no answer to wait for."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno not in (errno.ENXIO, errno.ENOENT, errno.ELOOP):
                log.warning("cannot ring %s: %s", path, exc)
            return False
        try:
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                return False
            with contextlib.suppress(BlockingIOError):  # full of rings it will answer
                os.write(fd, b"\0")
            return True
        finally:
            os.close(fd)
