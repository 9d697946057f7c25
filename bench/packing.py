#!/usr/bin/env python3
"""Packing throughput and the fixed costs of a partitioned pack.

    .venv/bin/python bench/packing.py                 # writes docs/bench/packing.{md,json}
    .venv/bin/python bench/packing.py --quick         # smaller, for a try

Two measurements, each in one run:

* **Throughput** with 1 and 2 workers (the local engine: one process per partition),
  per codec: a synthetic 10-minute recording (speech-band tones and pink noise, 16 kHz
  mono) encoded as FLAC, MP3 32 kb/s and Opus 24 kb/s, hard-linked as 12 recordings, packed
  into partitions of two recordings.  The sources sit in the page cache after the first
  repeat, so this is the CPU cost of packing (decode, seek index, copy), which is what a
  cluster pays per core; storage bandwidth is on top.  Repeats are interleaved; medians.
* **Fixed costs** at 1 000 and 100 000 recordings (a 1-second FLAC hard-linked that many
  times, 100 recordings per partition): the time of ``plan``, of running every partition
  with 2 workers, and of ``commit``; and the overhead of one partition (1 000 recordings
  packed as 1 000 partitions against one, with 1 worker).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cutfs.codec.packing.commit import commit_pack
from cutfs.codec.packing.engines import LocalEngine
from cutfs.codec.packing.output import LocalPackOutput
from cutfs.codec.packing.packer import pack
from cutfs.codec.packing.plan import make_plan

REPOSITORY = Path(__file__).resolve().parent.parent
RATE = 16000
CODECS = {
    "flac": ("flac", ["-c:a", "flac"]),
    "mp3": ("mp3", ["-c:a", "libmp3lame", "-b:a", "32k"]),
    "opus": ("opus", ["-c:a", "libopus", "-b:a", "24k"]),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=REPOSITORY / "bench" / "out" / "packing")
    parser.add_argument("--out", type=Path, default=REPOSITORY / "docs" / "bench")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    minutes = 2.0 if args.quick else 10.0
    sizes = [1000] if args.quick else [1000, 100_000]
    results: dict[str, Any] = {
        "machine": {"cores": os.cpu_count(), "python": sys.version.split()[0]},
        "recording_minutes": minutes,
        "throughput": _throughput(args.work, minutes, args.repeats),
        "fixed_costs": [_fixed_costs(args.work, count) for count in sizes],
        "partition_overhead": _partition_overhead(args.work),
        "task_memory": _task_memory(args.work, minutes),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    name = "packing-quick" if args.quick else "packing"
    (args.out / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n")
    table = _markdown(results)
    (args.out / f"{name}.md").write_text(table)
    print(table)
    return 0


def _synthesise(path: Path, seconds: float) -> None:
    if path.exists():
        return
    subprocess.run(
        ["sox", "-n", "-r", str(RATE), "-c", "1", "-b", "16", str(path),
         "synth", str(seconds), "sine", "200-3000", "synth", str(seconds), "pinknoise", "mix"],
        check=True,
    )  # fmt: skip


def _encode(source: Path, target: Path, arguments: list[str]) -> None:
    if not target.exists():
        subprocess.run(
            ["ffmpeg", "-v", "error", "-y", "-i", str(source), *arguments, str(target)],
            check=True,
        )


def _linked(directory: Path, original: Path, count: int, per_folder: int = 1000) -> Path:
    """``count`` hard links of ``original`` under ``directory``, ``per_folder`` a folder."""
    if directory.exists() and sum(len(files) for _, _, files in os.walk(directory)) == count:
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    source = original
    for number in range(count):
        folder = directory / f"f{number // per_folder:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"r{number:06d}{original.suffix}"
        if number % 10_000 == 0:  # a fresh inode now and then: file systems cap links per inode
            shutil.copyfile(original, target)
            source = target
        else:
            os.link(source, target)
    return directory


def _throughput(work: Path, minutes: float, repeats: int) -> list[dict[str, Any]]:
    source = work / f"source-{minutes:g}min.wav"
    _synthesise(source, minutes * 60)
    rows = []
    for codec, (extension, arguments) in CODECS.items():
        encoded = work / f"{codec}-{minutes:g}min.{extension}"
        _encode(source, encoded, arguments)
        corpus = _linked(work / f"corpus-{codec}-{minutes:g}", encoded, 12)
        shard_bytes = 2 * encoded.stat().st_size
        times: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(repeats):
            for workers in (1, 2):
                output = Path(tempfile.mkdtemp(dir=work)) / "shards"
                started = time.perf_counter()
                report = pack([str(corpus)], str(output), jobs=workers, max_shard_bytes=shard_bytes)
                times[workers].append(time.perf_counter() - started)
                shutil.rmtree(output.parent)
        hours = report.audio_seconds / 3600
        one, two = statistics.median(times[1]), statistics.median(times[2])
        rows.append(
            {
                "codec": codec,
                "hours": hours,
                "partitions": 6,
                "seconds_1_worker": one,
                "seconds_2_workers": two,
                "hours_per_second_1": hours / one,
                "hours_per_second_2": hours / two,
                "speedup": one / two,
            }
        )
        print(rows[-1], flush=True)
    return rows


def _tiny_recording(work: Path) -> Path:
    wav, flac = work / "tiny.wav", work / "tiny.flac"
    _synthesise(wav, 1.0)
    _encode(wav, flac, ["-c:a", "flac"])
    return flac


def _fixed_costs(work: Path, count: int) -> dict[str, Any]:
    corpus = _linked(work / f"tiny-{count}", _tiny_recording(work), count)
    shard_bytes = 100 * (work / "tiny.flac").stat().st_size
    directory = Path(tempfile.mkdtemp(dir=work)) / "out"
    output = LocalPackOutput(str(directory))
    try:
        started = time.perf_counter()
        plan = make_plan([str(corpus)], output, shard_bytes)
        planned = time.perf_counter()
        LocalEngine(2).run(output, plan, list(range(plan.partitions)), None)
        ran = time.perf_counter()
        report = commit_pack(output)
        committed = time.perf_counter()
    finally:
        shutil.rmtree(directory.parent)
    row = {
        "recordings": count,
        "partitions": plan.partitions,
        "cuts": report.cuts,
        "plan_seconds": planned - started,
        "run_seconds_2_workers": ran - planned,
        "commit_seconds": committed - ran,
    }
    print(row, flush=True)
    return row


def _partition_overhead(work: Path) -> dict[str, Any]:
    corpus = _linked(work / "tiny-1000", _tiny_recording(work), 1000)
    seconds = {}
    for shard_bytes, label in ((1, "partitions_1000"), (1 << 40, "partitions_1")):
        output = Path(tempfile.mkdtemp(dir=work)) / "shards"
        started = time.perf_counter()
        pack([str(corpus)], str(output), jobs=1, max_shard_bytes=shard_bytes)
        seconds[label] = time.perf_counter() - started
        shutil.rmtree(output.parent)
    overhead = (seconds["partitions_1000"] - seconds["partitions_1"]) / 999
    row = {**seconds, "overhead_seconds_per_partition": overhead}
    print(row, flush=True)
    return row


def _task_memory(work: Path, minutes: float) -> dict[str, Any]:
    """Peak resident memory of ``cutfs pack run`` packing 12 FLAC recordings, one worker."""
    corpus = work / f"corpus-flac-{minutes:g}"
    output = Path(tempfile.mkdtemp(dir=work)) / "out"
    command = [sys.executable, "-m", "cutfs.vfs.cli", "pack"]
    subprocess.run([*command, "plan", str(corpus), "-o", str(output)], check=True)
    timed = subprocess.run(
        ["/usr/bin/time", "-f", "%M", *command, "run", str(output), "--partition", "0"],
        check=True,
        capture_output=True,
        text=True,
    )
    peak_kib = int(timed.stderr.split()[-1])  # GNU time: maximum resident set, KiB
    size = sum(path.stat().st_size for path in output.glob("shard-*.arrow"))
    shutil.rmtree(output.parent)
    row = {
        "shard_bytes": size,
        "peak_rss_bytes": peak_kib * 1024,
    }
    print(row, flush=True)
    return row


def _markdown(results: dict[str, Any]) -> str:
    lines = [
        "# Packing: throughput and fixed costs",
        "",
        f"Machine: {results['machine']['cores']} cores, Python {results['machine']['python']}. "
        "Command: `.venv/bin/python bench/packing.py`. Sources in the page cache (CPU cost).",
        "",
        f"## Throughput ({results['recording_minutes']:g}-minute recordings, 16 kHz mono, 12 per "
        "codec, 6 partitions; median of the repeats)",
        "",
        "| codec | hours | 1 worker: s | h/s | 2 workers: s | h/s | speed-up | x real time |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in results["throughput"]:
        lines.append(
            f"| {row['codec']} | {row['hours']:.2f} | {row['seconds_1_worker']:.2f} | "
            f"{row['hours_per_second_1']:.3f} | {row['seconds_2_workers']:.2f} | "
            f"{row['hours_per_second_2']:.3f} | {row['speedup']:.2f}x | "
            f"{row['hours_per_second_1'] * 3600:.0f}x |"
        )
    lines += [
        "",
        "## Fixed costs (1-second FLAC recordings, 100 per partition, 2 workers)",
        "",
        "| recordings | partitions | plan: s | run: s | commit: s |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in results["fixed_costs"]:
        lines.append(
            f"| {row['recordings']:,} | {row['partitions']:,} | {row['plan_seconds']:.2f} | "
            f"{row['run_seconds_2_workers']:.1f} | {row['commit_seconds']:.2f} |"
        )
    overhead = results["partition_overhead"]
    lines += [
        "",
        "Overhead of one partition (1 000 recordings as 1 000 partitions: "
        f"{overhead['partitions_1000']:.1f} s, as one: {overhead['partitions_1']:.1f} s, one "
        f"worker): **{1000 * overhead['overhead_seconds_per_partition']:.1f} ms per partition**.",
        "",
        "Peak memory of one `cutfs pack run` task (12 FLAC recordings, a "
        f"{results['task_memory']['shard_bytes'] / 1e6:.0f} MB shard, one worker): "
        f"{results['task_memory']['peak_rss_bytes'] / 1e6:.0f} MB.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
