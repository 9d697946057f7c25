"""The Python API (``import cutfs``): the README's example, and what it promises."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Reference, needs_fuse

import cutfs
from cutfs.codec.cut import seconds_to_frames
from cutfs.vfs.mounted import MountFailedError

REPOSITORY = Path(__file__).resolve().parent.parent


@needs_fuse
@pytest.mark.mount
def test_the_readme_example_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    readme = (REPOSITORY / "README.md").read_text()
    code = re.search(r"<!-- api-example -->\n```python\n(.*?)```", readme, re.DOTALL)
    assert code is not None
    result = subprocess.run(
        [sys.executable, "-c", code[1]], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    promised = [line.split("# ", 1)[1] for line in code[1].splitlines() if "print(" in line]
    assert result.stdout.splitlines() == promised
    assert not os.path.ismount(tmp_path / "shards")


def test_open_reads_a_source_in_place_exactly(
    tmp_path: Path, corpus: dict[str, str], references: dict[str, Reference]
) -> None:
    audio = tmp_path / "audio"
    audio.mkdir()
    os.symlink(corpus["flac_mono_16k.flac"], audio / "a.flac")
    reference = references["flac_mono_16k.flac"]
    with cutfs.open(audio, cache_dir=str(tmp_path / "cache")) as corpus_reader:
        assert list(corpus_reader.cut_ids) == ["a"]
        samples, rate = corpus_reader.read_recording("a", 1.25, 3.5)
        assert rate == 16000
        first, end = seconds_to_frames(1.25, rate), seconds_to_frames(3.5, rate)
        assert (samples == reference.samples[first:end]).all()
        whole, _ = corpus_reader.read_cut("a")
        assert (whole == reference.samples).all()
        with pytest.raises(cutfs.codec.errors.CutfsError, match="no such cut"):
            corpus_reader.read_cut("missing")


@needs_fuse
@pytest.mark.mount
def test_mounted_always_unmounts_and_reports_failures(shard_dir: str, tmp_path: Path) -> None:
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    with pytest.raises(RuntimeError, match="inside"), cutfs.mounted(shard_dir, mountpoint) as root:
        assert os.path.ismount(root) and (root / "cuts").is_dir()
        raise RuntimeError("inside")
    assert not os.path.ismount(mountpoint)
    missing = tmp_path / "nothing"
    with pytest.raises(MountFailedError, match=r"(?i)no such file"), cutfs.mounted(missing):
        pass
