"""A seccomp filter for the processes that parse other people's data.

Serving processes, the zygote and decoder workers run FFmpeg, libFLAC,
libsndfile, pyarrow and gzip over files other people wrote, as the serving
user.  Dropping privileges (:func:`~cutfs.vfs.sandbox.serving_user.drop_privileges`)
limits what code taken over by such data could do to what that user can do;
this filter removes what none of these processes ever needs, so that a
taken-over decoder cannot start a shell, reach the network or poke at the
kernel's larger attack surfaces:

- executing a program (``execve``, ``execveat``), unless the mount runs the
  source's commands (``--allow-commands``);
- sockets other than Unix ones, unless the mount reads object storage (a
  refused ``socket`` fails with ``EACCES``, as a firewall would refuse it);
- tracing or reading other processes (``ptrace``, ``process_vm_*``,
  ``pidfd_getfd``, ``kcmp``), mounts and namespaces, ``bpf``,
  ``perf_event_open``, keyrings, kernel modules, ``kexec``, ``reboot``,
  swap, ``userfaultfd``, ``io_uring`` (its requests would bypass this filter),
  file handles, ``acct``, ``quotactl``, ``syslog``.

A process that makes any of these calls is killed by the kernel (``SIGSYS``),
so its read fails with EIO and it is replaced like a process that crashed.
The filter applies to every thread of the process (``SECCOMP_FILTER_FLAG_TSYNC``)
and to everything it forks; it needs ``no_new_privs``, which
:func:`drop_privileges` sets.  Only x86-64 has a table of system call numbers
here; elsewhere no filter is installed, and the log says so.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import socket
import struct
from dataclasses import dataclass
from typing import Final

log = logging.getLogger("cutfs.syscall_filter")

#: The system calls killed, by name, with their numbers on x86-64.
_DENIED_X86_64: Final = {
    "ptrace": 101,
    "syslog": 103,
    "pivot_root": 155,
    "chroot": 161,
    "acct": 163,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "init_module": 175,
    "delete_module": 176,
    "quotactl": 179,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "kcmp": 312,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "pidfd_getfd": 438,
    "mount_setattr": 442,
}
_EXECUTE_X86_64: Final = {"execve": 59, "execveat": 322}
_SOCKET_X86_64: Final = 41
_AUDIT_ARCH_X86_64: Final = 0xC000003E
#: System call numbers with this bit set are x32's, another table: none is allowed.
_X32_SYSCALL_BIT: Final = 0x40000000

# Classic BPF, as seccomp runs it (linux/filter.h, linux/seccomp.h).
_LOAD_WORD: Final = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JUMP_IF_EQUAL: Final = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JUMP_IF_AT_LEAST: Final = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RETURN: Final = 0x06  # BPF_RET | BPF_K
_KILL_PROCESS: Final = 0x80000000
_ALLOW: Final = 0x7FFF0000
_FAIL_WITH: Final = 0x00050000  # SECCOMP_RET_ERRNO, the errno in the low 16 bits
# Offsets in struct seccomp_data: nr, arch, instruction_pointer, args[6].
_NUMBER_OFFSET: Final = 0
_ARCH_OFFSET: Final = 4
_FIRST_ARGUMENT_OFFSET: Final = 16  # its low 32 bits, on a little-endian machine
_INSTRUCTION: Final = struct.Struct("=HBBI")
_SECCOMP_SYSCALL_X86_64: Final = 317
_SECCOMP_SET_MODE_FILTER: Final = 1
_SECCOMP_FILTER_FLAG_TSYNC: Final = 1


@dataclass(frozen=True)
class SyscallFilter:
    """What a process of a mount that parses data may still do beyond the basics."""

    #: Execute programs: the mount runs the source's commands.
    allow_exec: bool = False
    #: Open sockets other than Unix ones: the mount reads object storage.
    allow_network: bool = False

    def program(self) -> bytes:
        """The filter's classic BPF program for x86-64."""
        denied = dict(_DENIED_X86_64)
        if not self.allow_exec:
            denied.update(_EXECUTE_X86_64)
        code: list[tuple[int, int, int | str, int | str]] = [
            (_LOAD_WORD, _ARCH_OFFSET, 0, 0),
            (_JUMP_IF_EQUAL, _AUDIT_ARCH_X86_64, 0, "kill"),
            (_LOAD_WORD, _NUMBER_OFFSET, 0, 0),
            (_JUMP_IF_AT_LEAST, _X32_SYSCALL_BIT, "kill", 0),
        ]
        code += [(_JUMP_IF_EQUAL, number, "kill", 0) for number in sorted(denied.values())]
        if not self.allow_network:
            code += [
                (_JUMP_IF_EQUAL, _SOCKET_X86_64, 0, "allow"),
                (_LOAD_WORD, _FIRST_ARGUMENT_OFFSET, 0, 0),
                (_JUMP_IF_EQUAL, socket.AF_UNIX, "allow", "refuse"),
            ]
        labels = {"allow": len(code), "refuse": len(code) + 1, "kill": len(code) + 2}
        code += [
            (_RETURN, _ALLOW, 0, 0),
            (_RETURN, _FAIL_WITH | errno.EACCES, 0, 0),
            (_RETURN, _KILL_PROCESS, 0, 0),
        ]
        return b"".join(
            _INSTRUCTION.pack(
                operation,
                _offset(when_true, labels, index),
                _offset(when_false, labels, index),
                argument,
            )
            for index, (operation, argument, when_true, when_false) in enumerate(code)
        )

    def install(self) -> bool:
        """Install the filter on every thread of this process (and what it forks); False
        where there is no table for the machine (nothing installed, logged).  Raises
        OSError if the kernel refuses it."""
        if platform.machine() != "x86_64":
            log.warning("no system call filter on %s: none is installed", platform.machine())
            return False
        program = self.program()
        count = len(program) // _INSTRUCTION.size
        instructions = ctypes.create_string_buffer(program, len(program))
        fprog = struct.pack("=HxxxxxxQ", count, ctypes.addressof(instructions))
        fprog_buffer = ctypes.create_string_buffer(fprog, len(fprog))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        result = libc.syscall(
            ctypes.c_long(_SECCOMP_SYSCALL_X86_64),
            ctypes.c_ulong(_SECCOMP_SET_MODE_FILTER),
            ctypes.c_ulong(_SECCOMP_FILTER_FLAG_TSYNC),
            fprog_buffer,
        )
        if result != 0:
            code = ctypes.get_errno() if result < 0 else errno.EBUSY
            raise OSError(code, f"the kernel refused the system call filter: {os.strerror(code)}")
        return True


def _offset(target: int | str, labels: dict[str, int], index: int) -> int:
    """A jump's offset: 0 (the next instruction) or the distance to a label."""
    return target if isinstance(target, int) else labels[target] - index - 1
