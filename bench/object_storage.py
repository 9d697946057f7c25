#!/usr/bin/env python3
"""Shards in object storage against the same shards on local disk, side by side.

    npm install --prefix bench/out s3rver@3     # once: the S3 server on loopback
    .venv/bin/python bench/object_storage.py    # a few minutes on 2 cores

The corpus is bench/run.py's two-hour recordings (FLAC, MP3, Opus; 16 kHz mono), packed
once and uploaded to s3rver on 127.0.0.1.  s3rver is fast (2-3 ms per ranged GET) but
ignores If-Match: correctness is tested against moto in the test suite, this measures
latency and requests.  Three mounts of the same shards are read cut by cut, interleaved:

* ``local``: the shard directory on local disk;
* ``s3 cold``: ``s3://`` with an empty piece cache (a fresh one per recording);
* ``s3 disk cache``: ``s3://``, a fresh daemon whose piece cache already holds the cuts
  (filled by an earlier mount, as a second mount on the same node would find it).

Before every read the kernel page cache is dropped, so "cold" means no byte of the cut is
in memory anywhere.  Every cut is read whole (open, read, close).  Per cut, the store's
counters in ``.cutfs/stats`` give the GETs and bytes fetched; the compressed span of a
cut is the byte range between the seek points around it.  After each cut, the span alone
is fetched straight from s3rver and read from the local shard (both cold), so that what
the test server itself costs is told apart from what cutfs adds.  Results go to
docs/bench/object-storage.{md,json}; the machine is shared and noisy: compare medians and
ratios within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from run import CUT_SECONDS, RATE, Cut, Setup, _drop_caches, _machine, _prepare, _unmount

from cutfs.codec.catalogue.shard_set import ShardSet
from cutfs.codec.catalogue.shard_upload import upload_shards
from cutfs.codec.storage.object_location import ObjectLocation
from cutfs.codec.storage.object_store import ObjectStore

REPOSITORY = Path(__file__).resolve().parent.parent
CUTFS = [sys.executable, "-m", "cutfs.vfs.cli"]
BUCKET = "bench"
STORE_FIELDS = ("gets", "bytes_fetched")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=REPOSITORY / "bench" / "out")
    parser.add_argument("--out", type=Path, default=REPOSITORY / "docs" / "bench")
    parser.add_argument("--samples", type=int, default=16, help="cold cuts per recording")
    parser.add_argument("--s3rver", help="the s3rver command (default: bench/out's npm install)")
    parser.add_argument(
        "--s3rver-data",
        type=Path,
        help="where s3rver keeps its objects (default: WORK/s3rver-data, on disk; a tmpfs "
        "directory such as /dev/shm/cutfs-s3rver keeps them in memory: the server's own "
        "disk reads then leave the cold figures)",
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("run as root: cold reads drop the kernel page cache")
    s3rver = args.s3rver or str(args.work / "node_modules" / ".bin" / "s3rver")
    if shutil.which(s3rver) is None:
        parser.error(f"no s3rver at {s3rver}: npm install --prefix {args.work} s3rver@3")
    os.environ.update(
        AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY="S3RVER", AWS_DEFAULT_REGION="us-east-1"
    )
    setup = _prepare(args.work, {"2h": 7200.0}, args.samples)
    server_data = args.s3rver_data or args.work / "s3rver-data"
    with _s3rver(s3rver, server_data) as endpoint:
        uri = _uploaded(setup, endpoint)
        results: dict[str, Any] = {"machine": _machine(), "uri": uri.split("?")[0]}
        results["server_data"] = (
            "on disk" if args.s3rver_data is None else f"in {args.s3rver_data} (given)"
        )
        results["cuts"] = _cold_cuts(setup, uri, endpoint)
        results["throughput"] = _throughput(setup, uri)
        with _delayed(uri, endpoint, REQUEST_DELAY_MS) as delayed_uri:
            results["sequential"] = _sequential(setup, uri, delayed_uri)
    results["summary"] = _summary(results["cuts"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "object-storage.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "object-storage.md").write_text(_markdown(results))
    print(_markdown(results))
    return 0


@contextmanager
def _s3rver(command: str, data: Path) -> Iterator[str]:
    port = _free_port()
    data.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [command, "-d", str(data), "-a", "127.0.0.1", "-p", str(port), "-s"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_port(port, "s3rver")
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for_port(port: int, what: str, timeout_seconds: float = 30.0) -> None:
    """Return once something listens on 127.0.0.1:``port``; raise after the timeout."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.05)


