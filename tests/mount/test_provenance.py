"""Provenance: a mounted WAV file says, in extended attributes, where its audio comes from,
read with real clients (getfattr, Python's os.getxattr, ``cutfs which``), and reading them
never decodes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.mounts import CUTFS, mounted, needs_fuse

pytestmark = [pytest.mark.mount, needs_fuse]


def _manifest(path: str) -> dict[str, dict[str, object]]:
    with open(path, encoding="utf-8") as lines:
        return {entry["id"]: entry for entry in map(json.loads, lines)}


def _attributes(path: Path) -> dict[str, str]:
    """The file's ``user.cutfs.*`` attributes through getfattr if installed, else Python."""
    if shutil.which("getfattr") is not None:
        printed = subprocess.run(
            ["getfattr", "--absolute-names", "-d", "-m", "^user\\.cutfs\\.", str(path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        pairs = (line.split("=", 1) for line in printed.splitlines() if "=" in line)
        return {name.removeprefix("user.cutfs."): value.strip('"') for name, value in pairs}
    return {
        name.removeprefix("user.cutfs."): os.getxattr(path, name).decode()
        for name in os.listxattr(path)
    }


def _decodes(mountpoint: Path) -> tuple[int, int, int]:
    """What the mount decoded and read of audio so far (decodes, frames, stored bytes)."""
    counters = json.loads((mountpoint / ".cutfs" / "stats").read_text())["counters"]
    names = ("decodes", "frames_decoded", "storage_bytes_read")
    return tuple(int(counters.get(name, 0)) for name in names)  # type: ignore[return-value]


def test_a_packed_cut_names_its_recording_source_shard_and_samples(
    shard_dir: str, lhotse_manifests: list[str], tmp_path: Path
) -> None:
    recordings, cuts = _manifest(lhotse_manifests[0]), _manifest(lhotse_manifests[1])
    if "start" not in next(iter(cuts.values())):
        recordings, cuts = cuts, recordings
    mountpoint = tmp_path / "mnt"
    with mounted(shard_dir, str(mountpoint), "--serving-processes", "1") as mounted_at:
        root = Path(mounted_at)
        before = _decodes(root)
        for cut_id in ("flac_mono_16k/end", "mp3_cbr_mono_16k/start"):
            expected = cuts[cut_id]
            recording = recordings[str(expected["recording_id"])]
            rate = int(recording["sampling_rate"])  # type: ignore[call-overload]
            found = _attributes(root / "cuts" / f"{cut_id}.wav")
            assert found["cut"] == cut_id and found["recording"] == expected["recording_id"]
            source = recording["sources"][0]["source"]  # type: ignore[index]
            assert found["source"] == source  # what pack read it from
            assert found["shard"].startswith("shard-") and found["shard"].endswith(".arrow")
            assert found["codec"].startswith("flac" if cut_id.startswith("flac") else "mp3")
            assert int(found["start_sample"]) == round(float(expected["start"]) * rate)
            assert int(found["num_samples"]) == round(float(expected["duration"]) * rate)
            assert found["sample_rate"] == str(rate) and found["channels"] == "0"
        assert _decodes(root) == before, "reading attributes decoded audio"
        assert os.getxattr(root / "cuts" / "flac_mono_16k" / "end.wav", "user.cutfs.codec") == (
            b"flac"
        )
        with pytest.raises(OSError) as missing:
            os.getxattr(root / "cuts" / "flac_mono_16k" / "end.wav", "user.other")
        assert missing.value.errno == 61  # ENODATA
        assert os.listxattr(root / "wav.scp") == []  # text files have none
        printed = subprocess.run(
            [*CUTFS, "which", str(root / "cuts" / "flac_mono_16k" / "end.wav")],
            capture_output=True,
            text=True,
            check=False,
        )
    assert printed.returncode == 0, printed.stderr
    assert "recording     flac_mono_16k" in printed.stdout
    assert "codec         flac" in printed.stdout


def test_a_cut_served_in_place_names_its_file_relative_to_the_source(
    corpus: dict[str, str], tmp_path: Path
) -> None:
    source = tmp_path / "audio"
    (source / "talks").mkdir(parents=True)
    shutil.copy(corpus["flac_mono_16k.flac"], source / "talks" / "a.flac")
    mountpoint = tmp_path / "mnt"
    options = ("--serving-processes", "1", "--cache-dir", str(tmp_path / "cache"))
    with mounted(str(source), str(mountpoint), *options) as mounted_at:
        cut = Path(mounted_at) / "cuts" / "talks" / "a.wav"
        frames = (cut.stat().st_size - 44) // 2  # the size needs the recording indexed
        before = _decodes(Path(mounted_at))
        found = _attributes(cut)
        assert _decodes(Path(mounted_at)) == before
    assert found["recording"] == found["cut"] == "talks/a"
    assert found["source"] == "talks/a.flac"  # no path of the machine above the source
    assert found["codec"] == "flac" and found["start_sample"] == "0"
    assert int(found["num_samples"]) == frames and found["sample_rate"] == "16000"
    printed = subprocess.run(
        [*CUTFS, "which", str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert printed.returncode != 0 and "no provenance" in printed.stderr
