"""The read-ahead board without a mount: where tripwires are, which jobs a reader's reads
post, and the shared cell slots, across real processes where it matters."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator

import pytest

from cutfs.vfs.fuse import read_ahead
from cutfs.vfs.fuse.read_ahead import CELL_BYTES, PAGE_BYTES, WAITING, CellFile, ReadAhead

INODE = 1 << 41
#: A file of 9 cells and a bit (a 20-minute recording of 16 kHz mono).
SIZE_BYTES = 38_400_044
FILE = CellFile(INODE, SIZE_BYTES, 12345)
OTHER = CellFile(INODE + 1, SIZE_BYTES, 678)


@pytest.fixture
def board() -> Iterator[ReadAhead]:
    made = ReadAhead.create(4)
    try:
        yield made
    finally:
        made.close()


def _posted(board: ReadAhead) -> list[tuple[int, int]]:
    """The jobs queued, in order (taken off the queue)."""
    jobs = []
    while (job := board.take()) is not None:
        jobs.append((job.inode, job.cell))
    return jobs


def test_pushes_and_cells_leave_exactly_the_tripwires_out() -> None:
    covered = bytearray(SIZE_BYTES // PAGE_BYTES + 1)
    last_cell = (SIZE_BYTES - 1) // CELL_BYTES
    for cell in range(last_cell + 1):
        start, end = ReadAhead.cell_span(cell, SIZE_BYTES)
        assert start == cell * CELL_BYTES
        for page in range(start // PAGE_BYTES, -(-end // PAGE_BYTES)):
            covered[page] += 1
        # A push from anywhere in the cell stops where the cell's pushed bytes end.
        assert ReadAhead.push_end(start + 12345, SIZE_BYTES) == end
    tripwires = [
        page for page, count in enumerate(covered[: -(-SIZE_BYTES // PAGE_BYTES)]) if not count
    ]
    assert tripwires == [(cell + 1) * CELL_BYTES // PAGE_BYTES - 1 for cell in range(last_cell)]
    assert all(ReadAhead.is_tripwire(page * PAGE_BYTES, SIZE_BYTES) for page in tripwires)
    assert max(covered) == 1
    # A push that starts on a tripwire stops there: the reader must ask for it.
    assert ReadAhead.push_end(CELL_BYTES - PAGE_BYTES, SIZE_BYTES) == CELL_BYTES - PAGE_BYTES
    # A file of under two cells has no tripwire: pushes go to its end.
    assert ReadAhead.push_end(0, 2 * CELL_BYTES - 1) == 2 * CELL_BYTES - 1
    assert ReadAhead.cell_of(0, 4096, 2 * CELL_BYTES - 1) is None


def test_a_reader_in_order_gets_each_cell_posted_once_the_window_doubling(
    board: ReadAhead,
) -> None:
    posted_after: list[list[int]] = []
    for offset in range(0, SIZE_BYTES, 128 << 10):
        board.on_read(INODE, offset, 128 << 10, SIZE_BYTES)
        if ReadAhead.is_tripwire(offset + (128 << 10) - PAGE_BYTES, SIZE_BYTES):
            posted_after.append([cell for _, cell in _posted(board)])
    assert posted_after[:4] == [[1], [2, 3], [4, 5, 6], [7]]  # 1, 2, then 4 ahead
    assert sorted(cell for cells in posted_after for cell in cells) == list(range(1, 10))
    assert board.counts["posted"] == 9
    # The file read again from the start (its pages evicted): read ahead again.
    board.on_read(INODE, CELL_BYTES - PAGE_BYTES, PAGE_BYTES, SIZE_BYTES)
    assert [cell for _, cell in _posted(board)] == [1]


def test_reads_of_scattered_windows_post_no_more_than_one_cell_each(board: ReadAhead) -> None:
    rng = random.Random(3)
    windows = 200
    for _ in range(windows):
        offset = rng.randrange(0, SIZE_BYTES - (1 << 20)) // PAGE_BYTES * PAGE_BYTES
        board.on_read(INODE, offset, 1 << 20, SIZE_BYTES)
    posted = _posted(board)
    # About a quarter of 1 MiB windows touch a tripwire; a window in a new place starts
    # over at one cell ahead (two tripwires in order are needed for more).
    assert 0 < len(posted) <= windows // 2
    assert max(cell for _, cell in posted) <= (SIZE_BYTES - 1) // CELL_BYTES


def test_jobs_passed_by_their_reader_or_too_old_are_dropped(
    board: ReadAhead, monkeypatch: pytest.MonkeyPatch
) -> None:
    tripwire = CELL_BYTES - PAGE_BYTES
    board.on_read(INODE, tripwire, PAGE_BYTES, SIZE_BYTES)  # posts cell 1
    board.on_read(INODE, tripwire + 2 * CELL_BYTES, PAGE_BYTES, SIZE_BYTES)  # past cell 2
    assert [job.cell for job in iter(board.take, None)] == [3]  # cell 1 was passed
    # Only cells ahead of the reader count as posted: a read behind it decodes as usual.
    assert board.is_posted(INODE, 3) and not board.is_posted(INODE, 1)
    assert not board.is_posted(INODE, 2) and not board.is_posted(INODE, 4)
    board.on_read(INODE + 1, tripwire, PAGE_BYTES, SIZE_BYTES)
    monkeypatch.setattr(read_ahead, "JOB_SECONDS", -1.0)
    assert board.take() is None
    assert board.counts["dropped"] == 2


def test_a_cell_slot_is_claimed_once_filled_once_and_read_as_filled(board: ReadAhead) -> None:
    data = os.urandom(CELL_BYTES - PAGE_BYTES)
    claim = board.claim(FILE, 2)
    assert claim is not None
    assert board.claim(FILE, 2) is None  # being filled
    assert board.cell_read(FILE, 2, 0, 10) is WAITING
    assert board.cell_read(FILE, 3, 0, 10) is None
    assert board.fill(claim, data)
    assert board.cell_read(FILE, 2, 4096, 65536) == data[4096 : 4096 + 65536]
    # The same inode naming another file (a time range's inode, reused) is not served.
    assert board.cell_read(CellFile(INODE, SIZE_BYTES, 999), 2, 0, 10) is None
    assert board.cell_read(FILE, 2, len(data) - 1, 2) is None  # past what the slot holds
    assert board.claim(FILE, 2) is None  # held
    # The empty slots first, then the ready one (its cell no longer read), then none.
    claims = [board.claim(OTHER, cell) for cell in range(11)]
    assert all(claim is not None for claim in claims[:10]) and claims[10] is None
    assert board.cell_read(FILE, 2, 0, 10) is None


def test_a_slot_whose_filler_died_is_taken_back_at_once(board: ReadAhead) -> None:
    """A serving process killed while it fills a cell: the others do not wait for it."""
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        claimed = board.claim(FILE, 5)
        os._exit(0 if claimed is not None else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert board.cell_read(FILE, 5, 0, 10) is None  # not WAITING: its filler is gone
    claim = board.claim(FILE, 5)
    assert claim is not None
    assert board.fill(claim, b"x" * 100)
    assert board.cell_read(FILE, 5, 0, 100) == b"x" * 100


def test_a_fill_after_the_slot_was_taken_back_writes_nothing(
    board: ReadAhead, monkeypatch: pytest.MonkeyPatch
) -> None:
    late = board.claim(FILE, 1)
    assert late is not None
    monkeypatch.setattr(read_ahead, "STALE_SECONDS", -1.0)  # the filler hangs
    taker = board.claim(FILE, 1)
    assert taker is not None and taker.slot == late.slot
    assert board.fill(taker, b"a" * 50)
    assert not board.fill(late, b"b" * 50)
    assert board.cell_read(FILE, 1, 0, 50) == b"a" * 50
