"""Root runs cutfs from a directory a user can write: none of that user's code runs.

The attack (issue 37): an administrator runs ``cd /home/alice/project && cutfs mount
corpus /mnt/x --allow-other`` (or ``cutfs pack``), and alice has put Python files there
named like modules cutfs and its processes import (``multiprocessing/``, ``numpy.py``, a
folder named ``cutfs``...).  Each planted module, if it is ever imported, leaves a mark in
a directory only root can write and then fails the import.  The tests assert what matters
to the administrator: no mark (no code of alice's ran, in any process), and the command
did its job (the mount serves the right bytes, the pack is readable), with relative paths
still taken from the directory the command was run from.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.corpus import wav_header
from support.mounts import CUTFS, is_mounted, unmount
from support.references import Reference
from support.users import give_to_other_user, needs_root, public_directory

from cutfs.codec.trust.clean_start import clean_environment, safe_search_path

FLAC = "flac_mono_16k.flac"

#: Modules a planted copy of would run first: what ``-c``/``-m`` children import at start,
#: what cutfs imports, and the package itself.
PLANTED = (
    "multiprocessing",
    "cutfs",
    "numpy",
    "trio",
    "pyarrow",
    "av",
    "pyfuse3",
    "encodings",
    "sitecustomize",
    "usercustomize",
)

#: The ``cutfs`` command as administrators run it: the installed entry point.
INSTALLED = shutil.which("cutfs", path=os.path.dirname(sys.executable))


@pytest.fixture
def project(corpus: dict[str, str]) -> Iterator[tuple[Path, Path]]:
    """A user's project directory (its owner is the other user) holding a corpus of two
    FLAC files and planted modules, and a root-only directory where marks would appear."""
    with public_directory() as public:
        marks = public / "marks"
        marks.mkdir(mode=0o700)
        project = public / "project"
        (project / "corpus").mkdir(parents=True)
        shutil.copy(corpus[FLAC], project / "corpus" / "a.flac")
        shutil.copy(corpus[FLAC], project / "corpus" / "b.flac")  # two: pack spawns indexers
        for name in PLANTED:
            code = (
                f"open({str(marks / name)!r}, 'w').close()\n"
                f"raise ImportError('planted {name} ran')\n"
            )
            if name in ("sitecustomize", "usercustomize", "numpy", "trio", "av"):
                (project / f"{name}.py").write_text(code)
            else:
                (project / name).mkdir()
                (project / name / "__init__.py").write_text(code)
        give_to_other_user(project)
        project.chmod(0o777)
        yield project, marks


def _marks(marks: Path) -> list[str]:
    return sorted(os.listdir(marks))


def _installed() -> str:
    """The entry point (``python -m`` puts the working directory first on the import path
    before any of cutfs runs: it is for developers, never for a user's directory)."""
    if INSTALLED is None:
        pytest.skip("the cutfs command is not installed beside this interpreter")
    return INSTALLED


pytestmark = [needs_root]


@pytest.mark.mount
@pytest.mark.parametrize("foreground", [False, True], ids=["background", "foreground"])
def test_root_mounting_from_a_users_directory_runs_none_of_its_code(
    project: tuple[Path, Path], references: dict[str, Reference], foreground: bool
) -> None:
    if not os.path.exists("/dev/fuse"):
        pytest.skip("needs /dev/fuse")
    directory, marks = project
    mountpoint = directory.parent / "mnt"
    mountpoint.mkdir()
    arguments = [_installed(), "mount", "corpus", "../mnt", "--allow-other"]
    arguments += ["--serving-processes", "2"]
    arguments += ["--no-decode-in-turn", "--workers", "1"] if foreground else []
    daemon: subprocess.Popen[bytes] | None = None
    try:
        if foreground:
            daemon = subprocess.Popen(
                [*arguments, "--foreground"],
                cwd=directory,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            _wait_for_mount(mountpoint, daemon)
        else:
            result = subprocess.run(
                arguments, cwd=directory, capture_output=True, text=True, check=False, timeout=120
            )
            assert result.returncode == 0, result.stderr
        reference = references[FLAC]
        expected = wav_header(reference.rate, 1, len(reference.samples))
        expected += reference.samples[:, :1].astype("<i2").tobytes()
        assert (mountpoint / "cuts" / "a.wav").read_bytes() == expected
    finally:
        unmount(str(mountpoint))
        if daemon is not None:
            daemon.communicate(timeout=30)
    assert _marks(marks) == []


def _wait_for_mount(mountpoint: Path, daemon: subprocess.Popen[bytes]) -> None:
    """Until the foreground daemon has mounted (the mount appears) or has ended."""
    while not is_mounted(str(mountpoint)):
        try:
            daemon.wait(0.1)
        except subprocess.TimeoutExpired:
            continue
        assert daemon.stderr is not None
        pytest.fail(f"the daemon ended: {daemon.stderr.read().decode(errors='replace')}")


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["local", "slurm"])
def test_root_packing_from_a_users_directory_runs_none_of_its_code(
    project: tuple[Path, Path], engine: str
) -> None:
    directory, marks = project
    arguments = [_installed(), "pack", "corpus", "-o", "../packed", "-j", "2", "--engine", engine]
    if engine == "slurm":
        pytest.importorskip("submitit")
        arguments += ["--slurm-executor", "local", "--slurm-folder", "../slurm"]
    result = subprocess.run(
        arguments, cwd=directory, capture_output=True, text=True, check=False, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert (directory.parent / "packed" / "manifest.json").is_file()
    assert _marks(marks) == []


def test_a_daemon_that_dies_before_it_can_log_says_why(tmp_path: Path) -> None:
    """A background start whose daemon fails before its log is set up (here: a log file in
    a folder that does not exist) reports what the daemon printed, not only its status."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    source = tmp_path / "audio"
    source.mkdir()
    log_file = tmp_path / "no-such-folder" / "cutfs.log"
    result = subprocess.run(
        [*CUTFS, "mount", "--log-file", str(log_file), str(source), str(mountpoint)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode != 0
    assert str(log_file) in result.stderr
    assert not is_mounted(str(mountpoint))


def test_the_environment_keeps_what_cutfs_reads_and_drops_the_rest(tmp_path: Path) -> None:
    writable = tmp_path / "bin"
    writable.mkdir(mode=0o777)
    writable.chmod(0o777)
    environment = clean_environment(
        {
            "PATH": f".:{writable}:relative:/usr/bin:/bin",
            "PYTHONPATH": "/tmp/x",
            "LD_PRELOAD": "/tmp/x.so",
            "AWS_ACCESS_KEY_ID": "key",
            "LC_ALL": "C.UTF-8",
            "NOTIFY_SOCKET": "/run/systemd/notify",
            "ADMIN_SECRET": "hunter2",
        },
        caller="/home/alice/project",
    )
    assert environment == {
        "PATH": "/usr/bin:/bin",
        "AWS_ACCESS_KEY_ID": "key",
        "LC_ALL": "C.UTF-8",
        "NOTIFY_SOCKET": "/run/systemd/notify",
        "CUTFS_CALLER_DIRECTORY": "/home/alice/project",
    }
    system = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert safe_search_path(f"{writable}:.") == system
