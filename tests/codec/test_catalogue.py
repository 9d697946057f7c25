"""The mapped catalogue without FUSE: Kaldi order, wav.scp served in pieces, manifests
spilled in chunks, shard directories of format 1 and 2, and views answering on their own."""

from __future__ import annotations

import gzip
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
import trio
from support.shards import format_1_copy, write_arrow_file

from cutfs.codec.catalogue.file_tree import served_paths
from cutfs.codec.catalogue.kaldi_order import KaldiOrder, kaldi_key, write_kaldi_order
from cutfs.codec.catalogue.path_escape import escape_id
from cutfs.codec.catalogue.shard_format import CUTS_FILE, MANIFEST_FILE, RECORDINGS_FILE
from cutfs.codec.catalogue.shard_set import ShardSet
from cutfs.codec.errors import ShardFormatError, SourceError
from cutfs.codec.packing.packer import pack
from cutfs.vfs.tree.cuts_view import CutsView
from cutfs.vfs.tree.manifests_view import SpilledText, WavScp
from cutfs.vfs.tree.view import CUT_DIRECTORY_BASE, CUT_INODE_BASE

IDS = [
    "spk2/utt-b",
    "spk1/utt-a",
    "with space",
    "tab\there",
    "100%",
    "é/ü",
    "a",
    "a.wav/b",  # clashes with a's file: escaped
    "Z",
    "",
    "../up",
]


def _reference_wav_scp(ids: list[str], cuts_directory: str) -> bytes:
    """Independently of the code under test: one line per cut, sorted by key bytes."""
    lines = []
    paths = served_paths(ids).to_pylist()
    for identifier, path in zip(ids, paths, strict=True):
        key = identifier
        if not identifier or any(c.isspace() for c in identifier):
            key = "".join(f"%{ord(c):02X}" if c.isspace() or c == "%" else c for c in identifier)
            key = key or "%"
        lines.append(f"{key} {cuts_directory}/{path}\n".encode())
    lines.sort(key=lambda line: line.split(b" ", 1)[0])
    return b"".join(lines)


def _wav_scp(tmp_path: Path, ids: list[str], cuts_directory: str) -> WavScp:
    paths = served_paths(ids)
    write_kaldi_order(str(tmp_path / "order.arrow"), pa.array(ids), paths)
    order = KaldiOrder(str(tmp_path / "order.arrow"), len(ids))
    return WavScp(order, ids, paths.to_pylist().__getitem__, cuts_directory)


def test_wav_scp_in_any_pieces_equals_the_sorted_reference(tmp_path: Path) -> None:
    ids = IDS + [f"spk{n % 13}/utt-{n:06d}" for n in range(3000)]
    random.Random(7).shuffle(ids)
    cuts_directory = "/mnt/corpus with space/cuts"
    expected = _reference_wav_scp(ids, cuts_directory)
    served = _wav_scp(tmp_path, ids, cuts_directory)
    assert served.size_bytes() == len(expected)
    assert served.read(0, len(expected) + 100) == expected
    rng = random.Random(1)
    for _ in range(300):
        offset = rng.randrange(0, len(expected) + 10)
        size = rng.choice([1, 7, 4096, 131072, rng.randrange(0, 5000)])
        assert served.read(offset, size) == expected[offset : offset + size]
    pieces = [served.read(offset, 4096) for offset in range(0, len(expected), 4096)]
    assert b"".join(pieces) == expected


def test_kaldi_keys_match_the_reference_rule(tmp_path: Path) -> None:
    assert kaldi_key("a b") == "a%20b" and kaldi_key("x%y") == "x%y" and kaldi_key("") == "%"
    assert kaldi_key("a%\u3000") == "a%25%3000"


