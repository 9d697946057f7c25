"""Sources served in place, entry by entry: what other people wrote wrong costs the entry
it is in, named in a ``refused:`` message, and the rest is served; only what concerns the
whole source (a file that cannot be read to its end) refuses it, with a SourceError.

Each case here once escaped as another exception (stopping the whole source: a mount
exiting 1 with a traceback), stopped the whole source for one line, or served wrong
audio without a word. The readers run without a mount; nothing here is timed.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import tarfile
import wave
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from support.shards import write_arrow_file

from cutfs.codec.errors import SourceError
from cutfs.codec.sources import Refusals, read_source
from cutfs.codec.sources.catalogue import SourceCatalogue
from cutfs.codec.sources.source_index import SourceIndex, prepare_index
from cutfs.codec.trust.source_policy import SourcePolicy
from cutfs.vfs.tree.manifest_files import _supervisions

FLAC = "flac_mono_16k.flac"


def _lenient(*paths: Path) -> tuple[SourceCatalogue, list[str]]:
    refusals = Refusals(strict=False)
    catalogue = read_source([str(path) for path in paths], refusals)
    return catalogue, refusals.messages


def _cut_ids(catalogue: SourceCatalogue) -> list[str]:
    return sorted(cut.cut_id for cut in catalogue.cuts)


def _lhotse_line(cut_id: str, path: str, **extra: object) -> str:
    recording = {
        "id": f"rec-{cut_id}",
        "sources": [{"type": "file", "channels": [0], "source": path}],
        "sampling_rate": 16000,
        "num_samples": 16000,
        "duration": 1.0,
        "channel_ids": [0],
    }
    cut = {"id": cut_id, "start": 0.0, "duration": 1.0, "channel": 0, "recording": recording}
    return json.dumps({**cut, **extra, "type": "MonoCut"})


def test_lhotse_lines_that_are_not_utf8_json_or_text_are_refused_one_by_one(
    tmp_path: Path, corpus: dict[str, str]
) -> None:
    deep = "[" * 100_000 + "]" * 100_000  # past Python's recursion limit
    lines = [
        _lhotse_line("good", corpus[FLAC]).encode(),
        b'{"id": "caf\xe9"}',  # Latin-1, not UTF-8
        deep.encode(),
        # JSON escapes of lone surrogates: an id no file can have, and a text kept as it is
        _lhotse_line("lone", corpus[FLAC]).replace('"lone"', '"lone\\ud800"').encode(),
        _lhotse_line("said", corpus[FLAC], supervisions=[{"text": "TEXT"}])
        .replace("TEXT", "x\\udc80y")
        .encode(),
    ]
    manifest = tmp_path / "cuts.jsonl"
    manifest.write_bytes(b"\n".join(lines) + b"\n")
    catalogue, refused = _lenient(manifest)
    assert _cut_ids(catalogue) == ["good", "said"]
    assert any("cuts.jsonl:2" in message for message in refused), refused
    assert any("cuts.jsonl:3" in message for message in refused), refused
    assert any("not UTF-8 text" in message for message in refused), refused
    said = next(cut for cut in catalogue.cuts if cut.cut_id == "said")
    assert said.metadata["supervisions"][0]["text"] == "x\udc80y"  # kept, as an escape


def test_a_manifest_cut_short_refuses_the_source_with_a_source_error(
    tmp_path: Path, corpus: dict[str, str]
) -> None:
    whole = gzip.compress((_lhotse_line("a", corpus[FLAC]) + "\n").encode() * 50)
    manifest = tmp_path / "cuts.jsonl.gz"
    manifest.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(SourceError, match="cannot read the manifest"):
        _lenient(manifest)


def test_lhotse_paths_are_found_beside_the_manifest_before_the_working_directory(
    tmp_path: Path, corpus: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source, elsewhere = tmp_path / "source", tmp_path / "elsewhere"
    for directory, name in ((source, FLAC), (elsewhere, "mp3_cbr_mono_16k.mp3")):
        (directory / "audio").mkdir(parents=True)
        (directory / "audio" / "x.flac").write_bytes(Path(corpus[name]).read_bytes())
    (source / "cuts.jsonl").write_text(_lhotse_line("a", "audio/x.flac") + "\n")
    monkeypatch.chdir(elsewhere)  # holds audio/x.flac too, other audio
    catalogue, _ = _lenient(source / "cuts.jsonl")
    assert catalogue.recordings[0].path == str(source / "audio" / "x.flac")


def test_kaldi_lines_that_are_not_utf8_are_refused_one_by_one(
    tmp_path: Path, corpus: dict[str, str]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "wav.scp").write_text(f"rec1 {corpus[FLAC]}\n")
    (data / "segments").write_text("utt1 rec1 0 1\nutt2 rec1 1 2\n")
    (data / "text").write_bytes(b"utt1 hello\nutt2 caf\xe9\n")
    catalogue, refused = _lenient(data)
    assert _cut_ids(catalogue) == ["utt1", "utt2"]
    texts = {cut.cut_id: cut.metadata.get("text") for cut in catalogue.cuts}
    assert texts == {"utt1": "hello", "utt2": None}
    assert any("text:2" in message and "UTF-8" in message for message in refused), refused


def _member(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    member = tarfile.TarInfo(name)
    member.size = len(data)
    archive.addfile(member, io.BytesIO(data))


def test_a_shar_line_that_is_not_json_costs_that_cut_only(
    tmp_path: Path, corpus: dict[str, str]
) -> None:
    audio = Path(corpus[FLAC]).read_bytes()
    with tarfile.open(tmp_path / "recording.000000.tar", "w") as archive:
        for cut_id in ("a", "b"):
            _member(archive, f"{cut_id}.flac", audio)
    lines = [json.dumps({"id": "a", "start": 0.0}), "{not json", json.dumps({"id": "b"})]
    with gzip.open(tmp_path / "cuts.000000.jsonl.gz", "wt") as out:
        out.write("\n".join(lines) + "\n")
    catalogue, refused = _lenient(tmp_path)
    assert _cut_ids(catalogue) == ["a", "b"]
    assert any("cuts.000000.jsonl.gz:2" in message for message in refused), refused


def _wav_with_a_hole(path: Path) -> np.ndarray:
    """A 16-bit WAV whose middle second is silence stored as a hole of the file system."""
    rng = np.random.default_rng(7)
    samples = (rng.standard_normal(48_000) * 3000).astype("<i2")
    samples[16_000:32_000] = 0
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(samples.tobytes())
    data = path.read_bytes()
    hole_start, hole_end = 44 + 2 * 16_000 + 8192, 44 + 2 * 32_000 - 8192
    hole_start, hole_end = -(-hole_start // 4096) * 4096, hole_end // 4096 * 4096
    with open(path, "r+b") as out:  # punch the zeros out: write around them
        out.truncate(0)
        out.write(data[:hole_start])
        out.seek(hole_end)
        out.write(data[hole_end:])
    return samples


def test_sparse_tar_members_are_refused_not_served_as_other_audio(
    tmp_path: Path, corpus: dict[str, str]
) -> None:
    """A sparse member's bytes are stored in pieces; served as one range they were other
    audio (30 207 of 48 000 frames wrong in the case that found it), without an error."""
    files = tmp_path / "files"
    files.mkdir()
    _wav_with_a_hole(files / "holey.wav")
    (files / "plain.flac").write_bytes(Path(corpus[FLAC]).read_bytes())
    tar_path = tmp_path / "shard.tar"
    subprocess.run(
        ["tar", "--sparse", "--format=gnu", "-cf", str(tar_path), "holey.wav", "plain.flac"],
        cwd=files,
        check=True,
    )
    with tarfile.open(tar_path) as archive:
        assert archive.getmember("holey.wav").issparse()  # else the test shows nothing
    catalogue, refused = _lenient(tar_path)
    assert _cut_ids(catalogue) == ["plain"]
    assert any("holey.wav" in message and "sparse" in message for message in refused), refused


def test_a_tar_header_that_cannot_be_read_is_noted_with_the_members_after_it(
    tmp_path: Path, corpus: dict[str, str]
) -> None:
    audio = Path(corpus[FLAC]).read_bytes()
    tar_path = tmp_path / "shard.tar"
    with tarfile.open(tar_path, "w") as archive:
        for key in ("a", "b", "c"):
            _member(archive, f"{key}.flac", audio)
    with tarfile.open(tar_path) as archive:
        second = archive.getmember("b.flac").offset
    data = bytearray(tar_path.read_bytes())
    data[second : second + 100] = b"\xff" * 100  # b's header: its name and checksum broken
    tar_path.write_bytes(bytes(data))
    catalogue, refused = _lenient(tar_path)
    assert _cut_ids(catalogue) == ["a"]
    assert any(f"unreadable tar header at byte {second}" in m for m in refused), refused


def _arrow_file(path: Path, batches: list[pa.RecordBatch]) -> None:
    write_arrow_file(path, pa.Table.from_batches(batches))  # a chunk is a batch


def test_arrow_rows_without_usable_audio_cost_their_row_only(
    tmp_path: Path, corpus: dict[str, str]
) -> None:
    """An empty cell alone in its batch once made a negative offset, refusing the whole
    source on every mount; a row with no bytes and no path stopped it too."""
    audio = Path(corpus[FLAC]).read_bytes()
    kind = pa.struct([("bytes", pa.binary()), ("path", pa.string())])

    def batch(ids: list[str], cells: list[dict[str, object]]) -> pa.RecordBatch:
        return pa.record_batch([pa.array(ids), pa.array(cells, kind)], names=["id", "audio"])

    _arrow_file(
        tmp_path / "data.arrow",
        [
            batch(["good"], [{"bytes": audio, "path": None}]),
            batch(["empty"], [{"bytes": b"", "path": None}]),
            batch(["nowhere", "also-good"], [{"bytes": None, "path": None}, {"bytes": audio}]),
        ],
    )
    catalogue, refused = _lenient(tmp_path)
    assert _cut_ids(catalogue) == ["also-good", "good"]
    assert len(refused) == 2, refused
    with open(tmp_path / "data.arrow", "rb") as stored:
        for recording in catalogue.recordings:
            stored.seek(recording.offset_bytes)
            assert stored.read(recording.length_bytes or 0) == audio, recording.recording_id


@pytest.mark.parametrize("segments", ["segments.csv", "segments.jsonl"])
def test_bad_segment_rows_cost_their_row_only(
    tmp_path: Path, corpus: dict[str, str], segments: str
) -> None:
    table = pa.table({"id": ["rec"], "audio": [Path(corpus[FLAC]).read_bytes()]})
    _arrow_file(tmp_path / "data.arrow", table.to_batches())
    if segments.endswith(".csv"):
        # s2 has a field more than the header: the reader keeps it under the key None
        text = "id,recording,start,end,speaker\ns1,rec,0,1,j\ns2,rec,1,2,k,spare\ns3,rec,x,2,l\n"
    else:
        rows = [{"id": "s1", "recording": "rec", "start": 0, "end": 1}, "{not json"]
        rows.append({"id": "s2", "recording": "rec", "start": 1, "end": 2, "speaker": "k"})
        text = "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n"
    (tmp_path / segments).write_text(text)
    catalogue, refused = _lenient(tmp_path)
    assert _cut_ids(catalogue) == ["s1", "s2"]
    assert len(refused) == 1, refused
    s2 = next(cut for cut in catalogue.cuts if cut.cut_id == "s2")
    assert s2.metadata == {"speaker": "k"}


def test_a_segment_table_that_cannot_be_read_refuses_the_source_with_a_source_error(
    tmp_path: Path, corpus: dict[str, str]
) -> None:
    table = pa.table({"id": ["rec"], "audio": [Path(corpus[FLAC]).read_bytes()]})
    _arrow_file(tmp_path / "data.arrow", table.to_batches())
    (tmp_path / "segments.csv").write_text(f"id,recording,start,end\ns1,rec,0,{'1' * 200_000}\n")
    with pytest.raises(SourceError, match="cannot read the segment list"):
        _lenient(tmp_path)


def test_a_supervision_without_usable_times_is_left_out_of_the_manifests() -> None:
    """Supervisions are kept as metadata unchecked; one with a start of "abc", [1] or a
    400-digit number failed the rendering of cuts.jsonl.gz and supervisions.rttm whole."""
    metadata = {
        "supervisions": [
            {"start": 0.5, "duration": 1.0, "text": "kept"},
            {"start": "abc"},
            {"start": [1]},
            {"start": 10**400},
            {"start": 0.0, "duration": float("nan")},
        ]
    }
    supervisions = _supervisions("cut", metadata, 2.0)
    assert [s.get("text") for s in supervisions] == ["kept"]
    assert supervisions[0]["start"] == 0.5 and supervisions[0]["duration"] == 1.0


def test_files_with_names_that_are_not_utf8_are_refused_one_by_one(
    tmp_path: Path, corpus: dict[str, str]
) -> None:
    folder = tmp_path / "audio"
    folder.mkdir()
    (folder / "good.flac").write_bytes(Path(corpus[FLAC]).read_bytes())
    os.link(folder / "good.flac", os.path.join(os.fsencode(folder), b"caf\xe9.flac"))
    catalogue, refused = _lenient(folder)
    assert _cut_ids(catalogue) == ["good"]
    assert any("not UTF-8 text" in message for message in refused), refused


def test_a_process_that_comes_to_a_rewritten_file_later_does_not_serve_it(
    tmp_path: Path,
) -> None:
    """Each process of a mount makes or loads its own plans. One process indexes a WAV;
    its owner rewrites the samples in place and puts the times back; a second process (a
    second SourceIndex on the same catalogue) that comes to the recording only now must
    refuse it, not stamp the file as it is now and serve the new audio."""
    source = tmp_path / "audio"
    source.mkdir()
    samples = (np.sin(np.arange(16000 * 4) * 0.05) * 10000).astype("<i2")
    with wave.open(str(source / "a.wav"), "wb") as audio:
        audio.setnchannels(1)
        audio.setsampwidth(2)
        audio.setframerate(16000)
        audio.writeframes(samples.tobytes())
    policy = SourcePolicy.for_source(str(source))
    directory = prepare_index(str(source), str(tmp_path / "cache"), policy)
    with SourceIndex(directory, policy=policy) as first:
        assert first.read_frames(0, 0, 16000)[:, 0].tobytes() == samples[:16000].tobytes()
    before = os.stat(source / "a.wav")
    with open(source / "a.wav", "r+b") as audio:
        audio.seek(44)
        audio.write((-samples).tobytes())
    os.utime(source / "a.wav", ns=(before.st_atime_ns, before.st_mtime_ns))
    with SourceIndex(directory, policy=policy) as second, pytest.raises(SourceError):
        frames = second.read_frames(0, 16000, 32000)
        assert frames[:, 0].tobytes() == samples[16000:32000].tobytes(), "other audio served"
