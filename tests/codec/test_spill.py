"""Tables larger than memory: the external sort, single-batch spills, the catalogue writer,
and a pack in a tiny memory budget, each against an independent reference."""

from __future__ import annotations

import filecmp
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cutfs.codec.catalogue.shard_format import CUTS_FILE, CUTS_SCHEMA, write_table
from cutfs.codec.catalogue.shard_writer import write_cut_catalogue
from cutfs.codec.errors import SourceError
from cutfs.codec.sources.catalogue import Refusals
from cutfs.codec.sources.kaldi_dir import read_kaldi_dir
from cutfs.codec.spill.catalogue_writer import CatalogueWriter
from cutfs.codec.spill.column_spill import ColumnSpill
from cutfs.codec.spill.external_sort import MAX_FAN_IN, ExternalSort
from cutfs.codec.spill.sorted_lookup import SortedLookup

CUTFS = [sys.executable, "-m", "cutfs.vfs.cli"]
CATALOGUE_FILES = (
    "cuts.arrow",
    "cuts.entries.arrow",
    "cuts.directories.arrow",
    "cuts.paths.arrow",
    "kaldi-order.arrow",
)


def _cuts(ids: list[str]) -> pa.Table:
    count = len(ids)
    numbers = np.arange(count, dtype=np.int64)
    return pa.table(
        [
            pa.array(ids, pa.large_string()),
            pa.array(numbers % 3, pa.int32()),
            pa.array(numbers * 7),
            pa.array(numbers % 100 + 1),
            pa.array([[0] if n % 4 else [1, 0] for n in range(count)], pa.list_(pa.int16())),
            pa.array([json.dumps({"text": f"w{n}"}) for n in range(count)], pa.large_string()),
        ],
        schema=CUTS_SCHEMA,
    )


def _by_id_bytes(table: pa.Table) -> pa.Table:
    """The rows in the order of their ids' bytes, sorted by Python (the reference)."""
    ids = table.column("cut_id").to_pylist()
    order = sorted(range(len(ids)), key=lambda row: ids[row].encode("utf-8"))
    return table.take(pa.array(order))


def test_a_spilled_table_is_the_file_written_whole(tmp_path: Path) -> None:
    table = _cuts([f"spk{n % 5}/utt{n}" + "é" * (n % 3) for n in range(5000)])
    write_table(str(tmp_path / "whole.arrow"), table)
    with ColumnSpill(CUTS_SCHEMA, str(tmp_path)) as spill:
        for start in range(0, table.num_rows, 777):  # slices: arrays with offsets
            spill.append(table.slice(start, 777))
        spill.finish(str(tmp_path / "spilled.arrow"))
    assert filecmp.cmp(tmp_path / "whole.arrow", tmp_path / "spilled.arrow", shallow=False)
    assert sorted(os.listdir(tmp_path)) == ["spilled.arrow", "whole.arrow"]  # spills removed
    with ColumnSpill(CUTS_SCHEMA, str(tmp_path)) as spill:
        spill.finish(str(tmp_path / "empty.arrow"))
    write_table(str(tmp_path / "empty-whole.arrow"), CUTS_SCHEMA.empty_table())
    assert filecmp.cmp(tmp_path / "empty.arrow", tmp_path / "empty-whole.arrow", shallow=False)
    nulls = pa.schema([("n", pa.int64())])
    with ColumnSpill(nulls, str(tmp_path)) as spill, pytest.raises(ValueError, match="nulls"):
        spill.append(pa.record_batch([pa.array([1, None])], schema=nulls))


def test_an_external_sort_in_many_runs_is_stable_and_complete(tmp_path: Path) -> None:
    rng = random.Random(7)
    keys = [
        rng.choice(["", "a", "ab", "b", "é", "zz"]) + str(rng.randrange(300)) for _ in range(40_000)
    ]
    schema = pa.schema([("key", pa.string()), ("row", pa.int64())])
    with ExternalSort(schema, "key", str(tmp_path), 1) as ordered:
        for start in range(0, len(keys), 300):
            rows = pa.array(range(start, min(start + 300, len(keys))), pa.int64())
            ordered.add(pa.record_batch([pa.array(keys[start : start + 300]), rows], schema=schema))
        assert ordered.runs_written > MAX_FAN_IN  # merged in two passes
        result = pa.Table.from_batches(list(ordered.sorted_batches()), schema)
    expected = sorted(range(len(keys)), key=lambda row: (keys[row].encode(), row))
    assert result.column("row").to_pylist() == expected
    assert not [name for name in os.listdir(tmp_path) if name.startswith("run-")]