def test_spilled_manifest_streams_chunks_and_compresses_them() -> None:
    lines = [f"line {n} {'x' * (n % 50)}\n".encode() for n in range(20000)]

    def chunks():  # type: ignore[no-untyped-def]
        for start in range(0, len(lines), 1000):
            yield b"".join(lines[start : start + 1000])

    async def main() -> tuple[bytes, bytes, int]:
        plain = SpilledText(chunks, compressed=False, index_all=None)
        packed = SpilledText(chunks, compressed=True, index_all=None)
        assert not plain.ready()
        await plain.prepare()
        await packed.prepare()
        whole = plain.read(0, plain.size_bytes())
        middle = plain.read(1000, 10)
        assert middle == whole[1000:1010]
        return whole, packed.read(0, packed.size_bytes()), plain.size_bytes()

    whole, compressed, size = trio.run(main)
    assert whole == b"".join(lines) and size == len(whole)
    assert gzip.decompress(compressed) == whole


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, corpus: dict[str, str]) -> Path:
    root = tmp_path_factory.mktemp("catalogue")
    flac = corpus["flac_mono_16k.flac"]
    cuts = [
        {
            "id": identifier or "empty",
            "start": 0.5 * n,
            "duration": 1.0,
            "channel": 0,
            "recording": {
                "id": "rec",
                "sources": [{"type": "file", "channels": [0], "source": flac}],
                "sampling_rate": 16000,
                "num_samples": 16000 * 10,
                "duration": 10.0,
                "channel_ids": [0],
            },
            "supervisions": [],
            "type": "MonoCut",
        }
        for n, identifier in enumerate(IDS)
    ]
    manifest = root / "cuts.jsonl"
    manifest.write_text("".join(json.dumps(cut) + "\n" for cut in cuts))
    pack([str(manifest)], str(root / "shards"))
    return root / "shards"


def corpus_flac(packed: Path) -> str:
    return str(
        json.loads((packed.parent / "cuts.jsonl").read_text().splitlines()[0])["recording"][
            "sources"
        ][0]["source"]
    )


def test_a_format_2_directory_maps_its_catalogue(packed: Path) -> None:
    with ShardSet(str(packed)) as shards:
        assert shards.version == 2
        cut_tree, recording_tree = shards.trees()
        assert cut_tree.item_count == shards.num_cuts == len(IDS)
        for number, identifier in enumerate(shards.cut_ids):
            assert cut_tree.find(cut_tree.path(number)) == number
            assert identifier in {i or "empty" for i in IDS}
        assert recording_tree.find("rec.wav") == 0
        name, start, end = shards.blob_location(0)
        with open(packed / name, "rb") as shard:  # the stored offset is where the FLAC is
            shard.seek(start)
            assert shard.read(4) == b"fLaC"
        assert end - start == Path(corpus_flac(packed)).stat().st_size


def test_a_format_1_directory_still_mounts_with_the_same_catalogue(
    packed: Path, tmp_path: Path
) -> None:
    old = tmp_path / "old"
    format_1_copy(packed, old)
    with ShardSet(str(packed)) as new, ShardSet(str(old)) as legacy:
        assert legacy.version == 1
        assert list(legacy.cut_ids) == list(new.cut_ids)
        assert legacy.blob_location(0) == new.blob_location(0)
        assert legacy.kaldi_order().cuts.tolist() == new.kaldi_order().cuts.tolist()
        cut = new.cut(0)
        assert (
            legacy.read_frames(0, cut.start_frame, cut.end_frame)
            == new.read_frames(0, cut.start_frame, cut.end_frame)
        ).all()


def test_the_cuts_view_looks_up_and_lists_without_a_mount(packed: Path) -> None:
    with ShardSet(str(packed)) as shards:
        cut_tree, _ = shards.trees()
        view = CutsView(shards, cut_tree, [(b"metadata.jsonl", 5)])
        top = CUT_DIRECTORY_BASE

        async def lookup(directory: int, name: bytes) -> int | None:
            return await view.lookup(directory, name, 0)

        spk1 = trio.run(lookup, top, b"spk1")
        assert spk1 is not None and view.parent(spk1) == top
        inode = trio.run(lookup, spk1, b"utt-a.wav")
        assert inode is not None and shards.cut_ids[inode - CUT_INODE_BASE] == "spk1/utt-a"
        span = view.audio(inode)
        assert span is not None and span.num_frames == 16000
        assert trio.run(lookup, top, b"missing.wav") is None
        assert trio.run(lookup, top, b"metadata.jsonl") == 5
        listing = view.listing(top)
        names = [name for name, _ in listing]
        assert names[-1] == b"metadata.jsonl" and names[:-1] == sorted(names[:-1])
        assert listing[2:4] == [listing[2], listing[3]]  # offsets are stable rows
        escaped = escape_id("with space").encode()
        assert trio.run(lookup, top, escaped) is not None


def test_the_python_api_finds_every_cut_by_id_even_odd_and_clashing_ones(packed: Path) -> None:
    import soundfile  # noqa: PLC0415

    import cutfs  # noqa: PLC0415

    whole, rate = soundfile.read(corpus_flac(packed), dtype="int16")
    with cutfs.open(packed) as corpus:
        for number, identifier in enumerate(IDS):
            samples, served_rate = corpus.read_cut(identifier or "empty")
            first = int(0.5 * number * rate)
            assert served_rate == rate
            assert (samples[:, 0] == whole[first : first + rate]).all(), identifier
        with pytest.raises(cutfs.codec.errors.CutfsError, match="no such cut"):
            corpus.read_cut("a.wav")  # a path, not an id


