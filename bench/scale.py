#!/usr/bin/env python3
"""How a mount behaves as the catalogue grows: 10 000, 1 000 000 and 10 000 000 cuts.

    .venv/bin/python bench/scale.py                      # 10k, 1M, 10M (about 15 minutes)
    .venv/bin/python bench/scale.py --cuts 10000 100000  # any sizes
    .venv/bin/python bench/scale.py --cuts --upgrade 10000 1000000 10000000

Four 30-minute FLAC recordings are generated (sox) and packed with ``cutfs pack``; each
size then gets a shard directory that shares those shards and has a catalogue of N cuts
written by the packer's own catalogue writer (``CatalogueWriter``, in a process of its
own, the cuts given in random id order a batch at a time, within ``--memory``; its time,
peak RSS and disk use are measured): 10 s cuts at random places, ids
``s<dir>/u<number>`` with 2 000 cuts per directory, metadata ``{"text": ...}``.  Each
directory is mounted for real (``cutfs mount``, two decoder workers) and measured:

* mount: seconds from starting ``cutfs mount`` to the mount answering;
* PSS of the daemon and its workers (sum of ``Pss`` in ``/proc/PID/smaps_rollup``) after
  mounting, and again after everything below;
* lookup: median and p99 of ``os.stat`` of cut files never looked up before, with the
  catalogue cold (page cache dropped before mounting: a stat may look up the directory
  too), and with the catalogue in the page cache and the directory already looked up
  (the cut's own lookup: the figure the 1.5x target is about);
* listing: ``os.listdir`` of a directory of 2 000 cuts, first time;
* missing names: ``os.stat`` of names that do not exist (must be ENOENT);
* reads: median time to read a whole random cut (cold for the daemon);
* wav.scp: seconds to its first megabyte, seconds to read it all, and its line count.

``--pack N...`` times ``cutfs pack --memory M`` of a Lhotse supervisions manifest of N
cuts listed in random id order, with the peak RSS of its whole process tree and its
peak disk use.

``--upgrade N...`` times ``cutfs upgrade`` of each size's directory rewritten as shard
format 1 (the shards hard-linked), with its peak RSS, and the mount of the directory
before and after (page cache dropped first).

Results go to docs/bench/scale.md and scale.json.  The machine is shared and noisy:
compare within a run.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from processes import daemon_pids, pss_bytes, read_bytes, run_measured

from cutfs.codec.catalogue.shard_format import CUTS_SCHEMA, MANIFEST_FILE
from cutfs.vfs.daemon.mount_options import parse_size

REPOSITORY = Path(__file__).resolve().parent.parent
CUTFS = [sys.executable, "-m", "cutfs.vfs.cli"]
RATE = 16000
RECORDINGS = 4
RECORDING_SECONDS = 1800
CUT_FRAMES = 10 * RATE
PER_DIRECTORY = 2000
LOOKUPS = 2000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cuts", type=int, nargs="*", default=[10_000, 1_000_000, 10_000_000])
    parser.add_argument("--work", type=Path, default=REPOSITORY / "bench" / "out-scale")
    parser.add_argument("--out", type=Path, default=REPOSITORY / "docs" / "bench")
    parser.add_argument(
        "--pack",
        type=int,
        nargs="*",
        default=[],
        help="also time `cutfs pack` of Lhotse supervisions manifests of these many cuts",
    )
    parser.add_argument(
        "--upgrade",
        type=int,
        nargs="*",
        default=[],
        help="also time `cutfs upgrade` of format-1 directories of these many cuts",
    )
    parser.add_argument(
        "--table-only",
        action="store_true",
        help="only rewrite OUT/scale.md from OUT/scale.json and scale-pack.json",
    )
    parser.add_argument(
        "--memory", default="2G", help="the catalogue writer's and the pack's budget (2G)"
    )
    parser.add_argument("--write-catalogue", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument(
        "--mount-rounds",
        type=int,
        default=0,
        metavar="N",
        help="only time N rounds of mounting the catalogues of --cuts already written, "
        "alternating sizes (page cache dropped each time), into OUT/scale-mounts.json",
    )
    args = parser.parse_args()
    if args.write_catalogue:
        count, directory = args.write_catalogue
        _write_catalogue(int(count), Path(directory), parse_size(args.memory))
        return 0
    if args.table_only:
        _write_table(args.out)
        return 0
    if args.mount_rounds:
        _mount_rounds(args.work, args.cuts, args.mount_rounds, args.out)
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    base = _base_shards(args.work)
    packs = [_time_pack(args.work, count, args.memory) for count in args.pack]
    for row in packs:
        print(json.dumps(row), flush=True)
    if packs:
        (args.out / "scale-pack.json").write_text(json.dumps(packs, indent=2) + "\n")
    upgrades = [_time_upgrade(base, args.work, count) for count in args.upgrade]
    for row in upgrades:
        print(json.dumps(row), flush=True)
    if upgrades:
        (args.out / "scale-upgrade.json").write_text(json.dumps(upgrades, indent=2) + "\n")
    if not args.cuts:
        _write_table(args.out)
        return 0
    results = []
    directories = {}
    for count in args.cuts:
        directories[count] = args.work / f"cuts-{count}"
        written = _catalogue(base, directories[count], count, args.memory)
        result = _measure(directories[count], args.work / f"mnt-{count}", count) | written
        print(json.dumps(result), flush=True)
        results.append(result)
    side_by_side = _lookups_side_by_side(directories, args.work)
    for result in results:
        result.update(side_by_side[result["cuts"]])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale.json").write_text(json.dumps(results, indent=2) + "\n")
    _write_table(args.out)
    return 0


def _write_table(out: Path) -> None:
    results = json.loads((out / "scale.json").read_text())
    # Runs of one larger size, made separately (`--cuts 100000000 --out DIR`, then the
    # result copied to scale-<N>.json): columns of their own, not in the interleaved ratio.
    for extra in sorted(out.glob("scale-[0-9]*.json")):
        for result in json.loads(extra.read_text()):
            result.setdefault("lookup_side_by_side_us", "(own run)")
            result.setdefault("lookup_ratio_to_smallest", "(own run)")
            results.append(result)
    packs_file = out / "scale-pack.json"
    packs = json.loads(packs_file.read_text()) if packs_file.exists() else []
    memories = {str(r["catalogue_memory"]) for r in results if "catalogue_memory" in r}
    notes = [
        f"\nCatalogues written by `CatalogueWriter` (the pack's commit) with `--memory "
        f"{', '.join(sorted(memories))}`, cuts given in random id order, by a process of its "
        "own: its peak RSS and the file system's extra use while it ran (runs, spills and "
        "the catalogue) sampled every 0.2 s.\n"
        for _ in [0]
        if memories
    ]
    notes += [f"\n{r['note']}\n" for r in results if "note" in r]
    mounts_file = out / "scale-mounts.json"
    if mounts_file.exists():
        rounds = json.loads(mounts_file.read_text())
        for result in results:
            found = rounds.get(str(result["cuts"]))
            if found:
                result["mount_rounds"] = f"{found['median_s']} ({found['min_s']}-{found['max_s']})"
        counts = ", ".join(f"{int(count):,}" for count in rounds)
        notes.append(
            f"\nMount in alternating rounds (`--mount-rounds`): the catalogues of {counts} "
            f"cuts mounted in turn, {len(next(iter(rounds.values()))['all_s'])} times each, "
            "page cache dropped before each; median (min-max). The single mount of the "
            "first row is each size's measurement run; the 100 M one came right after its "
            "catalogue's 27.5 GB were written.\n"
        )
    upgrades_file = out / "scale-upgrade.json"
    upgrades = json.loads(upgrades_file.read_text()) if upgrades_file.exists() else []
    text = _table(results) + "".join(notes) + _pack_table(packs) + _upgrade_table(upgrades)
    text += _METHOD
    (out / "scale.md").write_text(text)
    print(text)


def _pack_table(packs: list[dict[str, Any]]) -> str:
    if not packs:
        return ""
    lines = [
        "",
        "## `cutfs pack` of Lhotse manifests (4 recordings, N supervisions in random id order)",
        "",
        "Peak RSS: the sum over the pack's whole process tree (its indexing workers too), "
        "sampled every 0.2 s; disk: the file system's extra use while it ran, output included.",
        "",
    ]
    lines.append("| cuts | --memory | seconds | peak RSS (MB) | peak disk (MB) |")
    lines.append("|---:|---:|---:|---:|---:|")
    for row in packs:
        lines.append(
            f"| {row['pack_cuts']:,} | {row.get('pack_memory', '-')} | {row['pack_seconds']} "
            f"| {row['pack_peak_rss_mb']} | {row.get('pack_peak_disk_mb', '-')} |"
        )
    return "\n".join(lines) + "\n"


def _upgrade_table(upgrades: list[dict[str, Any]]) -> str:
    if not upgrades:
        return ""
    lines = ["", "## `cutfs upgrade` of shard format 1 (4 recordings, N cuts)", ""]
    lines.append(
        "| cuts | upgrade seconds | upgrade peak RSS (MB) | mount of format 1 (s) "
        "| mount after upgrade (s) |"
    )
    lines.append("|---:|---:|---:|---:|---:|")
    for row in upgrades:
        lines.append(
            f"| {row['upgrade_cuts']:,} | {row['upgrade_seconds']} | "
            f"{row['upgrade_peak_rss_mb']} | {row['mount_format_1_seconds']} | "
            f"{row['mount_upgraded_seconds']} |"
        )
    return "\n".join(lines) + "\n"


_METHOD = """
## How it was measured

