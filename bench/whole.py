#!/usr/bin/env python3
"""Whole recordings read cold: through the mount, against decoding the original.

    sudo .venv/bin/python bench/whole.py --rounds 3
    sudo .venv/bin/python bench/whole.py --rounds 3 "base=--read-ahead-cells 0" ahead=

A diarization pipeline loads a whole recording first (pyannote.audio's ``Audio()(path)``
inside its ``Inference``). For each 20-minute recording (FLAC, MP3, Opus; bench/run.py's
synthetic audio) and each round, with the page cache dropped before every read and a fresh
daemon for every read through the mount (an empty block cache, started 2 s before the
read): ``open().read()`` of
``recordings/<id>.wav`` and pyannote's ``Audio()(path)`` through each variant of the
mount (``name=mount options``), against ``Audio()(path)`` of the original file (pyannote
decodes it with torchcodec) and the ffmpeg command line decoding it to /dev/null; and
through each variant, 40 random 10 s windows read with soundfile (seek and read, as a
training loop cropping recordings does: what read-ahead must not slow down). The
pyannote reads run in a long-lived process of the pyannote environment
(``.venv-pyannote``, see scripts/compat.py): only the call is timed, not the imports.
Prints the medians and each one's ratio to pyannote on the original, and writes them to
``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final, TypeVar

import soundfile
from processes import unmount
from run import CUTFS, REPOSITORY, _drop_caches, _prepare, _read_file

T = TypeVar("T")
RECORDINGS: Final = ("flac_20min", "mp3_20min", "opus_20min")
#: Random 10 s windows read per recording and variant (the scattered reader).
WINDOWS: Final = 40
#: How long after mounting a read starts (a user's job starts later than that).
SETTLE_SECONDS: Final = 2.0
PYANNOTE_PYTHON: Final = REPOSITORY / ".venv-pyannote" / "bin" / "python"
#: Reads paths from stdin, answers each with the seconds ``Audio()(path)`` took and the
#: frames it returned.
PYANNOTE_READER: Final = """
import sys, time
from pyannote.audio.core.io import Audio
audio = Audio()
print("ready", flush=True)
for line in sys.stdin:
    started = time.perf_counter()
    waveform, rate = audio(line.strip())
    print(time.perf_counter() - started, waveform.shape[-1], rate, flush=True)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "variants",
        nargs="*",
        default=["cutfs="],
        help="name=mount options, e.g. 'base=--read-ahead-cells 0' (default: 'cutfs=')",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=REPOSITORY / "bench" / "out")
    parser.add_argument("--out", type=Path, help="write the medians here as JSON")
    args = parser.parse_args()
    variants = dict(_variant(text) for text in args.variants)
    setup = _prepare(args.work, {"20min": 1200.0}, 4)
    mountpoint = args.work / "mnt" / "whole"
    mountpoint.mkdir(parents=True, exist_ok=True)
    times: dict[tuple[str, str], list[float]] = {}
    reader = subprocess.Popen(
        [str(PYANNOTE_PYTHON), "-c", PYANNOTE_READER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert reader.stdin is not None and reader.stdout is not None
    if reader.stdout.readline().strip() != "ready":
        raise RuntimeError("the pyannote reader did not start")

    def pyannote(path: Path) -> float:
        assert reader.stdin is not None and reader.stdout is not None
        reader.stdin.write(f"{path}\n")
        reader.stdin.flush()
        seconds, _, _ = reader.stdout.readline().split()
        return float(seconds)

    try:
        for number in range(args.rounds):
            for recording in _rotated(RECORDINGS, number):
                original = setup.corpus[recording]
                _drop_caches()
                _add(times, recording, "original: pyannote", pyannote(original))
                _drop_caches()
                _add(times, recording, "original: ffmpeg", _ffmpeg_seconds(original))
                for name, options in _rotated(list(variants.items()), number):
                    path = mountpoint / "recordings" / f"{recording}.wav"
                    _mount(setup.shards, mountpoint, options)
                    started = time.perf_counter()
                    _read_file(path)
                    _add(times, recording, f"{name}: read()", time.perf_counter() - started)
                    _mount(setup.shards, mountpoint, options)
                    _add(times, recording, f"{name}: pyannote", pyannote(path))
                    _mount(setup.shards, mountpoint, options)
                    seconds = _scattered_windows(path, random.Random(number))
                    _add(times, recording, f"{name}: {WINDOWS} windows", seconds)
                print(f"round {number + 1} of {args.rounds} done", flush=True)
    finally:
        unmount(mountpoint)
        reader.kill()
    _report(times, args.rounds, args.out)
    return 0


def _variant(text: str) -> tuple[str, list[str]]:
    name, _, options = text.partition("=")
    return name, shlex.split(options)


def _rotated(items: Sequence[T], by: int) -> list[T]:
    shift = by % len(items)
    return [*items[shift:], *items[:shift]]


def _add(times: dict[tuple[str, str], list[float]], recording: str, how: str, s: float) -> None:
    times.setdefault((recording, how), []).append(s)


def _mount(shards: Path, mountpoint: Path, options: list[str]) -> None:
    """A fresh daemon (an empty block cache), settled (its serving processes import the
    decoders' modules in the background once mounted), the page cache dropped."""
    unmount(mountpoint)
    subprocess.run(
        [*CUTFS, "mount", *options, str(shards), str(mountpoint)], check=True, cwd=REPOSITORY
    )
    time.sleep(SETTLE_SECONDS)
    _drop_caches()


def _scattered_windows(path: Path, rng: random.Random) -> float:
    """Seconds to read WINDOWS random 10 s windows of a file with soundfile (seek, read), as
    a training loop cropping a recording does: what the read-ahead must not slow down."""
    started = time.perf_counter()
    with soundfile.SoundFile(path) as sound:
        length = sound.frames - 10 * sound.samplerate
        for _ in range(WINDOWS):
            sound.seek(rng.randrange(length))
            sound.read(10 * sound.samplerate, dtype="int16")
    return time.perf_counter() - started


def _ffmpeg_seconds(path: Path) -> float:
    started = time.perf_counter()
    subprocess.run(
        ["ffmpeg", "-v", "error", "-i", str(path), "-f", "s16le", "-y", "/dev/null"],
        check=True,
    )
    return time.perf_counter() - started


def _report(times: dict[tuple[str, str], list[float]], rounds: int, out: Path | None) -> None:
    medians = {key: statistics.median(values) for key, values in times.items()}
    rows = []
    print(f"\n| recording | reader | median s ({rounds} rounds) | x pyannote on the original |")
    print("|---|---|---|---|")
    for (recording, how), median in medians.items():
        # Windows are compared between variants, not with a whole decode.
        whole = not how.endswith(" windows")
        ratio = median / medians[(recording, "original: pyannote")] if whole else None
        rows.append(
            {
                "recording": recording,
                "reader": how,
                "median_seconds": median,
                "ratio": ratio,
                "seconds": times[(recording, how)],
            }
        )
        print(
            f"| {recording} | {how} | {median:.2f} | {'-' if ratio is None else f'{ratio:.2f}'} |"
        )
    if out is not None:
        out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
