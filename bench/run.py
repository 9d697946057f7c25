#!/usr/bin/env python3
"""Side-by-side benchmark of cutfs and the tools users would pick instead.

    .venv/bin/python bench/run.py            # quick mode: a few minutes on 2 cores
    .venv/bin/python bench/run.py --full     # adds 36 h recordings and 1 000 000 cuts

Everything is measured in one run, on a generated corpus (sox: a frequency sweep plus pink
noise, 16 kHz mono, encoded by ffmpeg as FLAC, MP3 32 kb/s and Opus 24 kb/s), and written as
a markdown table, JSON and PNG plots to docs/bench/.  Medians and p99 are of the samples
printed beside them; the machine is shared and noisy, so compare ratios within one run.

"Cold" means: the kernel page cache is dropped before every read (echo 1 >
/proc/sys/vm/drop_caches), FUSE daemons are restarted before every batch, and every cut of a
batch is new to the daemon (cuts are at least 20 s apart, so no decoded block is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Final

import numpy as np
import soundfile
from processes import daemon_pids, read_bytes
from processes import unmount as _unmount

from cutfs.codec.catalogue.shard_set import ShardSet

REPOSITORY = Path(__file__).resolve().parent.parent
CUTFS = [sys.executable, "-m", "cutfs.vfs.cli"]
RATE = 16000
CUT_SECONDS = 10.0
CODECS = {
    "flac": ("flac", ["-c:a", "flac"]),
    "mp3": ("mp3", ["-c:a", "libmp3lame", "-b:a", "32k"]),
    "opus": ("opus", ["-c:a", "libopus", "-b:a", "24k"]),
}


@dataclass(frozen=True)
class Cut:
    cut_id: str
    recording: str
    start_seconds: float


@dataclass
class Setup:
    work: Path
    corpus: dict[str, Path]  # recording id -> original file
    lengths: dict[str, float]  # recording id -> seconds
    cuts: dict[str, list[Cut]]  # recording id -> cold cuts
    shards: Path
    plain: Path  # pre-cut WAVs on tmpfs
    tar: Path  # the same in a tar, for ratarmount


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="36 h recordings and 1M cuts too")
    parser.add_argument("--work", type=Path, default=REPOSITORY / "bench" / "out")
    parser.add_argument("--out", type=Path, default=REPOSITORY / "docs" / "bench")
    parser.add_argument("--samples", type=int, default=12, help="cold cuts per recording")
    parser.add_argument(
        "--replot",
        action="store_true",
        help="only redraw the plots of OUT/results.json (no measurement)",
    )
    args = parser.parse_args()
    if args.replot:
        _plots(json.loads((args.out / "results.json").read_text()), args.out)
        return 0
    if os.geteuid() != 0:
        parser.error("run as root: cold measurements drop the kernel page cache")
    lengths = {"30min": 1800.0, "2h": 7200.0} | ({"36h": 36 * 3600.0} if args.full else {})
    setup = _prepare(args.work, lengths, args.samples)
    results: dict[str, Any] = {"mode": "full" if args.full else "quick", "machine": _machine()}
    with _mounts(setup) as mounts:
        results["latency"] = _latency(setup, mounts)
        results["position"] = _position(setup, mounts)
        results["throughput"] = _throughput(setup, mounts)
        results["bytes_per_cold_cut"] = _bytes_per_cut(setup, mounts)
    results["cold_scaling"] = _cold_scaling(setup)
    results["uncached_throughput"] = _uncached_throughput(setup)
    results["uncached_throughput_workers"] = _uncached_throughput(setup, options=WORKERS)
    results["uncached_throughput_evicted"] = _uncached_throughput(setup, evict=True)
    results["catalogue"] = _catalogue(setup, [10_000, 100_000] + ([1_000_000] if args.full else []))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "results.md").write_text(_markdown(results))
    _plots(results, args.out)
    print(_markdown(results))
    return 0


# -- corpus -------------------------------------------------------------------------------


def _prepare(work: Path, lengths: dict[str, float], samples: int) -> Setup:
    corpus_dir = work / "corpus"
    corpus_dir.mkdir(parents=True, exist_ok=True)
    corpus: dict[str, Path] = {}
    jobs = []
    for length_name, seconds in lengths.items():
        source = corpus_dir / f"source_{length_name}.wav"
        for codec, (extension, arguments) in CODECS.items():
            path = corpus_dir / f"{codec}_{length_name}.{extension}"
            corpus[f"{codec}_{length_name}"] = path
            if not path.exists():
                jobs.append((source, seconds, path, arguments))
    for source, seconds, _, _ in jobs:
        if not source.exists():
            print(f"bench: synthesising {seconds / 3600:g} h of audio", flush=True)
            subprocess.run(
                [
                    "sox",
                    "-n",
                    "-r",
                    str(RATE),
                    "-c",
                    "1",
                    "-b",
                    "16",
                    str(source),
                    "synth",
                    str(seconds),
                    "sine",
                    "200-3000",
                    "synth",
                    str(seconds),
                    "pinknoise",
                    "mix",
                ],
                check=True,
            )
    running = []
    for source, _, path, arguments in jobs:  # two encoders at a time
        print(f"bench: encoding {path.name}", flush=True)
        partial = path.with_suffix(".part" + path.suffix)
        running.append(
            subprocess.Popen(
                ["ffmpeg", "-v", "error", "-y", "-i", str(source), *arguments, str(partial)]
            )
        )
        if len(running) == 2:
            _finish(running.pop(0))
    for process in running:
        _finish(process)
    for _, _, path, _ in jobs:
        path.with_suffix(".part" + path.suffix).rename(path)
    lengths_by_id = {rid: lengths[rid.split("_")[1]] for rid in corpus}
    rng = random.Random(42)
    cuts = {rid: _spread_cuts(rid, seconds, samples, rng) for rid, seconds in lengths_by_id.items()}
    # Runs with other lengths or another number of cuts keep shards and cuts of their own
    # (shards packed for other cuts would serve none of these).
    key = "-".join(sorted(lengths)) + f"-{samples}"
    shards = work / f"shards-{key}"
    manifests = _manifests(work, corpus, lengths_by_id, cuts)
    if not (shards / "manifest.json").exists():
        print("bench: packing", flush=True)
        subprocess.run(
            [*CUTFS, "pack", "-q", *manifests, "-o", str(shards)], check=True, cwd=REPOSITORY
        )
    plain = Path(f"/dev/shm/cutfs-bench-plain-{key}")
    tar = work / f"cuts-{key}.tar"
    if not plain.exists() or not tar.exists():
        _precut(corpus, cuts, plain, tar)
    return Setup(work, corpus, lengths_by_id, cuts, shards, plain, tar)


def _finish(process: subprocess.Popen[bytes]) -> None:
    if process.wait() != 0:
        raise RuntimeError("an encoder failed")


def _spread_cuts(recording: str, seconds: float, count: int, rng: random.Random) -> list[Cut]:
    """``count`` cuts at least 20 s apart, spread over the recording, plus fixed positions."""
    slots = int((seconds - 60) // 20)
    chosen = sorted(rng.sample(range(1, slots), min(count, slots - 1)))
    cuts = [Cut(f"{recording}/c{slot:06d}", recording, slot * 20.0) for slot in chosen]
    if seconds >= 7200:
        cuts.append(Cut(f"{recording}/hour1", recording, 3600.0))
    cuts.append(Cut(f"{recording}/minute1", recording, 60.0))
    cuts.append(Cut(f"{recording}/last", recording, seconds - 40.0))
    return cuts


def _manifests(
    work: Path, corpus: dict[str, Path], lengths: dict[str, float], cuts: dict[str, list[Cut]]
) -> list[str]:
    recordings = work / "bench_recordings.jsonl"
    supervisions = work / "bench_supervisions.jsonl"
    with open(recordings, "w") as recs, open(supervisions, "w") as sups:
        for rid, path in corpus.items():
            recs.write(
                json.dumps(
                    {
                        "id": rid,
                        "sampling_rate": RATE,
                        "duration": lengths[rid],
                        "num_samples": int(lengths[rid] * RATE),
                        "sources": [{"type": "file", "channels": [0], "source": str(path)}],
                    }
                )
                + "\n"
            )
            for cut in cuts[rid]:
                sups.write(
                    json.dumps(
                        {
                            "id": cut.cut_id,
                            "recording_id": rid,
                            "start": cut.start_seconds,
                            "duration": CUT_SECONDS,
                            "channel": 0,
                        }
                    )
                    + "\n"
                )
    return [str(recordings), str(supervisions)]


def _precut(corpus: dict[str, Path], cuts: dict[str, list[Cut]], plain: Path, tar: Path) -> None:
    """The same cuts as plain WAV files (ffmpeg's decode), on tmpfs and in a tar."""
    print("bench: writing pre-cut WAV files", flush=True)
    shutil.rmtree(plain, ignore_errors=True)
    for rid, path in corpus.items():
        rate = 48000 if rid.startswith("opus") else RATE
        spans = [(round(cut.start_seconds * rate), int(CUT_SECONDS * rate)) for cut in cuts[rid]]
        for cut, samples in zip(cuts[rid], _decoded_spans(path, spans), strict=True):
            target = plain / f"{cut.cut_id}.wav"
            target.parent.mkdir(parents=True, exist_ok=True)
            soundfile.write(target, samples, rate, subtype="PCM_16")
    with tarfile.open(tar, "w") as archive:
        archive.add(plain, arcname="cuts")


def _decoded_spans(path: Path, spans: list[tuple[int, int]]) -> list[np.ndarray]:
    """Sample ranges (first, count) of ffmpeg's full decode, streamed: a 36 h decode does
    not fit in memory."""
    parts: list[list[np.ndarray]] = [[] for _ in spans]
    decoder = subprocess.Popen(
        ["ffmpeg", "-v", "error", "-i", str(path), "-f", "s16le", "-"], stdout=subprocess.PIPE
    )
    assert decoder.stdout is not None
    position = 0
    while chunk := decoder.stdout.read(1 << 22):
        samples = np.frombuffer(chunk, dtype="<i2")  # chunks are even: 16-bit samples
        for number, (first, count) in enumerate(spans):
            low, high = max(first, position), min(first + count, position + len(samples))
            if high > low:
                parts[number].append(samples[low - position : high - position])
        position += len(samples)
    if decoder.wait() != 0:
        raise RuntimeError(f"ffmpeg could not decode {path}")
    return [np.concatenate(chunks) if chunks else np.zeros(0, np.int16) for chunks in parts]


# -- mounts -------------------------------------------------------------------------------


@dataclass
class Mounts:
    root: Path
    setup: Setup
    cutfs: Path
    ffmpegfs: Path | None
    ratarmount: Path | None

    def cutfs_restart(self, *options: str) -> None:
        _unmount(self.cutfs)
        subprocess.run(
            [*CUTFS, "mount", *options, str(self.setup.shards), str(self.cutfs)],
            check=True,
            cwd=REPOSITORY,
        )

    def ffmpegfs_restart(self) -> None:
        if self.ffmpegfs is None:
            return
        _unmount(self.ffmpegfs)
        cache = self.root / "ffmpegfs-cache"
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir()
        subprocess.run(
            [
                "ffmpegfs",
                "--desttype=wav",
                f"--cachepath={cache}",
                str(self.setup.corpus["flac_30min"].parent),
                str(self.ffmpegfs),
            ],
            check=True,
            capture_output=True,
        )
        _wait(lambda: bool(os.listdir(self.ffmpegfs)))


@contextmanager
def _mounts(setup: Setup) -> Iterator[Mounts]:
    root = setup.work / "mnt"
    paths = {name: root / name for name in ("cutfs", "ffmpegfs", "ratarmount")}
    for path in paths.values():
        _unmount(path)
        path.mkdir(parents=True, exist_ok=True)
    have_ffmpegfs = shutil.which("ffmpegfs") is not None
    have_ratarmount = shutil.which("ratarmount", path=str(Path(sys.executable).parent)) is not None
    mounts = Mounts(
        root,
        setup,
        paths["cutfs"],
        paths["ffmpegfs"] if have_ffmpegfs else None,
        paths["ratarmount"] if have_ratarmount else None,
    )
    try:
        mounts.cutfs_restart()
        mounts.ffmpegfs_restart()
        if mounts.ratarmount is not None:
            subprocess.run(
                [
                    str(Path(sys.executable).parent / "ratarmount"),
                    str(setup.tar),
                    str(mounts.ratarmount),
                ],
                check=True,
                capture_output=True,
            )
        yield mounts
    finally:
        for path in paths.values():
            _unmount(path)


def _wait(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError("timed out")


def _drop_caches() -> None:
    """Empty the kernel's page cache. Dirty pages are not dropped, so everything is written
    back first: a piece cache filled just before a measurement would otherwise be read
    from memory (and while the kernel writes it back), not from disk."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as drop:
        drop.write("1\n")


# -- readers ------------------------------------------------------------------------------


def _read_file(path: Path) -> int:
    with open(path, "rb") as audio:
        return len(audio.read())


def _soundfile_cut(path: Path, start_seconds: float) -> int:
    with soundfile.SoundFile(path) as sound:
        sound.seek(round(start_seconds * sound.samplerate))
        return len(sound.read(int(CUT_SECONDS * sound.samplerate), dtype="int16"))


_LHOTSE_RECORDINGS: dict[Path, Any] = {}


def _lhotse_cut(path: Path, start_seconds: float) -> int:
    """Lhotse's ``cut.load_audio()`` on the original recording (what users run today)."""
    cut = _lhotse_recording(path).to_cut().truncate(offset=start_seconds, duration=CUT_SECONDS)
    return int(cut.load_audio().shape[1])


def _lhotse_recording(path: Path) -> Any:
    """The Lhotse recording of a file, read once (a manifest would hold it): not timed."""
    from lhotse import Recording  # noqa: PLC0415 - the compat extra

    recording = _LHOTSE_RECORDINGS.get(path)
    if recording is None:
        recording = _LHOTSE_RECORDINGS[path] = Recording.from_file(str(path))
    return recording


def _torchcodec_cut(path: Path, start_seconds: float) -> int:
    from torchcodec.decoders import AudioDecoder  # noqa: PLC0415 - the compat extra

    samples = AudioDecoder(str(path)).get_samples_played_in_range(
        start_seconds, start_seconds + CUT_SECONDS
    )
    return int(samples.data.shape[1])


def _installed(module: str) -> bool:
    try:
        __import__(module)
    except (ImportError, OSError):
        return False
    return True


def _readers(setup: Setup, mounts: Mounts, cut: Cut) -> dict[str, Callable[[], int]]:
    """Each way of getting the cut's samples, as a user would."""
    original = setup.corpus[cut.recording]
    cut_file = mounts.cutfs / "cuts" / f"{cut.cut_id}.wav"
    readers: dict[str, Callable[[], int]] = {
        "cutfs": lambda: _read_file(cut_file),
        # What an unmodified script runs on a cut file: soundfile reads the header in small
        # reads (the kernel's first read is then 16 KiB, and the rest is pushed).
        "cutfs, soundfile": lambda: _soundfile_cut(cut_file, 0.0),
        "soundfile": lambda: _soundfile_cut(original, cut.start_seconds),
        "tmpfs WAV": lambda: _read_file(setup.plain / f"{cut.cut_id}.wav"),
    }
    if _installed("lhotse"):
        readers["Lhotse"] = lambda: _lhotse_cut(original, cut.start_seconds)
    if _installed("torchcodec.decoders"):
        readers["torchcodec"] = lambda: _torchcodec_cut(original, cut.start_seconds)
    if mounts.ffmpegfs is not None:
        wav = mounts.ffmpegfs / (original.name + ".wav")  # ffmpegfs appends .wav
        readers["ffmpegfs"] = lambda: _soundfile_cut(wav, cut.start_seconds)
    if mounts.ratarmount is not None:
        readers["ratarmount"] = lambda: _read_file(mounts.ratarmount / "cuts" / f"{cut.cut_id}.wav")  # type: ignore[operator]
    return readers


def _timed(read: Callable[[], int]) -> float:
    started = time.perf_counter()
    read()
    return (time.perf_counter() - started) * 1000


def _latency(setup: Setup, mounts: Mounts) -> list[dict[str, Any]]:
    rows = []
    for rid in sorted(setup.corpus):
        if rid.endswith("36h"):
            continue  # position and catalogue cover the longest recordings
        batch = [cut for cut in setup.cuts[rid] if "/c" in cut.cut_id]
        systems = _readers(setup, mounts, batch[0]).keys()
        for system in systems:
            if system == "ffmpegfs" and not rid.endswith("30min"):
                continue  # ffmpegfs transcodes from the start: minutes per cold 2 h read
            cold, warm = [], []
            if system.startswith("cutfs"):
                mounts.cutfs_restart()
            if system == "ffmpegfs":
                mounts.ffmpegfs_restart()
            if system == "Lhotse":
                _lhotse_recording(setup.corpus[rid])
            for cut in batch:
                read = _readers(setup, mounts, cut)[system]
                _drop_caches()
                cold.append(_timed(read))
                warm.append(_timed(read))
            rows.append(
                {
                    "recording": rid,
                    "system": system,
                    **_summary("cold", cold),
                    **_summary("warm", warm),
                }
            )
            print(
                f"bench: latency {rid:12s} {system:10s} cold p50 "
                f"{rows[-1]['cold_p50_ms']:8.1f} ms, warm p50 {rows[-1]['warm_p50_ms']:7.2f} ms",
                flush=True,
            )
    return rows


def _summary(name: str, values: list[float]) -> dict[str, float]:
    return {
        f"{name}_p50_ms": round(statistics.median(values), 2),
        f"{name}_p99_ms": round(float(np.percentile(values, 99)), 2),
        f"{name}_n": len(values),
    }


def _position(setup: Setup, mounts: Mounts) -> list[dict[str, Any]]:
    """Cold latency of a cut at minute 1 and near the end, and of its first 4 KiB."""
    rows = []
    longest = max(setup.lengths.values())
    for rid in sorted(setup.corpus):
        if setup.lengths[rid] != longest:
            continue
        mounts.cutfs_restart()
        for cut in setup.cuts[rid][-2:]:
            path = mounts.cutfs / "cuts" / f"{cut.cut_id}.wav"
            whole, first = [], []
            for _ in range(5):
                _drop_caches()
                mounts.cutfs_restart()
                first.append(_timed(lambda p=path: len(open(p, "rb").read(4096))))  # noqa: SIM115
                _drop_caches()
                whole.append(_timed(lambda p=path: _read_file(p)))
            rows.append(
                {
                    "recording": rid,
                    "system": "cutfs",
                    "cut": cut.cut_id.split("/")[1],
                    "at_seconds": cut.start_seconds,
                    "cold_whole_p50_ms": round(statistics.median(whole), 2),
                    "cold_first_4k_p50_ms": round(statistics.median(first), 2),
                }
            )
            print(f"bench: position {rid} {cut.cut_id}: {rows[-1]}", flush=True)
        hour1 = next((cut for cut in setup.cuts[rid] if cut.cut_id.endswith("/hour1")), None)
        if hour1 is not None and mounts.ffmpegfs is not None and rid.startswith("flac"):
            rows += _hour_one(setup, mounts, hour1)
    return rows


def _hour_one(setup: Setup, mounts: Mounts, cut: Cut) -> list[dict[str, Any]]:
    """A cold cut at hour 1 of the 2 h FLAC file: cutfs against ffmpegfs (one sample each)."""
    rows = []
    for system in ("cutfs", "ffmpegfs"):
        _drop_caches()
        if system == "cutfs":
            mounts.cutfs_restart()
        else:
            mounts.ffmpegfs_restart()
        _drop_caches()
        milliseconds = _timed(_readers(setup, mounts, cut)[system])
        rows.append(
            {
                "recording": cut.recording,
                "system": system,
                "cut": "hour1",
                "at_seconds": cut.start_seconds,
                "cold_whole_p50_ms": round(milliseconds, 2),
                "cold_first_4k_p50_ms": "-",
            }
        )
        print(f"bench: position {cut.cut_id} {system}: {milliseconds:.1f} ms", flush=True)
    return rows


def _reader_loop(paths: list[str], seconds: float, seed: int, buffering: int = -1) -> int:
    rng = random.Random(seed)
    stop = time.monotonic() + seconds
    done = 0
    while time.monotonic() < stop:
        with open(rng.choice(paths), "rb", buffering=buffering) as audio:
            audio.read()
        done += 1
    return done


#: A system's name in the warm throughput table ends with this when its readers open
#: files unbuffered, as soundfile and ffmpeg do: Python's buffered ``open`` (before
#: Python 3.14) asks ``isatty``, an ioctl that the kernel sends to a FUSE daemon.
UNBUFFERED = ", unbuffered"


def _throughput(setup: Setup, mounts: Mounts) -> list[dict[str, Any]]:
    """Warm whole-cut reads per second with 1 to 8 reader processes (open, read, close),
    with Python's buffered ``open`` and unbuffered."""
    rows = []
    cuts = [cut for rid in sorted(setup.cuts) for cut in setup.cuts[rid] if "30min" in rid]
    trees = {
        "tmpfs WAV": setup.plain,
        f"tmpfs WAV{UNBUFFERED}": setup.plain,
        "cutfs": mounts.cutfs / "cuts",
        f"cutfs{UNBUFFERED}": mounts.cutfs / "cuts",
        "cutfs direct_io": mounts.cutfs / "cuts",
    }
    if mounts.ratarmount is not None:
        trees["ratarmount"] = mounts.ratarmount / "cuts"
    second = mounts.root / "cutfs-second"
    trees["cutfs, 2 mounts"] = mounts.cutfs / "cuts"
    context = get_context("fork")
    for system, tree in trees.items():
        if system.startswith("cutfs") and system != f"cutfs{UNBUFFERED}":  # as for "cutfs"
            mounts.cutfs_restart(*(["--direct-io"] if "direct" in system else []))
        # Readers of the two-mount case alternate between two daemons of the same shards.
        trees_used = [tree]
        if system == "cutfs, 2 mounts":
            second.mkdir(exist_ok=True)
            _unmount(second)
            subprocess.run(
                [*CUTFS, "mount", str(setup.shards), str(second)], check=True, cwd=REPOSITORY
            )
            trees_used.append(second / "cuts")
        path_sets = [[str(t / f"{cut.cut_id}.wav") for cut in cuts] for t in trees_used]
        for paths in path_sets:  # warm every cache
            for path in paths:
                _read_file(Path(path))
        for readers in (1, 2, 4, 8):
            buffering = 0 if system.endswith(UNBUFFERED) else -1
            jobs = [(path_sets[n % len(path_sets)], 3.0, n, buffering) for n in range(readers)]
            with context.Pool(readers) as pool:
                counts = pool.starmap(_reader_loop, jobs)
            rows.append(
                {"system": system, "readers": readers, "cuts_per_second": round(sum(counts) / 3.0)}
            )
            print(
                f"bench: throughput {system:16s} {readers} readers: "
                f"{rows[-1]['cuts_per_second']} cuts/s",
                flush=True,
            )
    _unmount(second)
    mounts.cutfs_restart()
    return rows


def _bytes_per_cut(setup: Setup, mounts: Mounts) -> list[dict[str, Any]]:
    """Bytes read from storage per cold cut, against the compressed size of the cut's span."""
    rows = []
    with ShardSet(str(setup.shards)) as shards:
        index_of = {rec.recording_id: n for n, rec in enumerate(shards.recordings)}
        for rid in sorted(setup.corpus):
            if rid.endswith("36h"):
                continue
            recording = shards.recordings[index_of[rid]]
            cuts = [cut for cut in setup.cuts[rid] if "/c" in cut.cut_id]
            mounts.cutfs_restart()
            # One read of another recording first, so that the decoder's own code and
            # tables, faulted in once per process, are not counted against this one.
            other = next(r for r in sorted(setup.corpus) if r != rid and not r.endswith("36h"))
            _read_file(mounts.cutfs / "cuts" / f"{setup.cuts[other][0].cut_id}.wav")
            _read_file(mounts.cutfs / "cuts" / f"{setup.cuts[rid][-1].cut_id}.wav")
            pids = daemon_pids(mounts.cutfs)
            spans = []
            before = read_bytes(pids)
            for cut in cuts:
                _drop_caches()
                _read_file(mounts.cutfs / "cuts" / f"{cut.cut_id}.wav")
                first = round(cut.start_seconds * recording.sample_rate)
                end = first + round(CUT_SECONDS * recording.sample_rate)
                start_byte = recording.seek_index.point_at_or_before(first).byte_offset
                after = recording.seek_index.first_point_after(end)
                end_byte = after.byte_offset if after else len(shards.blob(index_of[rid]))
                spans.append(end_byte - start_byte)
            read = (read_bytes(pids) - before) / len(cuts)
            span = statistics.mean(spans)
            rows.append(
                {
                    "recording": rid,
                    "storage_bytes_per_cut": round(read),
                    "compressed_span_bytes": round(span),
                    "ratio_to_span_plus_256k": round(read / (1.5 * span + 262144), 2),
                }
            )
            print(f"bench: bytes {rid}: {rows[-1]}", flush=True)
    return rows


def _cold_scaling(setup: Setup) -> list[dict[str, Any]]:
    """Cold cuts decoded per second with 1 and 2 processes decoding in turn (4 readers)."""
    rows = []
    mountpoint = setup.work / "mnt" / "scaling"
    mountpoint.mkdir(parents=True, exist_ok=True)
    cuts = [cut for rid in sorted(setup.cuts) if rid.startswith("flac") for cut in setup.cuts[rid]]
    context = get_context("fork")
    for workers in (1, 2):
        _unmount(mountpoint)
        subprocess.run(
            [
                *CUTFS,
                "mount",
                "--serving-processes",
                str(workers),
                "--cache-size",
                "1M",
                "--direct-io",
                str(setup.shards),
                str(mountpoint),
            ],
            check=True,
            cwd=REPOSITORY,
        )
        paths = [str(mountpoint / "cuts" / f"{cut.cut_id}.wav") for cut in cuts]
        with context.Pool(4) as pool:
            counts = pool.starmap(_reader_loop, [(paths, 4.0, n) for n in range(4)])
        rows.append({"workers": workers, "cold_cuts_per_second": round(sum(counts) / 4.0, 1)})
        print(f"bench: cold scaling {rows[-1]}", flush=True)
    _unmount(mountpoint)
    return rows


def _soundfile_loop(cuts: list[tuple[str, float]], seconds: float, seed: int) -> int:
    rng = random.Random(seed)
    stop = time.monotonic() + seconds
    done = 0
    while time.monotonic() < stop:
        path, start_seconds = rng.choice(cuts)
        _soundfile_cut(Path(path), start_seconds)
        done += 1
    return done


#: The mount options of the rows with decoder workers (the default decodes in turn).
WORKERS: Final = ("--no-decode-in-turn",)


def _counter(mountpoint: Path, name: str) -> int:
    """A counter of a mount's ``.cutfs/stats`` (its processes' figures up to a second old)."""
    counters: dict[str, int] = json.loads((mountpoint / ".cutfs" / "stats").read_bytes())[
        "counters"
    ]
    return counters.get(name, 0)


def _evicting_loop(paths: list[str], seconds: float, seed: int) -> int:
    """Whole files read as soundfile reads them (unbuffered), each file's pages dropped
    from the page cache after it is read (``POSIX_FADV_DONTNEED``): the next read of it is
    the kernel's first again, as for a cut that no reader has read yet."""
    rng = random.Random(seed)
    stop = time.monotonic() + seconds
    done = 0
    while time.monotonic() < stop:
        descriptor = os.open(rng.choice(paths), os.O_RDONLY)
        try:
            while os.read(descriptor, 1 << 20):
                pass
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)
        done += 1
    return done


def _uncached_throughput(
    setup: Setup,
    readers: int = 2,
    cutfs: tuple[str, ...] = tuple(CUTFS),
    options: tuple[str, ...] = (),
    evict: bool = False,
) -> list[dict[str, Any]]:
    """Cuts decoded per second by ``readers`` processes: through a mount that caches no
    PCM (every read decodes), against the same number of processes decoding the same cuts
    from the original files with soundfile. Storage is in the page cache for both.
    ``cutfs``: the command that mounts (another checkout's: see bench/revisions.py); ``options``:
    more options of ``cutfs mount`` (see bench/serving.py).

    The kernel must not answer from the cut's pages: by default the mount has
    ``--direct-io`` (so each cut also costs an OPEN, a RELEASE, a READ that finds the end,
    and, from Python's buffered ``open``, an ioctl); with ``evict`` it is an ordinary
    mount and the readers drop each file's pages after reading it (a cut costs one READ,
    as a cut read for the first time does)."""
    rows = []
    mountpoint = setup.work / "mnt" / "uncached"
    mountpoint.mkdir(parents=True, exist_ok=True)
    context = get_context("fork")
    _unmount(mountpoint)
    pages = () if evict else ("--direct-io",)
    loop = _evicting_loop if evict else _reader_loop
    command = [*cutfs, "mount", "--cache-size", "1M", *pages, *options]
    # Revisions before the clean start imported cutfs from the working directory.
    checkout = Path(cutfs[0]).parents[2] if cutfs[0] != sys.executable else REPOSITORY
    subprocess.run([*command, str(setup.shards), str(mountpoint)], check=True, cwd=checkout)
    try:
        for rid in sorted(rid for rid in setup.cuts if rid.endswith("2h")):
            cuts = setup.cuts[rid]
            paths = [str(mountpoint / "cuts" / f"{cut.cut_id}.wav") for cut in cuts]
            originals = [(str(setup.corpus[rid]), cut.start_seconds) for cut in cuts]
            for path in paths:  # the shard's pages and the decoders' code, as for soundfile
                _read_file(Path(path))
            time.sleep(1.2)  # serving processes publish their counters every second
            decodes_before = _counter(mountpoint, "decodes")
            with context.Pool(readers) as pool:
                mounted = sum(pool.starmap(loop, [(paths, 4.0, n) for n in range(readers)]))
                direct = sum(
                    pool.starmap(_soundfile_loop, [(originals, 4.0, n) for n in range(readers)])
                )
            decodes = _counter(mountpoint, "decodes") - decodes_before  # published meanwhile
            rows.append(
                {
                    "recording": rid,
                    "readers": readers,
                    "cutfs_cuts_per_second": round(mounted / 4.0, 1),
                    "soundfile_cuts_per_second": round(direct / 4.0, 1),
                    # The 1 MB block cache still answers some cuts whole: what a cut cost.
                    "decodes_per_cut": round(decodes / max(mounted, 1), 2),
                }
            )
            print(f"bench: uncached throughput {rows[-1]}", flush=True)
    finally:
        _unmount(mountpoint)
    return rows


def _catalogue(setup: Setup, sizes: list[int]) -> list[dict[str, Any]]:
    """Mount time, daemon memory, lookup and ls time for catalogues of many cuts."""
    rows = []
    short = setup.corpus["flac_30min"]
    for size in sizes:
        data = setup.work / f"kaldi_{size}"
        shards = setup.work / f"shards_{size}"
        if not (shards / "manifest.json").exists():
            data.mkdir(exist_ok=True)
            (data / "wav.scp").write_text(f"rec {short}\n")
            with open(data / "segments", "w") as segments:
                for number in range(size):
                    start = (number * 1.7) % 1780
                    segments.write(f"utt{number:07d} rec {start:.3f} {start + 10:.3f}\n")
            subprocess.run(
                [*CUTFS, "pack", "-q", str(data), "-o", str(shards)], check=True, cwd=REPOSITORY
            )
        mountpoint = setup.work / "mnt" / f"catalogue_{size}"
        mountpoint.mkdir(parents=True, exist_ok=True)
        _unmount(mountpoint)
        started = time.perf_counter()
        subprocess.run(
            [*CUTFS, "mount", "--serving-processes", "1", str(shards), str(mountpoint)],
            check=True,
            cwd=REPOSITORY,
        )
        mount_seconds = time.perf_counter() - started
        rng = random.Random(size)
        names = [f"utt{rng.randrange(size):07d}.wav" for _ in range(1000)]
        started = time.perf_counter()
        for name in names:
            os.stat(mountpoint / "cuts" / name)
        lookup_us = (time.perf_counter() - started) / len(names) * 1e6
        started = time.perf_counter()
        listed = subprocess.run(
            f"ls {mountpoint}/cuts | wc -l", shell=True, check=True, capture_output=True, text=True
        ).stdout.strip()
        ls_seconds = time.perf_counter() - started
        rss = _rss_mib(daemon_pids(mountpoint)[:1])
        _unmount(mountpoint)
        rows.append(
            {
                "cuts": size,
                "listed": int(listed),
                "mount_seconds": round(mount_seconds, 2),
                "lookup_us": round(lookup_us, 1),
                "ls_seconds": round(ls_seconds, 2),
                "daemon_rss_mib": rss,
            }
        )
        print(f"bench: catalogue {rows[-1]}", flush=True)
    return rows


def _rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return round(total / 1024, 1)


# -- output -------------------------------------------------------------------------------


def _machine() -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "kernel": os.uname().release,
        "python": sys.version.split()[0],
        "date": time.strftime("%Y-%m-%d"),
        "ffmpegfs": shutil.which("ffmpegfs") is not None,
    }