def _uploaded(setup: Setup, endpoint: str) -> str:
    uri = f"s3://{BUCKET}/{setup.shards.name}?endpoint_override={endpoint}&scheme=http"
    import botocore.session  # noqa: PLC0415 - only once the server runs

    client = botocore.session.get_session().create_client("s3", endpoint_url=f"http://{endpoint}")
    with contextlib.suppress(
        client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists
    ):
        client.create_bucket(Bucket=BUCKET)
    client.close()
    store = ObjectStore(ObjectLocation.from_uri(uri))
    try:
        present = store.exists("manifest.json")
    finally:
        store.close()
    if not present:
        print("bench: uploading the shards to s3rver", flush=True)
        upload_shards(str(setup.shards), uri)
    return uri


class Mount:
    """One ``cutfs mount`` of the shards, restartable, with its store counters."""

    def __init__(self, source: str, path: Path, cache: Path | None = None) -> None:
        self.source, self.path, self.cache = source, path, cache
        path.mkdir(parents=True, exist_ok=True)

    def restart(self, *, empty_cache: bool = False) -> None:
        _unmount(self.path)
        options = []
        if self.cache is not None:
            if empty_cache:
                shutil.rmtree(self.cache, ignore_errors=True)
            options = ["--cache-dir", str(self.cache)]
        subprocess.run(
            [*CUTFS, "mount", *options, self.source, str(self.path)], check=True, cwd=REPOSITORY
        )

    def store(self) -> dict[str, int]:
        stats = json.loads((self.path / ".cutfs" / "stats").read_text())
        return dict(stats.get("store", {}))

    def cut(self, cut: Cut) -> Path:
        return self.path / "cuts" / f"{cut.cut_id}.wav"

    def stop(self) -> None:
        _unmount(self.path)


def _timed_read(path: Path) -> float:
    _drop_caches()
    started = time.perf_counter()
    with open(path, "rb") as file:
        file.read()
    return (time.perf_counter() - started) * 1000


def _span_bytes(shards: ShardSet, cut: Cut) -> int:
    """The compressed bytes between the seek points around a cut (what decoding it needs)."""
    start, stop = _span(shards, cut)[1:]
    return stop - start


def _span(shards: ShardSet, cut: Cut) -> tuple[str, int, int]:
    """The shard holding a cut's compressed span, and the span's byte range in it."""
    index = list(shards.recording_ids).index(cut.recording)
    recording = shards.recording(index)
    first = round(cut.start_seconds * RATE)
    end = first + round(CUT_SECONDS * RATE)
    seek = recording.seek_index
    start = seek.point_at_or_before(first - recording.preroll_frames).byte_offset
    after = seek.first_point_after(end)
    stop = after.byte_offset if after is not None else len(shards.blob(index))
    shard, blob_start, _ = shards.blob_location(index)
    return shard, blob_start + start, blob_start + stop


def _server_alone(setup: Setup, endpoint: str, span: tuple[str, int, int]) -> tuple[float, float]:
    """What the storage alone costs for a cut's span, cold (ms): a ranged GET of it
    straight from s3rver (unsigned, on a new connection: the server's own latency), and a
    ``pread`` of it from the local shard."""
    shard, start, stop = span
    host, port = endpoint.rsplit(":", 1)
    _drop_caches()
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    started = time.perf_counter()
    try:
        path = f"/{BUCKET}/{setup.shards.name}/{shard}"
        connection.request("GET", path, headers={"Range": f"bytes={start}-{stop - 1}"})
        reply = connection.getresponse()
        body = reply.read()
    finally:
        connection.close()
    get_ms = (time.perf_counter() - started) * 1000
    if reply.status != 206 or len(body) != stop - start:
        raise RuntimeError(f"s3rver answered {reply.status} with {len(body)} bytes")
    _drop_caches()
    descriptor = os.open(setup.shards / shard, os.O_RDONLY)
    started = time.perf_counter()
    try:
        os.pread(descriptor, stop - start, start)
    finally:
        os.close(descriptor)
    return get_ms, (time.perf_counter() - started) * 1000


