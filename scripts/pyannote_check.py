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


def _segmentation_model() -> Any:
    """pyannote's PyanNet, randomly initialised with a fixed seed (no weights can be
    downloaded here): the same model in every run, a real network either way."""
    import torch  # noqa: PLC0415
    from pyannote.audio.core.task import Problem, Resolution, Specifications  # noqa: PLC0415
    from pyannote.audio.models.segmentation import PyanNet  # noqa: PLC0415

    torch.manual_seed(0)
    model = PyanNet()
    model.specifications = Specifications(
        problem=Problem.MONO_LABEL_CLASSIFICATION,
        resolution=Resolution.FRAME,
        duration=5.0,
        classes=["speaker1", "speaker2", "speaker3"],
        powerset_max_classes=2,
        permutation_invariant=True,
    )
    model.build()
    return model.eval()


def _inference() -> Any:
    import torch  # noqa: PLC0415
    from pyannote.audio import Inference  # noqa: PLC0415

    return Inference(
        _segmentation_model(), window="sliding", step=2.5, batch_size=4, device=torch.device("cpu")
    )


def _same_features(mounted: Any, reference: Any) -> str | None:
    windows = [
        (f.sliding_window.start, f.sliding_window.duration, f.sliding_window.step)
        for f in (mounted, reference)
    ]
    if windows[0] != windows[1]:
        return f"windows {windows[0]} against {windows[1]}"
    if mounted.data.shape != reference.data.shape:
        return f"shape {mounted.data.shape} against {reference.data.shape}"
    differing = int(np.count_nonzero(mounted.data != reference.data))
    return None if differing == 0 else f"{differing} of {mounted.data.size} outputs differ"


def pyannote_inference(spec: dict[str, Any]) -> str | None:
    """pyannote.audio's Inference (a sliding window over the whole file) on the mounted
    file and on a WAV of the reference decode: outputs bit-identical."""
    inference = _inference()
    return _same_features(inference(spec["path"]), inference(spec["reference"]))


def pyannote_protocol(spec: dict[str, Any]) -> str | None:
    """A pyannote.database protocol whose paths point into the mount (``database.yml``):
    Inference over each file it yields equals Inference over the reference WAV."""
    from pyannote.database import FileFinder, registry  # noqa: PLC0415

    registry.load_database(spec["database"])
    protocol = registry.get_protocol(spec["protocol"], preprocessors={"audio": FileFinder()})
    inference = _inference()
    checked = 0
    for file in protocol.test():
        problem = _same_features(inference(file), inference(spec["references"][file["uri"]]))
        if problem is not None:
            return f"{file['uri']}: {problem}"
        checked += 1
    return None if checked == len(spec["references"]) else f"{checked} files checked"


def pyannote_diarization(spec: dict[str, Any]) -> str | None:
    """pyannote.audio's SpeakerDiarization pipeline (segmentation, embeddings, VBx
    clustering; randomly initialised models and PLDA, fixed seeds) on the mounted file and
    on the reference WAV: the same speaker turns, to the RTTM line."""
    import torch  # noqa: PLC0415
    from pyannote.audio.core.plda import PLDA  # noqa: PLC0415
    from pyannote.audio.models.embedding import WeSpeakerResNet34  # noqa: PLC0415
    from pyannote.audio.pipelines import SpeakerDiarization  # noqa: PLC0415

    random = np.random.default_rng(0)
    work = os.path.dirname(spec["reference"])
    transform, plda = os.path.join(work, "transform.npz"), os.path.join(work, "plda.npz")
    np.savez(
        transform,
        mean1=random.normal(size=256),
        mean2=random.normal(size=128),
        lda=random.normal(size=(256, 128)),
    )
    np.savez(
        plda,
        mu=random.normal(size=128),
        tr=np.eye(128) + 0.1 * random.normal(size=(128, 128)),
        psi=random.uniform(0.5, 2.0, size=128),
    )
    segmentation = _segmentation_model()
    torch.manual_seed(1)
    pipeline = SpeakerDiarization(
        segmentation=segmentation,
        embedding=WeSpeakerResNet34().eval(),
        plda=PLDA(transform, plda),
        segmentation_batch_size=4,
        embedding_batch_size=4,
    )
    pipeline.instantiate(
        {
            "segmentation": {"min_duration_off": 0.0},
            "clustering": {"threshold": 0.6, "Fa": 0.07, "Fb": 0.8},
        }
    )
    turns = []
    for path in (spec["path"], spec["reference"]):
        np.random.seed(0)  # whatever the pipeline draws, the same each run
        torch.manual_seed(0)
        output = pipeline({"audio": path, "uri": "file"})
        annotation = getattr(output, "speaker_diarization", output)
        turns.append(annotation.to_rttm())
    if not turns[0].strip():
        return "no speaker turn found"
    return None if turns[0] == turns[1] else f"turns differ:\n{turns[0]}\n{turns[1]}"


CHECKS: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "torchaudio_load": torchaudio_load,
    "pyannote_call": pyannote_call,
    "pyannote_crop": pyannote_crop,
    "pyannote_windows": pyannote_windows,
    "pyannote_inference": pyannote_inference,
    "pyannote_protocol": pyannote_protocol,
    "pyannote_diarization": pyannote_diarization,
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
