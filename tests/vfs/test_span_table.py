"""The table of time-range inodes: kernel references, forgetting, and per-user shares, for
one process (:class:`SpanTable`) and shared by the processes of a mount
(:class:`SharedSpanTable`): both behave the same."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

import pytest

from cutfs.vfs.fuse.fs_error import FsError
from cutfs.vfs.tree.span_table import SharedSpanTable, SpanTable

Table = SpanTable | SharedSpanTable
MakeTable = Callable[[int, int], Table]


@pytest.fixture(params=["one process", "shared"])
def make_table(request: pytest.FixtureRequest, tmp_path: Path) -> MakeTable:
    def make(base: int, capacity: int) -> Table:
        if request.param == "one process":
            return SpanTable(base=base, capacity=capacity)
        path = str(tmp_path / "time-ranges")
        SharedSpanTable.create(path, capacity)
        return SharedSpanTable(path, base, capacity)

    return make


def test_a_range_lives_while_the_kernel_holds_a_reference(
    make_table: Callable[[int, int], Table],
) -> None:
    table = make_table(1000, 8)
    first = table.acquire((0, 10, 20), user=5)
    assert table.acquire((0, 10, 20), user=5) == first  # two lookups, one inode
    assert table.get(first) == (0, 10, 20)
    table.forget(first, 1)
    assert table.get(first) == (0, 10, 20)
    table.forget(first, 1)
    assert table.get(first) is None and len(table) == 0
    table.forget(first, 1)  # a forget of what is gone is ignored


def test_one_user_cannot_take_every_range(make_table: MakeTable) -> None:
    table = make_table(1000, 8)
    taken = [table.acquire((0, n, n + 1), user=7) for n in range(2)]
    with pytest.raises(FsError) as refused:
        table.acquire((0, 99, 100), user=7)  # a quarter of 8 is 2
    assert refused.value.errno == errno.ENFILE
    others = [table.acquire((1, n, n + 1), user=8) for n in range(2)]
    assert len(table) == 4 and len(set(taken + others)) == 4
    table.forget(taken[0], 1)
    assert table.acquire((0, 99, 100), user=7) > max(taken + others)  # room again


def test_the_whole_table_is_bounded(make_table: MakeTable) -> None:
    table = make_table(1000, 8)
    for user in range(4):
        for n in range(2):
            table.acquire((user, n, n + 1), user=user)
    with pytest.raises(FsError):
        table.acquire((9, 0, 1), user=9)


def test_processes_sharing_a_table_agree(tmp_path: Path) -> None:
    path = str(tmp_path / "time-ranges")
    SharedSpanTable.create(path, 8)
    one, other = SharedSpanTable(path, 1000, 8), SharedSpanTable(path, 1000, 8)
    inode = one.acquire((3, 100, 200), user=5)
    assert other.get(inode) == (3, 100, 200)  # looked up in one process, read in another
    assert other.acquire((3, 100, 200), user=5) == inode
    one.forget(inode, 1)
    other.forget(inode, 1)
    assert one.get(inode) is None and other.get(inode) is None and len(one) == 0
    again = other.acquire((3, 100, 200), user=5)  # the slot is reused, under a new inode
    assert again != inode and one.get(inode) is None and one.get(again) == (3, 100, 200)


def test_a_shared_table_of_another_size_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "time-ranges")
    SharedSpanTable.create(path, 8)
    with pytest.raises(ValueError, match="not a table of 16 time ranges"):
        SharedSpanTable(path, 1000, 16)
