#!/usr/bin/env python3
"""cutfs against the in-process readers of long compressed recordings: speed and exactness.

    ./scripts/setup_peers.sh                          # .venv-peers (torch, torchcodec, ...)
    .venv-peers/bin/python bench/peers.py --quick     # about 1 minute: 5 min recordings
    .venv-peers/bin/python bench/peers.py             # 3 minutes: 20 min, 20 cuts per codec

Runs as root (cold reads drop the kernel page cache) in .venv-peers, which holds the
peers; cutfs runs in the repository's .venv (``--cutfs-python`` to use another).

The corpus: one recording per codec (sox -R: a frequency sweep plus pink noise, 16 kHz mono;
encoded by ffmpeg as FLAC, MP3 32 kb/s with libmp3lame and Opus 24 kb/s with libopus),
served by cutfs in place from a Lhotse manifest (recordings, and supervisions as cuts).
Per codec: ``--cuts`` random 10 s cuts, starts rounded to 1 ms, at least 20 s apart (no
decoded block is shared), plus the first 10 s and the last 10 s of the recording; one
more cut, not measured, is each reader's first call.

Readers of a cut:

* ``cutfs``: ``open().read()`` of ``cuts/<recording>/<cut>.wav`` in the mount, and
  ``cutfs, soundfile``: ``soundfile.read`` of the same file (int16);
* ``soundfile``: ``sf.read(original, start, frames)`` (libsndfile: libFLAC, libmpg123,
  libopus);
* ``torchcodec``: ``AudioDecoder(original).get_samples_played_in_range(s, s + 10)``, a new
  decoder per cut, as a Dataset's ``__getitem__`` makes one;
* ``HF datasets``: ``ds[0]["audio"]`` of a dataset with an ``Audio()`` column (native rate)
  over the original, then its ``get_samples_played_in_range(s, s + 10)``, or its
  ``["array"]`` (the whole recording, decoded) sliced; the latter is timed on
  ``--array-cuts`` cuts only, and judged on all of them from one decode;
* ``Lhotse``: ``recording.to_cut().truncate(offset=s, duration=10).load_audio()`` with the
  default backend (libsndfile), and under ``TorchcodecBackend``; ``Recording.from_file``
  is made once per recording, not timed (a manifest holds it).

Timing: "cold" drops the page cache (``echo 1 > /proc/sys/vm/drop_caches``) before each
read, and cutfs's daemon is started afresh before each batch (a reader and a codec), so
that its decoded-block cache is empty; "warm" is the same cut read again at once.  The
peers run in this process: imports are done first, and each reader's first call (a cold
read of the extra cut) is reported apart, as is cutfs's first read after its daemon
starts.  Medians and p90 are of the cuts' times; the machine may be shared and noisy:
compare within one run.

Exactness: every reader's samples are compared as 16-bit PCM with a full decode of the
original by the ffmpeg CLI (``ffmpeg -i FILE -f s16le -ac 1 [-ar RATE] -``), which is what
cutfs promises to serve.  Float outputs are quantised as ffmpeg's ``-f s16le`` does
(swresample: ``clip(lrintf(x * 32768))``, rounding halves to even); the run checks that
this quantisation of ffmpeg's own ``-f f32le`` decode gives its ``-f s16le`` decode
exactly.  A cut starting at ``s`` seconds is expected to be the reference's samples
``round(s * rate)`` onwards, ``round(10 * rate)`` of them.  The offset of a window is the
lag with which it best matches the reference (FFT cross-correlation of its first 16384
samples over +-4096, refined by the least mean absolute difference); a window is exact
when it has the expected length, offset 0, and no sample differs.  Opus is compared at
48 kHz, the rate FFmpeg decodes it at and cutfs serves it at (the mount's WAV header is
checked); libsndfile decodes Opus at the 16 kHz of the file's header, so soundfile and
Lhotse's default backend are compared with ``ffmpeg -ar 16000`` (a different resampler:
never exact).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import datasets
import lhotse
import numpy as np
import soundfile
import torch
import torchcodec
from datasets import Audio, Dataset
from lhotse import Recording, RecordingSet, SupervisionSegment, SupervisionSet
from lhotse.audio import AudioSource, audio_backend
from processes import unmount as _unmount
from torchcodec.decoders import AudioDecoder

REPOSITORY = Path(__file__).resolve().parent.parent
RATE = 16000
CUT_SECONDS = 10.0
SPACING = 20.0  # seconds between the starts of two measured cuts, at least
SEARCH = 4096  # samples either side of the nominal start searched for a window's offset
HEAD = 16384  # samples of a window correlated with the reference
#: codec -> (file extension, ffmpeg's encoder options, the rate FFmpeg decodes it at)
CODECS: dict[str, tuple[str, list[str], int]] = {
    "flac": ("flac", ["-c:a", "flac"], RATE),
    "mp3": ("mp3", ["-c:a", "libmp3lame", "-b:a", "32k"], RATE),
    "opus": ("opus", ["-c:a", "libopus", "-b:a", "24k"], 48000),
}
TORCHCODEC_BACKEND = "TorchcodecBackend"
#: The decoders of :attr:`Reader.decoder`, as the tables name them.
DECODERS = {"ffmpeg": "FFmpeg (the CLI's)", "pyav": "FFmpeg (PyAV's)", "libsndfile": "libsndfile"}
#: Full decodes, 16-bit, by (decoder, codec, rate): the ffmpeg CLI's, and those of the
#: decoders the readers link (see :attr:`Reader.decoder`)
References = dict[tuple[str, str, int], np.ndarray]
#: A full decode by PyAV, run by cutfs's Python (.venv-peers has no PyAV): the samples as
#: cutfs makes 16-bit PCM of float frames (rounded halves to even, clipped).
PYAV_DECODE = """
import sys
import av
import numpy as np

