"""The mapped file tree (the catalogue's directory tree), without FUSE."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.references import ODD_IDS

from cutfs.codec.catalogue.file_tree import ROOT, FileTree, served_paths, write_file_tree
from cutfs.codec.catalogue.path_escape import escape_id, unescape_path
from cutfs.codec.errors import ShardFormatError


def _tree(tmp_path: Path, ids: list[str]) -> tuple[FileTree, list[str]]:
    paths = served_paths(ids).to_pylist()
    write_file_tree(str(tmp_path / "cuts"), paths)
    return FileTree(str(tmp_path / "cuts")), paths


def _resolve(tree: FileTree, path: str) -> int | None:
    """The item at ``path``, walking one lookup per component as the kernel does."""
    directory = ROOT
    *components, name = path.split("/")
    for component in components:
        entry = tree.lookup(directory, component.encode("utf-8", "surrogateescape"))
        if entry is None or not entry.is_directory:
            return None
        directory = entry.child
    entry = tree.lookup(directory, name.encode("utf-8", "surrogateescape"))
    return None if entry is None or entry.is_directory else entry.item


def test_clashes_are_resolved_in_favour_of_the_first_claim() -> None:
    ids = ["a", "a.wav/b", "c/d", "c", "x/y.wav", "x/y.wav/z", "p.wav/q", "p"]
    paths = served_paths(ids).to_pylist()
    assert paths == [
        "a.wav",
        escape_id("a.wav/b", force=True),  # needs a directory where a file is
        "c/d.wav",
        "c.wav",  # c.wav is not the directory c: no clash
        "x/y.wav.wav",
        "x/y.wav/z.wav",
        "p.wav/q.wav",
        escape_id("p", force=True),  # a file where a directory is
    ]
    assert [unescape_path(path) for path in paths] == ids


def test_every_item_is_found_at_its_path_and_nothing_else(tmp_path: Path) -> None:
    ids = [f"spk{n % 7}/sess{n % 3}/utt-{n:05d}" for n in range(2000)] + list(ODD_IDS)
    tree, paths = _tree(tmp_path, ids)
    assert tree.item_count == len(ids)
    for item, path in enumerate(paths):
        assert _resolve(tree, path) == item
        assert tree.path(item) == path
    assert _resolve(tree, "spk1/sess1/utt-99999.wav") is None
    assert tree.lookup(ROOT, b"nope") is None
    assert tree.lookup(ROOT, b"") is None


def test_listings_are_sorted_rows_with_stable_offsets(tmp_path: Path) -> None:
    ids = [f"spk{n % 7}/utt-{n:05d}" for n in range(2000)] + ["zz", "aa", "spk3.wav/x"]
    tree, _ = _tree(tmp_path, ids)
    root = tree.entries(ROOT)
    names = [entry.name for entry in root]
    assert names == sorted(names) and len(set(names)) == len(names)
    assert set(names) == {f"spk{n}".encode() for n in range(7)} | {
        b"aa.wav",
        b"zz.wav",
        b"spk3.wav",
    }
    assert tree.subdirectories(ROOT) == 8
    spk3 = tree.lookup(ROOT, b"spk3")
    assert spk3 is not None and spk3.is_directory
    listing = tree.entries(spk3.child)
    assert len(listing) == len([n for n in range(2000) if n % 7 == 3])
    assert [entry.name for entry in listing[5:8]] == [listing[k].name for k in (5, 6, 7)]
    assert tree.parent(spk3.child) == ROOT
    assert tree.parent(ROOT) == ROOT
    with pytest.raises(IndexError):
        listing[len(listing)]


def test_a_damaged_tree_is_refused(tmp_path: Path) -> None:
    _tree(tmp_path, ["a", "b/c"])
    (tmp_path / "cuts.directories.arrow").write_bytes(b"not arrow")
    with pytest.raises(ShardFormatError):
        FileTree(str(tmp_path / "cuts"))


_ID_CHARACTERS = st.sampled_from([*"ab./%- \u00e9", "\x00"])


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.text(_ID_CHARACTERS, max_size=8), max_size=40, unique=True))
def test_any_ids_give_unique_reversible_paths_that_resolve(tmp_path: Path, ids: list[str]) -> None:
    paths = served_paths(ids).to_pylist()
    assert len(set(paths)) == len(ids)
    assert [unescape_path(path) for path in paths] == ids
    write_file_tree(str(tmp_path / "t"), paths)
    tree = FileTree(str(tmp_path / "t"))
    for item, path in enumerate(paths):
        assert _resolve(tree, path) == item


def test_many_clashes_resolve_each_in_favour_of_the_first_claim() -> None:
    """Hostile ids clash in bulk: every pair resolves, by the same rule as a single one."""
    pairs = 5000
    ids = [f"k{n}" for n in range(pairs)] + [f"k{n}.wav/x" for n in range(pairs)]
    ids += [f"d{n}.wav/x" for n in range(pairs)] + [f"d{n}" for n in range(pairs)]
    paths = served_paths(ids).to_pylist()
    assert paths[:pairs] == [f"k{n}.wav" for n in range(pairs)]  # first: kept
    assert all(path.startswith("%") for path in paths[pairs : 2 * pairs])  # needed a file's name
    assert paths[2 * pairs : 3 * pairs] == [f"d{n}.wav/x.wav" for n in range(pairs)]
    assert all(path.startswith("%") for path in paths[3 * pairs :])
    assert [unescape_path(path) for path in paths] == ids


def _walk(tree: FileTree, directory: int = ROOT, path: str = "") -> dict[str, int | None]:
    """Every entry's path, with its item (None for a directory), and the order of listings."""
    found: dict[str, int | None] = {}
    names = []
    for entry in tree.entries(directory):
        names.append(entry.name)
        where = path + entry.name.decode("utf-8", "surrogateescape")
        if entry.is_directory:
            assert tree.parent(entry.child) == directory
            found[where + "/"] = None
            found.update(_walk(tree, entry.child, where + "/"))
        else:
            found[where] = entry.item
    assert names == sorted(names) and len(set(names)) == len(names)
    subdirectories = sum(entry.is_directory for entry in tree.entries(directory))
    assert tree.subdirectories(directory) == subdirectories
    return found


