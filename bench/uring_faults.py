#!/usr/bin/env python3
"""What FUSE over io_uring does with a request held by a server process that dies, and
whether another process can fail it: a minimal reproducer for issue #39's fault design.

    sudo .venv/bin/python bench/uring_faults.py [--kill-client]

Needs Linux 6.14 or later, root, and ``/sys/module/fuse/parameters/enable_uring`` (set to
``Y`` for the run and put back after). Nothing of cutfs is used: the script mounts a FUSE
file system of one file by hand (``mount(2)`` on a ``/dev/fuse`` descriptor), answers
INIT, and serves every later request over io_uring (``IORING_OP_URING_CMD``, 128-byte
SQEs) from a forked *server* process, one ring entry per queue (one queue per possible
CPU). The entries' buffers live in one shared ``memfd`` mapped at the same address in
every process (``MAP_FIXED_NOREPLACE`` before the fork). Then:

1. a *client* process, pinned to CPU 0, looks the file up and reads it;
2. the server answers the lookup, takes the READ and holds it; it is killed (SIGKILL);
3. two seconds later: is the client still waiting? Its read is not failed by the death,
   unlike a request read from ``/dev/fuse``, which fails as the dead process's descriptor
   closes. With ``--kill-client`` the client is then sent SIGKILL: is it still there, in
   state ``D``?
4. the parent, which never served anything, writes an ``EIO`` header into the dead
   server's entry (the shared memory, at the same address) and commits the held request
   by its id from a ring of its own; the entry is then the parent's, and the parent
   answers what the queue hands it (a READ with 4 KiB of ``x``): does the client finish,
   and how soon?

It prints each step's outcome, and finally aborts the connection (the adopted entry
would otherwise wait for requests) and unmounts.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import signal
import struct
import sys
import tempfile
import time
from typing import Final

LIBC: Final = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long
LIBC.mmap.restype = ctypes.c_void_p
LIBC.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
SYS_IO_URING_SETUP: Final = 425
SYS_IO_URING_ENTER: Final = 426
IORING_SETUP_SQE128: Final = 1 << 10
IORING_OFF_SQ_RING: Final = 0
IORING_OFF_CQ_RING: Final = 0x8000000
IORING_OFF_SQES: Final = 0x10000000
IORING_ENTER_GETEVENTS: Final = 1
IORING_OP_URING_CMD: Final = 46
FUSE_IO_URING_CMD_REGISTER: Final = 1
FUSE_IO_URING_CMD_COMMIT_AND_FETCH: Final = 2
MAP_FIXED_NOREPLACE: Final = 0x100000
SHARED_ADDRESS: Final = 0x7E0000000000
HEADER_BYTES: Final = 288  # in_out[128], op_in[128], ent_in_out (32)
PAYLOAD_BYTES: Final = 1 << 20
ENTRY_BYTES: Final = HEADER_BYTES + PAYLOAD_BYTES + 4096 - HEADER_BYTES % 4096
ENABLE: Final = "/sys/module/fuse/parameters/enable_uring"

IN_HEADER: Final = struct.Struct("<IIQQIIIHH")  # len opcode unique nodeid uid gid pid ext pad
OUT_HEADER: Final = struct.Struct("<IiQ")
ENT_IN_OUT: Final = struct.Struct("<QQIIQ")  # flags commit_id payload_sz padding reserved
INIT_IN: Final = struct.Struct("<IIII")
INIT_OUT: Final = struct.Struct("<IIIIHHIIHHI28x")
ATTR: Final = struct.Struct("<QQQQQQIIIIIIIIII")
LOOKUP, GETATTR, OPEN, READ, INIT = 1, 3, 14, 15, 26


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


class Ring:
    """A bare io_uring with 128-byte SQEs: submit one SQE at a time, reap completions."""

    def __init__(self, entries: int = 8) -> None:
        params = (ctypes.c_uint32 * 30)()
        params[2] = IORING_SETUP_SQE128
        self.fd = _check(LIBC.syscall(SYS_IO_URING_SETUP, entries, params), "io_uring_setup")
        sq_entries, cq_entries = params[0], params[1]
        sq_off = list(params[10:17])  # head tail ring_mask ring_entries flags dropped array
        cq_off = list(params[20:26])  # head tail ring_mask ring_entries overflow cqes
        sq_bytes = sq_off[6] + sq_entries * 4
        cq_bytes = cq_off[5] + cq_entries * 16
        size = max(sq_bytes, cq_bytes)  # IORING_FEAT_SINGLE_MMAP (every kernel since 5.4)
        self.rings = mmap.mmap(self.fd, size, offset=IORING_OFF_SQ_RING)
        self.sqes = mmap.mmap(self.fd, sq_entries * 128, offset=IORING_OFF_SQES)
        self.sq_off, self.cq_off = sq_off, cq_off
        self.sq_mask = self._u32(sq_off[2])
        self.cq_mask = self._u32(cq_off[2])

    def _u32(self, offset: int) -> int:
        value: int = struct.unpack_from("<I", self.rings, offset)[0]
        return value

    def submit(
        self, cmd_op: int, fd: int, command: bytes, user_data: int, addr: int = 0, length: int = 0
    ) -> None:
        tail = self._u32(self.sq_off[1])
        index = tail & self.sq_mask
        sqe = bytearray(128)
        struct.pack_into("<BBHiII", sqe, 0, IORING_OP_URING_CMD, 0, 0, fd, cmd_op, 0)
        struct.pack_into("<QI", sqe, 16, addr, length)
        struct.pack_into("<Q", sqe, 32, user_data)
        sqe[48 : 48 + len(command)] = command
        self.sqes[index * 128 : index * 128 + 128] = bytes(sqe)
        struct.pack_into("<I", self.rings, self.sq_off[6] + index * 4, index)
        struct.pack_into("<I", self.rings, self.sq_off[1], tail + 1)
        _check(LIBC.syscall(SYS_IO_URING_ENTER, self.fd, 1, 0, 0, None, 0), "io_uring_enter")

    def peek(self) -> tuple[int, int] | None:
        """A completion if one is there: (user_data, res)."""
        head, tail = self._u32(self.cq_off[0]), self._u32(self.cq_off[1])
        if head == tail:
            return None
        at = self.cq_off[5] + (head & self.cq_mask) * 16
        user_data, res, _ = struct.unpack_from("<QiI", self.rings, at)
        struct.pack_into("<I", self.rings, self.cq_off[0], head + 1)
        return user_data, res

    def wait(self) -> tuple[int, int]:
        """The next completion: (user_data, res)."""
        while True:
            head, tail = self._u32(self.cq_off[0]), self._u32(self.cq_off[1])
            if head != tail:
                at = self.cq_off[5] + (head & self.cq_mask) * 16
                user_data, res, _ = struct.unpack_from("<QiI", self.rings, at)
                struct.pack_into("<I", self.rings, self.cq_off[0], head + 1)
                return user_data, res
            _check(
                LIBC.syscall(SYS_IO_URING_ENTER, self.fd, 0, 1, IORING_ENTER_GETEVENTS, None, 0),
                "io_uring_enter",
            )


def command(commit_id: int, qid: int) -> bytes:
    return struct.pack("<QQH6x", 0, commit_id, qid)


def entry(qid: int) -> int:
    return SHARED_ADDRESS + qid * ENTRY_BYTES


def attr_bytes() -> bytes:
    return ATTR.pack(2, 4096, 8, 0, 0, 0, 0, 0, 0, 0o100444, 1, 0, 0, 0, 4096, 0)


def serve(device: int, queues: int, report: int) -> None:
    """The server: register an entry per queue, answer LOOKUP/GETATTR, hold the READ."""
    ring = Ring()
    iovecs = (ctypes.c_uint64 * (4 * queues))()
    for qid in range(queues):
        iovecs[4 * qid : 4 * qid + 4] = [entry(qid), HEADER_BYTES, entry(qid) + 4096, PAYLOAD_BYTES]
        address = ctypes.addressof(iovecs) + 32 * qid
        ring.submit(FUSE_IO_URING_CMD_REGISTER, device, command(0, qid), qid, address, 2)
    os.write(report, b"ready\n")
    while True:
        qid, res = ring.wait()
        if res < 0:
            os.write(report, f"completion {res} on queue {qid}\n".encode())
            continue
        opcode, unique = respond(qid, hold_reads=True)
        if opcode == READ:
            os.write(report, f"holding {unique} {qid}\n".encode())
            time.sleep(3600)
        ring.submit(FUSE_IO_URING_CMD_COMMIT_AND_FETCH, device, command(unique, qid), qid)


def respond(qid: int, hold_reads: bool) -> tuple[int, int]:
    """Answer the request in queue ``qid``'s entry (a READ only if not ``hold_reads``: 4 KiB
    of ``x``); its opcode and id."""
    headers = (ctypes.c_char * HEADER_BYTES).from_address(entry(qid))
    _, opcode, unique, _, _, _, _, _, _ = IN_HEADER.unpack_from(headers, 0)
    body, error = b"", -errno.ENOSYS
    if opcode == LOOKUP:
        body, error = struct.pack("<QQQQII", 2, 0, 10, 10, 0, 0) + attr_bytes(), 0
    elif opcode == GETATTR:
        body, error = struct.pack("<QII", 10, 0, 0) + attr_bytes(), 0
    elif opcode == READ:
        if hold_reads:
            return opcode, unique
        body, error = b"x" * 4096, 0
    answer(headers, qid, unique, error, body)
    return opcode, unique


def answer(
    headers: ctypes.Array[ctypes.c_char], qid: int, unique: int, error: int, body: bytes
) -> None:
    """Write a reply into an entry's buffers (header in in_out, body in the payload)."""
    OUT_HEADER.pack_into(headers, 0, OUT_HEADER.size + len(body), error, unique)
    ctypes.memmove(entry(qid) + 4096, body, len(body))
    ENT_IN_OUT.pack_into(headers, 256, 0, unique, len(body), 0, 0)


