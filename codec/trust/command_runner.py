"""Running a source's shell command (Kaldi ``cmd |``, Lhotse ``command``) within limits.

A command runs with ``/bin/sh -c`` in a session and process group of its own,
as the user of the calling process, with a minimal environment of its own.  Its
standard output goes to a file;
the whole group is killed when it runs past its deadline or writes more than
its output cap, and when it is done (stragglers it left in the background).
When the process that started it dies, the shell gets ``SIGKILL`` as its
parent-death signal, and the group is announced through
:func:`announce_groups_to` beforehand so that whoever watches that process
(a decoder pool) can kill the rest.  A failed or killed command leaves no
output file.

Whether a command may run at all is decided by
:class:`cutfs.codec.trust.source_policy.SourcePolicy`, not here.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import selectors
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from cutfs.codec.errors import SourceError

_PR_SET_PDEATHSIG: Final = 1
#: Loaded in the parent: the child between fork and exec only calls into it.
_LIBC: Final = ctypes.CDLL(None, use_errno=True)
_CHUNK_BYTES: Final = 1 << 20
_STDERR_KEPT_BYTES: Final = 4096


_announce: Callable[[int], None] | None = None


def announce_groups_to(callback: Callable[[int], None] | None) -> None:
    """Call ``callback`` with each command's process group id as it starts (one per process)."""
    global _announce  # noqa: PLW0603 - one watcher per process, set once by a decoder worker
    _announce = callback


@dataclass(frozen=True, slots=True)
class CommandLimits:
    """How long a command may run and how much it may write."""

    timeout_seconds: float = 600.0
    max_output_bytes: int = 4 << 30


def run_command(
    command: str,
    output_path: str,
    limits: CommandLimits,
    where: str,
    working_directory: str | None = None,
) -> None:
    """Run ``command`` (in ``working_directory``, default the caller's) and write its
    standard output to ``output_path``.

    The output is written to a temporary name beside ``output_path`` and
    renamed when the command succeeds.  Raises :class:`SourceError` when it
    exits with a non-zero status, runs past ``limits.timeout_seconds`` or
    writes more than ``limits.max_output_bytes``.
    """
    partial = f"{output_path}.{os.getpid()}.partial"
    try:
        with open(partial, "wb") as output:
            _run(command, output.fileno(), limits, where, working_directory)
        os.replace(partial, output_path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)


def _run(
    command: str, output: int, limits: CommandLimits, where: str, working_directory: str | None
) -> None:
    process = subprocess.Popen(
        ["/bin/sh", "-c", command],
        env=_environment(),
        cwd=working_directory,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=_die_with_parent,  # noqa: PLW1509 - only calls prctl
    )
    assert process.stdout is not None and process.stderr is not None
    if _announce is not None:
        _announce(process.pid)
    deadline = time.monotonic() + limits.timeout_seconds
    written = 0
    errors = b""
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            selector.register(process.stderr, selectors.EVENT_READ)
            while selector.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise SourceError(
                        f"command ran longer than {limits.timeout_seconds:g} s and was killed",
                        where=where,
                    )
                for key, _ in selector.select(min(remaining, 1.0)):
                    chunk = os.read(key.fd, _CHUNK_BYTES)
                    if not chunk:
                        selector.unregister(key.fileobj)
                    elif key.fileobj is process.stderr:
                        errors = (errors + chunk)[-_STDERR_KEPT_BYTES:]
                    else:
                        written += len(chunk)
                        if written > limits.max_output_bytes:
                            raise SourceError(
                                f"command wrote more than {limits.max_output_bytes} bytes "
                                "and was killed",
                                where=where,
                            )
                        _write_all(output, chunk)
        status = process.wait(max(deadline - time.monotonic(), 0.1))
    finally:
        _kill_group(process)  # on failure the command, on success what it left running
        process.stdout.close()
        process.stderr.close()
    if status != 0:
        message = errors.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise SourceError(f"command exited with status {status}: {message[0]}", where=where)


def kill_group(group: int) -> bool:
    """Kill a command's process group (announced by :func:`announce_groups_to`); False if
    there is no such group.  Raises :class:`PermissionError` for a group this process may
    not signal."""
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(PermissionError):  # its own child: not expected
        kill_group(process.pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(5)


def _environment() -> dict[str, str]:
    """A command's whole environment: nothing of the caller's (a daemon started by root may
    hold secrets in its environment), a standard PATH, the home of the user it runs as."""
    try:
        home = pwd.getpwuid(os.geteuid()).pw_dir
    except KeyError:
        home = "/"
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "LC_ALL": "C.UTF-8"}


def _write_all(descriptor: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view) :]


def _die_with_parent() -> None:
    """In the child, before exec: be killed when the parent (a decoder worker) dies."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
