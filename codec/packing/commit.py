"""The last step of a pack: the partitions' tables merged, the manifest written last.

``cutfs pack commit OUT`` checks that every partition of the plan is done
(its ``done`` marker matches the plan, its shard is there with the recorded
size, its partial tables hold the counts the marker records), concatenates
the partial tables in partition order (recordings renumbered, shards
numbered by partition already), writes the catalogue (recordings table, cuts
table, file trees, Kaldi order) and then ``manifest.json``.  Until the
manifest is written the output is not mountable; once it is, it is complete.
The plan and the partial tables are then removed.

Safe to rerun: an output that is already committed is reported, not written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from cutfs.codec.catalogue.catalogue_copy import CATALOGUE_FILES
from cutfs.codec.catalogue.shard_format import CUTS_SCHEMA, MANIFEST_FILE, RECORDINGS_SCHEMA
from cutfs.codec.catalogue.shard_writer import manifest_of, write_recordings
from cutfs.codec.errors import SourceError
from cutfs.codec.packing.output import PackOutput
from cutfs.codec.packing.partition_packer import PartitionResult, finished_partitions, part_name
from cutfs.codec.packing.plan import PLAN_CUTS, PLAN_FILE, PLAN_RECORDINGS, PackPlan, read_plan
from cutfs.codec.packing.progress import SORTING, PackProgress, ProgressCallback
from cutfs.codec.spill.catalogue_writer import CatalogueWriter
from cutfs.codec.spill.memory_budget import DEFAULT_MEMORY_BYTES, buffer_bytes

#: Partial tables read at once by the commit.
_TABLE_READERS: Final = 16


@dataclass
class PackReport:
    """What a pack wrote."""

    output_dir: str
    recordings: int = 0
    cuts: int = 0
    stored_bytes: int = 0
    audio_seconds: float = 0.0
    transcoded: dict[str, str] = field(default_factory=dict)  # recording id -> reason
    #: True when the output was committed before and nothing was written.
    already_committed: bool = False


def commit_pack(
    output: PackOutput,
    *,
    keep_parts: bool = False,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
    on_progress: ProgressCallback | None = None,
) -> PackReport:
    """Commit the pack in ``output`` (see the module docstring).

    Raises :class:`SourceError` naming the partitions that are not done (or
    not consistent) when the pack cannot be committed; nothing is written then.
    The cuts are merged in about ``memory_bytes`` (see :class:`CatalogueWriter`).
    """
    if output.exists(MANIFEST_FILE) and not output.exists(PLAN_FILE):
        return _committed_report(output)
    plan = read_plan(output)
    results = _finished(output, plan)
    _check_shards(output, results)
    recordings = _merged_recordings(output, results)
    with output.scratch() as scratch:
        spill = os.path.join(scratch, "spill")
        os.makedirs(spill, exist_ok=True)

        def on_rows(phase: str, done: int, total: int) -> None:
            if on_progress is not None:
                on_progress(PackProgress.of_rows(phase, done, total))

        budget = buffer_bytes(memory_bytes)
        with CatalogueWriter(scratch, spill, budget, on_rows) as catalogue:
            first_recording, added, total = 0, 0, sum(result.cuts for result in results)
            for result in results:
                for cuts in _part_cuts(output, result, first_recording):
                    catalogue.add(cuts)
                    added += cuts.num_rows
                    on_rows(SORTING, added, total)
                first_recording += result.recordings
            written = catalogue.finish()
        write_recordings(scratch, recordings)
        for name in CATALOGUE_FILES:
            output.put_file(name, os.path.join(scratch, name))
    report = PackReport(
        output.uri,
        recordings=recordings.num_rows,
        cuts=written.cuts,
        stored_bytes=sum(result.stored_bytes for result in results),
        audio_seconds=sum(result.audio_seconds for result in results),
        transcoded={k: v for result in results for k, v in result.transcoded.items()},
    )
    extra = {
        "created_by": "cutfs",
        "source": plan.source_kind,
        "transcoded": len(report.transcoded),
    }
    shards = [result.shard for result in results]
    manifest = manifest_of(shards, recordings.num_rows, written.cuts, written.mentions, extra)
    output.write_small(MANIFEST_FILE, (json.dumps(manifest, indent=2) + "\n").encode())
    if not keep_parts:
        _remove_parts(output)
    return report


def missing_partitions_message(missing: list[int], partitions: int) -> str:
    """``3 of 12 partitions are not done: 2, 5-6``: ranges, the first few."""
    runs: list[str] = []
    start = previous = missing[0]
    for number in [*missing[1:], None]:
        if number is not None and number == previous + 1:
            previous = number
            continue
        runs.append(str(start) if start == previous else f"{start}-{previous}")
        if number is not None:
            start = previous = number
    shown = ", ".join(runs[:10]) + (", ..." if len(runs) > 10 else "")
    return f"{len(missing)} of {partitions} partitions are not done: {shown}"


def _finished(output: PackOutput, plan: PackPlan) -> list[PartitionResult]:
    results = finished_partitions(output, plan)
    missing = [partition for partition, result in enumerate(results) if result is None]
    if missing:
        listed = ",".join(str(partition) for partition in missing[:20])
        more = " (and the rest)" if len(missing) > 20 else ""
        raise SourceError(
            f"cannot commit: {missing_partitions_message(missing, plan.partitions)}; run "
            f"'cutfs pack run {output.uri} --partition {listed}'{more}, then commit again "
            f"('cutfs pack status {output.uri}' shows why they are not done)",
            where=output.uri,
        )
    done = [result for result in results if result is not None]
    for result in done:
        _check_writer(output, result)
    for partition, result in enumerate(done):
        if result.recordings != plan.partition_recordings[partition]:
            raise SourceError(
                f"cannot commit: partition {partition} packed {result.recordings} recordings, "
                f"its plan lists {plan.partition_recordings[partition]}",
                where=output.where(part_name(partition, "done.json")),
            )
    return done


def _check_writer(output: PackOutput, result: PartitionResult) -> None:
    """Every file of a partition was written by this user (or root): a member of a group
    that may write a shared output could otherwise put a partition of their own, or alter
    one, and have it served under the plan's cut ids.  (Its ``done`` marker names the
    plan's digest, which binds it to the plan; this binds it to its writer.)"""
    why = (
        "a commit merges only partitions written by the user who commits; rerun the "
        "partition as that user, in an output others cannot write"
    )
    for kind in ("done.json", "recordings.arrow", "cuts.arrow"):
        output.check_trusted(part_name(result.partition, kind), why)
    output.check_trusted(str(result.shard["file"]), why)


