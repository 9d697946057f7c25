"""The Python API (``import cutfs``): the README's example, and what it promises."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from support.references import Reference, cut_plan, expected_cut
from support.servers import S3Server

import cutfs
from cutfs.codec.audio.cut import seconds_to_frames

REPOSITORY = Path(__file__).resolve().parents[2]


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


def test_open_with_a_relative_cache_extracts_parquet_rows_it_can_read_back(
    tmp_path: Path,
    corpus: dict[str, str],
    references: dict[str, Reference],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Parquet rows are extracted into the cache and then read by their path: with a
    relative ``cache_dir`` that path was taken from ``/`` (no such file)."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    dataset = tmp_path / "dataset"
    dataset.mkdir()
    audio = Path(corpus["flac_mono_16k.flac"]).read_bytes()
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    cells = pa.array([{"bytes": audio, "path": "a.flac"}], kind)
    pq.write_table(pa.table({"id": ["a"], "audio": cells}), dataset / "0.parquet")
    monkeypatch.chdir(tmp_path)
    with cutfs.open("dataset", cache_dir="cache") as corpus_reader:
        samples, rate = corpus_reader.read_cut("a")
    assert rate == 16000
    assert (samples == references["flac_mono_16k.flac"].samples).all()


def test_a_dataloader_reads_every_cut_exactly_in_its_workers(
    shard_dir: str, references: dict[str, Reference]
) -> None:
    torch = pytest.importorskip("torch")
    dataset = cutfs.CutDataset(shard_dir, dtype="int16")
    plan = {str(cut["id"]): cut for cut in cut_plan(references)}
    assert len(dataset) == len(plan)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=2, multiprocessing_context="spawn"
    )
    seen = set()
    for samples, rate, cut_id in loader:
        expected, expected_rate = expected_cut(plan[cut_id], references)
        assert rate == expected_rate
        lossless = any(tag in str(plan[cut_id]["recording"]) for tag in ("flac", "wav"))
        difference = np.abs(samples.numpy().astype(np.int32) - expected.astype(np.int32))
        assert difference.max(initial=0) <= (0 if lossless else 1), cut_id
        seen.add(cut_id)
    assert seen == set(plan)
    floats = cutfs.CutDataset(shard_dir)
    samples, _, cut_id = floats[0]
    exact, _, _ = dataset[0]
    assert samples.dtype == np.float32 and samples.shape == exact.T.shape
    assert np.array_equal(samples, exact.T.astype(np.float32) / 32768)


def test_open_reads_shards_in_object_storage(
    shard_dir: str, s3_server: S3Server, tmp_path: Path
) -> None:
    s3_server.upload(shard_dir, "api", "shards")
    uri = s3_server.uri("api", "shards")
    with cutfs.open(shard_dir) as local, cutfs.open(uri, str(tmp_path / "cache")) as remote:
        assert list(remote.cut_ids) == list(local.cut_ids)
        for cut_id in local.cut_ids:
            remote_samples, remote_rate = remote.read_cut(cut_id)
            local_samples, local_rate = local.read_cut(cut_id)
            assert remote_rate == local_rate
            assert np.array_equal(remote_samples, local_samples), cut_id
