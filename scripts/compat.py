"""Run the compatibility suite (tests/test_compat.py) and write docs/compat.md.

Usage: .venv/bin/python scripts/compat.py

Each client reads cuts from a real mount; the table records whether its test
passed and the version of the client that ran it.  Clients that cannot be
installed beside the CPU build of PyTorch are listed with the reason.
"""

from __future__ import annotations

import datetime
import platform
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parent.parent

#: test name -> (client, what it does, how its version is found)
CLIENTS = {
    "test_python_wave": ("Python wave", "wave.open, readframes", "python"),
    "test_soundfile": ("soundfile", "soundfile.read(path, dtype='int16')", "soundfile"),
    "test_torchcodec": ("torchcodec", "AudioDecoder(path).get_all_samples()", "torchcodec"),
    "test_lhotse_reads_the_mount_manifest": (
        "Lhotse",
        "CutSet.from_file(mount/cuts.jsonl.gz), cut.load_audio(), DynamicBucketingSampler",
        "lhotse",
    ),
    "test_datasets_audiofolder": (
        "HuggingFace datasets",
        "load_dataset('audiofolder', data_dir=mount/cuts) with text and speaker columns",
        "datasets",
    ),
    "test_sox_ffprobe_ffmpeg": (
        "sox, ffprobe, ffmpeg",
        "soxi -s, sox to raw, ffprobe, ffmpeg",
        "sox",
    ),
    "test_lhotse_manifest_is_valid_gzip_jsonl": ("gzip + json", "cuts.jsonl.gz parses", "python"),
}

NOT_RUNNABLE = [
    (
        "torchaudio",
        "torchaudio.load",
        "its newest release (2.11.1) is built for torch 2.11 and fails to load its library with "
        "the CPU build of torch this machine provides (2.13.0); the only torch 2.11 wheels on PyPI "
        "are CUDA builds, which this project does not install",
    ),
    (
        "pyannote.audio",
        "Audio()(path), Audio().crop(path, Segment)",
        "imports torchaudio at start (see above); pyannote.audio 4.0.7 installs but cannot import",
    ),
]


def version(source: str) -> str:
    if source == "python":
        return platform.python_version()
    if source == "sox":
        sox = subprocess.run(["sox", "--version"], capture_output=True, text=True, check=False)
        ffmpeg = subprocess.run(["ffmpeg", "-version"], capture_output=True, text=True, check=False)
        return f"{sox.stdout.split()[-1]}; ffmpeg {ffmpeg.stdout.split()[2]}"
    try:
        return metadata.version(source)
    except metadata.PackageNotFoundError:
        return "not installed"


def main() -> int:
    with tempfile.TemporaryDirectory() as work:
        report = Path(work) / "report.xml"
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "tests/test_compat.py",
            f"--junitxml={report}",
        ]
        status = subprocess.run(command, cwd=ROOT, check=False).returncode
        outcomes = {}
        for case in ElementTree.parse(report).getroot().iter("testcase"):
            failed = case.find("failure") is not None or case.find("error") is not None
            skipped = case.find("skipped") is not None
            outcomes[case.get("name", "")] = (
                "skipped" if skipped else "FAILED" if failed else "passes"
            )
    when = f"{datetime.date.today()}, Python {platform.python_version()}"
    lines = [
        "# Compatibility with users' tools",
        "",
        f"Written by `scripts/compat.py` ({when}, torch {version('torch')}, "
        f"{platform.machine()}). Each client reads cuts from a real mount with its ordinary API; "
        "samples are compared with ffmpeg's full decode of the originals "
        "(`tests/test_compat.py`). Reproduce: `./scripts/setup.sh && .venv/bin/python "
        "scripts/compat.py`.",
        "",
        "| client | what it does on the mount | version | result |",
        "|---|---|---|---|",
    ]
    for test, (client, usage, source) in CLIENTS.items():
        lines.append(
            f"| {client} | {usage} | {version(source)} | {outcomes.get(test, 'not run')} |"
        )
    for client, usage, reason in NOT_RUNNABLE:
        lines.append(f"| {client} | {usage} | - | not runnable here: {reason} |")
    lines += [
        "",
        "Formats served in place, each written by its own library (`tests/test_formats.py`, "
        "`tests/test_in_place.py`): Lhotse manifests, Lhotse Shar (Lhotse "
        f"{version('lhotse')}), Kaldi data directories, HuggingFace `save_to_disk` and Parquet "
        f"(datasets {version('datasets')}), WebDataset tars (webdataset {version('webdataset')}), "
        "Arrow episode shards with a segment list (pyarrow).",
        "",
    ]
    (ROOT / "docs" / "compat.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return status


if __name__ == "__main__":
    sys.exit(main())