def test_a_sorted_lookup_in_many_runs_answers_as_a_dict_would(tmp_path: Path) -> None:
    rng = random.Random(11)
    rows = [(f"u{rng.randrange(5000):05d}", f"v{n}") for n in range(30_000)]
    reference = dict(rows)  # the last row of a key wins
    asked = sorted({f"u{rng.randrange(6000):05d}" for _ in range(4000)})
    with SortedLookup(str(tmp_path), 1) as lookup:
        for start in range(0, len(rows), 700):
            part = rows[start : start + 700]
            lookup.add([key for key, _ in part], [value for _, value in part])
        found: list[str | None] = []
        for start in range(0, len(asked), 97):
            found += lookup.values_of(pa.array(asked[start : start + 97])).to_pylist()
        assert [name for name in os.listdir(tmp_path) if name.startswith("run-")]  # spilled
        with pytest.raises(ValueError, match="out of order"):
            lookup.values_of(pa.array(["u00000"]))
    assert found == [reference.get(key) for key in asked]
    assert any(value is None for value in found) and any(found)


def test_a_kaldi_directory_joins_its_metadata_in_a_tiny_memory_budget(tmp_path: Path) -> None:
    rng = random.Random(5)
    utterances = [f"spk{n % 37}-utt{n:06d}" for n in range(20_000)]
    rng.shuffle(utterances)
    (tmp_path / "wav.scp").write_text("".join(f"r{n} /audio/r{n}.flac\n" for n in range(3)))
    (tmp_path / "segments").write_text(
        "".join(f"{u} r{n % 3} {n % 50}.5 {n % 50 + 2}\n" for n, u in enumerate(utterances))
    )
    speakers = {u: u.split("-")[0] for u in utterances if rng.random() < 0.9}
    (tmp_path / "utt2spk").write_text("".join(f"{u} {s}\n" for u, s in speakers.items()))
    text_lines = [(u, f"words of {u}") for u in utterances if rng.random() < 0.7]
    text_lines += [(u, "said again") for u, _ in text_lines[:500]]  # later lines win
    text_lines.append(("not-a-segment", "ignored"))
    (tmp_path / "text").write_text("".join(f"{u} {t}\n" for u, t in text_lines))
    texts = dict(text_lines)

    catalogue = read_kaldi_dir(str(tmp_path), Refusals(sort_memory_bytes=64 << 10))
    cuts = catalogue.cuts.table()
    assert cuts.num_rows == len(utterances)
    ids = cuts.column("cut_id").to_pylist()
    metadata = dict(zip(ids, map(json.loads, cuts.column("metadata").to_pylist()), strict=True))
    for utterance in utterances:
        expected = {}
        if utterance in speakers:
            expected["speaker"] = speakers[utterance]
        if utterance in texts:
            expected["text"] = texts[utterance]
        assert metadata[utterance] == expected, utterance
    segment_of = {u: n for n, u in enumerate(utterances)}
    for cut_id, start in zip(
        cuts.column("cut_id").to_pylist(), cuts.column("start_seconds").to_pylist(), strict=True
    ):
        assert start == segment_of[cut_id] % 50 + 0.5


@pytest.mark.parametrize(
    "odd",
    [[], ["with space", "tab\there"], ["a", "a.wav/b"]],
    ids=["plain", "whitespace", "clashing paths"],
)
def test_a_catalogue_of_cuts_in_any_order_is_the_one_written_in_memory(
    tmp_path: Path, odd: list[str]
) -> None:
    ids = [f"s{n % 13:02d}/u{n}" for n in range(6000)] + odd
    random.Random(3).shuffle(ids)
    cuts = _cuts(ids)
    (tmp_path / "memory").mkdir()
    write_cut_catalogue(str(tmp_path / "memory"), _by_id_bytes(cuts))
    for name, rows, memory in (
        ("shuffled", cuts, 64 << 10),
        ("sorted", _by_id_bytes(cuts), 1 << 30),
    ):
        directory = tmp_path / name
        (directory / "spill").mkdir(parents=True)
        with CatalogueWriter(str(directory), str(directory / "spill"), memory) as writer:
            for batch in rows.to_batches(500):
                writer.add(batch)
            summary = writer.finish()
        assert summary.cuts == len(ids)
        assert summary.mentions == {"text": True, "speaker": False}
        assert (summary.runs > 2) == (name == "shuffled")  # a multi-way merge, or none
        assert os.listdir(directory / "spill") == []
        for file in CATALOGUE_FILES:
            assert filecmp.cmp(tmp_path / "memory" / file, directory / file, shallow=False), file


