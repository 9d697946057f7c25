"""The supervisor: the one process of a mount that keeps root, and parses nothing.

A mount is served by a supervisor and N serving processes
(:mod:`cutfs.vfs.daemon.serving_process`).  The supervisor holds what needs
privilege: it mounts (through pyfuse3, whose loop never runs), answers the
kernel's INIT, tunes the kernel, starts serving processes and replacements,
answers ``EIO`` for the requests of the ones it kills or that die, and
unmounts.  It never opens the source, its manifests, tables, shards or media:
the serving processes do, as the serving user with no capability.  What it
reads from them is fixed-size or bounded and checked: a report of a few
bytes (:class:`~cutfs.vfs.daemon.serving_process.OpenedReport`), the word
"ready", the numbers of their request slots
(:class:`~cutfs.vfs.daemon.request_slot.RequestSlot`), and log records
through :mod:`cutfs.vfs.daemon.log_channel`.

Faults: a serving process that dies fails only the request it was answering
(answered ``EIO`` here, with the copy of its descriptor the supervisor keeps;
the kernel ends anything else it had read once that copy is closed) and is
started again; one that dies before it serves is tried three times.  One past
its request's deadline, or that has not run for the read timeout (at most
10 s: stopped by its user, hung), is killed and replaced.  When none is left
the supervisor unmounts: a mount nobody serves must not hang its readers.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import time
from collections.abc import Sequence
from dataclasses import replace
from multiprocessing import reduction
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Final

import trio

from cutfs.vfs.daemon.exit_status import how_it_ended
from cutfs.vfs.daemon.log_channel import LogChannel
from cutfs.vfs.daemon.request_slot import READ_AHEAD_UNIQUE, RequestSlot
from cutfs.vfs.daemon.serving_setup import (
    MOST_MESSAGE_BYTES,
    READY,
    FailedReport,
    OpenedReport,
    ServingSetup,
    decode_report,
    shared_board_path,
    shared_supervisor_path,
)
from cutfs.vfs.daemon.spawned_process import SpawnedProcess
from cutfs.vfs.fuse.device_channel import clone_device, write_reply
from cutfs.vfs.fuse.read_ahead import ReadAhead
from cutfs.vfs.sandbox.serving_user import kill_command_group
from cutfs.vfs.stats.statistics import Statistics
from cutfs.vfs.stats.statistics_board import StatisticsBoard

log = logging.getLogger("cutfs.supervisor")

#: How often the supervisor looks at its serving processes.
_WATCH_SECONDS: Final = 0.25
#: How often it publishes its figures for ``.cutfs/stats``.
_PUBLISH_SECONDS: Final = 1.0
#: How many times in a row a process may die before it serves.
_TRIES_BEFORE_SERVING: Final = 3
#: The longest a serving process may go without running (while it holds no request).
_MOST_SILENT_SECONDS: Final = 10.0
#: How long serving processes get to end by themselves once the mount is gone.
_ENDING_SECONDS: Final = 5.0


class ServingFailedError(Exception):
    """The first serving process could not open the source; says why in one line."""

    def __init__(self, message: str, at_source: bool) -> None:
        super().__init__(message)
        self.at_source = at_source


def _ended_before_report(process: BaseProcess) -> ServingFailedError:
    return ServingFailedError(
        f"the serving process {how_it_ended(process.exitcode or 0)} before it opened the "
        "source (see the log)",
        at_source=False,
    )


def mount_device_fd() -> int:
    """This process's descriptor of /dev/fuse (pyfuse3 does not expose its session's)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "/dev/fuse":
                found.append(int(name))
        except OSError:
            continue
    if len(found) != 1:
        raise OSError(f"expected one /dev/fuse descriptor in the daemon, found {len(found)}")
    return found[0]


