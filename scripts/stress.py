#!/usr/bin/env python3
"""Stress run: many readers hammer a real mount while faults are injected.

Every byte read is checked against a reference made by ffmpeg from the original
files (never by cutfs): whole-file reads and random byte ranges of cuts and
recordings.  Faults follow a fixed schedule: a decoder worker killed, a decoder
worker hung past the read deadline, the storage under the shards paused (a FUSE
passthrough stopped with SIGSTOP, like a hung NFS server).  Errors inside a fault
window (plus the deadline) are counted as injected; any other error, and any wrong
byte, fails the run.

    .venv/bin/python scripts/stress.py --duration 300 --readers 32 --report docs/stress-report.md
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import multiprocessing
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cutfs.codec.audio.cut import seconds_to_frames
from cutfs.codec.catalogue.path_escape import escape_id

REPOSITORY = Path(__file__).resolve().parent.parent
READ_TIMEOUT_SECONDS = 4.0


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(
        name, REPOSITORY / "tests" / "support" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@dataclass
class Target:
    """A virtual file and the reference bytes it must hold."""

    path: str
    expected: bytes
    lossless: bool


@dataclass
class ReaderResult:
    operations: int = 0
    bytes_verified: int = 0
    wrong_bytes: int = 0
    errors: list[tuple[float, str]] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of reading")
    parser.add_argument("--readers", type=int, default=32, help="reader processes")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of test recordings")
    parser.add_argument("--report", type=Path, help="write a markdown report here (and .json)")
    parser.add_argument("--no-faults", action="store_true", help="read only, inject nothing")
    parser.add_argument(
        "--cache-size",
        default="16M",
        help="the daemon's block cache, smaller than the corpus so that blocks "
        "are evicted and decoded again (default 16M)",
    )
    parser.add_argument(
        "--drop-caches-every",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="drop the kernel page cache this often (root only; 0: never), so that reads "
        "reach the daemon instead of being served by the kernel",
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="cutfs-stress-"))
    corpus_module = _load("corpus")
    print(f"stress: making a corpus of {args.seconds:g} s recordings in {work}", flush=True)
    corpus = corpus_module.make_corpus(str(work / "audio"), args.seconds)
    manifests = _write_manifests(work, corpus, corpus_module)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "cutfs.vfs.cli",
            "pack",
            "-q",
            *manifests,
            "-o",
            str(work / "shards"),
        ],
        check=True,
        cwd=REPOSITORY,
    )
    storage = work / "storage"
    mountpoint = work / "mnt"
    storage.mkdir()
    mountpoint.mkdir()
    passthrough = subprocess.Popen(
        [
            sys.executable,
            str(REPOSITORY / "tests" / "support" / "pausable_fs.py"),
            str(work / "shards"),
            str(storage),
        ]
    )
    _wait(lambda: bool(os.listdir(storage)))
    cache = args.cache_size
    subprocess.run(
        [
            sys.executable,
            "-m",
            "cutfs.vfs.cli",
            "mount",
            "--workers",
            "2",
            "--cache-size",
            cache,
            "--read-timeout",
            str(READ_TIMEOUT_SECONDS),
            "--log-file",
            str(work / "cutfs.log"),
            str(storage),
            str(mountpoint),
        ],
        check=True,
        cwd=REPOSITORY,
    )
    daemon = _pids(f"cutfs.vfs.cli .*{mountpoint}")
    try:
        targets = _targets(corpus, manifests[1], mountpoint, corpus_module)
        report = _run(args, targets, mountpoint, passthrough)
    finally:
        passthrough.send_signal(signal.SIGCONT)
        subprocess.run(["fusermount3", "-u", str(mountpoint)], check=False)
        # The daemon's decoder workers map the shards: let them go before the storage.
        _wait(lambda: not any(Path(f"/proc/{pid}").exists() for pid in daemon), 60)
        if subprocess.run(["fusermount3", "-u", str(storage)], check=False).returncode:
            subprocess.run(["fusermount3", "-u", "-z", str(storage)], check=False)
        passthrough.wait(timeout=30)
    report["cache_size"] = cache
    report["read_timeout_seconds"] = READ_TIMEOUT_SECONDS
    _print_and_save(report, args.report)
    passed = report["wrong_bytes"] == 0 and report["unexpected_errors"] == 0
    print("stress: PASSED" if passed else "stress: FAILED", flush=True)
    return 0 if passed else 1


def _write_manifests(work: Path, corpus: dict[str, str], corpus_module: Any) -> list[str]:
    recordings = work / "stress_recordings.jsonl"
    cuts = work / "stress_cuts.jsonl"
    rng = random.Random(1)
    with open(recordings, "w") as recs, open(cuts, "w") as cut_lines:
        for name, path in sorted(corpus.items()):
            samples, rate, channels = corpus_module.ffmpeg_decode(path)
            duration = len(samples) / rate
            rec_id = name.rsplit(".", 1)[0]
            recs.write(
                json.dumps(
                    {
                        "id": rec_id,
                        "sampling_rate": rate,
                        "num_samples": len(samples),
                        "duration": duration,
                        "sources": [
                            {"type": "file", "channels": list(range(channels)), "source": path}
                        ],
                    }
                )
                + "\n"
            )
            for number in range(12):
                length = round(rng.uniform(1.0, min(12.0, duration / 2)), 3)
                start = round(rng.uniform(0, duration - length), 3)
                cut_lines.write(
                    json.dumps(
                        {
                            "id": f"{rec_id}/{number:02d}",
                            "recording_id": rec_id,
                            "start": start,
                            "duration": length,
                            "channel": rng.randrange(channels),
                            "type": "MonoCut",
                        }
                    )
                    + "\n"
                )
    return [str(recordings), str(cuts)]


def _targets(
    corpus: dict[str, str], cuts_manifest: str, mountpoint: Path, corpus_module: Any
) -> list[Target]:
    lossless = {encoding.name: encoding.lossless for encoding in corpus_module.ENCODINGS}
    decoded = {
        name.rsplit(".", 1)[0]: (corpus_module.ffmpeg_decode(path), lossless[name])
        for name, path in corpus.items()
    }
    targets = []
    for rec_id, ((samples, rate, channels), is_lossless) in decoded.items():
        body = samples.astype("<i2").tobytes()
        targets.append(
            Target(
                str(mountpoint / "recordings" / f"{rec_id}.wav"),
                corpus_module.wav_header(rate, channels, len(samples)) + body,
                is_lossless,
            )
        )
    with open(cuts_manifest) as lines:
        for line in lines:
            cut = json.loads(line)
            (samples, rate, _), is_lossless = decoded[cut["recording_id"]]
            first = seconds_to_frames(cut["start"], rate)
            count = seconds_to_frames(cut["duration"], rate)
            mono = samples[first : first + count, cut["channel"]]
            targets.append(
                Target(
                    str(mountpoint / "cuts" / escape_id(cut["id"])),
                    corpus_module.wav_header(rate, 1, len(mono)) + mono.astype("<i2").tobytes(),
                    is_lossless,
                )
            )
    return targets


def _wrong_bytes(actual: bytes, expected: bytes, offset: int, lossless: bool) -> int:
    """Bytes of ``actual`` that break the contract (lossy samples may differ by 1 LSB)."""
    if len(actual) != len(expected):
        return max(len(actual), len(expected))
    if actual == expected:
        return 0
    if lossless:
        return sum(a != b for a, b in zip(actual, expected, strict=True))
    header = max(0, 44 - offset)
    wrong = sum(a != b for a, b in zip(actual[:header], expected[:header], strict=True))
    start = header + ((offset + header - 44) % 2)
    usable = (len(actual) - start) // 2 * 2
    a = np.frombuffer(actual[start : start + usable], dtype="<i2").astype(np.int32)
    b = np.frombuffer(expected[start : start + usable], dtype="<i2").astype(np.int32)
    return wrong + 2 * int(np.count_nonzero(np.abs(a - b) > 1))


def _reader(targets: list[Target], stop_at: float, seed: int, results: Any) -> None:
    rng = random.Random(seed)
    result = ReaderResult()
    while time.time() < stop_at:
        target = rng.choice(targets)
        whole = rng.random() < 0.5
        size = len(target.expected)
        offset = 0 if whole else rng.randrange(size + 64)
        length = (
            size if whole else rng.choice([1, 44, 4096, 65536, 200_000, rng.randrange(size + 1)])
        )
        started = time.perf_counter()
        try:
            with open(target.path, "rb") as audio:
                audio.seek(offset)
                data = audio.read(length)
        except OSError as exc:
            result.errors.append((time.time(), f"{type(exc).__name__} errno {exc.errno}"))
            continue
        result.latencies_ms.append((time.perf_counter() - started) * 1000)
        expected = target.expected[offset : offset + length]
        result.operations += 1
        result.bytes_verified += len(expected)
        result.wrong_bytes += _wrong_bytes(data, expected, offset, target.lossless)
    results.put(result)


def _pids(pattern: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False)
    return [int(pid) for pid in found.stdout.split()]


def _decoder_pids(mountpoint: Path) -> list[int]:
    daemon = subprocess.run(
        ["pgrep", "-f", f"cutfs.vfs.cli .*{mountpoint}"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    if not daemon:
        return []
    children = subprocess.run(
        ["pgrep", "-P", ",".join(daemon)], capture_output=True, text=True, check=False
    ).stdout.split()
    pids = []
    for pid in children:
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(int(pid))
        except OSError:
            pass
    return pids


def _rss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def _run(
    args: argparse.Namespace,
    targets: list[Target],
    mountpoint: Path,
    passthrough: subprocess.Popen[bytes],
) -> dict[str, Any]:
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    started = time.time()
    stop_at = started + args.duration
    readers = [
        context.Process(target=_reader, args=(targets, stop_at, seed, results))
        for seed in range(args.readers)
    ]
    for reader in readers:
        reader.start()
    daemon = int(
        subprocess.run(
            ["pgrep", "-f", f"cutfs.vfs.cli .*{mountpoint}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()[0]
    )
    schedule = [] if args.no_faults else _schedule(args.duration)
    windows: list[tuple[float, float, str]] = []
    peak_daemon = peak_total = 0
    rng = random.Random(7)
    dropped_at = time.time()
    drops = 0
    while time.time() < stop_at:
        if args.drop_caches_every and time.time() - dropped_at >= args.drop_caches_every:
            with contextlib.suppress(OSError), open("/proc/sys/vm/drop_caches", "w") as drop:
                drop.write("1\n")
                drops += 1
            dropped_at = time.time()
        now = time.time() - started
        while schedule and schedule[0][0] <= now:
            _, kind, seconds = schedule.pop(0)
            windows.append(_inject(kind, seconds, mountpoint, passthrough, rng, started))
        workers = _decoder_pids(mountpoint)
        peak_daemon = max(peak_daemon, _rss_kib([daemon]))
        peak_total = max(peak_total, _rss_kib([daemon, *workers]))
        time.sleep(0.25)
    outcomes = [results.get(timeout=120) for _ in readers]
    for reader in readers:
        reader.join(timeout=30)
    report = _summarise(args, outcomes, windows, started, peak_daemon, peak_total, mountpoint)
    report["page_cache_drops"] = drops
    return report


def _schedule(duration: float) -> list[tuple[float, str, float]]:
    kinds = [("kill a decoder worker", 0.0), ("hang a decoder worker", 8.0), ("pause storage", 8.0)]
    schedule = []
    at = 15.0
    number = 0
    while at < duration - 15:
        kind, seconds = kinds[number % len(kinds)]
        schedule.append((at, kind, seconds))
        at += 25.0
        number += 1
    return schedule


def _inject(
    kind: str,
    seconds: float,
    mountpoint: Path,
    passthrough: subprocess.Popen[bytes],
    rng: random.Random,
    started: float,
) -> tuple[float, float, str]:
    begin = time.time()
    print(
        f"stress: t={begin - started:6.1f} s  {kind}" + (f" for {seconds:g} s" if seconds else ""),
        flush=True,
    )
    if kind == "pause storage":
        passthrough.send_signal(signal.SIGSTOP)
        time.sleep(seconds)
        passthrough.send_signal(signal.SIGCONT)
    else:
        workers = _decoder_pids(mountpoint)
        if workers:
            victim = rng.choice(workers)
            if kind == "kill a decoder worker":
                os.kill(victim, signal.SIGKILL)
            else:
                os.kill(victim, signal.SIGSTOP)
                time.sleep(seconds)
                with contextlib.suppress(ProcessLookupError):  # the daemon may have killed it
                    os.kill(victim, signal.SIGCONT)
    # Reads that were waiting when the fault ended may still fail up to two deadlines
    # later (the kernel retries a failed read once).
    return (begin, time.time() + 2 * READ_TIMEOUT_SECONDS + 1, kind)


def _summarise(
    args: argparse.Namespace,
    outcomes: list[ReaderResult],
    windows: list[tuple[float, float, str]],
    started: float,
    peak_daemon: int,
    peak_total: int,
    mountpoint: Path,
) -> dict[str, Any]:
    latencies = np.array([ms for outcome in outcomes for ms in outcome.latencies_ms] or [0.0])
    injected: Counter[str] = Counter()
    unexpected: Counter[str] = Counter()
    for outcome in outcomes:
        for when, kind in outcome.errors:
            window = next((w for w in windows if w[0] <= when <= w[1]), None)
            (injected if window else unexpected)[f"{kind} ({window[2] if window else 'none'})"] += 1
    return {
        "duration_seconds": args.duration,
        "readers": args.readers,
        "reads": sum(o.operations for o in outcomes),
        "bytes_verified": sum(o.bytes_verified for o in outcomes),
        "wrong_bytes": sum(o.wrong_bytes for o in outcomes),
        "injected_errors": sum(injected.values()),
        "unexpected_errors": sum(unexpected.values()),
        "errors_by_kind": {
            **{f"injected: {k}": v for k, v in injected.items()},
            **{f"unexpected: {k}": v for k, v in unexpected.items()},
        },
        "latency_ms": {
            "p50": float(np.percentile(latencies, 50)),
            "p99": float(np.percentile(latencies, 99)),
            "max": float(latencies.max()),
        },
        "peak_rss_mib": {
            "daemon": round(peak_daemon / 1024, 1),
            "daemon_and_workers": round(peak_total / 1024, 1),
        },
        "fault_schedule": [
            {"at_seconds": round(w[0] - started, 1), "fault": w[2]} for w in windows
        ],
        "daemon_stats": _without_paths(json.loads((mountpoint / ".cutfs" / "stats").read_text())),
    }


def _without_paths(stats: dict[str, Any]) -> dict[str, Any]:
    """The daemon's statistics without this run's temporary directory."""
    stats.get("shards", {}).pop("directory", None)
    return stats


def _print_and_save(report: dict[str, Any], path: Path | None) -> None:
    lines = [
        "| | |",
        "|---|---|",
        f"| duration | {report['duration_seconds']:g} s, {report['readers']} reader processes |",
        f"| reads done | {report['reads']} (the kernel page cache was dropped "
        f"{report['page_cache_drops']} times) |",
        f"| bytes verified | {report['bytes_verified']:,} |",
        f"| wrong bytes | {report['wrong_bytes']} |",
        f"| errors inside fault windows (injected) | {report['injected_errors']} |",
        f"| errors outside fault windows | {report['unexpected_errors']} |",
        f"| read latency p50 / p99 / max | {report['latency_ms']['p50']:.1f} / "
        f"{report['latency_ms']['p99']:.1f} / {report['latency_ms']['max']:.1f} ms |",
        f"| peak RSS: daemon / daemon + decoder workers | {report['peak_rss_mib']['daemon']} / "
        f"{report['peak_rss_mib']['daemon_and_workers']} MiB (cache {report['cache_size']}) |",
    ]
    lines += ["", "Errors by kind:", ""]
    lines += [f"- {kind}: {count}" for kind, count in report["errors_by_kind"].items()] or [
        "- none"
    ]
    lines += ["", f"Fault schedule (read deadline {report['read_timeout_seconds']:g} s):", ""]
    lines += [f"- t = {f['at_seconds']} s: {f['fault']}" for f in report["fault_schedule"]] or [
        "- none"
    ]
    stats = report["daemon_stats"]
    lines += [
        "",
        "The daemon's own counters at the end (`.cutfs/stats`):",
        "",
        f"- counters: {stats['counters']}",
        f"- errors: {stats['errors']}",
        f"- workers: {stats['workers']}",
        f"- cache: {stats['cache']}",
    ]
    machine = (
        f"{os.cpu_count()} cores, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )
    heading = [
        "# cutfs stress run",
        "",
        f"`scripts/stress.py --duration {report['duration_seconds']:g} --readers "
        f"{report['readers']}` on {time.strftime('%Y-%m-%d')}, {machine}. Every byte read is "
        "compared with ffmpeg's decode of the original files (1 LSB allowed for lossy codecs); "
        "reads are whole files or random byte ranges of cuts and recordings.",
        "",
    ]
    text = "\n".join(heading + lines)
    print(text, flush=True)
    if path is not None:
        path.write_text(text + "\n")
        path.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")


def _wait(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError("timed out")


if __name__ == "__main__":
    sys.exit(main())