with av.open(sys.argv[1]) as container, open(sys.argv[2], "wb") as out:
    for frame in container.decode(audio=0):
        samples = frame.to_ndarray()
        if samples.dtype.kind == "f":
            samples = np.clip(np.rint(samples.astype(np.float64) * 32768.0), -32768, 32767)
        out.write(np.asarray(samples[0], dtype="<i2").tobytes())
"""


@dataclass(frozen=True)
class Cut:
    cut_id: str
    start: float  # seconds


@dataclass
class Original:
    """One recording of the corpus, with its cuts."""

    codec: str
    recording_id: str
    path: Path
    rate: int  # FFmpeg's (and cutfs's) rate
    frames: int  # of ffmpeg's full decode at that rate
    cuts: list[Cut]  # measured
    first: Cut  # each reader's first call


@dataclass
class Reader:
    """A way of getting a cut's samples: ``read`` is what is timed."""

    name: str
    rate: int  # of what it returns
    read: Callable[[Cut], np.ndarray]
    restart: Callable[[], None] | None = None  # cutfs: a new daemon before the batch
    timed_cuts: int | None = None  # time only the first N cuts ...
    untimed: Callable[[Cut], np.ndarray] | None = None  # ... and read the rest with this
    #: Whose full decode the reader's windows are also compared with: the decoder it
    #: links ("ffmpeg": the CLI's own FFmpeg; "pyav": the FFmpeg PyAV bundles, which cutfs
    #: decodes with; "libsndfile").
    decoder: str = "ffmpeg"


@dataclass
class Result:
    codec: str
    reader: str
    rate: int
    first_call_ms: float
    decoder: str
    cold_ms: list[float] = field(default_factory=list)
    warm_ms: list[float] = field(default_factory=list)
    windows: list[dict[str, Any]] = field(default_factory=list)


def main() -> int:
    args = _arguments()
    started = time.monotonic()
    warnings.filterwarnings("ignore", module="lhotse")
    datasets.disable_progress_bars()
    work: Path = args.work.resolve()
    seconds = 300.0 if args.quick else args.minutes * 60.0
    count = 6 if args.quick else args.cuts
    corpus = _corpus(work, seconds, count, args.seed)
    references, check = _references(work, corpus, args.cutfs_python)
    source, declared = _manifests(corpus)
    results: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "machine": _machine(),
        "versions": _versions(args.cutfs_python),
        "recordings": _recording_facts(corpus, declared),
        "quantisation_check": check,
        "settings": {
            "seconds": seconds,
            "cuts_per_codec": count + 2,
            "array_cuts": 2 if args.quick else args.array_cuts,
            "seed": args.seed,
            "torch_threads": torch.get_num_threads(),
        },
    }
    mountpoint = work / "mnt"
    index_cache = work / "cutfs-index"
    shutil.rmtree(index_cache, ignore_errors=True)  # the first reads index the recordings
    log = work / "cutfs.log"
    log.unlink(missing_ok=True)
    rows: list[Result] = []
    with _mounted(args.cutfs_python, source, mountpoint, index_cache, log) as restart:
        results["cutfs_mount"] = _mount_facts(mountpoint, corpus)
        for original in corpus.values():
            readers = _cutfs_readers(mountpoint, original, restart) + _peers(
                original, results["settings"]["array_cuts"]
            )
            for reader in readers:
                rows.append(_measure(reader, original, references))
                _progress(rows[-1])
    results["untimed"] = _untimed(corpus)
    results["lhotse_default_manifest"] = _probe(args.cutfs_python, work, corpus, index_cache)
    results["cutfs_log_errors"] = _log_errors(log, work)
    results["results"] = [_summary(row) for row in rows]
    results["windows"] = [
        {"codec": row.codec, "reader": row.reader, **window}
        for row in rows
        for window in row.windows
    ]
    results["machine"]["load_after"] = os.getloadavg()
    results["seconds_taken"] = round(time.monotonic() - started, 1)
    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    name = "peers-quick" if args.quick else "peers"
    (out / f"{name}.json").write_text(json.dumps(results, indent=1, default=_json) + "\n")
    (out / f"{name}.md").write_text(_markdown(results))
    print(_markdown(results))
    print(f"peers: wrote {out / name}.md and .json in {results['seconds_taken']:.0f} s")
    return 0


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 min recordings, 6+2 cuts")
    parser.add_argument("--minutes", type=float, default=20.0, help="length of the recordings")
    parser.add_argument("--cuts", type=int, default=20, help="random cuts per codec")
    parser.add_argument("--array-cuts", type=int, default=5, help='cuts timed for ["array"]')
    parser.add_argument("--seed", type=int, default=20260)
    parser.add_argument("--work", type=Path, default=REPOSITORY / "bench" / "out" / "peers")
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=None,
        help="where peers.md and .json go (default: docs/bench; --quick: bench/out/peers)",
    )
    parser.add_argument(
        "--cutfs-python",
        type=Path,
        default=REPOSITORY / ".venv" / "bin" / "python",
        help="the Python that runs `python -m cutfs.vfs.cli mount` (default: .venv's)",
    )
    args = parser.parse_args()
    if args.out_dir is None:
        args.out_dir = args.work if args.quick else REPOSITORY / "docs" / "bench"
    if os.geteuid() != 0:
        parser.error("run as root: cold reads drop the kernel page cache")
    if not args.cutfs_python.exists():
        parser.error(f"{args.cutfs_python} not found: run ./scripts/setup.sh or --cutfs-python")
    if args.cuts > (args.minutes * 60 - 2 * SPACING) // SPACING - 1:
        parser.error("too many cuts for the recordings' length (they are 20 s apart)")
    return args


# -- corpus -------------------------------------------------------------------------------


