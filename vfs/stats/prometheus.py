"""The statistics of a mount in Prometheus' text exposition format (``.cutfs/metrics``).

Node fleets are watched with Prometheus: node_exporter's textfile collector
reads ``*.prom`` files, so a timer can copy ``MOUNTPOINT/.cutfs/metrics`` (or
``cutfs stats --prometheus MOUNTPOINT``) into its directory.  Names follow
Prometheus' conventions: ``cutfs_`` prefix, ``_total`` for counters, base
units (seconds, bytes), labels for kinds.

Latencies are histograms with fixed ``le`` edges.  The mount keeps them in
quarter-octave buckets (:class:`cutfs.vfs.stats.statistics.Histogram`); a bucket is
counted under the first edge at or above its upper end, so an observation up
to 19% below an edge may be counted under the next edge instead.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any, Final

from cutfs.vfs.stats.statistics import Histogram, Statistics

#: ``le`` edges of the latency histograms, in seconds.
LATENCY_EDGES_SECONDS: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
_LABEL_UNSAFE: Final = re.compile(r'[\\"\n]')


def render_metrics(statistics: Statistics, sections: Mapping[str, Mapping[str, Any]]) -> str:
    """The exposition text: counters, errors, requests and latencies from ``statistics``;
    gauges (counters for ``store``) from ``sections`` (``cache``, ``workers``, ``shards``,
    ``store``, ``views``, ``serving``: name -> number; other values are left out)."""
    lines: list[str] = []
    lines += _family(
        "cutfs_uptime_seconds",
        "gauge",
        "Seconds since the mount started.",
        [({}, _uptime(statistics))],
    )
    requests = {
        k.removeprefix("requests."): v
        for k, v in statistics.counters.items()
        if k.startswith("requests.")
    }
    others = {k: v for k, v in statistics.counters.items() if not k.startswith("requests.")}
    lines += _family(
        "cutfs_requests_total",
        "counter",
        "FUSE requests answered, by kind.",
        [({"kind": kind}, count) for kind, count in sorted(requests.items())],
    )
    lines += _family(
        "cutfs_errors_total",
        "counter",
        "Requests that failed, by kind of failure.",
        [({"kind": kind}, count) for kind, count in sorted(statistics.errors.items())],
    )
    for name, value in sorted(others.items()):
        metric = "cutfs_" + _metric_name(name) + "_total"
        lines += _family(
            metric, "counter", "A counter of the mount (named by the metric).", [({}, value)]
        )
    lines += _histograms(statistics.latencies)
    for section, values in sorted(sections.items()):
        for name, value in sorted(values.items()):
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            metric = f"cutfs_{_metric_name(section)}_{_metric_name(name)}"
            counter = name in _COUNTER_FIELDS or section in _COUNTER_SECTIONS
            kind = "counter" if counter else "gauge"
            if kind == "counter":
                metric += "_total"
            lines += _family(metric, kind, _SECTION_HELP.get(section, _OTHER_HELP), [({}, value)])
    return "\n".join(lines) + "\n"


#: The HELP text of each section's figures: fixed strings, never names from the data.
_SECTION_HELP: Final = {
    "cache": "A figure of the mount's block cache (named by the metric).",
    "workers": "A figure of the mount's decoder workers (named by the metric).",
    "shards": "A figure of the mount's shards or source (named by the metric).",
    "store": "A figure of the mount's byte store (named by the metric).",
    "views": "A figure of the mount's views (named by the metric).",
    "indexing": "A figure of the mount's indexing of recordings (named by the metric).",
    "serving": "A figure of the mount's supervisor and serving processes (named by the metric).",
}
_OTHER_HELP: Final = "A figure of the mount (named by the metric)."
#: Fields of the sections that only ever grow.
_COUNTER_FIELDS: Final = frozenset({"hits", "misses", "restarts"})
#: Sections all of whose fields only ever grow.
_COUNTER_SECTIONS: Final = frozenset({"store"})


def _histograms(latencies: Mapping[str, Histogram]) -> list[str]:
    lines = [
        "# HELP cutfs_latency_seconds Time spent per phase of the read path.",
        "# TYPE cutfs_latency_seconds histogram",
    ]
    for phase, histogram in sorted(latencies.items()):
        labels = {"phase": phase}
        for edge, count in zip(
            LATENCY_EDGES_SECONDS, histogram.cumulative(LATENCY_EDGES_SECONDS), strict=True
        ):
            lines.append(
                _sample("cutfs_latency_seconds_bucket", {**labels, "le": _number(edge)}, count)
            )
        lines.append(
            _sample("cutfs_latency_seconds_bucket", {**labels, "le": "+Inf"}, histogram.count)
        )
        lines.append(_sample("cutfs_latency_seconds_sum", labels, histogram.total_seconds))
        lines.append(_sample("cutfs_latency_seconds_count", labels, histogram.count))
    return lines


def _family(
    name: str, kind: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]]
) -> list[str]:
    rows = [_sample(name, labels, value) for labels, value in samples]
    if not rows:
        return []
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *rows]


def _sample(name: str, labels: Mapping[str, str], value: float) -> str:
    if labels:
        rendered = ",".join(f'{key}="{_escape(str(val))}"' for key, val in labels.items())
        return f"{name}{{{rendered}}} {_number(value)}"
    return f"{name} {_number(value)}"


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _escape(text: str) -> str:
    return _LABEL_UNSAFE.sub(lambda match: {"\\": "\\\\", '"': '\\"', "\n": "\\n"}[match[0]], text)


def _metric_name(text: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", text)


def _uptime(statistics: Statistics) -> float:
    return round(time.time() - statistics.started, 3)


#: The lines of the exposition format cutfs writes: comments on its own families, and
#: samples of them (labels quoted and escaped, a number).
_EXPOSITION_LINE: Final = re.compile(
    r"# (HELP|TYPE) cutfs_[a-zA-Z0-9_]+ [ -~]*"
    r'|cutfs_[a-zA-Z0-9_]+(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\.)*",?)*\})? '
    r"(-?[0-9.eE+-]+|[+-]Inf|NaN)"
)


def exposition_lines(text: str) -> str:
    """The lines of ``text`` (a ``.cutfs/metrics`` file) that are lines cutfs writes; others
    are dropped, so that what reaches node_exporter's textfile collector is cutfs's own
    families only, whatever a serving process wrote."""
    kept = [line for line in text.splitlines() if _EXPOSITION_LINE.fullmatch(line)]
    return "".join(f"{line}\n" for line in kept)