`bench/scale.py` (see its docstring): four 30-minute FLAC recordings packed once; per
size, a shard directory sharing those shards with a catalogue of N cuts written by the
packer's catalogue writer (10 s cuts, 2 000 per directory, ids `s<dir>/u<number>`, given
to the writer in random order).
Each is mounted for real (`cutfs mount`, two decoder workers) after dropping the page
cache. PSS is the sum over the daemon and its workers (`smaps_rollup`); "11 s later" is
after the daemon's periodic release of the catalogue pages it mapped (they stay in the
page cache). The cold lookups may include the directory's lookup; the other lookup rows
time a cut whose directory was looked up first, and the interleaved row mounts every
size at once and alternates rounds between them, so that a shared machine's noise falls
on all sizes alike. "First cut" reads a cut of one recording, drops the page cache,
then reads a cut of another and counts the bytes the daemon and its workers read from
storage (`/proc/PID/io`), code faulted in again after the drop included. The tables
above were measured before ca2964a; until then the benchmark counted the daemon's
descendants one level deep: the decoder workers under the zygote are missing from
their PSS (about 73 MB, at 10 k and 10 M alike: 182.6 MB after mount with them) and from
the first cut's bytes read (0.0 above; 256 KiB with them for a 247 KiB span).
"""


def _base_shards(work: Path) -> Path:
    """Four 30-minute 16 kHz FLAC recordings, packed (made once per work directory)."""
    shards = work / "base"
    if (shards / MANIFEST_FILE).exists():
        return shards
    audio = work / "audio"
    audio.mkdir(exist_ok=True)
    lines = []
    for number in range(RECORDINGS):
        path = audio / f"rec{number}.flac"
        if not path.exists():
            subprocess.run(
                [
                    "sox",
                    "-n",
                    "-r",
                    str(RATE),
                    "-c",
                    "1",
                    "-b",
                    "16",
                    str(path),
                    "synth",
                    str(RECORDING_SECONDS),
                    "pinknoise",
                    "vol",
                    "0.3",
                ],
                check=True,
            )
        lines.append(f"rec{number} {path}\n")
    kaldi = work / "kaldi"
    kaldi.mkdir(exist_ok=True)
    (kaldi / "wav.scp").write_text("".join(lines))
    subprocess.run([*CUTFS, "pack", str(kaldi), "-o", str(shards)], check=True)
    return shards


def _time_pack(work: Path, count: int, memory: str) -> dict[str, Any]:
    """``cutfs pack`` of a recordings manifest (the four recordings) and a supervisions
    manifest of ``count`` 10 s supervisions (with text and speaker) listed in random id
    order, timed, with the peak resident memory of the whole process tree and the peak
    extra disk use (:func:`run_measured`)."""
    manifests = work / f"lhotse-{count}"
    manifests.mkdir(exist_ok=True)
    recordings = manifests / "recordings.jsonl"
    with open(recordings, "w") as out:
        for number in range(RECORDINGS):
            out.write(
                json.dumps(
                    {
                        "id": f"rec{number}",
                        "sources": [
                            {
                                "type": "file",
                                "channels": [0],
                                "source": str(work / "audio" / f"rec{number}.flac"),
                            }
                        ],
                        "sampling_rate": RATE,
                        "num_samples": RECORDING_SECONDS * RATE,
                        "duration": float(RECORDING_SECONDS),
                        "channel_ids": [0],
                    }
                )
                + "\n"
            )
    supervisions = manifests / "supervisions.jsonl"
    if not supervisions.exists():
        rng = np.random.default_rng(count)
        starts = rng.integers(0, (RECORDING_SECONDS - 10) * 100, count) / 100
        with open(supervisions, "w") as out:
            for start in range(0, count, 1 << 16):
                positions = np.arange(start, min(start + (1 << 16), count), dtype=np.int64)
                for number in _scrambled(positions, count).tolist():
                    out.write(
                        f'{{"id": "s{number // PER_DIRECTORY:05d}/u{number:09d}", '
                        f'"recording_id": "rec{number % RECORDINGS}", '
                        f'"start": {starts[number]}, "duration": 10.0, "channel": 0, '
                        f'"text": "hello world", "speaker": "spk{number % 1000}"}}\n'
                    )
    output = work / f"packed-{count}"
    shutil.rmtree(output, ignore_errors=True)
    command = [*CUTFS, "pack", "-q", str(recordings), str(supervisions), "-o", str(output)]
    measured = run_measured([*command, "--memory", memory], work)
    shutil.rmtree(output, ignore_errors=True)
    return {
        "pack_cuts": count,
        "pack_seconds": round(measured["seconds"], 1),
        "pack_peak_rss_mb": round(measured["peak_rss_bytes"] / 1e6, 1),
        "pack_peak_disk_mb": round(measured["peak_disk_bytes"] / 1e6, 1),
        "pack_memory": memory,
    }


def _catalogue(base: Path, directory: Path, count: int, memory: str) -> dict[str, Any]:
    """``base``'s shards (hard links) with a catalogue of ``count`` cuts, written by a
    process of its own (``--write-catalogue``) whose time, peak memory and disk use are
    measured."""
    if (directory / MANIFEST_FILE).exists() and (directory / "written.json").exists():
        written: dict[str, Any] = json.loads((directory / "written.json").read_text())
        return written
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    for item in base.iterdir():
        if item.name.startswith("shard-") or item.name.startswith("recordings"):
            os.link(item, directory / item.name)
    command = [sys.executable, __file__, "--write-catalogue", str(count), str(directory)]
    measured = run_measured([*command, "--memory", memory], directory)
    manifest = json.loads((base / MANIFEST_FILE).read_text())
    manifest.update(cuts=count, mentions={"text": True, "speaker": False})
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))
    written = {
        "catalogue_seconds": round(measured["seconds"], 1),
        "catalogue_peak_rss_mb": round(measured["peak_rss_bytes"] / 1e6, 1),
        "catalogue_peak_disk_mb": round(measured["peak_disk_bytes"] / 1e6, 1),
        "catalogue_memory": memory,
    }
    (directory / "written.json").write_text(json.dumps(written))
    print(f"catalogue of {count} cuts: {written}", flush=True)
    return written


def _write_catalogue(count: int, directory: Path, memory: int) -> None:
    """Write a catalogue of ``count`` cuts into ``directory`` with the packer's writer, the
    cuts given in random id order a batch at a time (as a pack's partitions give them)."""
    from cutfs.codec.spill.catalogue_writer import CatalogueWriter  # noqa: PLC0415
    from cutfs.codec.spill.memory_budget import buffer_bytes  # noqa: PLC0415

    spill = directory / "spill"
    spill.mkdir(exist_ok=True)
    metadata = pa.scalar('{"text": "hello world"}', pa.large_string())
    with CatalogueWriter(str(directory), str(spill), buffer_bytes(memory)) as writer:
        for start in range(0, count, 1 << 16):
            positions = np.arange(start, min(start + (1 << 16), count), dtype=np.int64)
            numbers = _scrambled(positions, count)
            rows = len(numbers)
            rng = np.random.default_rng([count, start])
            channels = pa.ListArray.from_arrays(
                pa.array(np.zeros(rows + 1, dtype=np.int32)), pa.array([], pa.int16())
            )
            cuts = pa.table(
                [
                    _ids(numbers),
                    pa.array(rng.integers(0, RECORDINGS, rows), pa.int32()),
                    pa.array(rng.integers(0, RECORDING_SECONDS * RATE - CUT_FRAMES, rows)),
                    pa.array(np.full(rows, CUT_FRAMES, dtype=np.int64)),
                    channels,
                    pa.repeat(metadata, rows),
                ],
                schema=CUTS_SCHEMA,
            )
            writer.add(cuts)
        writer.finish()
    spill.rmdir()


def _scrambled(positions: np.ndarray, count: int) -> np.ndarray:
    """A permutation of ``0..count-1`` computed per position (no table of ``count``
    numbers): position ``p`` gets ``(p * A + 12345) % count``, ``A`` a prime not dividing
    ``count``; the ids then come in an order unrelated to their sort order."""
    multiplier = 1_000_003 if count % 1_000_003 else 998_244_353
    result: np.ndarray = (positions * multiplier + 12345) % max(count, 1)
    return result


def _time_upgrade(base: Path, work: Path, count: int) -> dict[str, Any]:
    """``cutfs upgrade`` of a format-1 copy of the ``count``-cut directory, timed, with the
    peak RSS of the command, and the mounts before and after."""
    directory = _format_1(_catalogue(base, work / f"cuts-{count}", count), work / f"v1-{count}")
    mount_before = _mount_seconds(directory, work / f"mnt-v1-{count}")
    started = time.perf_counter()
    command = subprocess.Popen([*CUTFS, "upgrade", str(directory)])
    _, status, usage = os.wait4(command.pid, 0)
    seconds = time.perf_counter() - started
    command.returncode = os.waitstatus_to_exitcode(status)
    if command.returncode != 0:
        raise RuntimeError(f"cutfs upgrade {directory} failed")
    return {
        "upgrade_cuts": count,
        "upgrade_seconds": round(seconds, 1),
        "upgrade_peak_rss_mb": round(usage.ru_maxrss / 1024),
        "mount_format_1_seconds": mount_before,
        "mount_upgraded_seconds": _mount_seconds(directory, work / f"mnt-v1-{count}"),
    }


def _format_1(directory: Path, copy: Path) -> Path:
    """``directory`` as the first releases wrote it: the shards, recordings table without
    blob offsets and cuts table of 32-bit strings, no trees, manifest version 1."""
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir(parents=True)
    for item in directory.glob("shard-*"):
        os.link(item, copy / item.name)
    with pa.memory_map(str(directory / "recordings.arrow")) as source:
        recordings = pa.ipc.open_file(source).read_all().drop_columns(["blob_offset"])
    with pa.memory_map(str(directory / "cuts.arrow")) as source:
        cuts = pa.ipc.open_file(source).read_all()
    narrow = pa.schema(
        [
            field.with_type(pa.string()) if field.type == pa.large_string() else field
            for field in cuts.schema
        ]
    )
    for name, table in (("recordings.arrow", recordings), ("cuts.arrow", cuts.cast(narrow))):
        with (
            pa.OSFile(str(copy / name), "wb") as sink,
            pa.ipc.new_file(sink, table.schema) as writer,
        ):
            writer.write_table(table, max_chunksize=max(table.num_rows, 1))
    manifest = json.loads((directory / MANIFEST_FILE).read_text())
    manifest["version"] = 1
    (copy / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))
    return copy


