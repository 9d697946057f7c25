"""How many requests one mount answers with 1, 2, ... serving processes, side by side.

Mounts the same shards with ``--serving-processes 1`` and with more, one after
the other in one run, and measures with R reader processes:

- warm opens: each reader opens a cut already in the page cache, reads it and
  closes it, in a loop (the data comes from the page cache; the kernel opens
  without asking, so no request reaches the daemon unless it runs with
  ``--direct-io``), beside the same loop over the cuts copied as plain WAV files
  to tmpfs;
- uncached cuts: each reader reads 10 s cuts once each, after the kernel's page
  and dentry caches are dropped (a lookup and one read).  The decoded
  audio is in the daemon's block cache by then (the warm phase read every cut,
  and the cache holds them all): this measures what serving processes change,
  the requests, not decoding, which ``--workers`` scales.

FUSE requests per cut are counted from ``.cutfs/stats``.  Ratios are against one
serving process with the same readers.  Run as root (``drop_caches``)::

    python bench/serving.py --processes 1 2 --readers 1 2 4 8

On a 2-core machine the readers and the serving processes share two cores, so
the ceiling is about 2x one loop whatever the count; on a many-core node use
``--processes 1 2 4 8 --readers 4 16 32``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
from processes import daemon_pids, pss_bytes

REPOSITORY = Path(__file__).resolve().parent.parent
CUTFS = [sys.executable, "-m", "cutfs.vfs.cli"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=REPOSITORY / "bench" / "out-serving")
    parser.add_argument("--out", type=Path, default=REPOSITORY / "docs" / "bench")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--readers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--workers", type=int, default=2, help="decoder workers of a mount")
    parser.add_argument(
        "--cache-size", default="3G", help="the mount's block cache, split among its processes"
    )
    parser.add_argument("--seconds", type=float, default=4.0, help="per warm measurement")
    parser.add_argument("--cold-cuts", type=int, default=600, help="per cold measurement")
    parser.add_argument("--rounds", type=int, default=3, help="repeats; medians are reported")
    parser.add_argument(
        "--catalogue",
        type=Path,
        help="instead: mount this shard directory (say, 10 million cuts from bench/scale.py) "
        "with each process count and report start-up time, memory and cold lookups "
        "(OUT/serving-catalogue.md)",
    )
    args = parser.parse_args()
    if args.catalogue is not None:
        report = _catalogue_report(args.catalogue, args.work / "mnt", args.processes, args.rounds)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "serving-catalogue.md").write_text(
            "# Serving processes over a large catalogue\n\n" + report
        )
        print(report)
        return 0

    shards = _prepare(args.work)
    results: list[dict[str, Any]] = []
    tmpfs = _wav_copies(shards, args.work)
    for round_number in range(args.rounds):
        for readers in args.readers:  # the same loop over plain WAV files in memory
            results.append(
                {
                    "round": round_number,
                    "processes": 0,
                    "readers": readers,
                    **_warm(tmpfs, sorted(os.listdir(tmpfs / "cuts")), readers, args.seconds),
                }
            )
        for processes in args.processes:
            mountpoint = args.work / "mnt"
            with _mounted(shards, mountpoint, processes, args.workers, args.cache_size):
                cuts = sorted(os.listdir(mountpoint / "cuts"))
                for readers in args.readers:
                    results.append(
                        {
                            "round": round_number,
                            "processes": processes,
                            "readers": readers,
                            **_warm(mountpoint, cuts, readers, args.seconds),
                            **_cold(mountpoint, cuts, readers, args.cold_cuts, round_number),
                        }
                    )
                    print(json.dumps(results[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serving.json").write_text(json.dumps(results, indent=1) + "\n")
    report = _markdown(results, args)
    (args.out / "serving.md").write_text(report)
    print(report)
    return 0


def _prepare(work: Path) -> Path:
    """Eight 10-minute FLAC recordings at 16 kHz (speech-like noise) and 10 s cuts every
    2 s: 2 400 cuts."""
    shards = work / "shards"
    if (shards / "manifest.json").exists():
        return shards
    audio = work / "audio"
    audio.mkdir(parents=True, exist_ok=True)
    recordings, cuts = [], []
    for number in range(8):
        path = audio / f"talk{number}.flac"
        if not path.exists():
            subprocess.run(
                ["ffmpeg", "-loglevel", "error", "-y", "-f", "lavfi", "-i",
                 f"anoisesrc=d=600:r=16000:c=pink:seed={number}", "-af", "volume=0.3",
                 "-c:a", "flac", str(path)],
                check=True,
            )  # fmt: skip
        recording = f"talk{number}"
        recordings.append(
            {
                "id": recording,
                "sources": [{"type": "file", "channels": [0], "source": str(path)}],
                "sampling_rate": 16000,
                "num_samples": 600 * 16000,
                "duration": 600.0,
                "channel_ids": [0],
            }
        )
        for start in range(0, 590, 2):
            cuts.append(
                {
                    "id": f"{recording}-{start:04d}",
                    "recording_id": recording,
                    "start": float(start),
                    "duration": 10.0,
                    "channel": 0,
                }
            )
    (work / "recordings.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recordings))
    (work / "supervisions.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cuts))
    shutil.rmtree(shards, ignore_errors=True)
    subprocess.run(
        [*CUTFS, "pack", "-q", str(work / "recordings.jsonl"), str(work / "supervisions.jsonl"),
         "-o", str(shards)],
        check=True,
    )  # fmt: skip
    return shards


@contextmanager
def _mounted(
    shards: Path, mountpoint: Path, processes: int, workers: int, cache_size: str
) -> Iterator[None]:
    mountpoint.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [*CUTFS, "mount", "--no-decode-in-turn", "--serving-processes", str(processes),
         "--workers", str(workers), "--cache-size", cache_size, str(shards), str(mountpoint)],
        check=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while _stats(mountpoint).get("serving", {}).get("ready", 1) < processes:
            if time.monotonic() > deadline:
                raise RuntimeError("the serving processes did not start")
            time.sleep(0.2)
        yield
    finally:
        subprocess.run(["fusermount3", "-u", str(mountpoint)], check=False)
        time.sleep(0.5)


def _catalogue_report(shards: Path, mountpoint: Path, counts: list[int], rounds: int) -> str:
    """Mount a large catalogue with each count of serving processes, in turns: seconds
    until the mount answers and until every process is ready, PSS of every process and
    decoder worker, and lookups and whole reads of random cuts with cold caches."""
    ids = pa.ipc.open_file(pa.memory_map(str(shards / "cuts.arrow"))).read_all().column("cut_id")
    rng = random.Random(1)
    names = [f"{ids[rng.randrange(len(ids))].as_py()}.wav" for _ in range(200)]
    rows: list[dict[str, Any]] = []
    for _ in range(rounds):
        for count in counts:
            mountpoint.mkdir(parents=True, exist_ok=True)
            started = time.perf_counter()
            with _mounted(shards, mountpoint, count, 2, "512M"):
                ready = time.perf_counter() - started
                pids = _stats(mountpoint).get("serving", {}).get("pids") or daemon_pids(mountpoint)
                workers = subprocess.run(
                    ["pgrep", "-P", ",".join(map(str, pids))],
                    capture_output=True,
                    text=True,
                    check=False,
                ).stdout.split()
                memory = pss_bytes(sorted(set(pids) | {int(pid) for pid in workers}))
                _drop_caches()
                began = time.perf_counter()
                for name in names:
                    os.stat(mountpoint / "cuts" / name)
                lookup = (time.perf_counter() - began) / len(names)
                began = time.perf_counter()
                for name in names[:50]:
                    (mountpoint / "cuts" / name).read_bytes()
                read = (time.perf_counter() - began) / 50
            rows.append(
                {"processes": count, "ready": ready, "pss": memory, "lookup": lookup, "read": read}
            )
            print(json.dumps(rows[-1]), flush=True)
    lines = [
        f"`python bench/serving.py --catalogue {shards.name} --processes "
        f"{' '.join(map(str, counts))} --rounds {rounds}` (medians): {len(ids):,} cuts",
        "",
        "| serving processes | every process ready, s | PSS of all, MB | cold lookup, ms "
        "| cold whole cut, ms |",
        "|---:|---:|---:|---:|---:|",
    ]
    for count in counts:
        mine = [row for row in rows if row["processes"] == count]

        def median(key: str, of: list[dict[str, Any]] = mine) -> float:
            return statistics.median(row[key] for row in of)

        lines.append(
            f"| {count} | {median('ready'):.2f} | {median('pss') / 1e6:.0f} | "
            f"{median('lookup') * 1e3:.2f} | {median('read') * 1e3:.2f} |"
        )
    return "\n".join(lines) + "\n"


def _wav_copies(shards: Path, work: Path) -> Path:
    """Every cut as a plain WAV file on tmpfs (/dev/shm), copied from a mount once."""
    copies = Path("/dev/shm") / "cutfs-bench-serving"
    if not (copies / "cuts").is_dir():
        with _mounted(shards, work / "mnt", 1, 2, "512M"):
            shutil.copytree(work / "mnt" / "cuts", copies / "cuts")
    return copies


def _stats(mountpoint: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((mountpoint / ".cutfs" / "stats").read_bytes())
    return result


def _requests(mountpoint: Path) -> int:
    if not (mountpoint / ".cutfs").exists():
        return 0  # not a mount: the tmpfs copies
    time.sleep(1.2)  # every serving process has published its counters since
    counters = _stats(mountpoint)["counters"]
    return sum(v for k, v in counters.items() if k.startswith("requests."))


def _drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def _warm_reader(paths: list[str], seconds: float, start: int, step: int) -> int:
    opened = 0
    deadline = time.monotonic() + seconds
    index = start
    while time.monotonic() < deadline:
        with open(paths[index % len(paths)], "rb") as cut:  # as bench/run.py reads them
            cut.read()
        opened += 1
        index += step
    return opened


def _cold_reader(paths: list[str]) -> list[float]:
    latencies = []
    for path in paths:
        started = time.perf_counter()
        with open(path, "rb") as cut:
            cut.read()
        latencies.append(time.perf_counter() - started)
    return latencies


def _warm(mountpoint: Path, cuts: list[str], readers: int, seconds: float) -> dict[str, Any]:
    paths = [str(mountpoint / "cuts" / name) for name in cuts]
    for path in paths:  # into the page cache, and the entries into the dentry cache
        with open(path, "rb") as cut:
            cut.read()
    before = _requests(mountpoint)
    context = multiprocessing.get_context("fork")
    with context.Pool(readers) as pool:
        started = time.perf_counter()
        opened = sum(
            pool.starmap(_warm_reader, [(paths, seconds, k, readers) for k in range(readers)])
        )
        elapsed = time.perf_counter() - started
    requests = _requests(mountpoint) - before
    return {
        "warm_opens_per_second": round(opened / elapsed),
        "warm_requests_per_second": round(requests / elapsed),
        "warm_requests_per_open": round(requests / max(opened, 1), 2),
    }


def _cold(
    mountpoint: Path, cuts: list[str], readers: int, count: int, round_number: int
) -> dict[str, Any]:
    chosen = [cuts[(round_number * 7919 + k * 13) % len(cuts)] for k in range(count)]
    paths = [str(mountpoint / "cuts" / name) for name in chosen]
    _drop_caches()
    before = _requests(mountpoint)
    context = multiprocessing.get_context("fork")
    with context.Pool(readers) as pool:
        started = time.perf_counter()
        latencies = [
            x for part in pool.map(_cold_reader, [paths[k::readers] for k in range(readers)])
            for x in part
        ]  # fmt: skip
        elapsed = time.perf_counter() - started
    requests = _requests(mountpoint) - before
    return {
        "cold_cuts_per_second": round(count / elapsed, 1),
        "cold_p50_ms": round(statistics.median(latencies) * 1000, 2),
        "cold_requests_per_cut": round(requests / count, 2),
    }


def _median(results: list[dict[str, Any]], processes: int, readers: int, key: str) -> float:
    return statistics.median(
        r[key] for r in results if r["processes"] == processes and r["readers"] == readers
    )


def _markdown(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        "# Serving one mount from several processes",
        "",
        f"`python bench/serving.py --processes {' '.join(map(str, args.processes))} "
        f"--readers {' '.join(map(str, args.readers))} --rounds {args.rounds}` on "
        f"{os.cpu_count()} cores; medians of {args.rounds} rounds; ratios against one "
        "serving process with the same readers. Warm: open, read from the page cache, "
        "close. Uncached: the page and dentry caches dropped, the decoded audio mostly in "
        "the daemon's block cache.",
        "",
        "| serving processes | readers | warm opens/s | ratio | / tmpfs | FUSE requests/s | "
        "requests per warm open | uncached cuts/s | ratio | uncached p50 ms | "
        "requests per uncached cut |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for processes in args.processes:
        for readers in args.readers:
            tmpfs = _median(results, 0, readers, "warm_opens_per_second")

            def median(key: str, p: int = processes, r: int = readers) -> float:
                return _median(results, p, r, key)

            warm, cold = median("warm_opens_per_second"), median("cold_cuts_per_second")
            base_warm = _median(results, args.processes[0], readers, "warm_opens_per_second")
            base_cold = _median(results, args.processes[0], readers, "cold_cuts_per_second")
            lines.append(
                f"| {processes} | {readers} | {warm:,.0f} | {warm / base_warm:.2f}x | "
                f"{warm / tmpfs:.2f}x | "
                f"{median('warm_requests_per_second'):,.0f} | "
                f"{median('warm_requests_per_open'):.2f} | {cold:,.1f} | "
                f"{cold / base_cold:.2f}x | {median('cold_p50_ms'):.2f} | "
                f"{median('cold_requests_per_cut'):.2f} |"
            )
    lines += [
        "",
        "The same warm loop over the cuts copied to tmpfs as plain WAV files: "
        + ", ".join(
            f"{r} readers {_median(results, 0, r, 'warm_opens_per_second'):,.0f} opens/s"
            for r in args.readers
        )
        + ".",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
