#!/usr/bin/env python3
"""How long a user waits before an s3:// corpus serves: ``cutfs mount`` and ``cutfs.open``.

    .venv/bin/python bench/start.py                  # a few minutes on 2 cores
    .venv/bin/python bench/start.py --rounds 9 --delays 0 10 30

The shards are bench/run.py's (packed there, under bench/out), uploaded once to moto's S3
server on 127.0.0.1; requests go through bench/delay_proxy.py, which holds each one for
the given delay (a store some distance away).  Each round, interleaved:

* ``mount s3:// (cold)``: ``cutfs mount`` until it returns (the mount serves), with a new,
  empty cache directory; then unmounted;
* ``mount s3:// (warm)``: the same with the cache of the previous cold mount (a second
  mount on the node: the catalogue is on disk);
* ``mount local``: the same shards from the local disk;
* ``cutfs.open s3:// (cold)`` and ``(warm)``: in a new Python process, ``cutfs.open`` of
  the corpus, as a DataLoader worker that opens its own does (a worker forked from a
  process that imported cutfs pays the open alone; the imports, 0.5-0.7 s here, are
  reported apart).

The store's requests of each mount are read from the mount's ``.cutfs/stats`` (lists,
HEADs, GETs) before unmounting.  Results go to docs/bench/start.{md,json}; the machine is
shared and noisy: compare medians within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from object_storage import _free_port, _wait_for_port
from processes import daemon_pids
from run import _machine

REPOSITORY = Path(__file__).resolve().parent.parent
CUTFS = [str(Path(sys.executable).with_name("cutfs"))]
BUCKET = "bench"
OPEN_PROBE = (
    "import sys, time\n"
    "began = time.perf_counter()\n"
    "import cutfs, cutfs.codec.corpus\n"
    "imported = time.perf_counter()\n"
    "with cutfs.open(sys.argv[1], cache_dir=sys.argv[2]) as corpus:\n"
    "    assert len(corpus.cut_ids) > 0\n"
    "print(imported - began, time.perf_counter() - imported)\n"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=REPOSITORY / "bench" / "out")
    parser.add_argument("--out", type=Path, default=REPOSITORY / "docs" / "bench")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--delays", type=int, nargs="+", default=[10], metavar="MS")
    parser.add_argument(
        "--serving-processes",
        type=int,
        nargs="+",
        default=[0],
        metavar="N",
        help="mount with N serving processes (0: the default, one per core)",
    )
    args = parser.parse_args()
    shards = _shards(args.work)
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1"
    )
    rows: list[dict[str, Any]] = []
    with _moto() as port:
        _upload(port, shards)
        for delay in args.delays:
            with _proxy(port, delay) as proxied:
                uri = f"s3://{BUCKET}/shards?endpoint_override=127.0.0.1:{proxied}&scheme=http"
                for processes in args.serving_processes:
                    rows += _rounds(uri, shards, delay, args.rounds, processes)
    shards_shown = os.path.relpath(shards, REPOSITORY)  # no path of this machine in the results
    results = {"machine": _machine(), "shards": shards_shown, "rounds": args.rounds, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "start.json").write_text(json.dumps(results, indent=1) + "\n")
    table = _markdown(results)
    (args.out / "start.md").write_text(table)
    print(table)
    return 0


def _shards(work: Path) -> str:
    found = sorted(work.glob("shards-*"))
    if not found:
        sys.exit(f"no shards under {work}: run bench/run.py first (it packs them)")
    return str(found[0])


@contextmanager
def _moto() -> Iterator[int]:
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for_port(port, "moto's S3 server")
        yield port
    finally:
        server.kill()
        server.wait()


@contextmanager
def _proxy(port: int, delay_ms: int) -> Iterator[int]:
    listen = _free_port()
    script = str(REPOSITORY / "bench" / "delay_proxy.py")
    proxy = subprocess.Popen([sys.executable, script, str(listen), str(port), str(delay_ms)])
    try:
        _wait_for_port(listen, "the delay proxy")
        yield listen
    finally:
        proxy.kill()
        proxy.wait()


def _upload(port: int, shards: str) -> None:
    import botocore.session  # noqa: PLC0415 - the object-storage extra

    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=f"http://127.0.0.1:{port}"
    )
    client.create_bucket(Bucket=BUCKET)
    for name in sorted(os.listdir(shards)):
        with open(os.path.join(shards, name), "rb") as file:
            client.put_object(Bucket=BUCKET, Key=f"shards/{name}", Body=file.read())
    client.close()


def _rounds(
    uri: str, shards: str, delay_ms: int, rounds: int, processes: int
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="cutfs-start-") as scratch:
            cache = os.path.join(scratch, "cache")
            for name, source, kept in (
                ("mount s3:// (cold)", uri, cache),
                ("mount s3:// (warm)", uri, cache),
                ("mount local", shards, os.path.join(scratch, "local-cache")),
            ):
                mountpoint = os.path.join(scratch, "mnt")
                seconds, requests = _timed_mount(source, kept, mountpoint, processes)
                what = f"{name}, {processes} serving processes" if processes else name
                rows.append({"what": what, "delay_ms": delay_ms, "seconds": seconds, **requests})
            opened = os.path.join(scratch, "open-cache")
            for name in ("cutfs.open s3:// (cold)", "cutfs.open s3:// (warm)"):
                probe = [sys.executable, "-I", "-c", OPEN_PROBE, uri, opened]
                printed = subprocess.run(probe, capture_output=True, check=True).stdout.split()
                imports, seconds = float(printed[0]), float(printed[1])
                rows.append(
                    {"what": name, "delay_ms": delay_ms, "seconds": seconds, "imports": imports}
                )
    return rows


def _timed_mount(
    source: str, cache: str, mountpoint: str, processes: int
) -> tuple[float, dict[str, int]]:
    os.makedirs(mountpoint, exist_ok=True)
    command = [*CUTFS, "mount", source, mountpoint, "--cache-dir", cache]
    if processes:
        command += ["--serving-processes", str(processes)]
    began = time.perf_counter()
    subprocess.run(command, check=True)
    seconds = time.perf_counter() - began
    try:
        stats = json.loads(Path(mountpoint, ".cutfs", "stats").read_text())
        store = stats.get("store") or {}
        requests = {key: int(store.get(key, 0)) for key in ("lists", "heads", "gets")}
    finally:
        subprocess.run(["fusermount3", "-u", mountpoint], check=True)
        _wait_for_exit(Path(mountpoint))
    return seconds, requests


def _wait_for_exit(mountpoint: Path, timeout_seconds: float = 30.0) -> None:
    """Wait until the daemon of an unmounted mount and its processes are gone: its later
    serving processes may still be starting, and would take the cores of the next mount."""
    deadline = time.monotonic() + timeout_seconds
    while daemon_pids(mountpoint) and time.monotonic() < deadline:
        time.sleep(0.05)


def _markdown(results: dict[str, Any]) -> str:
    lines = [
        "# Time to a serving corpus",
        "",
        f"bench/start.py, {results['rounds']} rounds; medians (min-max).  Requests: the "
        "store's counters of a mount after it is ready (lists, HEADs, GETs).",
        "",
        "| what | delay per request | seconds | lists | HEADs | GETs |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    seen: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in results["rows"]:
        seen.setdefault((row["what"], row["delay_ms"]), []).append(row)
    for (what, delay), rows in seen.items():
        seconds = [row["seconds"] for row in rows]
        counts = [
            f"{statistics.median(row[key] for row in rows):g}" if key in rows[0] else ""
            for key in ("lists", "heads", "gets")
        ]
        lines.append(
            f"| {what} | {delay} ms | {statistics.median(seconds):.2f} "
            f"({min(seconds):.2f}-{max(seconds):.2f}) | " + " | ".join(counts) + " |"
        )
    imports = [row["imports"] for row in results["rows"] if "imports" in row]
    if imports:
        lines += [
            "",
            f"``cutfs.open`` rows are the open alone; importing cutfs before it took "
            f"{statistics.median(imports):.2f} s (median) in those processes.",
        ]
    machine = results["machine"]
    lines += ["", f"Machine: {machine['cores']} CPUs, Linux {machine['kernel']}.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