def test_a_recording_row_that_lies_fails_where_it_is_used(packed: Path, tmp_path: Path) -> None:
    copy = _rewritten(packed, tmp_path / "lying", RECORDINGS_FILE, {"sample_rate": _a_billion})
    with ShardSet(str(copy)) as shards:  # opening reads no row
        assert shards.num_cuts == len(IDS)
        with pytest.raises(ShardFormatError, match="numbers out of range"):
            shards.shape(0)
        with pytest.raises(ShardFormatError, match="numbers out of range"):
            shards.cut_frames(0)
        with pytest.raises(ShardFormatError, match="numbers out of range"):
            shards.blob_location(0)


def test_catalogues_on_network_storage_are_copied_to_a_private_cache(
    packed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cutfs.codec.catalogue import catalogue_copy  # noqa: PLC0415

    monkeypatch.setattr(catalogue_copy, "is_on_network_storage", lambda path: True)
    cache = tmp_path / "cache"
    copy = Path(catalogue_copy.catalogue_directory(str(packed), str(cache)))
    assert copy.parent == cache / "catalogues"
    assert (copy / CUTS_FILE).read_bytes() == (packed / CUTS_FILE).read_bytes()
    assert {item.stat().st_mode & 0o777 for item in copy.iterdir()} == {0o600}
    assert catalogue_copy.catalogue_directory(str(packed), str(cache)) == str(copy)  # reused
    with ShardSet(str(packed), cache_root=str(cache)) as shards:
        # A pack writes its cuts in the order of their ids' bytes, whatever the input's.
        expected = sorted((i or "empty" for i in IDS), key=lambda i: i.encode())
        assert list(shards.cut_ids) == expected
    copy.chmod(0o777)  # a copy others could have written is not mapped
    with pytest.raises(SourceError, match="writable by its group or others"):
        catalogue_copy.catalogue_directory(str(packed), str(cache))


def _rewritten(packed: Path, copy: Path, name: str, change: dict[str, object]) -> Path:
    """A copy of the directory with columns of one table replaced: each name maps to a
    function of the column's values (a list), or to None to drop the column."""
    shutil.copytree(packed, copy)
    with pa.OSFile(str(copy / name), "rb") as source:
        table = pa.ipc.open_file(source).read_all()
    columns = {}
    for field in table.schema:
        replace = change.get(field.name, _unchanged)
        if replace is None:
            continue
        assert callable(replace)
        rows = replace(table.column(field.name).to_pylist())
        try:  # the column's own type where the values fit it
            columns[field.name] = pa.array(rows, field.type)
        except (pa.ArrowException, TypeError, ValueError):
            columns[field.name] = pa.array(rows)
    write_arrow_file(copy / name, pa.table(columns))
    return copy


def _unchanged(rows: list[object]) -> list[object]:
    return rows


def _a_billion(rows: list[object]) -> list[object]:
    return [10**9] * len(rows)


def _shape_of_first_cut(shards: ShardSet) -> object:
    return shards.shape(shards.cut_recording(0))


def _first_plan(shards: ShardSet) -> object:
    return shards.recording(0)


def _wav_scp_line(shards: ShardSet) -> object:
    view = WavScp(shards.kaldi_order(), shards.cut_ids, lambda cut: "c.wav", "/mnt/cuts")
    return view.read(0, view.size_bytes())


def _wav_scp_size(shards: ShardSet) -> object:
    return WavScp(shards.kaldi_order(), shards.cut_ids, lambda cut: "c.wav", "/m").size_bytes()


LIES = {  # table, columns changed, what then fails (None: opening the directory)
    "a missing column": (RECORDINGS_FILE, {"sample_rate": None}, None),
    "seek points that are not numbers": (
        RECORDINGS_FILE,
        {"seek_samples": lambda rows: [[str(point) for point in row] for row in rows]},
        None,
    ),
    "a cut of a recording that is not there": (
        CUTS_FILE,
        {"recording": lambda rows: [65535] * len(rows)},
        _shape_of_first_cut,
    ),
    "an unknown PCM sample format": (
        RECORDINGS_FILE,
        {
            "method": lambda rows: ["pcm"] * len(rows),
            "pcm_format": lambda rows: ["s12"] * len(rows),
        },
        _first_plan,
    ),
    "a demuxer's seek without a time base": (
        RECORDINGS_FILE,
        {
            "method": lambda rows: ["seek"] * len(rows),
            "time_base_numerator": lambda rows: [0] * len(rows),
        },
        _first_plan,
    ),
    "a file tree without a root": (
        "cuts.directories.arrow",
        {
            column: lambda rows: []
            for column in ("first_entry", "entry_count", "parent", "subdirectories")
        },
        None,
    ),
    "a file tree with an item more than there are cuts": (
        "cuts.paths.arrow",
        {"path": lambda rows: [*rows, "z.wav"]},
        None,
    ),
    "a Kaldi line naming no cut": (
        "kaldi-order.arrow",
        {"cut": lambda rows: [-1, *rows[1:]]},
        _wav_scp_line,
    ),
    "a Kaldi text of no possible size": (
        "kaldi-order.arrow",
        {"text_end": lambda rows: [*rows[:-1], -5]},
        None,
    ),
}


@pytest.mark.parametrize("lie", sorted(LIES))
def test_a_catalogue_that_lies_is_refused_with_a_clear_error(
    packed: Path, tmp_path: Path, lie: str
) -> None:
    """Every such table once raised KeyError, ValueError, IndexError or ZeroDivisionError,
    or (a Kaldi line naming cut -1) served another cut's line; now the open or the one
    use fails with ShardFormatError, the error a mount turns into exit status 3 or EIO."""
    name, change, use = LIES[lie]
    copy = _rewritten(packed, tmp_path / "lying", name, change)
    if use is None:
        with pytest.raises(ShardFormatError):
            ShardSet(str(copy))
        return
    with ShardSet(str(copy)) as shards, pytest.raises(ShardFormatError):
        use(shards)


def _offset_position(path: Path, column: str, row: int) -> tuple[int, int]:
    """Where in an Arrow IPC file the offset that ends string ``row`` of ``column`` is
    stored, and its width in bytes."""
    with pa.memory_map(str(path)) as source:
        whole = source.read_buffer()
        array = pa.ipc.open_file(whole).read_all().column(column).chunk(0)
        width = 8 if pa.types.is_large_string(array.type) else 4
        offsets = array.buffers()[1]
        assert offsets is not None
        return offsets.address - whole.address + (array.offset + row + 1) * width, width


def _with_offset(path: Path, column: str, row: int, value: int) -> None:
    at, width = _offset_position(path, column, row)
    data = bytearray(path.read_bytes())
    data[at : at + width] = value.to_bytes(width, "little", signed=True)
    path.write_bytes(bytes(data))


_IN_A_CHILD = """
import sys
from cutfs.codec.errors import ShardFormatError
from cutfs.codec.catalogue.shard_set import ShardSet
with ShardSet(sys.argv[1]) as shards:
    try:
        {use}
    except ShardFormatError as exc:
        print("refused:", exc)
"""


def _run_in_a_child(directory: Path, use: str) -> subprocess.CompletedProcess[str]:
    """Run ``use`` on the opened directory in a child process: what is tested here used to
    kill its process with a signal, which would take the test run with it."""
    script = _IN_A_CHILD.format(use=use)
    return subprocess.run(
        [sys.executable, "-c", script, str(directory)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_recording_row_whose_string_points_past_the_file_fails_its_use(
    packed: Path, tmp_path: Path
) -> None:
    """The recordings table is mapped unvalidated; a row's strings were read through
    pyarrow when its plan was built, and an offset 2 GB past the file killed the process
    with SIGBUS (a lookup of any of its cuts, in a mount)."""
    copy = tmp_path / "lying"
    shutil.copytree(packed, copy)
    _with_offset(copy / RECORDINGS_FILE, "container_format", 0, 0x7FFFFFF0)
    child = _run_in_a_child(copy, "shards.recording(0)")
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.startswith("refused:") and "invalid recording row" in child.stdout


def test_metadata_offsets_that_point_anywhere_fail_the_scan_not_the_process(
    packed: Path, tmp_path: Path
) -> None:
    """Without the manifest's record of which fields the cuts' metadata mentions (format 1,
    or a hand-made manifest) the column is scanned by an Arrow kernel; offsets pointing
    2**40 bytes away made it fault (SIGSEGV) at mount."""
    copy = tmp_path / "lying"
    shutil.copytree(packed, copy)
    _with_offset(copy / CUTS_FILE, "metadata", 1, 1 << 40)
    manifest = json.loads((copy / MANIFEST_FILE).read_text())
    manifest.pop("mentions", None)
    (copy / MANIFEST_FILE).write_text(json.dumps(manifest))
    child = _run_in_a_child(copy, 'shards.metadata_mentions("text")')
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.startswith("refused:"), child.stdout
    assert "the cuts' metadata column is invalid" in child.stdout
