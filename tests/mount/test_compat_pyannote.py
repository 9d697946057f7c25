"""torchaudio and pyannote.audio reading a mount, from the separate environment they need.

PyPI's torchaudio for Linux x86_64 is a CUDA build that cannot load beside the CPU torch
the project installs, and pyannote.audio imports torchaudio at start.  ``scripts/compat.py
--build-pyannote`` builds ``.venv-pyannote`` (about 2 GB of downloads) where they run on
the CPU; these tests drive ``scripts/pyannote_check.py`` in it.  They are skipped without
it, except where ``CUTFS_REQUIRE_PYANNOTE=1`` (CI, which builds it): there a missing
environment fails them.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from support.corpus import wav_header
from support.mounts import mounted, needs_fuse
from support.references import Reference, cut_path, cut_plan, expected_cut

REPOSITORY = Path(__file__).resolve().parents[2]
VENV = REPOSITORY / ".venv-pyannote"

pytestmark = [
    pytest.mark.mount,
    needs_fuse,
    pytest.mark.skipif(
        not (VENV / "bin" / "python").exists() and os.environ.get("CUTFS_REQUIRE_PYANNOTE") != "1",
        reason="needs .venv-pyannote (scripts/compat.py --build-pyannote builds it)",
    ),
]


def _run_checks(specs: list[dict[str, object]], work: Path) -> dict[str, str | None]:
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps(specs))
    environment = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    result = subprocess.run(
        [
            str(VENV / "bin" / "python"),
            str(REPOSITORY / "scripts" / "pyannote_check.py"),
            str(spec_path),
        ],
        capture_output=True,
        text=True,
        check=False,
        env=environment,
        timeout=600,
    )
    outcomes = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert outcomes, result.stderr
    return {f"{o['check']} {o['path']}": o["problem"] for o in outcomes}


def _tolerance(cut: dict[str, object], references: dict[str, Reference]) -> int:
    """1 LSB for lossy codecs, none for lossless ones (cutfs's contract)."""
    name = next(name for name in references if name.rsplit(".", 1)[0] == cut["recording"])
    return 0 if references[name].lossless else 1


def _save(work: Path, name: str, samples: np.ndarray) -> str:
    path = work / f"{name}.npy"
    np.save(path, samples)
    return str(path)


def test_torchaudio_load(mount: str, references: dict[str, Reference], tmp_path: Path) -> None:
    specs: list[dict[str, object]] = []
    chosen = [cut for cut in cut_plan(references) if str(cut["id"]).endswith("/overlap-b")]
    for cut in chosen:
        samples, rate = expected_cut(cut, references)
        specs.append(
            {
                "check": "torchaudio_load",
                "path": cut_path(mount, str(cut["id"])),
                "rate": rate,
                "expected": _save(tmp_path, f"cut{len(specs)}", samples),
                "tolerance": _tolerance(cut, references),
            }
        )
    problems = _run_checks(specs, tmp_path)
    assert len(problems) == len(chosen) == len(references)
    assert all(problem is None for problem in problems.values()), problems


def test_pyannote_audio_reads_cuts_crops_and_windows(
    shard_dir: str, references: dict[str, Reference], tmp_path: Path
) -> None:
    flac = references["flac_mono_16k.flac"]
    whole = _save(tmp_path, "flac", flac.samples)
    options = ("--window", "10", "--overlap", "2")
    with mounted(shard_dir, str(tmp_path / "mnt"), *options) as mountpoint:
        cut = cut_plan(references)[0]
        samples, rate = expected_cut(cut, references)
        specs: list[dict[str, object]] = [
            {
                "check": "pyannote_call",
                "path": cut_path(mountpoint, str(cut["id"])),
                "rate": rate,
                "expected": _save(tmp_path, "cut", samples),
                "tolerance": _tolerance(cut, references),
            },
            {
                "check": "pyannote_crop",
                "path": f"{mountpoint}/recordings/flac_mono_16k.wav",
                "rate": 16000,
                "window": 5.0,
                "step": 2.5,
                "expected": whole,
            },
            {
                "check": "pyannote_windows",
                "path": f"{mountpoint}/windows/flac_mono_16k",
                "rate": 16000,
                "expected": whole,
            },
        ]
        problems = _run_checks(specs, tmp_path)
    assert len(problems) == 3
    assert all(problem is None for problem in problems.values()), problems


def _reference_wav(work: Path, name: str, samples: np.ndarray, rate: int) -> str:
    """A 16-bit WAV file of ``samples`` (ffmpeg's decode), written by hand."""
    path = work / f"{name}.wav"
    path.write_bytes(wav_header(rate, samples.shape[1], len(samples)) + samples.tobytes())
    return str(path)


def test_pyannote_inference_and_diarization_over_the_mount_equal_those_over_the_decode(
    shard_dir: str, references: dict[str, Reference], tmp_path: Path
) -> None:
    """Unmodified pyannote.audio (randomly initialised PyanNet, WeSpeaker ResNet34 and PLDA
    with fixed seeds: no weights can be downloaded) over mounted recordings, a window and a
    pyannote.database protocol whose paths point into the mount gives bit-identical
    outputs to the same code over WAV files of ffmpeg's full decode."""
    names = {"flac_mono_16k": "flac_mono_16k.flac", "mp3_cbr_mono_16k": "mp3_cbr_mono_16k.mp3"}
    wavs = {
        uri: _reference_wav(tmp_path, uri, references[name].samples, references[name].rate)
        for uri, name in names.items()
    }
    with mounted(shard_dir, str(tmp_path / "mnt"), "--window", "10", "--overlap", "2") as mnt:
        windows = Path(mnt) / "windows" / "flac_mono_16k"
        window = sorted(windows.iterdir(), key=lambda p: float(p.name.split("-")[0]))[1]
        start, end = (float(edge) for edge in window.name.removesuffix(".wav").split("-"))
        flac = references["flac_mono_16k.flac"]
        piece = flac.samples[round(start * flac.rate) : round(end * flac.rate)]
        (tmp_path / "uris.txt").write_text("\n".join(names) + "\n")
        database = tmp_path / "database.yml"
        database.write_text(
            "Databases:\n"
            f"  Mount: {mnt}/recordings/{{uri}}.wav\n"
            "Protocols:\n"
            "  Mount:\n"
            "    SpeakerDiarization:\n"
            "      Check:\n"
            "        test:\n"
            f"          uri: {tmp_path / 'uris.txt'}\n"
        )
        specs: list[dict[str, object]] = [
            *(
                {"check": "pyannote_inference", "path": f"{mnt}/recordings/{uri}.wav"}
                | {"reference": wav}
                for uri, wav in wavs.items()
            ),
            {
                "check": "pyannote_inference",
                "path": str(window),
                "reference": _reference_wav(tmp_path, "window", piece, flac.rate),
            },
            {
                "check": "pyannote_protocol",
                "path": str(database),
                "database": str(database),
                "protocol": "Mount.SpeakerDiarization.Check",
                "references": wavs,
            },
            {
                "check": "pyannote_diarization",
                "path": f"{mnt}/recordings/flac_mono_16k.wav",
                "reference": wavs["flac_mono_16k"],
            },
        ]
        problems = _run_checks(specs, tmp_path)
    assert len(problems) == len(specs)
    assert [p for p in problems.values() if p is not None] == [], problems
