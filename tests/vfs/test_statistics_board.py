"""Statistics of several serving processes added up through the board they share."""

from __future__ import annotations

from pathlib import Path

from cutfs.vfs.stats.statistics import Statistics
from cutfs.vfs.stats.statistics_board import StatisticsBoard


def _counted(reads: int, seconds: float) -> Statistics:
    statistics = Statistics()
    statistics.count("requests.read", reads)
    statistics.error("corrupt_data")
    for _ in range(reads):
        statistics.observe("read", seconds)
    return statistics


def test_figures_of_every_process_add_up(tmp_path: Path) -> None:
    daemon, other = StatisticsBoard(str(tmp_path), 0, 3), StatisticsBoard(str(tmp_path), 1, 3)
    other.publish(
        _counted(30, 0.010),
        {"cache": {"hits": 5, "capacity_bytes": 100}, "shards": {"recordings": 7}},
    )
    total, sections = daemon.combine(
        _counted(10, 0.001),
        {"cache": {"hits": 1, "capacity_bytes": 100}, "shards": {"recordings": 7}},
    )
    assert total.counters["requests.read"] == 40 and total.errors["corrupt_data"] == 2
    assert total.latencies["read"].count == 40
    assert 0.008 <= total.latencies["read"].quantile(0.5) <= 0.012  # 30 of 40 took 10 ms
    assert sections["cache"] == {"hits": 6, "capacity_bytes": 200}
    assert sections["shards"] == {"recordings": 7}  # the same in every process: not added
    # process 2 has not published yet: it is not counted
    assert sections["serving"]["counted"] == 2
    assert sections["serving"]["requests_by_process"] == [10, 30, None]


def test_an_unreadable_file_is_left_out(tmp_path: Path) -> None:
    (tmp_path / "1.json").write_text('{"statistics": {"counters": "not a mapping"}}')
    (tmp_path / "2.json").write_text("not json")
    total, sections = StatisticsBoard(str(tmp_path), 0, 3).combine(_counted(4, 0.001), {})
    assert total.counters["requests.read"] == 4
    assert sections["serving"]["counted"] == 1
