"""Real mounts for tests: the command, mounting, unmounting, comparing served files."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from support.corpus import ENCODINGS
from support.references import recording_id

needs_fuse = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="needs /dev/fuse and fusermount3",
)


CUTFS = [sys.executable, "-m", "cutfs.vfs.cli"]


def is_mounted(mountpoint: str) -> bool:
    with open("/proc/mounts") as mounts:
        return any(line.split()[1] == mountpoint for line in mounts)


def unmount(mountpoint: str) -> None:
    """Unmount everything at ``mountpoint`` (a failed test may have stacked mounts)."""
    for _ in range(5):
        if not is_mounted(mountpoint):
            break
        result = subprocess.run(["fusermount3", "-u", mountpoint], capture_output=True, check=False)
        if result.returncode != 0:
            subprocess.run(
                ["fusermount3", "-u", "-z", mountpoint], capture_output=True, check=False
            )

    deadline = time.monotonic() + 10
    while _daemon_pids(mountpoint) and time.monotonic() < deadline:
        time.sleep(0.05)


def _daemon_pids(mountpoint: str) -> list[int]:
    result = subprocess.run(
        # The daemon's arguments are the source, the mountpoint, then the options.
        ["pgrep", "-f", f"cutfs.vfs.cli mount .* {re.escape(mountpoint)}( |$)"],
        capture_output=True,
        text=True,
        check=False,
    )
    return [int(pid) for pid in result.stdout.split()]


def daemon_pid(mountpoint: str) -> int:
    """The pid of the daemon (the supervisor) of the mount at ``mountpoint``."""
    (pid,) = _daemon_pids(mountpoint)
    return pid


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, their children, ...)."""
    found: list[int] = []
    waiting = [pid]
    while waiting:
        parent = waiting.pop()
        try:
            children = [
                int(child)
                for task in os.listdir(f"/proc/{parent}/task")
                for child in _read_text(f"/proc/{parent}/task/{task}/children").split()
            ]
        except FileNotFoundError:
            continue
        found += children
        waiting += children
    return found


def spawned_pids(mountpoint: str) -> list[int]:
    """The serving processes and decoder workers of the mount at ``mountpoint`` (every
    process its daemon started through ``multiprocessing``, directly or not)."""
    return [
        pid
        for pid in descendants(daemon_pid(mountpoint))
        if "spawn_main" in _read_text(f"/proc/{pid}/cmdline")
    ]


def process_name(pid: int) -> str:
    """A process's name (``cutfs-serving``, ``cutfs-zygote``, ``cutfs-decoder``, ...)."""
    return _read_text(f"/proc/{pid}/comm").strip()


def holds_fuse(pid: int) -> bool:
    """Whether a process has a /dev/fuse descriptor (a serving process, not a decoder)."""
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return False
    for descriptor in descriptors:
        try:
            if os.readlink(f"/proc/{pid}/fd/{descriptor}") == "/dev/fuse":
                return True
        except FileNotFoundError:  # closed meanwhile
            continue
    return False


def _read_text(path: str) -> str:
    try:
        with open(path, "rb") as file:
            return file.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


def all_files(mountpoint: str) -> list[str]:
    """Every file of a mount but its control directory, by relative path."""
    files = []
    for directory, _, names in os.walk(mountpoint):
        if ".cutfs" in directory.split(os.sep):
            continue
        files += [os.path.relpath(os.path.join(directory, name), mountpoint) for name in names]
    return sorted(files)


def assert_same_files(mountpoint: str, reference: str) -> None:
    """Every file of ``mountpoint`` (but its control directory) is in ``reference`` with the
    same bytes, and the other way round; there are cut files among them.

    Except for the samples of lossy recordings, which may differ by 1 LSB: a lossy
    decoder's float output depends slightly on the seek point it started from, and which
    one a mount starts from depends on the reads it was asked before (the session's
    mount has served parts of every recording to other tests; measured: 1 partial read of
    60 of ``opus_stereo_48k`` differed by 1 LSB from the whole read).
    """
    files = all_files(mountpoint)
    assert files == all_files(reference)
    assert sum(name.endswith(".wav") for name in files) > 30
    for name in files:
        assert_same_file(mountpoint, reference, name)


def assert_same_file(mountpoint: str, reference: str, name: str) -> None:
    """File ``name`` has the same bytes in both mounts, but for the samples of a lossy
    recording, which may differ by 1 LSB (see :func:`assert_same_files`)."""
    ours, theirs = file_content(mountpoint, name), file_content(reference, name)
    if ours != theirs and name.endswith(".wav") and _of_lossy_recording(name):
        assert len(ours) == len(theirs) and ours[:44] == theirs[:44], name
        samples, expected = (np.frombuffer(data[44:], "<i2") for data in (ours, theirs))
        difference = np.abs(samples.astype(np.int32) - expected.astype(np.int32))
        assert int(difference.max()) <= 1, name
    else:
        assert ours == theirs, name


def _of_lossy_recording(name: str) -> bool:
    """Whether the cut or recording file ``name`` holds samples of a lossy test encoding
    (the test cut ids start with their recording's id)."""
    lossy = {recording_id(encoding.name) for encoding in ENCODINGS if not encoding.lossless}
    file_name = name.split(os.sep, 1)[-1]
    return any(file_name.startswith(recording) for recording in lossy)


def file_content(mountpoint: str, name: str) -> bytes:
    """A file's bytes; manifests name the cut files by absolute path: the mountpoint is
    replaced by a placeholder."""
    with open(os.path.join(mountpoint, name), "rb") as file:
        data = file.read()
    if name.endswith(".gz"):
        data = gzip.decompress(data)
    return data if name.endswith(".wav") else data.replace(mountpoint.encode(), b"MOUNTPOINT")


@contextmanager
def mounted(shard_dir: str, mountpoint: str, *options: str) -> Iterator[str]:
    """``cutfs mount`` (in the background, as users run it); always unmounted afterwards."""
    os.makedirs(mountpoint, exist_ok=True)
    result = subprocess.run(
        [*CUTFS, "mount", *options, shard_dir, mountpoint],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    try:
        assert result.returncode == 0, result.stderr
        assert is_mounted(mountpoint)
        _wait_until_every_process_serves(mountpoint)
        yield mountpoint
    finally:
        unmount(mountpoint)


def _wait_until_every_process_serves(mountpoint: str, timeout_seconds: float = 30.0) -> None:
    """Wait until each serving process of a mount serves: a mount is ready once its first
    one does, and tests look at them all.  A mount where one never does (a test of
    faults) is left to its test after ``timeout_seconds``."""
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        try:
            with open(os.path.join(mountpoint, ".cutfs", "stats"), "rb", buffering=0) as stats:
                serving = json.loads(stats.readall())["serving"]
        except (OSError, ValueError, KeyError):
            return
        if serving["ready"] >= serving["processes"]:
            return
        time.sleep(0.05)
