"""Run the compatibility suite (tests/mount/test_compat.py) and write docs/compat.md.

Usage: .venv/bin/python scripts/compat.py [--with-pyannote] [--write]
       .venv/bin/python scripts/compat.py --build-pyannote

The report is printed; ``--write`` also writes it to docs/compat.md (a tracked file: a
run without it leaves the clone as it was).  ``--build-pyannote`` only builds (or
completes) ``.venv-pyannote``; ``scripts/setup.sh`` calls it when
``CUTFS_WITH_PYANNOTE=1`` (CI does).

Each client reads cuts from a real mount; the table records whether its test
passed and the version of the client that ran it.

torchaudio and pyannote.audio cannot be installed beside the CPU build of
PyTorch the project uses: PyPI's torchaudio for Linux x86_64 is a CUDA build
(``libtorchaudio.so`` needs ``libcudart.so.13`` and ``libc10_cuda.so``), and
pyannote.audio imports torchaudio at start.  ``--with-pyannote`` builds a
separate environment, ``.venv-pyannote``, where they run on the CPU (about
2 GB of downloads, a 5.4 GB directory; once), and runs
``tests/mount/test_compat_pyannote.py`` against it.  Without it their rows say why
they were not run.
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
    "test_pyannote_reads_the_uem_and_rttm": (
        "pyannote.database",
        "load_uem(mount/recordings.uem), load_rttm(mount/supervisions.rttm)",
        "pyannote.database",
    ),
    "test_nemo_manifest_lists_the_cut_files": (
        "NeMo manifest",
        "mount/nemo.jsonl: audio_filepath, duration, offset, text, checked line by line "
        "(the keys NeMo's ASRAudioText reads; NeMo itself is not installed here)",
        "python",
    ),
}
#: Tests of other modules that the table reports.
_OTHER_TESTS = [
    "tests/mount/test_views.py::test_pyannote_reads_the_uem_and_rttm",
    "tests/mount/test_views.py::test_nemo_manifest_lists_the_cut_files",
]

#: Clients of the separate environment (test name -> client, what it does, distribution).
PYANNOTE_CLIENTS = {
    "test_torchaudio_load": (
        "torchaudio",
        "torchaudio.load(path) of a cut of every test recording",
        "torchaudio",
    ),
    "test_pyannote_audio_reads_cuts_crops_and_windows": (
        "pyannote.audio",
        "Audio()(cut); Audio().crop(recordings/x.wav, chunk) over a SlidingWindow(5 s, step "
        "2.5 s) as Inference slides; Audio()(path) of every windows/x/ file",
        "pyannote.audio",
    ),
    "test_pyannote_inference_and_diarization_over_the_mount_equal_those_over_the_decode": (
        "pyannote.audio",
        "Inference (PyanNet) over recordings, a window and a pyannote.database protocol "
        "pointing into the mount, and a SpeakerDiarization pipeline (randomly initialised "
        "models, fixed seeds): bit-identical to the same over WAVs of ffmpeg's decode",
        "pyannote.audio",
    ),
}
PYANNOTE_VENV = ROOT / ".venv-pyannote"
#: The environment that runs them on the CPU (torch 2.11's CUDA build plus the CUDA
#: libraries it loads; no GPU is needed to load them).
PYANNOTE_PACKAGES = [
    "torch==2.11.0",
    "torchaudio==2.11.0",
    "torchcodec==0.11.0",
    "pyannote.audio==4.0.7",
    "cuda-toolkit[npp]==13.0.2",
]
#: Loaded at every start of that environment's interpreter (through a ``.pth`` file): the
#: CUDA libraries torchcodec's FFmpeg 5 core links to, which the dynamic linker would find
#: only with ``LD_LIBRARY_PATH`` (a library loaded already is found by its name).
CUDA_LIBRARIES_MODULE = '''"""Loads the CUDA libraries torchcodec links to (written by cutfs's
scripts/compat.py), so that no LD_LIBRARY_PATH is needed."""

import ctypes
import glob
import os
import sys

_LIBRARIES = os.path.join(sys.prefix, "lib", "python*", "site-packages", "nvidia", "cu13", "lib")
for _name in ("nppc", "nppicc", "nvrtc"):
    for _path in glob.glob(os.path.join(_LIBRARIES, f"lib{_name}.so.13")):
        ctypes.CDLL(_path, mode=ctypes.RTLD_GLOBAL)
'''
WHY_SEPARATE = (
    "PyPI's torchaudio for Linux x86_64 is a CUDA build that cannot load beside the CPU torch "
    "of this project; pyannote.audio imports torchaudio at start"
)


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
    if "--build-pyannote" in sys.argv[1:]:
        _build_pyannote_environment()
        return 0
    with_pyannote = "--with-pyannote" in sys.argv[1:]
    tests = ["tests/mount/test_compat.py", *_OTHER_TESTS]
    if with_pyannote:
        _build_pyannote_environment()
        tests.append("tests/mount/test_compat_pyannote.py")
    with tempfile.TemporaryDirectory() as work:
        report = Path(work) / "report.xml"
        command = [sys.executable, "-m", "pytest", "-q", *tests, f"--junitxml={report}"]
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
        "(`tests/mount/test_compat.py`, `tests/mount/test_compat_pyannote.py`). Reproduce: "
        "`./scripts/setup.sh && .venv/bin/python scripts/compat.py --with-pyannote`.",
        "",
        "| client | what it does on the mount | version | result |",
        "|---|---|---|---|",
    ]
    for test, (client, usage, source) in CLIENTS.items():
        lines.append(
            f"| {client} | {usage} | {version(source)} | {outcomes.get(test, 'not run')} |"
        )
    for test, (client, usage, source) in PYANNOTE_CLIENTS.items():
        if with_pyannote:
            found = f"{_pyannote_version(source)} (torch {_pyannote_version('torch')})"
            result = f"{outcomes.get(test, 'not run')}, in `.venv-pyannote` ({WHY_SEPARATE})"
            lines.append(f"| {client} | {usage} | {found} | {result} |")
        else:
            lines.append(
                f"| {client} | {usage} | - | not run: needs `scripts/compat.py --with-pyannote` "
                f"({WHY_SEPARATE}) |"
            )
    lines += [
        "",
        "**torchaudio and pyannote.audio on a CPU-only machine.** PyPI's torchaudio wheels for "
        "Linux x86_64 are CUDA builds: `libtorchaudio.so` needs `libcudart.so.13` and "
        "`libc10_cuda.so`, so torchaudio cannot load beside a CPU-only torch (the project's "
        "2.13.0+cpu), and pyannote.audio 4 imports torchaudio at start. They run on the CPU "
        "in a separate environment with the CUDA build of torch and the CUDA runtime libraries "
        "(no GPU needed to load them): `pip install " + " ".join(PYANNOTE_PACKAGES) + "` "
        "(about 2 GB of downloads, 5.4 GB installed); a `.pth` file of that environment loads "
        "the CUDA libraries torchcodec links to, so no `LD_LIBRARY_PATH` is needed. "
        "`scripts/compat.py --build-pyannote` builds it as `.venv-pyannote`, and CI builds it "
        "and runs `tests/mount/test_compat_pyannote.py` there on every change.",
        "",
        "Formats served in place, each written by its own library "
        "(`tests/mount/test_formats.py`, "
        "`tests/mount/test_in_place.py`): Lhotse manifests, Lhotse Shar (Lhotse "
        f"{version('lhotse')}), Kaldi data directories, HuggingFace `save_to_disk` and Parquet "
        f"(datasets {version('datasets')}), WebDataset tars (webdataset {version('webdataset')}), "
        "Arrow episode shards with a segment list (pyarrow).",
        "",
    ]
    if "--write" in sys.argv[1:]:
        (ROOT / "docs" / "compat.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return status


def _build_pyannote_environment() -> None:
    python = PYANNOTE_VENV / "bin" / "python"
    if not python.exists():
        print(f"building {PYANNOTE_VENV} (about 2 GB of downloads, once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(PYANNOTE_VENV)], check=True)
    missing = subprocess.run(
        [str(python), "-c", "import torchaudio, pyannote.audio"], capture_output=True, check=False
    )
    if missing.returncode != 0:
        subprocess.run([str(python), "-m", "pip", "install", "-q", *PYANNOTE_PACKAGES], check=True)
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (site / "cutfs_cuda_libraries.py").write_text(CUDA_LIBRARIES_MODULE)
    (site / "cutfs-cuda-libraries.pth").write_text("import cutfs_cuda_libraries\n")


def _pyannote_version(distribution: str) -> str:
    result = subprocess.run(
        [
            str(PYANNOTE_VENV / "bin" / "python"),
            "-c",
            f"import importlib.metadata as m; print(m.version({distribution!r}))",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
