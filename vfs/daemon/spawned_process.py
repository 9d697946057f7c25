"""A serving process spawned before its mount is set up.

Most of a mount's start is a serving process's own: a new interpreter that imports what
serving needs (pyarrow, numpy, PyAV, trio: 0.5-0.8 s here) before it can open the source.
So the daemon spawns its first serving process as soon as its options are checked; that
process imports on one core while the supervisor imports its own modules and sets the
mount up on the other, and then it waits for its
:class:`~cutfs.vfs.daemon.serving_setup.ServingSetup` and its request slot
(:meth:`SpawnedProcess.configure`).  Replacements and the other processes are spawned and
configured at once.

This module imports only the standard library and the supervisor's light modules, so
spawning early costs the daemon nothing it would not pay anyway.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import socket
from collections.abc import Sequence
from multiprocessing import reduction
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Final

from cutfs.vfs.daemon.request_slot import RequestSlot
from cutfs.vfs.daemon.serving_setup import ServingSetup

#: How long a process that was never configured gets to end once told to.
_ENDING_SECONDS: Final = 2.0


def _serving_main(connection: Connection, index: int, log_writer: socket.socket) -> None:
    """A serving process's start (see :func:`cutfs.vfs.daemon.serving_process.serving_main`),
    imported here, in the new process: the supervisor never imports what serving needs."""
    from cutfs.vfs.daemon.serving_process import serving_main  # noqa: PLC0415

    serving_main(connection, index, log_writer)


class SpawnedProcess:
    """A serving process started, importing what it needs, and not yet told what to
    serve.  Owned by one supervisor's slot (or closed, if the mount never gets that far)."""

    def __init__(self, index: int, log_writer: socket.socket) -> None:
        """Spawn serving process number ``index`` (1 to N), which logs to ``log_writer``."""
        context = multiprocessing.get_context("spawn")
        parent_end, child_end = context.Pipe()
        self._taken = False
        self.connection: Connection = parent_end
        self.process: BaseProcess = context.Process(
            target=_serving_main,
            args=(child_end, index, log_writer),
            daemon=False,  # it starts decoder workers; it dies with the supervisor instead
            name=f"cutfs-serving-{index}",
        )
        try:
            self.process.start()
        except BaseException:
            parent_end.close()
            raise
        finally:
            child_end.close()

    def configure(self, setup: ServingSetup, slot: RequestSlot, shared: Sequence[int] = ()) -> None:
        """Tell the process what to serve and give it its request slot, then the
        descriptors of what the serving processes share (the read-ahead board's, when
        ``setup`` reads ahead).  One that died before it took them (killed at start) is no
        error here: it is seen to have ended, as any other death.  Raises
        :class:`OSError` if the process is alive and yet cannot be reached."""
        try:
            self.connection.send(setup)
            reduction.send_handle(self.connection, slot.descriptor, self.process.pid)
            for descriptor in shared:
                reduction.send_handle(self.connection, descriptor, self.process.pid)
        except OSError:
            self.process.join(1)
            if self.process.exitcode is None:
                raise

    def take(self) -> tuple[BaseProcess, Connection]:
        """The process and its pipe, handed to their owner: :meth:`close` then does
        nothing."""
        self._taken = True
        return self.process, self.connection

    def close(self) -> None:
        """End a process that will never be configured (a mount that failed to start).
        It holds nothing yet (it imports, or waits), so it is ended at once."""
        if self._taken:
            return
        self._taken = True
        self.connection.close()
        self.process.terminate()
        self.process.join(_ENDING_SECONDS)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join(_ENDING_SECONDS)
        with contextlib.suppress(ValueError):
            self.process.close()
