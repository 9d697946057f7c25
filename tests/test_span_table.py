"""The table of time-range inodes: kernel references, forgetting, and per-user shares."""

from __future__ import annotations

import errno

import pytest

from cutfs.vfs.fs_error import FsError
from cutfs.vfs.span_table import SpanTable


def test_a_range_lives_while_the_kernel_holds_a_reference() -> None:
    table = SpanTable(base=1000, capacity=8)
    first = table.acquire((0, 10, 20), user=5)
    assert table.acquire((0, 10, 20), user=5) == first  # two lookups, one inode
    assert table.get(first) == (0, 10, 20)
    table.forget(first, 1)
    assert table.get(first) == (0, 10, 20)
    table.forget(first, 1)
    assert table.get(first) is None and len(table) == 0
    table.forget(first, 1)  # a forget of what is gone is ignored


def test_one_user_cannot_take_every_range() -> None:
    table = SpanTable(base=1000, capacity=8)
    taken = [table.acquire((0, n, n + 1), user=7) for n in range(2)]
    with pytest.raises(FsError) as refused:
        table.acquire((0, 99, 100), user=7)  # a quarter of 8 is 2
    assert refused.value.errno == errno.ENFILE
    others = [table.acquire((1, n, n + 1), user=8) for n in range(2)]
    assert len(table) == 4 and len(set(taken + others)) == 4
    table.forget(taken[0], 1)
    assert table.acquire((0, 99, 100), user=7) > max(taken + others)  # room again


def test_the_whole_table_is_bounded() -> None:
    table = SpanTable(base=1000, capacity=8)
    for user in range(4):
        for n in range(2):
            table.acquire((user, n, n + 1), user=user)
    with pytest.raises(FsError):
        table.acquire((9, 0, 1), user=9)
