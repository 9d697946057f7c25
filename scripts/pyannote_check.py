"""Read a cutfs mount with torchaudio and pyannote.audio; compare with expected samples.

Runs inside the separate environment that ``scripts/compat.py --with-pyannote`` builds
(torchaudio and pyannote.audio need a torch build that cannot sit beside the project's CPU
torch; see docs/compat.md).  Usage::

    python scripts/pyannote_check.py SPEC.json

SPEC lists checks: ``{"check": ..., "path": ..., "expected": "samples.npy", ...}``, where
the expected samples are int16 (frames, channels) from ffmpeg's full decode.  Prints one
JSON line per check with its outcome and exits 1 if any failed.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torchaudio
from pyannote.audio import Audio
from pyannote.core import Segment, SlidingWindow


def _as_int16(waveform: Any) -> np.ndarray:
    """(channels, frames) float in [-1, 1) back to int16 (frames, channels)."""
    samples = np.asarray(waveform, dtype=np.float64).T * 32768.0
    return np.clip(np.rint(samples), -32768, 32767).astype(np.int16)


def _compare(actual: np.ndarray, expected: np.ndarray, tolerance: int = 0) -> str | None:
    """``None`` when equal within ``tolerance`` (cutfs serves lossy codecs within 1 LSB of
    ffmpeg's full decode, lossless ones exactly)."""
    if actual.shape != expected.shape:
        return f"shape {actual.shape} != {expected.shape}"
    difference = int(np.abs(actual.astype(np.int32) - expected.astype(np.int32)).max(initial=0))
    return None if difference <= tolerance else f"differs by up to {difference}"


def torchaudio_load(spec: dict[str, Any]) -> str | None:
    waveform, rate = torchaudio.load(spec["path"])
    if rate != spec["rate"]:
        return f"rate {rate}"
    return _compare(_as_int16(waveform.numpy()), np.load(spec["expected"]), spec["tolerance"])


def pyannote_call(spec: dict[str, Any]) -> str | None:
    waveform, rate = Audio()(spec["path"])
    if rate != spec["rate"]:
        return f"rate {rate}"
    return _compare(_as_int16(waveform.numpy()), np.load(spec["expected"]), spec["tolerance"])


def pyannote_crop(spec: dict[str, Any]) -> str | None:
    """Audio().crop over a long recording, window after window, as pyannote's Inference
    slides over a file (pyannote.core.SlidingWindow, mode "center" chunks)."""
    audio = Audio()
    expected = np.load(spec["expected"])
    rate = spec["rate"]
    duration = len(expected) / rate
    windows = SlidingWindow(start=0.0, duration=spec["window"], step=spec["step"])
    checked = 0
    for chunk in windows(Segment(0, duration), align_last=False):
        if chunk.end > duration:
            break
        waveform, _ = audio.crop(spec["path"], chunk)
        first = round(chunk.start * rate)
        frames = waveform.shape[1]
        problem = _compare(_as_int16(waveform.numpy()), expected[first : first + frames])
        if problem is not None:
            return f"crop {chunk}: {problem}"
        checked += 1
    return None if checked else "no chunk checked"


def pyannote_windows(spec: dict[str, Any]) -> str | None:
    """Every file of windows/<recording>/ read with Audio()(path), placed by its name."""
    audio = Audio()
    expected = np.load(spec["expected"])
    rate = spec["rate"]
    names = sorted(os.listdir(spec["path"]), key=lambda name: float(name.split("-")[0]))
    for name in names:
        start = float(name.split("-")[0])
        waveform, _ = audio(os.path.join(spec["path"], name))
        first = round(start * rate)
        frames = waveform.shape[1]
        problem = _compare(_as_int16(waveform.numpy()), expected[first : first + frames])
        if problem is not None:
            return f"{name}: {problem}"
    return None if names else "no windows"


CHECKS: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "torchaudio_load": torchaudio_load,
    "pyannote_call": pyannote_call,
    "pyannote_crop": pyannote_crop,
    "pyannote_windows": pyannote_windows,
}


def main() -> int:
    with open(sys.argv[1], encoding="utf-8") as spec_file:
        specs = json.load(spec_file)
    failed = False
    for spec in specs:
        try:
            problem = CHECKS[spec["check"]](spec)
        except Exception as exc:  # report what the client raised
            problem = f"raised {exc!r}"
        failed |= problem is not None
        print(json.dumps({"check": spec["check"], "path": spec["path"], "problem": problem}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