def client(path: str) -> None:
    os.sched_setaffinity(0, {0})  # its requests go to queue 0
    try:
        with open(path, "rb", buffering=0) as file:
            file.read(4096)
    except OSError as exc:
        os._exit(100 + (exc.errno or 0))
    os._exit(0)


def possible_cpus() -> int:
    """The kernel's queue count: one per possible CPU (``0-1`` -> 2)."""
    with open("/sys/devices/system/cpu/possible") as possible:
        return max(int(part.split("-")[-1]) for part in possible.read().strip().split(",")) + 1


def state_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def main() -> int:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    if os.geteuid() != 0 or not os.path.exists(ENABLE):
        print("needs root and a kernel with FUSE over io_uring (6.14+)")
        return 2
    with open(ENABLE) as setting:
        was = setting.read().strip()
    with open(ENABLE, "w") as setting:
        setting.write("Y")
    if not os.listdir("/sys/fs/fuse/connections"):  # to abort the connection at the end
        LIBC.mount(b"fusectl", b"/sys/fs/fuse/connections", b"fusectl", 0, None)
    signal.signal(signal.SIGALRM, _give_up)
    signal.alarm(30)  # a step that hangs ends the run, which still tears the mount down
    mountpoint = tempfile.mkdtemp(prefix="uring-faults-")
    device = os.open("/dev/fuse", os.O_RDWR)
    options = f"fd={device},rootmode=40000,user_id=0,group_id=0".encode()
    _check(LIBC.mount(b"uring-faults", mountpoint.encode(), b"fuse", 0, options), "mount")
    children: list[int] = []
    try:
        print(f"{answer_init(device)}; enable_uring was {was}")
        map_entries(possible_cpus())
        experiment(device, mountpoint, possible_cpus(), children)
    finally:
        tear_down(mountpoint, children)
        with open(ENABLE, "w") as setting:
            setting.write(was)
    return 0