class _Server:
    """One serving process, seen from the supervisor."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.process: BaseProcess | None = None
        self.started = 0.0
        self._connection: Connection | None = None
        self._ready = False
        #: The process's clone of the mount's descriptor, kept to answer its request if it
        #: dies or is killed, and the slot saying which request that is.
        self._device: int | None = None
        self._slot: RequestSlot | None = None
        #: A request seen past its deadline at the last check (acted on at the second).
        self._overdue: int | None = None
        #: Whether the process was seen silent at the last check (acted on at the second).
        self._silent = False
        #: How many times in a row the process died before it said it serves.
        self.deaths_before_serving = 0
        #: Processes killed and not reaped yet.
        self._exited: list[BaseProcess] = []

    def start(
        self,
        setup: ServingSetup,
        log_writer: socket.socket,
        spawned: SpawnedProcess | None = None,
        shared: Sequence[int] = (),
    ) -> None:
        """Start the process (or take ``spawned``, started earlier) and tell it what to
        serve, with the descriptors ``shared`` by the serving processes (see
        :meth:`SpawnedProcess.configure`); it opens the source and waits for
        :meth:`hand_device`."""
        self._reap()
        if spawned is None:
            spawned = SpawnedProcess(self.index, log_writer)
        slot = RequestSlot.create()
        try:
            spawned.configure(setup, slot, shared)
        except BaseException:
            slot.close()
            spawned.close()
            raise
        self.process, self._connection = spawned.take()
        self._slot = slot
        self.started = time.monotonic()
        self._ready = False
        self._overdue = None
        self._silent = False

    def hand_device(self, mount_fd: int) -> None:
        """Give the process its clone of ``mount_fd`` (once INIT is answered); a copy is
        kept.  A process that is gone already is left to the watch."""
        if self.process is None or self._connection is None or self._device is not None:
            return
        clone = clone_device(mount_fd)
        try:
            reduction.send_handle(self._connection, clone, self.process.pid)
        except OSError as exc:
            os.close(clone)
            log.warning("serving process %d did not take the mount: %s", self.index, exc)
            return
        self._device = clone

    def wait_report(self) -> OpenedReport:
        """Wait for the process's report on the source; raises :class:`ServingFailedError`."""
        connection, process = self._connection, self.process
        assert connection is not None and process is not None
        while not connection.poll(0.5):
            if not process.is_alive():
                raise _ended_before_report(process)
        try:
            report = decode_report(connection.recv_bytes(MOST_MESSAGE_BYTES))
        except (EOFError, OSError) as exc:  # it died: its pipe closed
            process.join(5)
            if process.exitcode is not None:
                raise _ended_before_report(process) from exc
            raise ServingFailedError(
                f"the serving process did not report on the source: {exc}", at_source=False
            ) from exc
        except ValueError as exc:
            raise ServingFailedError(
                f"the serving process did not report on the source: {exc}", at_source=False
            ) from exc
        if isinstance(report, FailedReport):
            raise ServingFailedError(report.message, report.at_source)
        return report

    def silent(self, seconds: float) -> float | None:
        """How long this process has not run, if it holds no request and has not beaten
        for more than ``seconds``, seen so at this check and the one before; None else."""
        if self._slot is None or self._device is None or self._slot.current() is not None:
            self._silent = False
            return None
        silent_seconds = self._slot.silent_seconds()
        seen_before, self._silent = self._silent, silent_seconds > seconds
        return silent_seconds if seen_before and self._silent else None

    def overdue(self) -> tuple[int, int] | None:
        """The request (unique number, inode) this process has answered past its deadline,
        seen so at this check and the one before; None if there is none."""
        current = self._slot.current() if self._slot is not None else None
        if current is None or time.monotonic() < current[2]:
            self._overdue = None
            return None
        unique, inode, _ = current
        seen_before, self._overdue = self._overdue == unique, unique
        return (unique, inode) if seen_before else None

    def fail_current(self, setup: ServingSetup) -> tuple[int, int] | None:
        """Answer ``EIO`` to the request a dead process was answering, if any (its
        descriptor is then closed: the kernel ends what else it had read); the request's
        unique number and inode, or None."""
        current = self._slot.current() if self._slot is not None else None
        if self._slot is not None:
            kill_command_group(setup.user, self._slot.command_group())
        if self._device is not None:
            if current is not None and current[0] != READ_AHEAD_UNIQUE:
                write_reply(self._device, current[0], -errno.EIO, [])
            os.close(self._device)
            self._device = None
        if self._slot is not None:
            self._slot.close()
            self._slot = None
        return None if current is None else (current[0], current[1])

    def ready(self) -> bool:
        """Whether the process has said it serves, since it was last started (no waiting)."""
        try:
            while self._connection is not None and self._connection.poll():
                self._ready |= self._connection.recv_bytes(MOST_MESSAGE_BYTES) == READY
        except (EOFError, OSError):
            pass
        return self._ready

    def stop(self, setup: ServingSetup, wait: bool = True) -> None:
        """End the process: asked to (SIGTERM) and waited for a few seconds, killed if
        it does not end; with ``wait`` False, killed at once and reaped later (one stuck
        in the kernel on storage ends only when the kernel lets go of it)."""
        process = self.process
        if process is None:
            return
        if process.is_alive() and wait:
            process.terminate()
            process.join(5)
        if process.is_alive():
            process.kill()
            if wait:
                process.join(5)
        self._exited.append(process)
        self._reap()
        if self._connection is not None:
            self._connection.close()
        self._connection = None
        self.process = None
        self.fail_current(setup)

    def _reap(self) -> None:
        for process in list(self._exited):
            if process.exitcode is not None:
                process.close()
                self._exited.remove(process)