def test_a_tree_written_in_small_batches_is_the_same_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cutfs.codec.catalogue import file_tree  # noqa: PLC0415

    ids = [f"spk{n % 7}/sess{n % 5}/utt-{n:05d}" for n in range(600)]
    ids += [*ODD_IDS, "a", "a.wav/b", "deep/x/y/z/w", "deep/x/v"]
    (tmp_path / "whole").mkdir()
    (tmp_path / "batched").mkdir()
    whole, paths = _tree(tmp_path / "whole", ids)
    monkeypatch.setattr(file_tree, "TREE_BATCH", 7)  # directories met again in later batches
    batched, _ = _tree(tmp_path / "batched", ids)
    assert _walk(batched) == _walk(whole)
    assert len([p for p, item in _walk(batched).items() if item is not None]) == len(ids)
    for item, path in enumerate(paths):
        assert _resolve(batched, path) == item


def test_rows_already_in_order_are_written_unsorted_and_read_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np  # noqa: PLC0415
    import pyarrow as pa  # noqa: PLC0415

    from cutfs.codec.catalogue import file_tree, row_order  # noqa: PLC0415
    from cutfs.codec.catalogue.kaldi_order import KaldiOrder, write_kaldi_order  # noqa: PLC0415

    names = pa.array([b"a", b"ab", b"b", b"a", b"c"], pa.large_binary())
    assert row_order.rows_in_order(names, np.array([0, 0, 0, 1, 1]))
    assert not row_order.rows_in_order(names)
    assert not row_order.rows_in_order(names, np.array([0, 0, 1, 0, 1]))
    ids = [f"s{n // 40:03d}/u{n:06d}" for n in range(400)]  # made in order, as generators do
    trees = {}
    for sort_always in (False, True):
        if sort_always:  # the slow path, forced: the same tree and order must come out
            monkeypatch.setattr(file_tree, "rows_in_order", lambda *args: False)
            monkeypatch.setattr(
                "cutfs.codec.catalogue.kaldi_order.rows_in_order", lambda *args: False
            )
        directory = tmp_path / str(sort_always)
        directory.mkdir()
        tree, paths = _tree(directory, ids)
        write_kaldi_order(str(directory / "order.arrow"), pa.array(ids), pa.array(paths))
        order = KaldiOrder(str(directory / "order.arrow"), len(ids))
        trees[sort_always] = (_walk(tree), order.cuts.tolist(), order.text_ends.tolist())
        for item, path in enumerate(paths):
            assert _resolve(tree, path) == item
    assert trees[False] == trees[True]
