"""Counters and latency histograms of a mount, published as ``.cutfs/stats``.

Everything here is updated from the trio thread only, so it needs no locks.
Recording an event costs a dictionary update; latencies go into fixed
logarithmic buckets, so memory stays constant however long the mount runs.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any, Final

_BUCKETS_PER_OCTAVE: Final = 4
_SMALLEST_SECONDS: Final = 1e-6


class Histogram:
    """Latencies in buckets a quarter-octave wide (about 19% relative precision)."""

    def __init__(self) -> None:
        self._buckets: Counter[int] = Counter()
        self.count = 0
        self.total_seconds = 0.0
        self.max_seconds = 0.0

    def record(self, seconds: float) -> None:
        self.count += 1
        self.total_seconds += seconds
        self.max_seconds = max(self.max_seconds, seconds)
        ratio = max(seconds, _SMALLEST_SECONDS) / _SMALLEST_SECONDS
        self._buckets[int(math.log2(ratio) * _BUCKETS_PER_OCTAVE)] += 1

    def quantile(self, fraction: float) -> float:
        """The upper edge of the bucket holding the ``fraction`` quantile, in seconds."""
        if self.count == 0:
            return 0.0
        rank = fraction * self.count
        seen = 0
        for bucket in sorted(self._buckets):
            seen += self._buckets[bucket]
            if seen >= rank:
                edge = _SMALLEST_SECONDS * 2 ** ((bucket + 1) / _BUCKETS_PER_OCTAVE)
                return min(edge, self.max_seconds)
        return self.max_seconds

    def cumulative(self, edges_seconds: Iterable[float]) -> list[int]:
        """For each edge, the observations in buckets whose upper end is at or below it."""
        upper_ends = sorted(
            (_SMALLEST_SECONDS * 2 ** ((bucket + 1) / _BUCKETS_PER_OCTAVE), count)
            for bucket, count in self._buckets.items()
        )
        counts = []
        for edge in edges_seconds:
            counts.append(sum(count for end, count in upper_ends if end <= edge))
        return counts

    def export(self) -> dict[str, Any]:
        """The histogram as JSON-ready data, for :meth:`absorb` in another process."""
        return {
            "buckets": {str(bucket): count for bucket, count in self._buckets.items()},
            "count": self.count,
            "total_seconds": self.total_seconds,
            "max_seconds": self.max_seconds,
        }

    def absorb(self, exported: dict[str, Any]) -> None:
        """Add another histogram's observations (from :meth:`export`)."""
        buckets = {
            int(bucket): checked_count(count) for bucket, count in exported["buckets"].items()
        }
        if any(abs(bucket) > _MOST_BUCKET for bucket in buckets):
            raise ValueError("a histogram bucket out of range")
        seconds = float(exported["total_seconds"]), float(exported["max_seconds"])
        if not all(math.isfinite(value) and value >= 0 for value in seconds):
            raise ValueError("histogram seconds out of range")
        for bucket, count in buckets.items():
            self._buckets[bucket] += count
        self.count += checked_count(exported["count"])
        self.total_seconds += seconds[0]
        self.max_seconds = max(self.max_seconds, seconds[1])

    def summary(self) -> dict[str, float]:
        mean = self.total_seconds / self.count if self.count else 0.0
        return {
            "count": self.count,
            "mean_ms": round(mean * 1000, 3),
            "p50_ms": round(self.quantile(0.5) * 1000, 3),
            "p99_ms": round(self.quantile(0.99) * 1000, 3),
            "max_ms": round(self.max_seconds * 1000, 3),
        }


class Statistics:
    """What a mount has done since it started."""

    def __init__(self) -> None:
        self.started = time.time()
        self.counters: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.latencies: dict[str, Histogram] = {}

    def count(self, name: str, amount: int = 1) -> None:
        self.counters[name] += amount

    def error(self, kind: str) -> None:
        self.errors[kind] += 1

    def observe(self, phase: str, seconds: float) -> None:
        histogram = self.latencies.get(phase)
        if histogram is None:
            histogram = self.latencies[phase] = Histogram()
        histogram.record(seconds)

    def snapshot(self, **sections: Any) -> dict[str, Any]:
        """A JSON-ready picture of the counters, plus the caller's own sections."""
        return {
            "uptime_seconds": round(time.time() - self.started, 3),
            "counters": dict(sorted(self.counters.items())),
            "errors": dict(sorted(self.errors.items())),
            "latency": {phase: h.summary() for phase, h in sorted(self.latencies.items())},
            **sections,
        }

    def export(self) -> dict[str, Any]:
        """Everything counted, as JSON-ready data (see :meth:`absorb`)."""
        return {
            "started": self.started,
            "counters": dict(self.counters),
            "errors": dict(self.errors),
            "latencies": {phase: h.export() for phase, h in self.latencies.items()},
        }

    def absorb(self, exported: dict[str, Any]) -> None:
        """Add what another process counted (its :meth:`export`) to this one.

        What another process published is data from a process that runs as the source's
        owner: every name must be a :func:`checked_name` and every count a
        :func:`checked_count`, else ValueError (and nothing should be kept of it: absorb
        into a fresh :class:`Statistics` first)."""
        self.started = min(self.started, float(exported["started"]))
        self.counters.update(_checked_counts(exported["counters"]))
        self.errors.update(_checked_counts(exported["errors"]))
        for phase, histogram in exported["latencies"].items():
            self.latencies.setdefault(checked_name(phase), Histogram()).absorb(histogram)

    def copy(self) -> Statistics:
        """An independent copy (to add other processes' figures to)."""
        copied = Statistics()
        copied.absorb(self.export())
        copied.started = self.started
        return copied


#: Quarter-octave buckets span 2**-64 s to 2**64 s at most.
_MOST_BUCKET: Final = 4 * 64
#: What a counter, error or phase may be called: what cutfs's own names are made of.
_NAME: Final = re.compile(r"[A-Za-z0-9_.:-]{1,80}")
#: The most a count may be (a JSON integer can be of any size).
MOST_COUNT: Final = 1 << 62


def checked_name(name: object) -> str:
    """``name`` if it is a name cutfs could have given (letters, digits, ``_.:-``, at
    most 80 characters); ValueError else (a name with a line break or an escape sequence
    must never reach a terminal or Prometheus)."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise ValueError(f"not a statistics name: {name!r:.100}")
    return name


def checked_count(count: object) -> int:
    """``count`` if it is an integer in [0, 2**62]; ValueError else."""
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MOST_COUNT:
        raise ValueError(f"not a count: {count!r:.100}")
    return count


def _checked_counts(counts: Any) -> dict[str, int]:
    if not isinstance(counts, dict):
        raise ValueError("counts are not a mapping")
    return {checked_name(name): checked_count(count) for name, count in counts.items()}