class Supervisor:
    """A mount's serving processes: started, handed the mount, watched, replaced, stopped."""

    def __init__(
        self, setup: ServingSetup, log_channel: LogChannel, first: SpawnedProcess | None = None
    ) -> None:
        """``setup.processes``: the supervisor and its serving processes (at least 2).
        The processes log through ``log_channel`` (the caller's to stop, after
        :meth:`close`); ``first``, if given, is serving process 1, spawned early."""
        self._setup = setup
        self._first = first
        self._servers = [_Server(index) for index in range(1, setup.processes)]
        self._mount_fd: int | None = None
        #: The requests the supervisor failed (missed deadlines, deaths).
        self.statistics = Statistics()
        #: The kernel settings applied to the mount, shown in ``.cutfs/stats``.
        self.kernel: dict[str, str] = {}
        self.restarts = 0
        self._board = StatisticsBoard(
            shared_board_path(setup.shared_dir),
            0,
            setup.processes,
            shared_supervisor_path(setup.shared_dir),
        )
        self._log_channel = log_channel
        #: The serving processes' read-ahead board, made here and handed to each of them
        #: (the supervisor never reads it).
        self._read_ahead = (
            ReadAhead.create(setup.options.read_ahead_cells) if setup.options.reads_ahead else None
        )
        self._shared = [] if self._read_ahead is None else self._read_ahead.descriptors

    def open_source(self) -> OpenedReport:
        """Start the first serving process and wait for it to open the source (no time
        limit: indexing a large source takes minutes).  Raises
        :class:`ServingFailedError`."""
        spawned, self._first = self._first, None
        self._servers[0].start(self._setup, self._log_channel.writer, spawned, self._shared)
        report = self._servers[0].wait_report()
        self._setup = replace(self._setup, identity=report.identity)
        return report

    def start_others(self) -> None:
        """Start the other serving processes, handed the mount at once: they must open
        what the first one opened (from the index it made, if it made one), and serve
        as each is ready.  Called once the first serves: started earlier, on few cores,
        they would slow it down, and the mount with it."""
        assert self._mount_fd is not None
        if len(self._servers) > 1:
            log.info("serving process 1 serves; %d more start", len(self._servers) - 1)
        for server in self._servers[1:]:
            try:
                server.start(self._setup, self._log_channel.writer, shared=self._shared)
            except OSError as exc:  # the mount serves already: it goes on with fewer
                log.error("serving process %d could not be started: %s", server.index, exc)
                continue
            server.hand_device(self._mount_fd)

    def hand_mount(self, mount_fd: int) -> None:
        """Give the first process its clone of ``mount_fd``; call once the kernel's INIT
        exchange is over (a clone could otherwise read the INIT request)."""
        self._mount_fd = mount_fd
        self._servers[0].hand_device(mount_fd)

    async def wait_ready(self, seconds: float) -> None:
        """Wait until the first process serves, for at most ``seconds`` (then go on: it is
        watched as usual).  The mount answers from then on."""
        with trio.move_on_after(seconds):
            while not self._servers[0].ready():
                await trio.sleep(0.01)
            return
        log.warning("the first serving process was not ready within %g s", seconds)

    def describe(self) -> dict[str, object]:
        alive = [s for s in self._servers if s.process is not None and s.process.is_alive()]
        return {
            "processes": self._setup.processes,
            "running": 1 + len(alive),
            "ready": 1 + sum(1 for s in alive if s.ready()),
            "restarts": self.restarts,
            "pids": [os.getpid()] + [s.process.pid for s in self._servers if s.process],
        }

    def publish_now(self) -> None:
        """Publish the supervisor's figures for ``.cutfs/stats`` (processes, restarts,
        kernel settings, the requests it failed)."""
        self._board.publish(
            self.statistics, {"serving": self.describe(), "kernel": dict(self.kernel)}
        )

    async def publish(self) -> None:
        """Publish the figures every second; runs forever."""
        while True:
            self.publish_now()
            await trio.sleep(_PUBLISH_SECONDS)

    async def supervise(self, mount_fd: int) -> bool:
        """Watch the processes until the mount goes away (True) or none is left to serve
        (False: every one died before it served, three times).

        One past its request's deadline is killed, and the request of one that died or
        was killed is answered ``EIO``.  The supervisor serves nothing, so it learns of
        the unmount from its own descriptor, which then polls as an error.
        """
        device = select.poll()
        device.register(mount_fd, 0)  # only errors: requests are the processes' to take
        while True:
            await trio.sleep(_WATCH_SECONDS)
            if any(events & select.POLLERR for _, events in device.poll(0)):
                return True
            self._check()
            if not any(server.process is not None for server in self._servers):
                return False

    def _check(self) -> None:
        for server in self._servers:
            process = server.process
            if process is None or self._mount_fd is None:
                continue
            if process.is_alive() and not self._killed_overdue(server, process):
                continue
            failed = server.fail_current(self._setup)
            if failed is not None:
                self.statistics.error("worker_died")
                log.error(
                    "serving process %d died answering a request about inode %d: "
                    "that request fails with EIO",
                    server.index,
                    failed[1],
                )
            served = server.ready()  # before stop(): it reads the process's last words
            log.error(
                "serving process %d (pid %s) %s after %.0f s",
                server.index,
                process.pid,
                "was killed" if process.exitcode is None else how_it_ended(process.exitcode),
                time.monotonic() - server.started,
            )
            server.stop(self._setup, wait=False)  # dead or killed: the watch must not wait
            server.deaths_before_serving = 0 if served else server.deaths_before_serving + 1
            if server.deaths_before_serving >= _TRIES_BEFORE_SERVING:
                log.error(
                    "serving process %d is not started again: it died %d times before serving",
                    server.index,
                    server.deaths_before_serving,
                )
                continue
            self.restarts += 1
            server.start(self._setup, self._log_channel.writer, shared=self._shared)
            server.hand_device(self._mount_fd)

    def _killed_overdue(self, server: _Server, process: BaseProcess) -> bool:
        """Kill ``process`` if it is past its request's deadline, or has not run for as
        long while it holds none (stopped by its user, hung); whether it was."""
        overdue = server.overdue()
        if overdue is None:
            return self._killed_silent(server, process)
        log.error(
            "serving process %d (pid %s) answered a request about inode %d for longer than "
            "its deadline (storage not answering?): killing it; %s",
            server.index,
            process.pid,
            overdue[1],
            "it was reading ahead: no request fails"
            if overdue[0] == READ_AHEAD_UNIQUE
            else "the request fails with EIO",
        )
        process.kill()  # it runs no more code: its request can be answered now
        failed = server.fail_current(self._setup)
        if failed is not None and failed[0] == overdue[0] == READ_AHEAD_UNIQUE:
            self.statistics.error("read_ahead_deadline")
        elif failed is not None and failed[0] == overdue[0]:
            self.statistics.error("deadline")
        elif failed is not None:  # it had just gone on to another, which fails with it
            self.statistics.error("worker_died")
        return True

    def _killed_silent(self, server: _Server, process: BaseProcess) -> bool:
        """Kill ``process`` if it has not run for :func:`_silence_limit` while it holds no
        request: requests wait in the kernel for a process to read them, so one stopped
        (by the source's owner, whom it runs as) must be replaced, not waited for."""
        silent = server.silent(_silence_limit(self._setup.options.read_timeout_seconds))
        if silent is None:
            return False
        log.error(
            "serving process %d (pid %s) has not run for %.1f s (stopped or hung): killing "
            "it; another takes its place",
            server.index,
            process.pid,
            silent,
        )
        process.kill()
        return True

    def close(self) -> None:
        """Stop every serving process and the log relay.  Once the mount was handed out,
        the processes see it go away and end by themselves, stopping their decoders and
        what those left running, and logging it; they get a few seconds for that before
        they are asked (SIGTERM ends one at once, cleanup undone)."""
        if self._mount_fd is not None:
            deadline = time.monotonic() + _ENDING_SECONDS
            for server in self._servers:
                if server.process is not None:
                    server.process.join(max(0.0, deadline - time.monotonic()))
        for server in self._servers:
            server.stop(self._setup)
        if self._first is not None:  # never started: the mount failed before
            self._first.close()
        if self._read_ahead is not None:
            self._read_ahead.close()
            self._read_ahead = None


def _silence_limit(read_timeout_seconds: float) -> float:
    """How long a serving process may go without running before it is replaced: the read
    timeout, at most 10 s (its loop beats about every second when idle)."""
    return min(read_timeout_seconds, _MOST_SILENT_SECONDS)
