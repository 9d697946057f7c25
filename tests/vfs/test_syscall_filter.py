"""The seccomp filter of the processes that parse other people's data, installed for real
in a child process that then tries what a taken-over decoder would."""

from __future__ import annotations

import platform
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64's table only")

_PROLOGUE = """
import ctypes, os, socket, sys
from cutfs.vfs.sandbox.serving_user import drop_privileges
from cutfs.vfs.sandbox.syscall_filter import SyscallFilter
drop_privileges(None)
assert SyscallFilter(allow_exec={exec}, allow_network={network}).install()
print("installed", flush=True)
"""


def _run(attempt: str, *, exec_: bool = False, network: bool = False) -> tuple[int, str]:
    """Install the filter in a new Python process, then run ``attempt``; its exit status
    (minus a signal's number) and what it printed."""
    code = _PROLOGUE.format(exec=exec_, network=network) + attempt
    result = subprocess.run(
        [sys.executable, "-I", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "installed" in result.stdout, result.stderr
    return result.returncode, result.stdout


def test_a_program_started_kills_the_process() -> None:
    status, printed = _run('os.execv("/bin/true", ["true"])\nprint("ran", flush=True)')
    assert status == -signal.SIGSYS and "ran" not in printed


def test_programs_run_when_the_mount_runs_commands() -> None:
    status, _ = _run('os.execv("/bin/sh", ["sh", "-c", "exit 7"])', exec_=True)
    assert status == 7


@pytest.mark.parametrize(
    "call",
    [
        "ctypes.CDLL(None).syscall(425, 8, ctypes.create_string_buffer(120))",  # io_uring_setup
        "ctypes.CDLL(None).syscall(101, 16, os.getppid(), 0, 0)",  # ptrace attach
        "ctypes.CDLL(None).syscall(272, 0x20000)",  # unshare a mount namespace
        "ctypes.CDLL(None).syscall(321, 0, 0, 0)",  # bpf
    ],
)
def test_the_kernels_larger_surfaces_kill_the_process(call: str) -> None:
    status, printed = _run(f"{call}\nprint('survived', flush=True)")
    assert status == -signal.SIGSYS and "survived" not in printed


def test_only_unix_sockets_without_object_storage() -> None:
    attempt = """
socket.socketpair()
print("unix", flush=True)
for family in (socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK):
    try:
        socket.socket(family, socket.SOCK_DGRAM)
    except PermissionError:
        print("refused", family, flush=True)
"""
    status, printed = _run(attempt)
    assert status == 0 and "unix" in printed
    assert printed.count("refused") == 3


def test_network_sockets_with_object_storage() -> None:
    status, printed = _run("socket.socket(socket.AF_INET)\nprint('inet', flush=True)", network=True)
    assert status == 0 and "inet" in printed


def test_what_a_decoder_does_is_allowed() -> None:
    """Reading files, threads, mapping memory, forking (the zygote), pidfds."""
    attempt = """
import mmap, threading
assert open("/etc/hostname", "rb").read() is not None
thread = threading.Thread(target=lambda: None); thread.start(); thread.join()
memory = mmap.mmap(-1, 1 << 20); memory[:4] = b"abcd"
child = os.fork()
if child == 0:
    os._exit(3)
pidfd = os.pidfd_open(child)
assert os.waitpid(child, 0)[1] >> 8 == 3
print("fine", flush=True)
"""
    status, printed = _run(attempt)
    assert status == 0 and "fine" in printed
