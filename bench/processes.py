"""What the benchmarks read about a mount's daemon and its decoder workers from /proc."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


def daemon_pids(mountpoint: Path) -> list[int]:
    """The ``cutfs mount`` process serving ``mountpoint``, then all its descendants (serving
    processes, the zygote and its decoder workers)."""
    daemons = subprocess.run(
        ["pgrep", "-f", f"cutfs.vfs.cli .*{mountpoint}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    found: list[int] = []
    for daemon in daemons:
        found.extend(pid for pid in _tree(int(daemon)) if pid not in found)
    return found


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


def run_measured(
    command: list[str], disk: Path, env: dict[str, str] | None = None
) -> dict[str, float]:
    """Run ``command`` to its end, sampling every 0.2 s the resident memory of its whole
    process tree (the sum of ``VmRSS`` over the process and all its descendants: a pack's
    indexing workers too) and the space used on ``disk``'s file system beyond what was
    used at the start (spilled runs, unlinked temporary files and the output alike).

    Returns seconds, the peak tree RSS and the peak extra disk use, in bytes.  Raises
    ``subprocess.CalledProcessError`` when the command fails.
    """
    import os  # noqa: PLC0415

    def used() -> int:
        stat = os.statvfs(disk)
        return (stat.f_blocks - stat.f_bfree) * stat.f_frsize

    disk_at_start = used()
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    peak_rss = peak_disk = 0
    while process.poll() is None:
        peak_rss = max(peak_rss, _sum_field(_tree(process.pid), "status", "VmRSS:", 1024))
        peak_disk = max(peak_disk, used() - disk_at_start)
        time.sleep(0.2)
    seconds = time.perf_counter() - started
    _, errors = process.communicate()
    if process.returncode:
        raise subprocess.CalledProcessError(process.returncode, command, stderr=errors)
    return {"seconds": seconds, "peak_rss_bytes": peak_rss, "peak_disk_bytes": peak_disk}


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, from ``/proc/*/stat``."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        queue.extend(parents.get(current, []))
    return found