def _cold_cuts(setup: Setup, uri: str, endpoint: str) -> list[dict[str, Any]]:
    root = setup.work / "mnt-s3"
    local = Mount(str(setup.shards), root / "local")
    cold = Mount(uri, root / "s3-cold", setup.work / "s3-cache-cold")
    cached = Mount(uri, root / "s3-cached", setup.work / "s3-cache-disk")
    rows: list[dict[str, Any]] = []
    try:
        with ShardSet(str(setup.shards)) as shards:
            for rid in sorted(setup.cuts):
                batch = setup.cuts[rid]
                cached.restart(empty_cache=True)  # fill its piece cache, then a fresh daemon
                for cut in batch:
                    _timed_read(cached.cut(cut))
                cached.restart()
                local.restart()
                cold.restart(empty_cache=True)
                for cut in batch:
                    row: dict[str, Any] = {"recording": rid, "cut": cut.cut_id}
                    # First: once the local mount has read the cut, its mapped pages of the
                    # shard stay in memory (a dropped page cache keeps mapped pages).
                    span = _span(shards, cut)
                    row["server_get_ms"], row["pread_ms"] = _server_alone(setup, endpoint, span)
                    row["span_bytes"] = _span_bytes(shards, cut)
                    row["local_ms"] = _timed_read(local.cut(cut))
                    before = cold.store()
                    row["s3_cold_ms"] = _timed_read(cold.cut(cut))
                    after = cold.store()
                    for name in after:
                        row[f"s3_{name}"] = after[name] - before.get(name, 0)
                    before = cached.store()
                    row["s3_disk_cache_ms"] = _timed_read(cached.cut(cut))
                    row["s3_disk_cache_gets"] = cached.store().get("gets", 0) - before.get(
                        "gets", 0
                    )
                    rows.append(row)
                print(
                    f"bench: {rid}: p50 local "
                    f"{_median(rows, rid, 'local_ms'):.1f} ms, s3 cold "
                    f"{_median(rows, rid, 's3_cold_ms'):.1f} ms, s3 disk cache "
                    f"{_median(rows, rid, 's3_disk_cache_ms'):.1f} ms",
                    flush=True,
                )
    finally:
        for mount in (local, cold, cached):
            mount.stop()
    return rows


def _median(rows: list[dict[str, Any]], rid: str, field: str) -> float:
    return statistics.median(row[field] for row in rows if row["recording"] == rid)


def _reader(paths: list[str]) -> int:
    for path in paths:
        with open(path, "rb") as file:
            file.read()
    return len(paths)


def _throughput(setup: Setup, uri: str) -> list[dict[str, Any]]:
    """Cold cuts per second with 1 to 8 readers splitting every cut of the corpus between
    them (fresh daemon, empty piece cache, page cache dropped before each round)."""
    root = setup.work / "mnt-s3"
    mounts = {
        "local": Mount(str(setup.shards), root / "local"),
        "s3": Mount(uri, root / "s3-cold", setup.work / "s3-cache-cold"),
    }
    cuts = [cut for rid in sorted(setup.cuts) for cut in setup.cuts[rid]]
    rows = []
    context = get_context("fork")
    try:
        for readers in (1, 2, 4, 8):
            for system, mount in mounts.items():
                mount.restart(empty_cache=True)
                paths = [str(mount.cut(cut)) for cut in cuts]
                shares = [paths[n::readers] for n in range(readers)]
                _drop_caches()
                started = time.perf_counter()
                with context.Pool(readers) as pool:
                    done = sum(pool.map(_reader, shares))
                seconds = time.perf_counter() - started
                rows.append(
                    {"system": system, "readers": readers, "cuts_per_second": done / seconds}
                )
                print(
                    f"bench: throughput {system:5s} {readers} readers: "
                    f"{done / seconds:.1f} cold cuts/s",
                    flush=True,
                )
    finally:
        for mount in mounts.values():
            mount.stop()
    return rows


#: How much of each recording the sequential reads take (15 minutes of 16 kHz mono).
SEQUENTIAL_SECONDS = 900.0
#: What each request to the store costs more in the sequential reads' third system.
REQUEST_DELAY_MS = 20


@contextmanager
def _delayed(uri: str, endpoint: str, delay_ms: int) -> Iterator[str]:
    """The URI of the same store behind bench/delay_proxy.py: every request ``delay_ms``
    later."""
    port = _free_port()
    proxy = subprocess.Popen(
        [
            *(sys.executable, str(Path(__file__).with_name("delay_proxy.py")), str(port)),
            *(endpoint.rsplit(":", 1)[1], str(delay_ms)),
        ]
    )
    try:
        _wait_for_port(port, "the delay proxy")
        yield uri.replace(endpoint, f"127.0.0.1:{port}")
    finally:
        proxy.terminate()
        proxy.wait()