def _markdown(results: dict[str, Any]) -> str:
    machine = results["machine"]
    lines = [
        f"# cutfs benchmark ({results['mode']} mode)",
        "",
        f"{machine['cores']} cores, Linux {machine['kernel']}, Python {machine['python']}, "
        f"{machine['date']}. Generated by `bench/run.py`; see its docstring for what "
        "cold means.",
        "",
        "## One random 10 s cut (ms)",
        "",
        "cutfs reads the cut file with Python's `open().read()`; `cutfs, soundfile` with "
        "soundfile (as an unmodified script does), like soundfile on the original.",
        "",
        "| recording | system | cold p50 | cold p99 | warm p50 | warm p99 | cold vs soundfile |",
        "|---|---|---|---|---|---|---|",
    ]
    by_key = {(r["recording"], r["system"]): r for r in results["latency"]}
    for row in results["latency"]:
        reference = by_key.get((row["recording"], "soundfile"))
        ratio = row["cold_p50_ms"] / reference["cold_p50_ms"] if reference else float("nan")
        lines.append(
            f"| {row['recording']} | {row['system']} | {row['cold_p50_ms']} | "
            f"{row['cold_p99_ms']} | {row['warm_p50_ms']} | {row['warm_p99_ms']} | "
            f"{ratio:.2f}x |"
        )
    lines += [
        "",
        "## Position in the recording (cold, cutfs, ms)",
        "",
        "| recording | system | cut | at (s) | whole cut p50 | first 4 KiB p50 |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['recording']} | {r['system']} | {r['cut']} | {r['at_seconds']:g} | "
        f"{r['cold_whole_p50_ms']} | {r['cold_first_4k_p50_ms']} |"
        for r in results["position"]
    ]
    lines += [
        "",
        "## Warm throughput (whole 10 s cuts per second)",
        "",
        f"Readers use Python's `open()`; `{UNBUFFERED[2:]}`: `open(path, 'rb', buffering=0)`, "
        "which makes no `isatty` ioctl (as soundfile and ffmpeg).",
        "",
        "| system | 1 reader | 2 | 4 | 8 | 2 readers vs tmpfs (same reader) |",
        "|---|---|---|---|---|---|",
    ]
    systems: dict[str, dict[int, int]] = {}
    for row in results["throughput"]:
        systems.setdefault(row["system"], {})[row["readers"]] = row["cuts_per_second"]
    for system, counts in systems.items():
        tmpfs = systems.get(f"tmpfs WAV{UNBUFFERED if system.endswith(UNBUFFERED) else ''}", {})
        ratio = f"{counts[2] / tmpfs[2]:.2f}x" if counts.get(2) and tmpfs.get(2) else ""
        lines.append(
            f"| {system} | "
            + " | ".join(str(counts.get(n, "")) for n in (1, 2, 4, 8))
            + f" | {ratio} |"
        )
    lines += [
        "",
        "## Bytes read from storage per cold cut",
        "",
        "| recording | bytes read | compressed span | read / (1.5 span + 256 KiB) |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['recording']} | {r['storage_bytes_per_cut']:,} | "
        f"{r['compressed_span_bytes']:,} | {r['ratio_to_span_plus_256k']} |"
        for r in results["bytes_per_cold_cut"]
    ]
    lines += [
        "",
        "## Cold decoding with 1 and 2 processes decoding in turn (FLAC, 4 readers)",
        "",
        "| processes | cold cuts/s |",
        "|---|---|",
    ]
    lines += [f"| {r['workers']} | {r['cold_cuts_per_second']} |" for r in results["cold_scaling"]]
    for key, title in (
        ("uncached_throughput", "the mount (a 1 MB PCM cache, `--direct-io`)"),
        ("uncached_throughput_workers", f"the same with `{' '.join(WORKERS)}`"),
        (
            "uncached_throughput_evicted",
            "a mount without `--direct-io`, each file's pages dropped after its read",
        ),
    ):
        lines += [
            "",
            f"## Uncached cuts per second, 2 readers: {title} against soundfile",
            "",
            "| recording | cutfs | soundfile on the original | cutfs / soundfile "
            "| decodes per cut |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['recording']} | {r['cutfs_cuts_per_second']} | "
            f"{r['soundfile_cuts_per_second']} | "
            f"{r['cutfs_cuts_per_second'] / r['soundfile_cuts_per_second']:.2f}x | "
            f"{r.get('decodes_per_cut', '')} |"
            for r in results.get(key, [])
        ]
    lines += [
        "",
        "## Catalogue size",
        "",
        "| cuts | mount (s) | lookup (us) | `ls cuts \\| wc -l` (s) | daemon RSS (MiB) |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['cuts']:,} | {r['mount_seconds']} | {r['lookup_us']} | {r['ls_seconds']} | "
        f"{r['daemon_rss_mib']} |"
        for r in results["catalogue"]
    ]
    return "\n".join(lines) + "\n"