def _mount_seconds(directory: Path, mountpoint: Path) -> float:
    """Seconds from ``cutfs mount`` (page cache dropped) to the mount answering."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    started = time.perf_counter()
    subprocess.run(
        [*CUTFS, "mount", str(directory), str(mountpoint), "--no-decode-in-turn", "--workers", "1"],
        check=True,
    )
    try:
        os.stat(mountpoint / "cuts")
        return round(time.perf_counter() - started, 2)
    finally:
        subprocess.run(["fusermount3", "-u", str(mountpoint)], check=False)


def _mount_rounds(work: Path, counts: list[int], rounds: int, out: Path) -> None:
    """Mount each size's catalogue in turn, ``rounds`` times, so that a shared machine's
    noise falls on all sizes alike; the median and range per size, and every time."""
    times: dict[int, list[float]] = {count: [] for count in counts}
    for _ in range(rounds):
        for count in counts:
            directory = work / f"cuts-{count}"
            times[count].append(_mount_seconds(directory, work / f"mnt-{count}"))
    result = {
        str(count): {
            "median_s": statistics.median(values),
            "min_s": min(values),
            "max_s": max(values),
            "all_s": values,
        }
        for count, values in times.items()
    }
    print(json.dumps(result, indent=2))
    (out / "scale-mounts.json").write_text(json.dumps(result, indent=2) + "\n")


def _ids(numbers: np.ndarray) -> pa.Array:
    """``s<dir>/u<number>`` for many numbers without a Python string each."""
    import pyarrow.compute as pc  # noqa: PLC0415

    directories = pc.utf8_lpad(
        pc.cast(pa.array(numbers // PER_DIRECTORY), pa.large_string()), 5, "0"
    )
    cuts = pc.utf8_lpad(pc.cast(pa.array(numbers), pa.large_string()), 9, "0")

    def text(value: str) -> pa.Scalar:
        return pa.scalar(value, pa.large_string())

    return pc.binary_join_element_wise(text("s"), directories, text("/u"), cuts, text(""))


def _measure(directory: Path, mountpoint: Path, count: int) -> dict[str, Any]:
    mountpoint.mkdir(parents=True, exist_ok=True)
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    started = time.perf_counter()
    subprocess.run(
        [*CUTFS, "mount", str(directory), str(mountpoint), "--no-decode-in-turn", "--workers", "2"],
        check=True,
    )
    os.stat(mountpoint / "cuts")
    mount_seconds = time.perf_counter() - started
    try:
        pss_mounted = pss_bytes(daemon_pids(mountpoint))
        first_cut = _first_cut_bytes(directory, mountpoint, count)
        rng = random.Random(count)
        numbers = rng.sample(range(count), min(LOOKUPS, count))
        lookups = []
        for number in numbers:
            path = mountpoint / "cuts" / f"s{number // PER_DIRECTORY:05d}" / f"u{number:09d}.wav"
            begun = time.perf_counter()
            size = os.stat(path).st_size
            lookups.append(time.perf_counter() - begun)
            assert size == 44 + 2 * CUT_FRAMES, size
        _cache_catalogue(directory)
        warm = []
        for number in rng.sample(range(count), min(LOOKUPS, count)):
            parent = mountpoint / "cuts" / f"s{number // PER_DIRECTORY:05d}"
            os.stat(parent)  # the directory is known: the lookup timed is the cut's alone
            begun = time.perf_counter()
            os.stat(parent / f"u{number:09d}.wav")
            warm.append(time.perf_counter() - begun)
        missing = 0
        for number in numbers[:200]:
            try:
                os.stat(mountpoint / "cuts" / f"s{number // PER_DIRECTORY:05d}" / f"x{number}.wav")
            except FileNotFoundError as exc:
                missing += exc.errno == errno.ENOENT
        directory_number = rng.randrange(max(count // PER_DIRECTORY, 1))
        begun = time.perf_counter()
        listed = os.listdir(mountpoint / "cuts" / f"s{directory_number:05d}")
        listing_seconds = time.perf_counter() - begun
        reads = []
        for number in numbers[:30]:
            path = mountpoint / "cuts" / f"s{number // PER_DIRECTORY:05d}" / f"u{number:09d}.wav"
            begun = time.perf_counter()
            data = path.read_bytes()
            reads.append(time.perf_counter() - begun)
            assert len(data) == 44 + 2 * CUT_FRAMES
        first_megabyte, scp_seconds, lines = _read_wav_scp(mountpoint / "wav.scp")
        pss_after = pss_bytes(daemon_pids(mountpoint))
        time.sleep(11)  # the daemon releases the catalogue pages it mapped every 10 s
        pss_settled = pss_bytes(daemon_pids(mountpoint))
    finally:
        subprocess.run(["fusermount3", "-u", str(mountpoint)], check=False)
    lookups.sort()
    catalogue_bytes = sum(
        item.stat().st_size for item in directory.iterdir() if not item.name.startswith("shard-")
    )
    return {
        "cuts": count,
        "catalogue_bytes": catalogue_bytes,
        "mount_seconds": round(mount_seconds, 2),
        **first_cut,
        "pss_mounted_mb": round(pss_mounted / 1e6, 1),
        "pss_after_mb": round(pss_after / 1e6, 1),
        "pss_settled_mb": round(pss_settled / 1e6, 1),
        "lookup_warm_median_us": round(statistics.median(warm) * 1e6, 1),
        "lookup_median_us": round(statistics.median(lookups) * 1e6, 1),
        "lookup_p99_us": round(lookups[int(len(lookups) * 0.99) - 1] * 1e6, 1),
        "missing_enoent": f"{missing}/{min(200, len(numbers))}",
        "listing_entries": len(listed),
        "listing_ms": round(listing_seconds * 1e3, 2),
        "read_median_ms": round(statistics.median(reads) * 1e3, 2),
        "wav_scp_first_mb_s": round(first_megabyte, 3),
        "wav_scp_seconds": round(scp_seconds, 1),
        "wav_scp_lines": lines,
    }


def _lookups_side_by_side(directories: dict[int, Path], work: Path) -> dict[int, dict[str, Any]]:
    """Cut lookups of every size measured in interleaved rounds, all mounted at once with
    their catalogues in the page cache and each cut's directory already looked up, so that
    the noise of a shared machine falls on every size alike; medians and the ratio to the
    smallest size."""
    mounts = {count: work / f"side-{count}" for count in directories}
    timings: dict[int, list[float]] = {count: [] for count in directories}
    try:
        for count, directory in directories.items():
            mounts[count].mkdir(exist_ok=True)
            _cache_catalogue(directory)
            subprocess.run(
                [
                    *CUTFS,
                    "mount",
                    str(directory),
                    str(mounts[count]),
                    "--no-decode-in-turn",
                    "--workers",
                    "1",
                ],
                check=True,
            )
        rng = random.Random(0)
        for _ in range(10):
            for count, mountpoint in mounts.items():
                for number in rng.sample(range(count), min(200, count)):
                    parent = mountpoint / "cuts" / f"s{number // PER_DIRECTORY:05d}"
                    os.stat(parent)
                    begun = time.perf_counter()
                    os.stat(parent / f"u{number:09d}.wav")
                    timings[count].append(time.perf_counter() - begun)
    finally:
        for mountpoint in mounts.values():
            subprocess.run(["fusermount3", "-u", str(mountpoint)], check=False)
    smallest = statistics.median(timings[min(timings)])
    return {
        count: {
            "lookup_side_by_side_us": round(statistics.median(values) * 1e6, 1),
            "lookup_ratio_to_smallest": round(statistics.median(values) / smallest, 2),
        }
        for count, values in timings.items()
    }


def _first_cut_bytes(directory: Path, mountpoint: Path, count: int) -> dict[str, Any]:
    """Bytes the daemon and its workers read from storage for the first cut of a recording
    on a fresh mount, tables included, against the cut's compressed span (from its seek
    index).  A cut of another recording is read first and the page cache dropped, so that
    the code every first read faults in is not counted (what it faults in again after the
    drop is: the figure is an upper bound)."""
    from cutfs.codec.catalogue.shard_set import ShardSet  # noqa: PLC0415

    def cut_path(number: int) -> Path:
        return mountpoint / "cuts" / f"s{number // PER_DIRECTORY:05d}" / f"u{number:09d}.wav"

    with ShardSet(str(directory)) as shards:
        numbers = {int(shards.cut_recording(n)): n for n in range(min(count, 64))}
        warm, target = numbers[min(numbers)], numbers[max(numbers)]
        cut = shards.cut(target)
        index = shards.recording(cut.recording_index).seek_index
        start = index.point_at_or_before(cut.start_frame).byte_offset
        after = index.first_point_after(cut.end_frame)
        _, blob_start, blob_end = shards.blob_location(cut.recording_index)
        span = (after.byte_offset if after else blob_end - blob_start) - start
    cut_path(warm).read_bytes()
    pids = daemon_pids(mountpoint)
    Path("/proc/sys/vm/drop_caches").write_text("1\n")
    before = read_bytes(pids)
    cut_path(target).read_bytes()
    read = read_bytes(pids) - before
    return {
        "first_cut_read_kib": round(read / 1024, 1),
        "first_cut_span_kib": round(span / 1024, 1),
    }


def _cache_catalogue(directory: Path) -> None:
    """Read the catalogue files into the page cache, as on a node that has been serving."""
    for item in directory.iterdir():
        if not item.name.startswith("shard-"):
            subprocess.run(["cat", str(item)], stdout=subprocess.DEVNULL, check=True)


def _read_wav_scp(path: Path) -> tuple[float, float, int]:
    """(seconds to the first megabyte, seconds to the end, lines) of reading ``path``."""
    begun = time.perf_counter()
    lines = 0
    first_megabyte = 0.0
    with open(path, "rb") as scp:
        while chunk := scp.read(1 << 20):
            if not first_megabyte:
                first_megabyte = time.perf_counter() - begun
            lines += chunk.count(b"\n")
    return first_megabyte, time.perf_counter() - begun, lines


def _table(results: list[dict[str, Any]]) -> str:
    rows = [
        ("cuts", "cuts"),
        ("catalogue on disk (MB)", "catalogue_bytes"),
        ("catalogue written, ids in random order (s)", "catalogue_seconds"),
        ("  its writer's peak RSS (MB)", "catalogue_peak_rss_mb"),
        ("  its peak disk use, output included (MB)", "catalogue_peak_disk_mb"),
        ("mount ready (s)", "mount_seconds"),
        ("mount ready, alternating rounds, median (min-max) (s)", "mount_rounds"),
        ("first cut: bytes read, tables included (KiB)", "first_cut_read_kib"),
        ("first cut: its compressed span (KiB)", "first_cut_span_kib"),
        ("PSS after mount (MB)", "pss_mounted_mb"),
        ("PSS after all below (MB)", "pss_after_mb"),
        ("PSS 11 s later (MB)", "pss_settled_mb"),
        ("lookup, catalogue cold, median (us)", "lookup_median_us"),
        ("lookup, catalogue cold, p99 (us)", "lookup_p99_us"),
        ("cut lookup, catalogue in page cache, median (us)", "lookup_warm_median_us"),
        ("cut lookup, all sizes mounted, interleaved, median (us)", "lookup_side_by_side_us"),
        ("  ratio to the smallest size", "lookup_ratio_to_smallest"),
        ("missing names: ENOENT", "missing_enoent"),
        ("listing: entries", "listing_entries"),
        ("listing (ms)", "listing_ms"),
        ("read a 10 s cut, median (ms)", "read_median_ms"),
        ("wav.scp first MB (s)", "wav_scp_first_mb_s"),
        ("wav.scp whole (s)", "wav_scp_seconds"),
        ("wav.scp lines", "wav_scp_lines"),
    ]
    header = "| | " + " | ".join(f"{r['cuts']:,}" for r in results) + " |\n"
    header += "|---|" + "---:|" * len(results) + "\n"
    body = ""
    for label, key in rows[1:]:
        values = []
        for result in results:
            value = result.get(key, "-")
            big = key == "catalogue_bytes" and isinstance(value, int)
            values.append(f"{value / 1e6:.0f}" if big else str(value))
        body += f"| {label} | " + " | ".join(values) + " |\n"
    return "# Scale: one mount, growing catalogues\n\n" + header + body


if __name__ == "__main__":
    sys.exit(main())