def _sequential(setup: Setup, uri: str, delayed_uri: str) -> list[dict[str, Any]]:
    """The first :data:`SEQUENTIAL_SECONDS` of each whole recording read in order, in 1 MiB
    reads (what a diarization tool reading ``recordings/<id>.wav`` does): seconds of audio
    per second, and the GETs it took (fresh daemon, empty piece cache, page cache dropped);
    also from the store behind a proxy that delays each request."""
    root = setup.work / "mnt-s3"
    mounts = {
        "local": Mount(str(setup.shards), root / "local"),
        "s3": Mount(uri, root / "s3-cold", setup.work / "s3-cache-cold"),
        "s3 delayed": Mount(delayed_uri, root / "s3-delayed", setup.work / "s3-cache-delayed"),
    }
    rows = []
    try:
        for rid in sorted(setup.corpus):
            for system, mount in mounts.items():
                mount.restart(empty_cache=True)
                before = mount.store()
                _drop_caches()
                wanted = 44 + round(SEQUENTIAL_SECONDS * RATE) * 2
                got = 0
                started = time.perf_counter()
                with open(mount.path / "recordings" / f"{rid}.wav", "rb", buffering=0) as file:
                    while got < wanted and (chunk := file.read(1 << 20)):
                        got += len(chunk)
                seconds = time.perf_counter() - started
                after = mount.store()
                rows.append(
                    {
                        "recording": rid,
                        "system": system,
                        "audio_seconds_per_second": SEQUENTIAL_SECONDS / seconds,
                        "gets": after.get("gets", 0) - before.get("gets", 0),
                        "bytes_fetched": after.get("bytes_fetched", 0)
                        - before.get("bytes_fetched", 0),
                    }
                )
                print(f"bench: sequential {rid} {system}: {rows[-1]}", flush=True)
    finally:
        for mount in mounts.values():
            mount.stop()
    return rows


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by_recording: dict[str, Any] = {}
    for rid in sorted({row["recording"] for row in rows}):
        mine = [row for row in rows if row["recording"] == rid]
        local = statistics.median(row["local_ms"] for row in mine)
        cold = statistics.median(row["s3_cold_ms"] for row in mine)
        disk = statistics.median(row["s3_disk_cache_ms"] for row in mine)
        server = statistics.median(row["server_get_ms"] for row in mine)
        pread = statistics.median(row["pread_ms"] for row in mine)
        ratios = [row["s3_bytes_fetched"] / row["span_bytes"] for row in mine]
        by_recording[rid] = {
            "cuts": len(mine),
            "local_p50_ms": round(local, 2),
            "s3_cold_p50_ms": round(cold, 2),
            "s3_cold_minus_local_ms": round(cold - local, 2),
            "server_get_p50_ms": round(server, 2),
            "pread_p50_ms": round(pread, 2),
            # What cutfs adds over local beyond what the server itself adds over a pread.
            "s3_cold_minus_local_beyond_server_ms": round(cold - local - (server - pread), 2),
            "s3_disk_cache_p50_ms": round(disk, 2),
            "s3_disk_cache_over_local": round(disk / local, 3),
            "gets_per_cut_max": max(row["s3_gets"] for row in mine),
            "gets_per_cut_after_first_max": max(row["s3_gets"] for row in mine[1:]),
            "fetched_over_span_p50": round(statistics.median(ratios), 3),
            "fetched_over_span_max": round(max(ratios), 3),
            "fetched_minus_span_max_kib": round(
                max(row["s3_bytes_fetched"] - row["span_bytes"] for row in mine) / 1024, 1
            ),
            "span_kib_p50": round(statistics.median(row["span_bytes"] for row in mine) / 1024, 1),
            # The bound: at most 1.5x the compressed span + 256 KiB per cold cut.
            "cuts_over_byte_target": sum(
                row["s3_bytes_fetched"] > 1.5 * row["span_bytes"] + (256 << 10) for row in mine
            ),
            "disk_cache_gets": sum(row["s3_disk_cache_gets"] for row in mine),
        }
    sizes: dict[str, int] = {}
    for row in rows:
        for name, value in row.items():
            if name.startswith("s3_gets_up_to_"):
                key = name.removeprefix("s3_gets_up_to_")
                sizes[key] = sizes.get(key, 0) + value
    return {"recordings": by_recording, "get_sizes": sizes}


