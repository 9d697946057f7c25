"""The Python API over real mounts: the README's example, and ``cutfs.mounted``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.mounts import needs_fuse

import cutfs
from cutfs.vfs.cli.mounted import MountFailedError

REPOSITORY = Path(__file__).resolve().parents[2]


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
