"""Each format served in place, written by that format's own library, read through a real mount.

Lhotse writes the Shar directory, ``datasets`` the Arrow and Parquet shards,
``webdataset`` the tar, pyarrow the episode shards; every cut is compared with
ffmpeg's full decode of the bytes the format stored.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from support.corpus import ffmpeg_decode
from support.mounts import CUTFS, mounted, needs_fuse
from support.references import Reference

from cutfs.codec.catalogue.path_escape import escape_id

pytestmark = [pytest.mark.mount, needs_fuse]

CHOSEN = ("flac_mono_16k.flac", "mp3_cbr_mono_16k.mp3", "opus_stereo_48k.opus")


def read_cut(mountpoint: str, cut_id: str) -> tuple[np.ndarray, int, int]:
    """(samples as (frames, channels), rate, channels) of a cut file."""
    with open(os.path.join(mountpoint, "cuts", escape_id(cut_id)), "rb") as cut_file:
        data = cut_file.read()
    channels = int.from_bytes(data[22:24], "little")
    rate = int.from_bytes(data[24:28], "little")
    return np.frombuffer(data[44:], dtype="<i2").reshape(-1, channels), rate, channels


def assert_close(actual: np.ndarray, expected: np.ndarray, lossless: bool) -> None:
    assert actual.shape == expected.shape
    difference = np.abs(actual.astype(np.int32) - expected.astype(np.int32))
    assert int(difference.max(initial=0)) <= (0 if lossless else 1)


def test_webdataset_tar(
    tmp_path: Path, corpus: dict[str, str], references: dict[str, Reference]
) -> None:
    import webdataset  # noqa: PLC0415 - from the compat extra

    tar_path = tmp_path / "shard-000000.tar"
    with webdataset.TarWriter(str(tar_path)) as writer:
        for name in CHOSEN:
            key, extension = name.rsplit(".", 1)
            with open(corpus[name], "rb") as audio:
                sample = {"__key__": key, extension: audio.read()}
            writer.write({**sample, "json": {"text": f"text of {key}", "speaker": "s7"}})
    with mounted(str(tar_path), str(tmp_path / "mnt"), "--cache-dir", str(tmp_path / "c")) as mnt:
        for name in CHOSEN:
            reference = references[name]
            samples, rate, _ = read_cut(mnt, name.rsplit(".", 1)[0])
            assert rate == reference.rate
            assert_close(samples, reference.samples, reference.lossless)
        with open(os.path.join(mnt, "text")) as text:
            assert "flac_mono_16k text of flac_mono_16k\n" in text.read()


def test_lhotse_shar(tmp_path: Path, corpus: dict[str, str]) -> None:
    from lhotse import CutSet, Recording  # noqa: PLC0415 - from the compat extra

    cuts = CutSet.from_cuts(
        Recording.from_file(corpus[name], recording_id=name.rsplit(".", 1)[0])
        .to_cut()
        .truncate(offset=2.0 + number, duration=3.5)
        .with_id(f"cut-{number}")
        for number, name in enumerate(CHOSEN)
    )
    shar = tmp_path / "shar"
    shar.mkdir()
    cuts.to_shar(str(shar), fields={"recording": "flac"}, shard_size=2)
    members: dict[str, str] = {}
    for tar_path in sorted(shar.glob("recording.*.tar")):
        with tarfile.open(tar_path) as archive:
            for member in archive.getmembers():
                if member.name.endswith(".flac"):
                    archive.extract(member, tmp_path / "members", filter="data")
                    members[member.name.removesuffix(".flac")] = str(
                        tmp_path / "members" / member.name
                    )
    assert len(members) == 3
    with mounted(str(shar), str(tmp_path / "mnt"), "--cache-dir", str(tmp_path / "c")) as mnt:
        for cut_id, member in members.items():
            expected, rate, channels = ffmpeg_decode(member)
            samples, served_rate, served_channels = read_cut(mnt, cut_id)
            assert (served_rate, served_channels) == (rate, channels)
            assert_close(samples, expected, lossless=True)
        stats = json.loads(Path(mnt, ".cutfs", "stats").read_text())
        assert stats["shards"]["kind"] == "Lhotse Shar"
        assert stats["counters"].get("recordings_indexed", 0) == 0  # sizes were declared


def test_huggingface_save_to_disk_and_parquet(
    tmp_path: Path, corpus: dict[str, str], references: dict[str, Reference]
) -> None:
    from datasets import Audio, Dataset  # noqa: PLC0415 - from the compat extra

    dataset = Dataset.from_dict(
        {
            "audio": [corpus[name] for name in CHOSEN],
            "text": [f"words {number}" for number in range(len(CHOSEN))],
            "speaker": ["a", "b", "c"],
        }
    ).cast_column("audio", Audio(decode=False))
    dataset.save_to_disk(str(tmp_path / "saved"))  # embeds the audio bytes
    Dataset.load_from_disk(str(tmp_path / "saved")).to_parquet(str(tmp_path / "pq" / "0.parquet"))
    for source in ("saved", "pq"):
        mountpoint = str(tmp_path / f"mnt-{source}")
        with mounted(str(tmp_path / source), mountpoint, "--cache-dir", str(tmp_path / "c")) as mnt:
            for name in CHOSEN:
                reference = references[name]
                samples, rate, _ = read_cut(mnt, name.rsplit(".", 1)[0])
                assert rate == reference.rate
                assert_close(samples, reference.samples, reference.lossless)
            rows = [
                json.loads(line)
                for line in Path(mnt, "cuts", "metadata.jsonl").read_text().splitlines()
            ]
            assert [row["text"] for row in rows] == ["words 0", "words 1", "words 2"]


def test_arrow_episode_shards_with_a_segment_list(
    tmp_path: Path, corpus: dict[str, str], references: dict[str, Reference]
) -> None:
    episodes = tmp_path / "episodes"
    episodes.mkdir()
    ids = [name.rsplit(".", 1)[0] for name in CHOSEN]
    blobs = [Path(corpus[name]).read_bytes() for name in CHOSEN]
    table = pa.table({"id": ids, "audio": pa.array(blobs, pa.large_binary())})
    path = str(episodes / "episodes-000.arrow")
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    rows = [(f"{rec}-seg{n}", rec, 1.5 + 9 * n, 6.25 + 9 * n) for rec in ids for n in range(3)]
    lines = ["id\trecording\tstart\tend", *("\t".join(map(str, row)) for row in rows)]
    (episodes / "segments.tsv").write_text("\n".join(lines) + "\n")
    with mounted(str(episodes), str(tmp_path / "mnt"), "--cache-dir", str(tmp_path / "c")) as mnt:
        for cut_id, rec, start, end in rows:
            reference = references[next(n for n in CHOSEN if n.startswith(rec))]
            first, last = round(start * reference.rate), round(end * reference.rate)
            samples, _, _ = read_cut(mnt, cut_id)
            assert_close(samples, reference.samples[first:last], reference.lossless)


def test_arrow_rows_without_bytes_name_their_file(
    tmp_path: Path, corpus: dict[str, str], references: dict[str, Reference]
) -> None:
    audio_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    audio = pa.array([{"bytes": None, "path": corpus["mp3_cbr_mono_16k.mp3"]}], audio_type)
    table = pa.table({"id": ["external"], "audio": audio})
    path = str(dataset / "data-00000-of-00001.arrow")
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    allow = ("--allow-root", os.path.dirname(corpus["mp3_cbr_mono_16k.mp3"]))
    with mounted(
        str(dataset), str(tmp_path / "mnt"), "--cache-dir", str(tmp_path / "c"), *allow
    ) as mnt:
        samples, _, _ = read_cut(mnt, "external")
        assert_close(samples, references["mp3_cbr_mono_16k.mp3"].samples, lossless=False)
    broken = pa.array([{"bytes": None, "path": "nowhere.flac"}], audio_type)
    table = pa.table({"id": ["missing"], "audio": broken})
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    result = subprocess.run(
        [*CUTFS, "mount", "--cache-dir", str(tmp_path / "c"), str(dataset), str(tmp_path / "mnt")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 3
    assert "'nowhere.flac' is not a file" in result.stderr
