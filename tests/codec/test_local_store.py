"""The local byte store serves only the files it pinned: replaced or rewritten ones are refused.

Shards and audio served in place belong to other people, who may replace them under a
live mount; a read must then fail rather than serve bytes the plan was not made from.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cutfs.codec.errors import ShardFormatError
from cutfs.codec.storage.local_store import LocalStore


def _write(path: Path, byte: bytes) -> None:
    path.write_bytes(byte * 8192)


@pytest.fixture
def one_map(tmp_path: Path) -> Iterator[LocalStore]:
    """Files ``a`` (of A's) and ``b`` (of B's), and a store that keeps one map open."""
    _write(tmp_path / "a", b"A")
    _write(tmp_path / "b", b"B")
    store = LocalStore(str(tmp_path), max_open_maps=1)
    yield store
    store.close()


def test_a_file_replaced_after_its_map_was_closed_is_refused(
    tmp_path: Path, one_map: LocalStore
) -> None:
    """One open map at a time: reading ``b`` closes ``a``'s map; ``a`` opened again must
    be the file first read, not the one renamed into its place meanwhile."""
    assert bytes(one_map.read("a", 0, 4)) == b"AAAA"
    assert bytes(one_map.read("b", 0, 4)) == b"BBBB"  # a's map is closed
    _write(tmp_path / "new", b"N")  # same size, another inode
    os.replace(tmp_path / "new", tmp_path / "a")
    with pytest.raises(ShardFormatError, match="changed since it was first opened"):
        one_map.read("a", 0, 4)


def test_a_file_rewritten_in_place_after_its_map_was_closed_is_refused(
    tmp_path: Path, one_map: LocalStore
) -> None:
    assert bytes(one_map.read("a", 0, 4)) == b"AAAA"
    one_map.read("b", 0, 4)
    status = os.stat(tmp_path / "a")
    _write(tmp_path / "a", b"R")  # same inode and size
    os.utime(tmp_path / "a", ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000))
    with pytest.raises(ShardFormatError, match="changed since it was first opened"):
        one_map.read("a", 0, 4)


def test_a_file_replaced_between_its_open_and_its_pin_is_pinned_as_mapped(tmp_path: Path) -> None:
    """The race between opening a file and stat-ing its path: whatever is renamed into
    place just after the open, the pin is of the file mapped, so the check that follows
    sees the path no longer holds it."""
    _write(tmp_path / "a", b"A")
    _write(tmp_path / "swap", b"S")

    def open_then_swap(path: str) -> int:
        descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        os.replace(tmp_path / "swap", path)  # the other user wins the race
        return descriptor

    store = LocalStore(str(tmp_path), opener=open_then_swap)
    try:
        assert bytes(store.read("a", 0, 4)) == b"AAAA"  # the file opened is the one mapped
        with pytest.raises(ShardFormatError, match="changed since it was opened"):
            store.check_unchanged("a")
    finally:
        store.close()


def test_an_unchanged_file_is_opened_again_after_its_map_was_closed(one_map: LocalStore) -> None:
    for _ in range(3):
        assert bytes(one_map.read("a", 0, 4)) == b"AAAA"
        assert bytes(one_map.read("b", 8188, 8192)) == b"BBBB"
    one_map.check_unchanged("a")
