"""What the benchmarks read about a mount's daemon and its decoder workers from /proc."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


def daemon_pids(mountpoint: Path) -> list[int]:
    """The ``cutfs mount`` process serving ``mountpoint``, then its children (the workers)."""
    daemons = subprocess.run(
        ["pgrep", "-f", f"cutfs.vfs.cli .*{mountpoint}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    children = (
        subprocess.run(
            ["pgrep", "-P", ",".join(daemons)], capture_output=True, text=True, check=False
        ).stdout.split()
        if daemons
        else []
    )
    return [int(pid) for pid in daemons + children]


def read_bytes(pids: list[int]) -> int:
    """Bytes these processes made the kernel fetch from storage (``/proc/PID/io``)."""
    return _sum_field(pids, "io", "read_bytes:", 1)


def pss_bytes(pids: list[int]) -> int:
    """Their proportional memory (``Pss`` of ``/proc/PID/smaps_rollup``), in bytes."""
    return _sum_field(pids, "smaps_rollup", "Pss:", 1024)


def _sum_field(pids: list[int], name: str, field: str, unit: int) -> int:
    total = 0
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/{name}").read_text().splitlines()
        except OSError:
            continue  # gone meanwhile
        total += sum(int(line.split()[1]) * unit for line in lines if line.startswith(field))
    return total


def unmount(path: Path) -> None:
    """Unmount ``path`` if it is mounted: retried for a few seconds while it is busy (a
    reader of the previous step may still be closing a file), then lazily."""
    path = path.resolve()  # /proc/mounts lists absolute paths
    for attempt in range(26):
        if not any(
            line.split()[1] == str(path) for line in Path("/proc/mounts").read_text().splitlines()
        ):
            return
        lazy = ["-z"] if attempt == 25 else []
        done = subprocess.run(
            ["fusermount3", "-u", *lazy, str(path)], check=False, capture_output=True
        )
        if done.returncode != 0 and attempt in (0, 25):
            print(f"bench: unmounting {path}: {done.stderr.decode().strip()}", flush=True)
        time.sleep(0.2)