def _markdown(results: dict[str, Any]) -> str:
    summary = results["summary"]
    lines = [
        "# Shards in object storage (s3rver on loopback) against local disk",
        "",
        f"Generated by `bench/object_storage.py` on {results['machine']['date']}, "
        f"{results['machine']['cores']} cores. Cold: page cache dropped before "
        "every read; `s3 cold`: empty piece cache; `s3 disk cache`: a fresh daemon whose "
        "piece cache holds the cut. 10 s cuts of 2-hour recordings, read whole.",
        "",
        "| recording | cuts | local p50 ms | s3 cold p50 ms | s3 cold - local ms | "
        "s3 disk cache p50 ms | disk cache / local | GETs/cut max (after the first) | "
        "fetched / span p50 (max) | fetched - span max KiB | span p50 KiB | cuts over "
        "1.5 x span + 256 KiB | GETs from disk-cached mount |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for rid, row in summary["recordings"].items():
        lines.append(
            f"| {rid} | {row['cuts']} | {row['local_p50_ms']} | {row['s3_cold_p50_ms']} | "
            f"{row['s3_cold_minus_local_ms']:+} | {row['s3_disk_cache_p50_ms']} | "
            f"{row['s3_disk_cache_over_local']} | {row['gets_per_cut_max']} "
            f"({row['gets_per_cut_after_first_max']}) | {row['fetched_over_span_p50']} "
            f"({row['fetched_over_span_max']}) | {row['fetched_minus_span_max_kib']} | "
            f"{row['span_kib_p50']} | {row['cuts_over_byte_target']} | {row['disk_cache_gets']} |"
        )
    lines += [
        "",
        "The storage alone, in the same run: each cut's span fetched straight from s3rver by "
        "a ranged GET (cold, unsigned, on a new connection) against a cold `pread` of it from "
        f"the local shard. s3rver's data: {results.get('server_data', 'on disk')}.",
        "",
        "| recording | s3rver GET p50 ms | pread p50 ms | GET - pread ms | s3 cold - local ms "
        "| s3 cold - local beyond the server's own ms |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for rid, row in summary["recordings"].items():
        gap = row["server_get_p50_ms"] - row["pread_p50_ms"]
        lines.append(
            f"| {rid} | {row['server_get_p50_ms']} | {row['pread_p50_ms']} | {gap:+.2f} | "
            f"{row['s3_cold_minus_local_ms']:+} | "
            f"{row['s3_cold_minus_local_beyond_server_ms']:+} |"
        )
    lines += [
        "",
        "GET sizes (all cold cuts): "
        + ", ".join(f"up to {size}: {count}" for size, count in summary["get_sizes"].items()),
        "",
        "| readers | local cold cuts/s | s3 cold cuts/s | s3 / local |",
        "|--:|--:|--:|--:|",
    ]
    by_readers: dict[int, dict[str, float]] = {}
    for row in results["throughput"]:
        by_readers.setdefault(row["readers"], {})[row["system"]] = row["cuts_per_second"]
    for readers, systems in sorted(by_readers.items()):
        lines.append(
            f"| {readers} | {systems['local']:.1f} | {systems['s3']:.1f} | "
            f"{systems['s3'] / systems['local']:.2f} |"
        )
    lines += [
        "",
        f"The first {SEQUENTIAL_SECONDS:g} s of each recording read whole and in order "
        "(`recordings/<id>.wav`, 1 MiB reads), cold; `s3 delayed`: the same server behind "
        f"bench/delay_proxy.py, {REQUEST_DELAY_MS} ms more per request:",
        "",
        "| recording | local, s of audio per s | s3, s of audio per s | s3 / local | s3 GETs | "
        "s3 MB fetched | s3 delayed, s of audio per s | s3 delayed / local |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    by_recording: dict[str, dict[str, dict[str, Any]]] = {}
    for row in results.get("sequential", []):
        by_recording.setdefault(row["recording"], {})[row["system"]] = row
    for rid, systems in by_recording.items():
        local, remote, far = systems["local"], systems["s3"], systems["s3 delayed"]
        speed = local["audio_seconds_per_second"]
        lines.append(
            f"| {rid} | {speed:.0f} | {remote['audio_seconds_per_second']:.0f} | "
            f"{remote['audio_seconds_per_second'] / speed:.2f} | "
            f"{remote['gets']} | {remote['bytes_fetched'] / 1e6:.1f} | "
            f"{far['audio_seconds_per_second']:.0f} | "
            f"{far['audio_seconds_per_second'] / speed:.2f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
