"""A process that forks decoder workers for a serving process that may not start them.

A serving process runs as the serving user with no capability and
``no_new_privs`` (see :func:`~cutfs.vfs.sandbox.serving_user.drop_privileges`).
Starting a decoder worker the usual way (``multiprocessing``'s spawn) executes
the Python interpreter again, which that user may be unable to do: an
interpreter installed in root's home (pyenv under ``/root``, mode 0700) is
common.  Taking root back to start one is what the process split forbids.

So, like Chromium's zygote, a serving process that hands decoding to workers
starts a zygote first, while it is still root: a fresh interpreter that
imports everything a worker needs, then drops every privilege to the
serving user and waits.  Each worker is a ``fork`` of it: a copy of an
interpreter that has imported everything already, the serving user from its
first instruction, started in milliseconds instead of the second an
interpreter takes.  The zygote runs no thread, so forking it is safe.

The zygote and the serving process are the same user: what the serving
process sends (the worker's function and arguments, pickled) crosses no
privilege boundary.  The serving process gets the worker's end of a new socket
pair and a pidfd, through which it watches and kills the worker
(:class:`ForkedProcess`); the zygote reaps its children.  It ends when its
serving process does (its pipe closes, and the kernel signals it).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import multiprocessing
import os
import pickle
import select
import signal
import socket
import struct
import tempfile
import traceback
from collections.abc import Callable
from multiprocessing import reduction
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Final

from cutfs.vfs.daemon.process_name import name_process
from cutfs.vfs.sandbox.path_confinement import PathConfinement
from cutfs.vfs.sandbox.serving_user import ServingUser, drop_privileges
from cutfs.vfs.sandbox.syscall_filter import SyscallFilter

#: A fork request holds a function and its arguments, pickled: a few KiB.
_MOST_REQUEST_BYTES: Final = 1 << 20
_PID: Final = struct.Struct("<q")
#: How often an idle zygote reaps the workers that ended.
_REAP_SECONDS: Final = 1.0
_PR_SET_PDEATHSIG: Final = 1


class ForkedProcess:
    """A worker forked by a zygote, seen from the serving process: not its child, so it
    is watched and signalled through a pidfd (which cannot name a later process)."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self._pidfd: int | None = pidfd

    def is_alive(self) -> bool:
        if self._pidfd is None:
            return False
        readable, _, _ = select.select([self._pidfd], [], [], 0)
        return not readable  # a pidfd polls readable once its process has ended

    def kill(self) -> None:
        if self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def release(self) -> bool:
        """Close the pidfd once the process has ended; whether it has."""
        if self.is_alive():
            return False
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        return True


class Zygote:
    """The serving process's handle on its zygote (see the module's docstring)."""

    def __init__(self, process: BaseProcess, connection: Connection) -> None:
        self._process = process
        self._connection = connection

    @classmethod
    def start(
        cls,
        user: ServingUser | None,
        syscalls: SyscallFilter,
        paths: PathConfinement | None,
        preload: tuple[str, ...],
        scratch_dir: str | None = None,
    ) -> Zygote:
        """Start a zygote that imports the modules ``preload``, then becomes ``user``
        (``None``: stays who it is) with ``no_new_privs``, confines itself to ``paths``
        (``None``: not) and installs ``syscalls``, all of which its workers inherit; call
        while the interpreter may still be executed (before the caller drops its
        privileges).  ``scratch_dir``: where it and its workers make temporary files."""
        context = multiprocessing.get_context("spawn")
        ours, theirs = context.Pipe()
        process = context.Process(
            target=_zygote_main,
            args=(theirs, user, syscalls, paths, preload, scratch_dir),
            daemon=True,
            name="cutfs-zygote",
        )
        process.start()
        theirs.close()
        return cls(process, ours)

    def fork(
        self, target: Callable[..., object], args: tuple[Any, ...]
    ) -> tuple[Connection, ForkedProcess]:
        """A new process running ``target(connection, *args)``, and the other end of its
        ``connection``.  Raises OSError if the zygote is gone or could not fork."""
        try:
            self._connection.send_bytes(pickle.dumps((target, args)))
            (pid,) = _PID.unpack(self._connection.recv_bytes(_PID.size))
            if pid < 0:
                raise OSError(-pid, f"the zygote could not fork: {os.strerror(-pid)}")
            with socket.socket(fileno=os.dup(self._connection.fileno())) as channel:
                connection_fd, pidfd = reduction.recvfds(channel, 2)
        except EOFError as exc:
            raise OSError("the zygote ended") from exc
        return Connection(connection_fd), ForkedProcess(pid, pidfd)

    def close(self) -> None:
        self._connection.close()
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)


def _zygote_main(
    connection: Connection,
    user: ServingUser | None,
    syscalls: SyscallFilter,
    paths: PathConfinement | None,
    preload: tuple[str, ...],
    scratch_dir: str | None,
) -> None:
    name_process("cutfs-zygote")
    if scratch_dir is not None:
        tempfile.tempdir = scratch_dir
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for module in preload:
        importlib.import_module(module)
    drop_privileges(user)
    if paths is not None:
        paths.install()
    syscalls.install()
    while True:
        readable, _, _ = select.select([connection], [], [], _REAP_SECONDS)
        _reap()
        if not readable:
            continue
        try:
            request = connection.recv_bytes(_MOST_REQUEST_BYTES)
        except (EOFError, OSError):
            return
        target, args = pickle.loads(request)  # from the serving process: the same user
        _fork(connection, target, args)


def _fork(connection: Connection, target: Callable[..., object], args: tuple[Any, ...]) -> None:
    ours, theirs = socket.socketpair()
    try:
        pid = os.fork()
    except OSError as exc:
        ours.close()
        theirs.close()
        connection.send_bytes(_PID.pack(-(exc.errno or 1)))
        return
    if pid == 0:  # the worker
        status = 1
        try:
            connection.close()
            ours.close()
            target(Connection(theirs.detach()), *args)
            status = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(status)
    theirs.close()
    pidfd = os.pidfd_open(pid)  # the zygote reaps only in its loop: the pid is still its child's
    try:
        connection.send_bytes(_PID.pack(pid))
        with socket.socket(fileno=os.dup(connection.fileno())) as channel:
            reduction.sendfds(channel, [ours.fileno(), pidfd])
    finally:
        ours.close()
        os.close(pidfd)


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