def test_a_catalogue_refuses_two_cuts_of_one_id(tmp_path: Path) -> None:
    ids = [f"u{n}" for n in range(3000)] + ["u1234"]
    random.Random(1).shuffle(ids)
    with (
        CatalogueWriter(str(tmp_path), str(tmp_path), 64 << 10) as writer,
        pytest.raises(SourceError, match="duplicate cut id 'u1234'"),
    ):
        writer.add(_cuts(ids))
        writer.finish()


def _manifests(tmp_path: Path, corpus: dict[str, str], ids: list[str]) -> list[str]:
    recordings = tmp_path / "recordings.jsonl"
    sources = ("flac_mono_16k.flac", "mp3_cbr_mono_16k.mp3")
    with recordings.open("w") as out:
        for number, name in enumerate(sources):
            source = {"type": "file", "channels": [0], "source": corpus[name]}
            recording = {"id": f"rec{number}", "sources": [source], "sampling_rate": 16000}
            out.write(json.dumps(recording | {"num_samples": 480000, "duration": 30.0}) + "\n")
    supervisions = tmp_path / "supervisions.jsonl"
    with supervisions.open("w") as out:
        for cut_id in ids:
            number = int(cut_id.rpartition("u")[2])
            supervision = {"id": cut_id, "recording_id": f"rec{number % 2}", "channel": 0}
            start = (number * 37 % 2900) / 100
            supervision |= {"start": start, "duration": 0.5, "text": f"w{number}"}
            out.write(json.dumps(supervision) + "\n")
    return [str(recordings), str(supervisions)]


def test_a_pack_in_a_tiny_memory_budget_writes_the_catalogue_of_a_pack_in_memory(
    tmp_path: Path, corpus: dict[str, str]
) -> None:
    """Cuts in no order, over two partitions, packed with ``--memory 1`` (the smallest
    budget: every sort spills many runs), give the catalogue a pack of the same cuts in
    order writes in memory, byte for byte; its rows are in the order of the ids' bytes
    and their frames are the manifest's times."""
    ids = [f"s{n % 7}/u{n}" for n in range(8000)]
    ordered_ids = sorted(ids, key=str.encode)
    random.Random(5).shuffle(ids)
    outputs = {}
    for name, listed, memory in (("tiny", ids, "1"), ("ample", ordered_ids, "4G")):
        (tmp_path / name).mkdir()
        manifests = _manifests(tmp_path / name, corpus, listed)
        output = tmp_path / name / "shards"
        options = ("--memory", memory, "--shard-size", "1")
        result = subprocess.run(
            [*CUTFS, "pack", "-q", *manifests, "-o", str(output), *options],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        outputs[name] = output
    for file in (*CATALOGUE_FILES, "recordings.arrow"):
        assert filecmp.cmp(outputs["tiny"] / file, outputs["ample"] / file, shallow=False), file
    with pa.OSFile(str(outputs["tiny"] / CUTS_FILE)) as source:
        cuts = pa.ipc.open_file(source).read_all()
    assert cuts.column("cut_id").to_pylist() == ordered_ids
    numbers = np.array([int(i.rpartition("u")[2]) for i in ordered_ids])
    assert cuts.column("start_frame").to_pylist() == (numbers * 37 % 2900 * 160).tolist()
    assert pc.all(pc.equal(cuts.column("num_frames"), 8000)).as_py()
    (tmp_path / "memory").mkdir()
    write_cut_catalogue(str(tmp_path / "memory"), _by_id_bytes(cuts))
    for file in CATALOGUE_FILES:
        assert filecmp.cmp(tmp_path / "memory" / file, outputs["tiny"] / file, shallow=False)
