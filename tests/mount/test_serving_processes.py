"""One mount served by several processes (``--serving-processes``): the same bytes,
listings and time ranges whichever process answers, statistics added up, and the
faults of a process that dies.  The processes decode in turn by default; the event
loops of ``--no-decode-in-turn``, which hand decoding to workers, are tested too."""

from __future__ import annotations

import errno
import json
import mmap
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.corpus import wav_header
from support.mounts import CUTFS, mounted, needs_fuse, unmount
from support.references import (
    Reference,
    close_enough,
    cut_path,
    cut_plan,
    expected_file,
    recording_id,
)
from support.shards import resident_pages

pytestmark = [pytest.mark.mount, needs_fuse]

PROCESSES = 3
#: What ``serving`` counts: the supervisor besides the serving processes.
COUNTED = PROCESSES + 1
#: Two serving processes of each kind, and how many processes ``serving`` then counts.
KINDS = {
    "in turn": (("--serving-processes", "2"), 3),
    "loops": (("--no-decode-in-turn", "--serving-processes", "2"), 3),
}


def _stats(mount: str) -> dict[str, Any]:
    with open(os.path.join(mount, ".cutfs", "stats"), "rb") as stats:
        result: dict[str, Any] = json.loads(stats.read())
    return result


def _wait_for(mount: str, condition: Any, what: str, seconds: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    while True:
        stats = _stats(mount)
        if condition(stats["serving"]):
            return stats
        assert time.monotonic() < deadline, f"{what}: {stats['serving']}"
        time.sleep(0.2)


def _drop_caches() -> None:
    """The kernel forgets cached file pages and entries: reads and lookups reach the mount."""
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, shard_dir: str) -> Iterator[str]:
    mountpoint = str(tmp_path_factory.mktemp("served"))
    options = ("--serving-processes", str(PROCESSES), "--workers", "3", "--cache-size", "48M")
    with mounted(shard_dir, mountpoint, "--no-decode-in-turn", *options) as path:
        _wait_for(path, lambda s: s["ready"] == COUNTED, "every process serves")
        yield path


def _read(path: str) -> bytes:
    with open(path, "rb") as cut_file:
        return cut_file.read()


def test_every_cut_is_exact_whichever_process_reads_it(
    served: str, references: dict[str, Reference]
) -> None:
    cuts = cut_plan(references)
    expected = {str(c["id"]): expected_file(c, references) for c in cuts}
    lossless = {
        str(c["id"]): next(
            r for n, r in references.items() if recording_id(n) == c["recording"]
        ).lossless
        for c in cuts
    }
    for round_number in range(3):
        _drop_caches()
        order = list(expected)
        random.Random(round_number).shuffle(order)
        with ThreadPoolExecutor(max_workers=6) as readers:
            contents = list(readers.map(lambda i: _read(cut_path(served, i)), order))
        for cut_id, actual in zip(order, contents, strict=True):
            assert close_enough(actual, expected[cut_id], lossless[cut_id]), cut_id
    time.sleep(1.5)  # every process has published its figures since
    serving = _stats(served)["serving"]
    assert serving["processes"] == COUNTED and serving["counted"] == COUNTED
    supervisor, *processes = serving["requests_by_process"]
    assert supervisor == 0 and all(count > 0 for count in processes), serving


def test_listings_and_attributes_agree_across_processes(served: str, mount: str) -> None:
    """``mount`` is the suite's one-process mount of the same shards."""
    directories = ["", "cuts", "recordings", os.path.join("cuts", "flac_mono_16k")]
    expected = {d: _listing(served, d) for d in directories}
    for directory in directories:  # the manifests at the root name their mountpoint
        alone = _listing(mount, directory)
        assert [n for n, _ in expected[directory]] == [n for n, _ in alone]
        assert directory == "" or expected[directory] == alone
    before = _stats(served)["counters"].get("requests.directory_entries", 0)
    for _ in range(10):
        _drop_caches()
        for directory in directories:
            assert _listing(served, directory) == expected[directory], directory
    time.sleep(1.5)
    # Only the serving processes answer listings through Operations.directory_entries.
    assert _stats(served)["counters"].get("requests.directory_entries", 0) > before