def _check_shards(output: PackOutput, results: list[PartitionResult]) -> None:
    """Every partition's shard is there, of the size its run recorded."""
    present = output.sizes("shard-")
    for result in results:
        name = result.shard["file"]
        if present.get(name) != result.shard["bytes"]:
            found = "missing" if name not in present else f"{present[name]} bytes"
            raise SourceError(
                f"cannot commit: the shard of partition {result.partition} is {found}, its run "
                f"wrote {result.shard['bytes']} bytes; rerun the partition after removing "
                f"{part_name(result.partition, 'done.json')}",
                where=output.where(name),
            )


def _merged_recordings(output: PackOutput, results: list[PartitionResult]) -> pa.Table:
    """The partitions' recordings tables, concatenated (read a few at once: in object
    storage each is a GET or two).  One row per recording: small beside the cuts."""
    with ThreadPoolExecutor(max_workers=_TABLE_READERS) as readers:
        parts = list(readers.map(lambda result: _part_recordings(output, result), results))
    return pa.concat_tables(parts) if parts else RECORDINGS_SCHEMA.empty_table()


def _part_recordings(output: PackOutput, result: PartitionResult) -> pa.Table:
    """A partition's recordings table, checked against its done marker."""
    name = part_name(result.partition, "recordings.arrow")
    reader = _part_reader(output, name, RECORDINGS_SCHEMA)
    try:
        recordings = reader.read_all()
    except pa.ArrowException as exc:
        raise SourceError(f"cannot read: {exc}", where=output.where(name)) from exc
    if recordings.num_rows != result.recordings:
        raise _rows_differ(output, name)
    shards = recordings.column("shard")
    if len(shards) and pc.any(pc.not_equal(shards, result.partition)).as_py():
        raise SourceError("names a shard of another partition", where=output.where(name))
    return recordings


def _part_cuts(
    output: PackOutput, result: PartitionResult, first_recording: int
) -> Iterator[pa.RecordBatch]:
    """A partition's cuts, a batch at a time, their recordings renumbered from
    ``first_recording``; checked against its done marker as they are read."""
    name = part_name(result.partition, "cuts.arrow")
    reader = _part_reader(output, name, CUTS_SCHEMA)
    index = CUTS_SCHEMA.get_field_index("recording")
    rows = 0
    for number in range(reader.num_record_batches):
        try:
            batch = reader.get_batch(number)
        except pa.ArrowException as exc:
            raise SourceError(f"cannot read: {exc}", where=output.where(name)) from exc
        numbers = batch.column(index)
        if len(numbers) and (
            pc.min(numbers).as_py() < 0 or pc.max(numbers).as_py() >= result.recordings
        ):
            raise SourceError("names recordings outside its partition", where=output.where(name))
        rows += batch.num_rows
        renumbered = pc.add(numbers, pa.scalar(first_recording, pa.int32()))
        yield batch.set_column(index, "recording", renumbered)
    if rows != result.cuts:
        raise _rows_differ(output, name)


def _part_reader(output: PackOutput, name: str, schema: pa.Schema) -> pa.ipc.RecordBatchFileReader:
    reader = output.open_table(name)
    if not reader.schema.equals(schema):
        raise SourceError("holds a table of another layout", where=output.where(name))
    return reader


def _rows_differ(output: PackOutput, name: str) -> SourceError:
    return SourceError(
        "holds another number of rows than its done marker records", where=output.where(name)
    )


def _remove_parts(output: PackOutput) -> None:
    # The plan description first: a rerun that finds the manifest and no plan reports the
    # commit done, whatever of the rest a crash left behind.
    output.remove(PLAN_FILE)
    output.remove_many([PLAN_RECORDINGS, PLAN_CUTS])
    output.remove("_plan")
    output.remove_many(sorted(output.sizes("_parts/")))
    output.remove("_parts")


def _committed_report(output: PackOutput) -> PackReport:
    try:
        manifest = json.loads(output.read_small(MANIFEST_FILE))
        return PackReport(
            output.uri,
            recordings=int(manifest["recordings"]),
            cuts=int(manifest["cuts"]),
            already_committed=True,
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise SourceError(
            f"not a cutfs manifest: {exc}", where=output.where(MANIFEST_FILE)
        ) from exc