def _give_up(*_: object) -> None:
    raise SystemExit("a step hung for 30 s: giving up")


def answer_init(device: int) -> str:
    """Read INIT from the device and answer it, asking for io_uring."""
    request = os.read(device, 1 << 20)
    _, opcode, unique, _, _, _, _, _, _ = IN_HEADER.unpack_from(request)
    major, minor, readahead, _ = INIT_IN.unpack_from(request, IN_HEADER.size)
    assert opcode == INIT
    # FUSE_INIT_EXT, and FUSE_OVER_IO_URING (bit 41: bit 9 of flags2).
    body = INIT_OUT.pack(7, minor, readahead, 1 << 30, 0, 0, 1 << 20, 1, 256, 0, 1 << 9)
    os.write(device, OUT_HEADER.pack(OUT_HEADER.size + len(body), 0, unique) + body)
    return f"kernel FUSE {major}.{minor}"


def map_entries(queues: int) -> None:
    """The entries' buffers: a memfd at SHARED_ADDRESS, in this process and its forks."""
    memory = os.memfd_create("uring-entries")
    os.ftruncate(memory, queues * ENTRY_BYTES)
    mapped = LIBC.mmap(
        SHARED_ADDRESS,
        queues * ENTRY_BYTES,
        mmap.PROT_READ | mmap.PROT_WRITE,
        mmap.MAP_SHARED | MAP_FIXED_NOREPLACE,
        memory,
        0,
    )
    assert mapped == SHARED_ADDRESS, "the shared address is taken"