def test_every_node_shows_one_time_whichever_process_answers(served: str) -> None:
    """Each process answers with the mount's one time: files keep their cached pages when
    another process answers a listing of their directory (the kernel drops a file's pages
    when it is given another modification time)."""
    directory = os.path.join(served, "cuts", "flac_mono_16k")
    files = [os.path.join(directory, name) for name in sorted(os.listdir(directory))]
    nodes = [served, os.path.join(served, "cuts"), directory, *files]
    times: set[tuple[int, int, int]] = set()
    for _ in range(4):
        _drop_caches()  # every node is looked up again, by whichever process reads first
        with ThreadPoolExecutor(max_workers=6) as lookups:
            for seen in lookups.map(os.stat, nodes):
                times.add((seen.st_atime_ns, seen.st_mtime_ns, seen.st_ctime_ns))
    assert len(times) == 1, times
    pages = {path: -(-os.stat(path).st_size // mmap.PAGESIZE) for path in files}
    for _ in range(4):
        with ThreadPoolExecutor(max_workers=6) as readers:
            list(readers.map(_read, files))
        for entry in os.scandir(directory):  # a listing with attributes, any process
            entry.stat()
        # Asked at once: the kernel drops a file's pages as a listing gives it another
        # time, while reclaim (which may take cached pages too) has had milliseconds.
        lost = {
            os.path.basename(path): resident_pages(path, 0, count).count(False)
            for path, count in pages.items()
        }
        assert not any(lost.values()), lost


def _listing(mount: str, directory: str) -> list[tuple[str, int]]:
    """Names and sizes in a directory (``.cutfs`` aside: its sizes change)."""
    path = os.path.join(mount, directory)
    return sorted(
        (name, os.stat(os.path.join(path, name)).st_size)
        for name in os.listdir(path)
        if name != ".cutfs"
    )


def test_time_ranges_are_shared_by_every_process(
    served: str, references: dict[str, Reference]
) -> None:
    """A range looked up through one process is opened and read through others."""
    flac = references["flac_mono_16k.flac"]
    for attempt in range(12):
        _drop_caches()  # the kernel forgets the range: each round looks it up again
        start = 1.0 + attempt / 8
        data = _read(os.path.join(served, "recordings", "flac_mono_16k", f"{start}-3.5.wav"))
        first = round(start * 16000)
        assert data[:44] == wav_header(16000, 1, 56000 - first)
        samples = np.frombuffer(data[44:], dtype="<i2")
        assert np.array_equal(samples, flac.samples[first:56000, 0]), start
    with pytest.raises(FileNotFoundError):
        os.stat(os.path.join(served, "recordings", "flac_mono_16k", "3.5-1.25.wav"))


def test_statistics_read_through_any_process(served: str) -> None:
    for _ in range(20):
        stats = _stats(served)  # an open and a read, possibly answered by two processes
        assert stats["serving"]["processes"] == COUNTED
        assert stats["workers"]["workers"] == PROCESSES  # one decoder each: 3 split 3 ways


@pytest.mark.parametrize("kind", KINDS)
def test_a_killed_serving_process_is_replaced(
    tmp_path: Path, shard_dir: str, references: dict[str, Reference], kind: str
) -> None:
    options, processes = KINDS[kind]
    with mounted(shard_dir, str(tmp_path / "mnt"), *options) as mnt:
        serving = _wait_for(mnt, lambda s: s["ready"] == processes, "both processes serve")
        daemon, child = serving["serving"]["pids"][:2]
        os.kill(child, signal.SIGKILL)
        serving = _wait_for(
            mnt,
            lambda s: s["restarts"] == 1 and s["ready"] == processes,
            "the process is replaced",
        )["serving"]
        assert serving["pids"][0] == daemon and child not in serving["pids"]
        cuts = cut_plan(references)[:20]
        _drop_caches()
        for cut in cuts:
            actual = _read(cut_path(mnt, str(cut["id"])))
            lossless = next(
                r for n, r in references.items() if recording_id(n) == cut["recording"]
            ).lossless
            assert close_enough(actual, expected_file(cut, references), lossless), cut["id"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_processes_end_with_the_daemon(tmp_path: Path, shard_dir: str, kind: str) -> None:
    mountpoint = str(tmp_path / "mnt")
    options, processes = KINDS[kind]
    with mounted(shard_dir, mountpoint, *options) as mnt:
        pids = _wait_for(mnt, lambda s: s["ready"] == processes, "every process serves")["serving"][
            "pids"
        ]
        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in pids):
            assert time.monotonic() < deadline, "serving processes outlived their daemon"
            time.sleep(0.1)
        with pytest.raises(OSError) as raised:
            os.statvfs(mnt)
        # Not a mount that hangs: ENOTCONN once the kernel has aborted the connection, or
        # ECONNABORTED for a request queued while the last descriptor was being released
        # (seen on a loaded machine).
        assert raised.value.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    unmount(mountpoint)


@pytest.mark.parametrize("kind", KINDS)
def test_unmount_stops_every_process(tmp_path: Path, shard_dir: str, kind: str) -> None:
    mountpoint = str(tmp_path / "mnt")
    log = tmp_path / "log"
    options, processes = KINDS[kind]
    with mounted(shard_dir, mountpoint, *options, "--log-file", str(log)) as mnt:
        pids = _wait_for(mnt, lambda s: s["ready"] == processes, "both processes serve")["serving"][
            "pids"
        ]
    deadline = time.monotonic() + 20
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = {pid: _where_waiting(pid) for pid in pids if _alive(pid)}
    assert not survivors, f"outlived the mount: {survivors}\n{log.read_text()[-4000:]}"


def test_a_lazily_detached_mount_ends_its_daemon(tmp_path: Path, shard_dir: str) -> None:
    """``umount -l`` (the kernel detaches the mount; the connection lives on while anything
    holds it): the supervisor sees its descriptor fail and ends with every process, rather
    than serve, or wait, for a mount nobody can reach (before the process split, a daemon
    detached before INIT hung in the kernel, orphaned, for 1.5 hours)."""
    mountpoint = str(tmp_path / "mnt")
    log = tmp_path / "log"
    options, processes = KINDS["in turn"]
    with mounted(shard_dir, mountpoint, *options, "--log-file", str(log)) as mnt:
        pids = _wait_for(mnt, lambda s: s["ready"] == processes, "both processes serve")["serving"][
            "pids"
        ]
        detached = subprocess.run(["umount", "-l", mnt], capture_output=True, check=False)
        assert detached.returncode == 0, detached.stderr
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = {pid: _where_waiting(pid) for pid in pids if _alive(pid)}
        assert not survivors, f"outlived the mount: {survivors}\n{log.read_text()[-4000:]}"


def _where_waiting(pid: int) -> str:
    """What a process is doing, for a failure's message: its state and kernel wait."""
    try:
        with open(f"/proc/{pid}/stat") as stat, open(f"/proc/{pid}/wchan") as wchan:
            return f"state {stat.read().split(')')[-1].split()[0]} in {wchan.read() or '-'}"
    except OSError:
        return "gone"


def test_a_bad_process_count_is_refused(tmp_path: Path, shard_dir: str) -> None:
    (tmp_path / "mnt").mkdir()
    result = subprocess.run(
        [*CUTFS, "mount", "-f", "--serving-processes", "0", shard_dir, str(tmp_path / "mnt")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--serving-processes must be 1 to 64, not 0" in result.stderr


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_every_cut_is_exact_when_the_serving_processes_decode_in_turn(
    tmp_path: Path, shard_dir: str, references: dict[str, Reference]
) -> None:
    options = ("--serving-processes", "2", "--cache-size", "48M")  # in turn: the default
    with mounted(shard_dir, str(tmp_path / "mnt"), *options) as mnt:
        # Two processes decode in turn, besides the supervisor, which serves nothing.
        _wait_for(mnt, lambda s: s["ready"] == 3, "both processes serve")
        cuts = cut_plan(references)
        lossless = {n: r.lossless for n, r in ((recording_id(n), r) for n, r in references.items())}
        _drop_caches()
        with ThreadPoolExecutor(max_workers=4) as readers:
            contents = list(readers.map(lambda c: _read(cut_path(mnt, str(c["id"]))), cuts))
        for cut, actual in zip(cuts, contents, strict=True):
            expected = expected_file(cut, references)
            assert close_enough(actual, expected, lossless[str(cut["recording"])]), cut["id"]
        # Each process publishes its figures every second.
        deadline = time.monotonic() + 10
        while sum((by_process := _stats(mnt)["serving"]["requests_by_process"])[1:]) < len(cuts):
            assert time.monotonic() < deadline, by_process
            time.sleep(0.2)
        stats = _stats(mnt)
        assert by_process[0] == 0, by_process  # the daemon answered none: its worker idles
        assert stats["errors"] == {}
        assert stats["workers"]["workers"] == 0  # in turn: no decoder workers at all
        assert stats["counters"]["decodes"] >= len({str(c["recording"]) for c in cuts})