def _corpus(work: Path, seconds: float, count: int, seed: int) -> dict[str, Original]:
    """The recordings (made once per length) and their cuts."""
    directory = work / f"corpus_{seconds / 60:g}min"
    directory.mkdir(parents=True, exist_ok=True)
    wav = work / f"source_{seconds / 60:g}min.wav"
    if not wav.exists():
        print(f"peers: synthesising {seconds / 60:g} min of audio", flush=True)
        partial = wav.with_suffix(".part.wav")
        synth = ["synth", str(seconds)]
        noise = [*synth, "sine", "200-3000", *synth, "pinknoise", "mix"]
        subprocess.run(
            # -R: the same noise on every run (and machine, for one version of sox)
            ["sox", "-R", "-n", "-r", str(RATE), "-c", "1", "-b", "16", str(partial), *noise],
            check=True,
        )
        partial.rename(wav)
    corpus = {}
    for codec, (extension, options, rate) in CODECS.items():
        recording_id = f"{codec}_{seconds / 60:g}min"
        path = directory / f"{recording_id}.{extension}"
        if not path.exists():
            print(f"peers: encoding {path.name}", flush=True)
            partial = path.with_suffix(".part" + path.suffix)
            subprocess.run(
                ["ffmpeg", "-nostdin", "-v", "error", "-y", "-i", str(wav), *options, str(partial)],
                check=True,
            )
            partial.rename(path)
        first, *cuts = _starts(seconds, count, random.Random(f"{seed}-{codec}"))
        corpus[codec] = Original(
            codec=codec,
            recording_id=recording_id,
            path=path,
            rate=rate,
            frames=0,  # set by _references
            cuts=[Cut(f"{recording_id}/s{round(s * 1000):08d}", s) for s in cuts],
            first=Cut(f"{recording_id}/s{round(first * 1000):08d}", first),
        )
    return corpus


