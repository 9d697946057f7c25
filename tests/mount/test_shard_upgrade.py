"""``cutfs upgrade``: a format-1 shard directory rewritten as format 2 in place, its shards
untouched, serving every file as before; interrupted or refused upgrades change nothing
that a mount would notice."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from support.mounts import CUTFS, mounted, needs_fuse
from support.shards import format_1_copy

from cutfs.codec.catalogue import shard_upgrade
from cutfs.codec.catalogue.shard_format import MANIFEST_FILE, RECORDINGS_FILE
from cutfs.codec.catalogue.shard_set import ShardSet
from cutfs.codec.catalogue.shard_upgrade import upgrade_shards
from cutfs.codec.errors import SourceError


def _upgrade(directory: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CUTFS, "upgrade", str(directory)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _digests(directory: Path) -> dict[str, tuple[str, int]]:
    """Each shard file's SHA-256 and inode number."""
    found = {}
    for path in sorted(directory.glob("shard-*.arrow")):
        found[path.name] = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_ino)
    return found


def _tree_bytes(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` (a mount's cuts/ or recordings/) by relative path."""
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


@needs_fuse
def test_an_upgraded_directory_serves_every_file_as_the_packed_one(
    shard_dir: str, mount: str, tmp_path: Path
) -> None:
    old = tmp_path / "old"
    format_1_copy(shard_dir, old)
    shards_before = _digests(old)
    assert len(shards_before) > 1  # several shards, so blobs are located in each

    result = _upgrade(old)
    assert result.returncode == 0, result.stderr
    assert "from shard format 1" in result.stdout
    assert "the shards were not changed" in result.stdout

    assert _digests(old) == shards_before  # same bytes, same files (never rewritten)
    manifest = json.loads((old / MANIFEST_FILE).read_text())
    assert manifest["version"] == 2 and manifest["upgraded_from"] == 1
    for shard in manifest["shards"]:
        assert shard["bytes"] == (old / shard["file"]).stat().st_size
    assert not list(old.glob(".cutfs-upgrade-*"))
    with ShardSet(str(old)) as upgraded, ShardSet(shard_dir) as packed:
        assert upgraded.version == 2
        assert list(upgraded.cut_ids) == list(packed.cut_ids)
        assert [upgraded.blob_location(i) for i in range(len(packed.recording_ids))] == [
            packed.blob_location(i) for i in range(len(packed.recording_ids))
        ]

    with mounted(str(old), str(tmp_path / "mnt"), "--serving-processes", "1") as upgraded_mount:
        for top in ("cuts", "recordings"):
            served = _tree_bytes(Path(upgraded_mount) / top)
            assert served, top
            assert served == _tree_bytes(Path(mount) / top), top

    again = _upgrade(old)
    assert again.returncode == 0, again.stderr
    assert "already shard format 2: nothing to do" in again.stdout


def test_an_interrupted_upgrade_leaves_a_format_1_directory_that_mounts_and_finishes_later(
    shard_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = tmp_path / "old"
    format_1_copy(shard_dir, old)
    replace = os.replace

    def fail_at_the_manifest(source: str, target: str) -> None:
        if target.endswith(MANIFEST_FILE):
            raise OSError(28, "No space left on device")
        replace(source, target)

    monkeypatch.setattr(shard_upgrade.os, "replace", fail_at_the_manifest)
    with pytest.raises(SourceError, match="cannot write the new catalogue"):
        upgrade_shards(str(old))
    monkeypatch.undo()

    assert not list(old.glob(".cutfs-upgrade-*"))
    with ShardSet(str(old)) as half, ShardSet(shard_dir) as packed:
        assert half.version == 1  # every catalogue file is new, the manifest is not
        assert list(half.cut_ids) == list(packed.cut_ids)
        for index in range(half.num_cuts):
            cut = packed.cut(index)
            assert cut is not None
            recording = packed.cut_recording(index)
            assert (
                half.read_frames(recording, cut.start_frame, cut.end_frame)
                == packed.read_frames(recording, cut.start_frame, cut.end_frame)
            ).all()

    report = upgrade_shards(str(old))
    assert report.upgraded and report.from_version == 1
    with ShardSet(str(old)) as upgraded:
        assert upgraded.version == 2


def test_a_directory_whose_shard_is_damaged_is_refused_and_left_as_it_was(
    shard_dir: str, tmp_path: Path
) -> None:
    old = tmp_path / "old"
    format_1_copy(shard_dir, old)
    shard = sorted(old.glob("shard-*.arrow"))[-1]
    with open(shard, "r+b") as damaged:  # the Arrow footer, which locates the blobs, is gone
        damaged.truncate(shard.stat().st_size - 64)
    names_before = sorted(path.name for path in old.iterdir())
    catalogue_before = {
        name: (old / name).read_bytes() for name in (MANIFEST_FILE, RECORDINGS_FILE)
    }
    result = _upgrade(old)
    assert result.returncode == 3, result.stdout
    assert "cutfs upgrade: error:" in result.stderr and "nothing was changed" in result.stderr
    assert shard.name in result.stderr
    for name, data in catalogue_before.items():
        assert (old / name).read_bytes() == data
    assert sorted(path.name for path in old.iterdir()) == names_before


def test_object_storage_is_refused_with_what_to_do_instead() -> None:
    result = _upgrade("s3://bucket/prefix")
    assert result.returncode == 2
    assert "upgrade a local copy" in result.stderr