def experiment(device: int, mountpoint: str, queues: int, children: list[int]) -> None:
    reports_read, reports = os.pipe()
    server = os.fork()
    if server == 0:
        try:
            serve(device, queues, reports)
        finally:
            os._exit(1)
    children.append(server)
    lines = os.fdopen(reports_read)
    print("server:", lines.readline().strip(), f"({queues} queues)")
    reader = os.fork()
    if reader == 0:
        client(os.path.join(mountpoint, "f"))
    children.append(reader)
    held = lines.readline().split()
    print("server:", " ".join(held))
    unique, qid = int(held[1]), int(held[2])
    os.kill(server, signal.SIGKILL)
    os.waitpid(server, 0)
    time.sleep(2)
    done, _ = os.waitpid(reader, os.WNOHANG)
    state = "gone" if done else state_of(reader)
    print(f"2 s after the server's death the client is {'done' if done else 'waiting'} ({state})")
    if done:
        return
    if "--kill-client" in sys.argv:
        os.kill(reader, signal.SIGKILL)
        time.sleep(0.5)
        done, _ = os.waitpid(reader, os.WNOHANG)
        print(
            f"after SIGKILL the client is {'gone' if done else 'still there'}"
            f" ({'-' if done else state_of(reader)})"
        )
        if done:
            return
    recover(device, mountpoint, reader, unique, qid, children)


def recover(
    device: int, mountpoint: str, reader: int, unique: int, qid: int, children: list[int]
) -> None:
    """Fail the dead server's held request from this process, then serve its queue."""
    done = 0
    headers = (ctypes.c_char * HEADER_BYTES).from_address(entry(qid))
    answer(headers, qid, unique, -errno.EIO, b"")
    recovery = Ring()
    started = time.monotonic()
    recovery.submit(FUSE_IO_URING_CMD_COMMIT_AND_FETCH, device, command(unique, qid), 99)
    status = 0
    while time.monotonic() - started < 2 and not done:
        done, status = os.waitpid(reader, os.WNOHANG)
        completion = recovery.peek()
        if completion is not None and completion[1] < 0:
            print(f"the commit failed: {os.strerror(-completion[1])}")
        elif completion is not None:  # the adopted entry was handed a request
            headers = (ctypes.c_char * HEADER_BYTES).from_address(entry(qid))
            _, opcode, delivered, _, _, _, _, _, _ = IN_HEADER.unpack_from(headers, 0)
            print(f"the adopted entry was handed request {delivered} (opcode {opcode})")
            opcode, delivered = respond(qid, hold_reads=False)
            recovery.submit(FUSE_IO_URING_CMD_COMMIT_AND_FETCH, device, command(delivered, qid), 99)
        time.sleep(0.001)
    outcome = "still waiting"
    if done:
        code = os.waitstatus_to_exitcode(status)
        outcome = "gone: SIGKILLed before" if code < 0 else f"gone, exit {code}"
        outcome += " (its read failed with EIO)" if code == 100 + errno.EIO else ""
    print(
        f"after another process committed EIO for request {unique}: the client is "
        f"{outcome}, {(time.monotonic() - started) * 1000:.1f} ms later"
    )


def tear_down(mountpoint: str, children: list[int]) -> None:
    """Abort the connection (the adopted entry would wait for requests), unmount, reap."""
    with open("/proc/self/mountinfo") as table:
        for line in table:
            fields = line.split()
            if fields[4] == mountpoint:
                number = int(fields[2].split(":")[1])
                with (
                    contextlib.suppress(OSError),
                    open(f"/sys/fs/fuse/connections/{number}/abort", "w") as abort,
                ):
                    abort.write("1")
    LIBC.umount2(mountpoint.encode(), 2)  # MNT_DETACH
    for child in children:
        with contextlib.suppress(OSError):
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
    with contextlib.suppress(OSError):
        os.rmdir(mountpoint)


if __name__ == "__main__":
    sys.exit(main())