def _starts(seconds: float, count: int, rng: random.Random) -> list[float]:
    """The first-call cut's start, then ``count`` random starts and the two edges: slots
    of 20 s, a random start in the first half of each (rounded to 1 ms)."""
    slots = range(1, int((seconds - 2 * SPACING) // SPACING) + 1)
    chosen = rng.sample(slots, count + 1)
    starts = [round(slot * SPACING + rng.uniform(0.0, SPACING / 2), 3) for slot in chosen]
    return [starts[0], *sorted([*starts[1:], 0.0, seconds - CUT_SECONDS])]


def _references(
    work: Path, corpus: dict[str, Original], python: Path
) -> tuple[References, dict[str, dict[str, Any]]]:
    """Full decodes as int16: ffmpeg's, of every codec at FFmpeg's rate and of Opus at
    16 kHz too (for the readers that decode it at 16 kHz), with the check that the f32
    decode, quantised here, is the s16 decode; and those of PyAV (in ``python``) and of
    libsndfile, at their own rates."""
    directory = work / "references"
    directory.mkdir(exist_ok=True)
    references: References = {}
    check = {}
    for codec, original in corpus.items():
        for rate in sorted({original.rate, RATE}):
            decoded = {}
            for kind in ("s16le", "f32le"):
                target = directory / f"{original.path.name}.{rate}.{kind}"
                if not target.exists():
                    _ffmpeg_decode(original.path, rate, kind, target)
                decoded[kind] = np.fromfile(target, dtype="<i2" if kind == "s16le" else "<f4")
            reference = decoded["s16le"]
            quantised = _pcm16(decoded["f32le"])
            check[f"{codec}@{rate}"] = {
                "frames": len(reference),
                "samples_differing": int(np.count_nonzero(quantised != reference))
                if len(quantised) == len(reference)
                else f"lengths differ: {len(quantised)} and {len(reference)}",
            }
            references[("ffmpeg", codec, rate)] = reference
        original.frames = len(references[("ffmpeg", codec, original.rate)])
        references[("pyav", codec, original.rate)] = _pyav_decode(
            python, original.path, directory / f"{original.path.name}.pyav.s16le"
        )
        file_rate = soundfile.info(str(original.path)).samplerate
        references[("libsndfile", codec, file_rate)] = _pcm16(
            soundfile.read(original.path, dtype="float32")[0]
        )
    return references, check


def _pyav_decode(python: Path, path: Path, target: Path) -> np.ndarray:
    """The full decode of ``path`` by PyAV in cutfs's Python (mono files: channel 0)."""
    if not target.exists():
        partial = target.with_name(target.name + ".part")
        subprocess.run([str(python), "-c", PYAV_DECODE, str(path), str(partial)], check=True)
        partial.rename(target)
    return np.fromfile(target, dtype="<i2")


def _ffmpeg_decode(path: Path, rate: int, kind: str, target: Path) -> None:
    partial = target.with_name(target.name + ".part")
    output = ["-f", kind, "-ac", "1", "-ar", str(rate), str(partial)]
    subprocess.run(
        ["ffmpeg", "-nostdin", "-v", "error", "-y", "-i", str(path), *output], check=True
    )
    partial.rename(target)


def _manifests(corpus: dict[str, Original]) -> tuple[Path, dict[str, list[int]]]:
    """The Lhotse manifests that cutfs serves in place, beside the audio: recordings as
    Lhotse's default backend describes them, except Opus, declared at 48 kHz with
    ffmpeg's length (see _probe for the 16 kHz that Lhotse writes), and every cut as a
    supervision.  Returns their directory and each recording's declared rate and
    length."""
    directory = corpus["flac"].path.parent
    recordings = []
    for original in corpus.values():
        if original.rate == RATE:
            recordings.append(Recording.from_file(original.path, original.recording_id))
        else:
            recordings.append(_declared(original))
    supervisions = [
        SupervisionSegment(cut.cut_id, original.recording_id, cut.start, CUT_SECONDS, channel=0)
        for original in corpus.values()
        for cut in [original.first, *original.cuts]
    ]
    RecordingSet.from_recordings(recordings).to_file(directory / "recordings.jsonl.gz")
    SupervisionSet.from_segments(supervisions).to_file(directory / "supervisions.jsonl.gz")
    declared = {
        o.codec: [r.sampling_rate, r.num_samples]
        for o, r in zip(corpus.values(), recordings, strict=True)
    }
    return directory, declared


def _declared(original: Original) -> Recording:
    return Recording(
        id=original.recording_id,
        sources=[AudioSource(type="file", channels=[0], source=str(original.path))],
        sampling_rate=original.rate,
        num_samples=original.frames,
        duration=original.frames / original.rate,
    )


# -- cutfs --------------------------------------------------------------------------------


@contextmanager
def _mounted(
    python: Path, source: Path, mountpoint: Path, index_cache: Path, log: Path, *options: str
) -> Iterator[Callable[[], None]]:
    """A cutfs mount of ``source``; yields the function that starts its daemon afresh.
    Always unmounted."""
    command = [str(python), "-m", "cutfs.vfs.cli", "mount", "--cache-dir", str(index_cache)]
    command += ["--log-file", str(log), *options, str(source), str(mountpoint)]

    def restart() -> None:
        _unmount(mountpoint)
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPOSITORY, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"cutfs mount failed ({done.returncode}): {done.stderr.strip()}")

    mountpoint.mkdir(parents=True, exist_ok=True)
    try:
        restart()
        yield restart
    finally:
        _unmount(mountpoint)


def _mount_facts(mountpoint: Path, corpus: dict[str, Original]) -> dict[str, Any]:
    """What the mount shows (its top level, where the cuts are, their WAV headers), and
    the first cold read of each recording, which indexes it (one full decode; the index
    is kept in --cache-dir for later mounts)."""
    facts: dict[str, Any] = {"top_level": sorted(os.listdir(mountpoint)), "recordings": {}}
    for codec, original in corpus.items():
        directory = mountpoint / "cuts" / original.recording_id
        listed = sorted(os.listdir(directory))
        expected = sorted(f"{c.cut_id.split('/')[1]}.wav" for c in [original.first, *original.cuts])
        if listed != expected:
            raise RuntimeError(f"{directory} lists {listed}, not the cuts {expected}")
        path = directory / listed[0]
        _drop_caches()
        began = time.perf_counter()
        with open(path, "rb") as wav:
            header = wav.read(44)
            wav.read()
        indexing_ms = (time.perf_counter() - began) * 1000
        facts["recordings"][codec] = {
            "cut_files": f"cuts/{original.recording_id}/<cut>.wav ({len(listed)} files)",
            "st_size": path.stat().st_size,
            "header": _wav_header(header),
            "first_read_ms": round(indexing_ms, 1),
        }
        if facts["recordings"][codec]["header"]["rate"] != original.rate:
            raise RuntimeError(f"cutfs serves {codec} at {facts['recordings'][codec]['header']}")
    return facts


def _wav_header(header: bytes) -> dict[str, Any]:
    riff, _, wave, fmt, _, tag, channels, rate, _, _, bits, data, size = struct.unpack(
        "<4sI4s4sIHHIIHH4sI", header
    )
    if (riff, wave, fmt, data) != (b"RIFF", b"WAVE", b"fmt ", b"data"):
        raise RuntimeError(f"not a canonical WAV header: {header!r}")
    return {"format_tag": tag, "channels": channels, "rate": rate, "bits": bits, "bytes": size}


def _cutfs_readers(
    mountpoint: Path, original: Original, restart: Callable[[], None]
) -> list[Reader]:
    def path(cut: Cut) -> Path:
        return mountpoint / "cuts" / f"{cut.cut_id}.wav"

    def raw(cut: Cut) -> np.ndarray:
        with open(path(cut), "rb") as wav:
            return np.frombuffer(wav.read(), dtype="<i2", offset=44)

    def with_soundfile(cut: Cut) -> np.ndarray:
        return soundfile.read(path(cut), dtype="int16")[0]

    return [
        Reader("cutfs, open().read()", original.rate, raw, restart, decoder="pyav"),
        Reader("cutfs, soundfile", original.rate, with_soundfile, restart, decoder="pyav"),
    ]


def _probe(
    python: Path, work: Path, corpus: dict[str, Original], index_cache: Path
) -> dict[str, Any]:
    """Serve in place the manifest that Lhotse's own ``Recording.from_file`` writes (the
    default backend, which reads Opus at the 16 kHz of its header), and read one cut per
    recording: what a Lhotse user's manifest gets."""
    directory = work / "lhotse-default-manifest"
    directory.mkdir(exist_ok=True)
    recordings = [Recording.from_file(o.path, o.recording_id) for o in corpus.values()]
    supervisions = [
        SupervisionSegment(o.first.cut_id, o.recording_id, o.first.start, CUT_SECONDS, channel=0)
        for o in corpus.values()
    ]
    RecordingSet.from_recordings(recordings).to_file(directory / "recordings.jsonl.gz")
    SupervisionSet.from_segments(supervisions).to_file(directory / "supervisions.jsonl.gz")
    mountpoint = work / "mnt-probe"
    log = work / "cutfs-probe.log"
    log.unlink(missing_ok=True)
    audio = corpus["flac"].path.parent
    facts: dict[str, Any] = {}
    with _mounted(python, directory, mountpoint, index_cache, log, "--allow-root", str(audio)):
        for recording, original in zip(recordings, corpus.values(), strict=True):
            path = mountpoint / "cuts" / f"{original.first.cut_id}.wav"
            row: dict[str, Any] = {
                "declared_rate": recording.sampling_rate,
                "declared_samples": recording.num_samples,
                "st_size": path.stat().st_size,
            }
            try:
                with open(path, "rb") as wav:
                    data = wav.read()
                row["read"] = f"ok, {len(data)} bytes, {_wav_header(data[:44])['rate']} Hz"
            except OSError as error:
                row["read"] = f"{type(error).__name__}: {error}"
            facts[original.codec] = row
    facts["log_errors"] = _log_errors(log, work)
    return facts


def _log_errors(log: Path, work: Path) -> list[str]:
    """The daemon's error lines, without their time, the work directory as ``WORK``."""
    if not log.exists():
        return []
    lines = [line for line in log.read_text().splitlines() if " ERROR " in line]
    return sorted({line.split(" ", 2)[2].replace(str(work), "WORK") for line in lines})


# -- peers --------------------------------------------------------------------------------


def _peers(original: Original, array_cuts: int) -> list[Reader]:
    """The in-process readers of the original file (their set-up is not timed)."""
    path = original.path
    file_rate = soundfile.info(str(path)).samplerate  # libsndfile's rate (Opus: the header's)
    seconds = CUT_SECONDS

    def with_soundfile(cut: Cut) -> np.ndarray:
        start = round(cut.start * file_rate)
        return soundfile.read(
            path, start=start, frames=round(seconds * file_rate), dtype="float32"
        )[0]

    def with_torchcodec(cut: Cut) -> np.ndarray:
        decoder = AudioDecoder(str(path))
        return decoder.get_samples_played_in_range(cut.start, cut.start + seconds).data[0].numpy()

    dataset = Dataset.from_dict({"audio": [str(path)]}).cast_column("audio", Audio())

    def hf_range(cut: Cut) -> np.ndarray:
        decoder = dataset[0]["audio"]
        return decoder.get_samples_played_in_range(cut.start, cut.start + seconds).data[0].numpy()

    def hf_array(cut: Cut) -> np.ndarray:
        first = round(cut.start * original.rate)
        return dataset[0]["audio"]["array"][first : first + round(seconds * original.rate)]

    whole: list[np.ndarray] = []

    def hf_array_once(cut: Cut) -> np.ndarray:  # the same, from one decode
        if not whole:
            whole.append(dataset[0]["audio"]["array"])
        first = round(cut.start * original.rate)
        return whole[0][first : first + round(seconds * original.rate)]

    recording = Recording.from_file(path, original.recording_id)
    with audio_backend(TORCHCODEC_BACKEND):
        recording_tc = Recording.from_file(path, original.recording_id)

    def with_lhotse(cut: Cut) -> np.ndarray:
        return recording.to_cut().truncate(offset=cut.start, duration=seconds).load_audio()[0]

    def with_lhotse_tc(cut: Cut) -> np.ndarray:
        with audio_backend(TORCHCODEC_BACKEND):
            piece = recording_tc.to_cut().truncate(offset=cut.start, duration=seconds)
            return piece.load_audio()[0]

    return [
        Reader("soundfile", file_rate, with_soundfile, decoder="libsndfile"),
        Reader("torchcodec", original.rate, with_torchcodec),
        Reader("HF datasets, range", original.rate, hf_range),
        Reader('HF datasets, ["array"]', original.rate, hf_array, None, array_cuts, hf_array_once),
        Reader("Lhotse", recording.sampling_rate, with_lhotse, decoder="libsndfile"),
        Reader("Lhotse, torchcodec backend", recording_tc.sampling_rate, with_lhotse_tc),
    ]


def _untimed(corpus: dict[str, Original]) -> dict[str, dict[str, float]]:
    """What the tables leave out: Lhotse's ``Recording.from_file`` of each original
    (cold), which a manifest holds, made before the cuts are read."""
    costs: dict[str, dict[str, float]] = {}
    for codec, original in corpus.items():
        costs[codec] = {}
        for backend in ("default", TORCHCODEC_BACKEND):
            with audio_backend(backend):
                _drop_caches()
                began = time.perf_counter()
                Recording.from_file(original.path)
                costs[codec][backend] = round((time.perf_counter() - began) * 1000, 1)
    return costs


# -- measuring ----------------------------------------------------------------------------


def _drop_caches() -> None:
    """Empty the kernel's page cache (dirty pages are written back first)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as drop:
        drop.write("1\n")


def _timed(read: Callable[[Cut], np.ndarray], cut: Cut) -> tuple[float, np.ndarray | str]:
    began = time.perf_counter()
    try:
        samples = read(cut)
    except Exception as error:  # a reader's failure is a result: reported, not hidden
        return math.nan, f"{type(error).__name__}: {str(error)[:200]}"
    return (time.perf_counter() - began) * 1000, samples


def _measure(reader: Reader, original: Original, references: References) -> Result:
    if reader.restart is not None:
        reader.restart()
    _drop_caches()
    first_ms, _ = _timed(reader.read, original.first)
    result = Result(original.codec, reader.name, reader.rate, first_ms, reader.decoder)
    reference = references[("ffmpeg", original.codec, reader.rate)]
    own = references[(reader.decoder, original.codec, reader.rate)]
    for number, cut in enumerate(original.cuts):
        if reader.timed_cuts is None or number < reader.timed_cuts:
            _drop_caches()
            cold_ms, samples = _timed(reader.read, cut)
            warm_ms, again = _timed(reader.read, cut)
            result.cold_ms.append(cold_ms)
            result.warm_ms.append(warm_ms)
        else:
            assert reader.untimed is not None
            samples = again = reader.untimed(cut)
        window = _compare(samples, reference, cut, reader.rate)
        window["own_exact"] = _exact_against(samples, own, cut, reader.rate)
        window["repeat_differs"] = _differs(samples, again)
        result.windows.append(window)
    return result


def _pcm16(samples: np.ndarray) -> np.ndarray:
    """16-bit PCM as ffmpeg's ``-f s16le`` makes it of float samples (swresample:
    ``av_clip_int16(lrintf(x * 32768))``, halves to even)."""
    samples = np.asarray(samples).reshape(-1)
    if samples.dtype == np.int16:
        return samples
    return np.clip(np.rint(samples.astype(np.float64) * 32768.0), -32768, 32767).astype(np.int16)


def _differs(first: np.ndarray | str, second: np.ndarray | str) -> bool:
    if isinstance(first, str) or isinstance(second, str):
        return first != second
    return not np.array_equal(_pcm16(first), _pcm16(second))


def _compare(
    samples: np.ndarray | str, reference: np.ndarray, cut: Cut, rate: int
) -> dict[str, Any]:
    """A window against the reference (see the docstring at the top)."""
    nominal = round(cut.start * rate)
    expected = round(CUT_SECONDS * rate)
    window: dict[str, Any] = {"start": cut.start, "expected": expected}
    if isinstance(samples, str):
        return window | {"error": samples}
    pcm = _pcm16(samples).astype(np.int32)
    window["samples"] = len(pcm)
    if len(pcm) == 0:
        return window | {"error": "no samples"}
    lag = _lag(pcm, reference, nominal)
    window["offset"] = lag
    window["end_offset"] = lag + len(pcm) - expected
    window["max_diff_nominal"] = _max_diff(pcm, reference, nominal)
    window["max_diff_aligned"] = _max_diff(pcm, reference, nominal + lag)
    placed = len(pcm) == expected and lag == 0
    window["exact"] = placed and window["max_diff_nominal"] == 0
    window["within_1_lsb"] = placed and 0 <= window["max_diff_nominal"] <= 1
    return window


def _exact_against(samples: np.ndarray | str, reference: np.ndarray, cut: Cut, rate: int) -> bool:
    """Whether a window is exactly its place in ``reference`` (length and every sample)."""
    if isinstance(samples, str):
        return False
    pcm = _pcm16(samples)
    first, expected = round(cut.start * rate), round(CUT_SECONDS * rate)
    return len(pcm) == expected and np.array_equal(pcm, reference[first : first + expected])


def _max_diff(pcm: np.ndarray, reference: np.ndarray, first: int) -> int:
    """max |window - reference[first:]| over the samples both have."""
    overlap = min(len(pcm), len(reference) - first)
    if first < 0 or overlap <= 0:
        return -1
    return int(np.max(np.abs(pcm[:overlap] - reference[first : first + overlap].astype(np.int32))))


def _lag(pcm: np.ndarray, reference: np.ndarray, nominal: int) -> int:
    """The lag L for which pcm[k] best matches reference[nominal + L + k]."""
    head = pcm[:HEAD].astype(np.float64)
    low = max(0, nominal - SEARCH)
    high = min(len(reference), nominal + SEARCH + len(head))
    segment = reference[low:high].astype(np.float64)
    if len(segment) < len(head):
        return 0
    size = 1 << (len(segment) + len(head)).bit_length()
    spectrum = np.fft.rfft(segment, size) * np.conj(np.fft.rfft(head, size))
    correlation = np.fft.irfft(spectrum, size)[: len(segment) - len(head) + 1]
    best = int(np.argmax(correlation)) + low - nominal
    candidates = []
    for lag in range(best - 2, best + 3):  # the correlation's peak can be a sample off
        first = nominal + lag
        if first >= 0 and first + len(head) <= len(reference):
            piece = reference[first : first + len(head)]
            candidates.append((float(np.mean(np.abs(head - piece))), lag))
    return min(candidates)[1] if candidates else best


def _progress(row: Result) -> None:
    cold = statistics.median(row.cold_ms) if row.cold_ms else math.nan
    warm = statistics.median(row.warm_ms) if row.warm_ms else math.nan
    exact = sum(1 for w in row.windows if w.get("exact"))
    print(
        f"peers: {row.codec:4s} {row.reader:28s} first {row.first_call_ms:8.1f} ms, "
        f"cold p50 {cold:8.1f} ms, warm p50 {warm:8.1f} ms, exact {exact}/{len(row.windows)}",
        flush=True,
    )


# -- results ------------------------------------------------------------------------------


def _summary(row: Result) -> dict[str, Any]:
    windows = [w for w in row.windows if "error" not in w]
    summary: dict[str, Any] = {
        "codec": row.codec,
        "reader": row.reader,
        "rate": row.rate,
        "first_call_ms": round(row.first_call_ms, 1),
        "timed_cuts": len(row.cold_ms),
        "windows": len(row.windows),
        "errors": sorted({w["error"] for w in row.windows if "error" in w}),
        "exact": sum(1 for w in windows if w["exact"]),
        "within_1_lsb": sum(1 for w in windows if w["within_1_lsb"]),
        "decoder": DECODERS[row.decoder],
        "own_exact": sum(1 for w in row.windows if w.get("own_exact")),
        "repeat_differs": sum(1 for w in row.windows if w.get("repeat_differs")),
        "expected": round(CUT_SECONDS * row.rate),
        "samples": sorted({w["samples"] for w in windows}),
    }
    for name in ("cold", "warm"):
        values = [v for v in getattr(row, f"{name}_ms") if not math.isnan(v)]
        summary[f"{name}_p50_ms"] = round(statistics.median(values), 2) if values else None
        summary[f"{name}_p90_ms"] = round(float(np.percentile(values, 90)), 2) if values else None
    for name in ("offset", "end_offset"):
        values = [w[name] for w in windows]
        summary[name] = [int(np.median(values)), min(values), max(values)] if values else None
    for name in ("max_diff_nominal", "max_diff_aligned"):
        summary[name] = max((w[name] for w in windows), default=None)
    usual = summary["offset"][0] if summary["offset"] else 0
    keys = ("start", "samples", "offset", "max_diff_aligned")
    summary["odd_windows"] = [  # of another length or offset than most
        {key: w[key] for key in keys}
        for w in windows
        if w["samples"] != w["expected"] or w["offset"] != usual
    ]
    worst = max(windows, key=lambda w: w["max_diff_aligned"], default=None)
    summary["worst_start"] = worst["start"] if worst else None
    summary["differing_windows"] = sum(1 for w in windows if w["max_diff_aligned"] > 0)
    return summary


def _machine() -> dict[str, Any]:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "?",
    )
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": model,
        "kernel": os.uname().release,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "load_before": os.getloadavg(),
    }


def _versions(cutfs_python: Path) -> dict[str, str]:
    ffmpeg = subprocess.run(["ffmpeg", "-version"], capture_output=True, text=True, check=True)
    probe = (
        "import av, cutfs, importlib.metadata as m; "
        "print(m.version('cutfs'), cutfs.__file__, av.__version__, "
        "av.library_versions['libavcodec'][0])"
    )
    cutfs = subprocess.run(
        [str(cutfs_python), "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    checkout = Path(cutfs[1]).resolve().parent.parent
    commit = subprocess.run(
        ["git", "-C", str(checkout), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    loaded = torchcodec._core.get_ffmpeg_library_versions()["ffmpeg_version"]
    return {
        "cutfs": f"{cutfs[0]} ({commit or 'not a git checkout'})",
        "PyAV (cutfs's decoder)": f"{cutfs[2]} (libavcodec {cutfs[3]})",
        "torchcodec": f"{torchcodec.__version__} (FFmpeg {loaded})",
        "torch": torch.__version__,
        "datasets": datasets.__version__,
        "lhotse": lhotse.__version__,
        "soundfile": f"{soundfile.__version__} (libsndfile {soundfile.__libsndfile_version__})",
        "numpy": np.__version__,
        "ffmpeg CLI": ffmpeg.stdout.split("\n", 1)[0].split()[2],
    }


def _recording_facts(corpus: dict[str, Original], declared: dict[str, list[int]]) -> dict[str, Any]:
    return {
        codec: {
            "file": o.path.name,
            "bytes": o.path.stat().st_size,
            "rate": o.rate,
            "frames": o.frames,
            "manifest_declares": declared[codec],
            "cuts": [cut.start for cut in o.cuts],
            "first_call_cut": o.first.start,
        }
        for codec, o in corpus.items()
    }


def _json(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value)} is not JSON")


def _span(values: list[int] | None) -> str:
    if values is None:
        return "-"
    median, low, high = values
    return str(median) if low == high else f"{median} [{low}, {high}]"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _markdown(results: dict[str, Any]) -> str:
    machine, settings = results["machine"], results["settings"]
    lines = [
        "# cutfs and the in-process readers: a random 10 s cut of a long recording",
        "",
        f"Generated by `bench/peers.py` ({results['mode']} mode, {machine['date']}, "
        f"{results['seconds_taken']:.0f} s); its docstring says how. "
        f"{machine['nproc']} cores ({machine['cpu']}), {machine['memory_gib']} GiB, "
        f"Linux {machine['kernel']}, Python {machine['python']}; load average "
        f"{machine['load_before'][0]:.2f} before, {machine['load_after'][0]:.2f} after "
        "(the machine may be shared: compare within the run).",
        "",
        "| | version |",
        "|---|---|",
        *(f"| {name} | {version} |" for name, version in results["versions"].items()),
        "",
        f"Recordings: {settings['seconds'] / 60:g} min each, "
        f"{settings['cuts_per_codec']} cuts of 10 s per codec (random, seed {settings['seed']}, "
        "plus the first and the last 10 s).",
        "",
        "| codec | file | bytes | FFmpeg's rate (cutfs's) | frames | manifest declares "
        "| cutfs WAV header | cutfs's first read (indexing) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for codec, facts in results["recordings"].items():
        mounted = results["cutfs_mount"]["recordings"][codec]
        header = mounted["header"]
        lines.append(
            f"| {codec} | {facts['file']} | {facts['bytes']:,} | {facts['rate']} | "
            f"{facts['frames']:,} | {facts['manifest_declares'][0]} Hz, "
            f"{facts['manifest_declares'][1]:,} | {header['rate']} Hz, {header['bits']}-bit, "
            f"{header['channels']} ch | {mounted['first_read_ms']:.0f} ms |"
        )
    layout = results["cutfs_mount"]
    lines += [
        "",
        "cutfs serves the Lhotse manifests in place (`cutfs mount DIR MOUNTPOINT`); the "
        f"mount shows {', '.join(f'`{n}`' for n in layout['top_level'])}, and the cuts as "
        + ", ".join(f"`{r['cut_files']}`" for r in layout["recordings"].values())
        + ". Its first read of a recording indexes it (a full decode, kept in `--cache-dir` "
        "for later mounts); the measurements come after.",
    ]
    lines += _latency_table(results["results"])
    lines += _exactness_table(results["results"])
    lines += _notes(results)
    return "\n".join(lines) + "\n"


def _latency_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "## Time to read one 10 s cut (ms)",
        "",
        "cold: page cache dropped before the read (cutfs: a new daemon for each batch); "
        "warm: the same cut again at once. `/ soundfile`: the p50 over soundfile's on the "
        "original. first call: the reader's first read in the process (cutfs: after its "
        "daemon starts), cold, not in the other columns.",
        "",
        "| codec | reader | rate | cold p50 | cold p90 | warm p50 | warm p90 "
        "| cold / soundfile | warm / soundfile | first call | cuts timed |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = {row["codec"]: row for row in rows if row["reader"] == "soundfile"}
    for row in rows:
        ratios = []
        for name in ("cold", "warm"):
            ours, theirs = row[f"{name}_p50_ms"], base[row["codec"]][f"{name}_p50_ms"]
            ratios.append(f"{ours / theirs:.2f}x" if ours and theirs else "-")
        lines.append(
            f"| {row['codec']} | {row['reader']} | {row['rate']} | {_ms(row['cold_p50_ms'])} | "
            f"{_ms(row['cold_p90_ms'])} | {_ms(row['warm_p50_ms'])} | {_ms(row['warm_p90_ms'])} | "
            f"{ratios[0]} | {ratios[1]} | {_ms(row['first_call_ms'])} | {row['timed_cuts']} |"
        )
    return lines


def _exactness_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "## Exactness against ffmpeg's full decode (16-bit PCM)",
        "",
        "offsets in samples at the reader's rate: of the first sample (negative: early) and "
        "of the last (negative: the window ends early), median [min, max]; differences in "
        "LSB (1/32768), at the nominal position and at the window's own offset; exact: the "
        "expected length, offset 0 and no sample different. The last column compares each "
        "window with the full decode by the decoder the reader links: the system's FFmpeg "
        "(the CLI's: torchcodec), the FFmpeg PyAV bundles (cutfs), libsndfile (soundfile, "
        "Lhotse's default backend). Decoders of lossy codecs differ by an LSB here and "
        "there: that column says whether a reader's seeking changed anything.",
        "",
        "| codec | reader | rate | samples (expected) | first-sample offset "
        "| last-sample offset | max diff nominal | max diff aligned | exact | within 1 LSB "
        "| exact against its own decoder's full decode |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        samples = ", ".join(str(n) for n in row["samples"]) or "-"
        errors = f", {len(row['errors'])} kinds of error" if row["errors"] else ""
        lines.append(
            f"| {row['codec']} | {row['reader']} | {row['rate']} | {samples} ({row['expected']}) | "
            f"{_span(row['offset'])} | {_span(row['end_offset'])} | {row['max_diff_nominal']} | "
            f"{row['max_diff_aligned']} | {row['exact']}/{row['windows']}{errors} | "
            f"{row['within_1_lsb']}/{row['windows']} | "
            f"{row['own_exact']}/{row['windows']} ({row['decoder']}) |"
        )
    return lines


def _notes(results: dict[str, Any]) -> list[str]:
    """Facts the tables imply, stated: which peer is faster than cutfs, which is inexact."""
    rows = results["results"]
    lines = ["", "## Notes", ""]
    for codec in CODECS:
        for name in ("cold", "warm"):
            timed = [r for r in rows if r["codec"] == codec and r[f"{name}_p50_ms"] is not None]
            ranked = sorted(timed, key=lambda r, n=name: r[f"{n}_p50_ms"])
            lines.append(
                f"- {codec}, {name} p50, fastest first (ms): "
                + ", ".join(
                    (f"**{r['reader']}**" if r["reader"].startswith("cutfs") else r["reader"])
                    + f" {_ms(r[f'{name}_p50_ms'])}"
                    for r in ranked
                )
                + "."
            )
    for row in rows:
        facts = []
        if row["offset"] and row["offset"][0] != 0:
            facts.append(f"starts {-row['offset'][0]} samples early (median)")
        elif row["offset"] and (row["offset"][1] or row["offset"][2]):
            facts.append(f"starts at offsets {row['offset'][1]}..{row['offset'][2]}")
        short = [n for n in row["samples"] if n != row["expected"]]
        if short:
            facts.append(f"returns {', '.join(map(str, short))} samples in some windows")
        if row["max_diff_aligned"]:
            facts.append(
                f"differs by up to {row['max_diff_aligned']} LSB even aligned, in "
                f"{row['differing_windows']}/{row['windows']} windows (most at "
                f"{row['worst_start']} s)"
            )
        if row["errors"]:
            facts.append("fails: " + "; ".join(f"`{e}`" for e in row["errors"]))
        if row["repeat_differs"]:
            facts.append(f"a second read differs from the first in {row['repeat_differs']} cuts")
        facts += [
            f"at {w['start']} s: {w['samples']} samples, offset {w['offset']}, "
            f"{w['max_diff_aligned']} LSB aligned"
            for w in row["odd_windows"][:3]
        ]
        if facts:
            lines.append(
                f"- {row['codec']} @ {row['rate']} Hz, {row['reader']}: "
                f"{'; '.join(facts)} ({row['exact']}/{row['windows']} exact)."
            )
    lines.append(
        "- Not in the times: Lhotse's `Recording.from_file` of the original, cold (ms, default "
        "backend / TorchcodecBackend): "
        + ", ".join(
            f"{codec} {costs['default']:.0f} / {costs[TORCHCODEC_BACKEND]:.0f}"
            for codec, costs in results["untimed"].items()
        )
        + "; cutfs's first read of each recording (indexing) is in the table of recordings."
    )
    check = results["quantisation_check"]
    bad = {k: v for k, v in check.items() if v["samples_differing"] != 0}
    lines.append(
        "- Quantising ffmpeg's f32 decode as above gives its s16 decode "
        + ("exactly, for every reference." if not bad else f"except: {bad}.")
    )
    lines.append(
        "- Opus: soundfile and Lhotse's default backend (libsndfile) decode at 16 kHz, the "
        "rate in the Opus header, and are compared with `ffmpeg -ar 16000`; the others at "
        "48 kHz, which cutfs serves. Their times are for a third of the samples."
    )
    probe = results["lhotse_default_manifest"]
    lines.append(
        "- A manifest as Lhotse's `Recording.from_file` writes it (default backend), served "
        "in place: "
        + "; ".join(
            f"{codec} declared {row['declared_rate']} Hz, st_size {row['st_size']:,}, "
            f"read: {row['read']}"
            for codec, row in probe.items()
            if codec != "log_errors"
        )
        + (
            ". cutfs's log: " + " / ".join(f"`{line}`" for line in probe["log_errors"])
            if probe["log_errors"]
            else ""
        )
        + ". The measured mount declares Opus at 48 kHz with ffmpeg's length."
    )
    if results["cutfs_log_errors"]:
        lines.append(
            "- cutfs logged errors during the measurements: "
            + " / ".join(f"`{line}`" for line in results["cutfs_log_errors"])
        )
    return lines


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