def _plots(results: dict[str, Any], out: Path) -> None:
    import matplotlib  # noqa: PLC0415 - only the plots need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    rows = [r for r in results["latency"] if r["recording"].endswith("30min")]
    figure, axis = plt.subplots(figsize=(max(10.0, 0.42 * len(rows)), 5))
    labels = [f"{r['recording'].split('_')[0]} / {r['system']}" for r in rows]
    axis.bar(range(len(rows)), [r["cold_p50_ms"] for r in rows], label="cold p50")
    axis.bar(range(len(rows)), [r["warm_p50_ms"] for r in rows], label="warm p50")
    axis.set_xticks(range(len(rows)), labels, fontsize=8, rotation=45, ha="right")
    axis.set_yscale("log")
    axis.set_ylabel("ms per 10 s cut")
    axis.set_title("One random 10 s cut of a 30 min recording")
    axis.legend()
    figure.tight_layout()
    figure.savefig(out / "latency.png", dpi=100)
    plt.close(figure)
    figure, axis = plt.subplots(figsize=(6, 4))
    systems: dict[str, list[tuple[int, int]]] = {}
    for row in results["throughput"]:
        systems.setdefault(row["system"], []).append((row["readers"], row["cuts_per_second"]))
    for system, points in systems.items():
        axis.plot(*zip(*points, strict=True), marker="o", label=system)
    axis.set_xlabel("reader processes")
    axis.set_ylabel("warm whole cuts per second")
    axis.set_yscale("log")
    axis.legend()
    figure.tight_layout()
    figure.savefig(out / "throughput.png", dpi=100)
    plt.close(figure)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
