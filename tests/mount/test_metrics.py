"""A mount's statistics in Prometheus' text format, from the file and from ``cutfs stats``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.mounts import CUTFS, mounted, needs_fuse


@needs_fuse
@pytest.mark.mount
def test_metrics_parse_as_prometheus_text(shard_dir: str, tmp_path: Path) -> None:
    with mounted(shard_dir, str(tmp_path / "mnt"), "--serving-processes", "1") as mountpoint:
        with open(Path(mountpoint) / "cuts" / "flac_mono_16k" / "start.wav", "rb") as cut:
            assert len(cut.read()) > 44
        text = (Path(mountpoint) / ".cutfs" / "metrics").read_text()
        printed = subprocess.run(
            [*CUTFS, "stats", "--prometheus", mountpoint],
            capture_output=True,
            text=True,
            check=False,
        )
    assert printed.returncode == 0
    families = {family.name: family for family in text_string_to_metric_families(text)}
    printed_families = {family.name for family in text_string_to_metric_families(printed.stdout)}
    assert printed_families == set(families)
    requests = {s.labels["kind"]: s.value for s in families["cutfs_requests"].samples}
    assert requests["read"] >= 1 and requests["lookup"] >= 1
    assert families["cutfs_requests"].type == "counter"
    latency = families["cutfs_latency_seconds"]
    assert latency.type == "histogram"
    reads = [s for s in latency.samples if s.labels.get("phase") == "read"]
    buckets = [s.value for s in reads if s.name.endswith("_bucket")]
    assert buckets == sorted(buckets)  # cumulative
    count = next(s.value for s in reads if s.name.endswith("_count"))
    assert buckets[-1] == count >= 1
    # One serving process decoding in turn: no decoder worker; it and the supervisor run.
    assert families["cutfs_workers_alive"].samples[0].value == 0
    assert families["cutfs_serving_running"].samples[0].value == 2
    assert families["cutfs_serving_ready"].samples[0].value == 2
    assert families["cutfs_serving_restarts"].type == "counter"
    assert families["cutfs_cache_capacity_bytes"].type == "gauge"
