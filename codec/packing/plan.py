"""The plan of a partitioned pack: which recordings and cuts each partition packs.

``cutfs pack plan`` reads the sources once, checks them, and splits the
recordings, in input order, into partitions of about one shard's worth of
source bytes each (a partition is closed once it holds ``max_shard_bytes``
or more, so it exceeds that by at most one recording).  Each partition later
becomes exactly one shard, ``shard-NNNNN.arrow`` with N the partition number,
whichever engine runs it and in whichever order: the plan alone decides the
output, byte for byte.

Layout under the output (local directory or object-storage prefix)::

    _plan/recordings.arrow   one record batch per partition: its recordings
    _plan/cuts.arrow         its cuts, grouped by partition, in batches of at most
                             65 536 (``partition_cut_batches`` in the plan: how many
                             batches each partition has, in order)
    _plan/plan.json          written last: counts, options, a digest of both tables

A partition run reads only its own batches.  Planning holds no table of cuts in
memory: the cuts are grouped by partition as they come when the input lists them in
recording order (nearly every input does), and by an external sort otherwise.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from cutfs.codec.catalogue.mapped_table import release_mapped_pages
from cutfs.codec.catalogue.shard_format import MANIFEST_FILE
from cutfs.codec.errors import CutfsError, SourceError
from cutfs.codec.packing.output import PackOutput
from cutfs.codec.packing.progress import PLANNING, READING, PackProgress, ProgressCallback
from cutfs.codec.sources import Refusals, SourceCatalogue, SourceRecording, read_source
from cutfs.codec.sources.catalogue import CUT_COLUMNS_SCHEMA, DeclaredAudio
from cutfs.codec.spill.external_sort import ExternalSort
from cutfs.codec.spill.memory_budget import DEFAULT_MEMORY_BYTES, buffer_bytes
from cutfs.codec.storage.object_location import ObjectLocation, split_object_url
from cutfs.codec.storage.object_store import ObjectStore

PLAN_FILE: Final = "_plan/plan.json"
PLAN_RECORDINGS: Final = "_plan/recordings.arrow"
PLAN_CUTS: Final = "_plan/cuts.arrow"
PLAN_VERSION: Final = 3
#: Recordings in object storage are sized with a HEAD each at planning, this many at once,
#: each within this deadline (retries included).
_PARALLEL_HEADS: Final = 16
_HEAD_DEADLINE_SECONDS: Final = 60.0
#: Cuts per record batch of ``_plan/cuts.arrow`` at most (what a partition run holds).
_CUT_BATCH_ROWS: Final = 1 << 16
#: The sort key that groups cuts by partition (its number, 4 bytes big-endian).
_PARTITION_KEY: Final = "partition_key"
#: Partitions a plan may have (far more than any cluster runs at once).
MAX_PARTITIONS: Final = 10_000_000
#: What a recording whose size cannot be known before it is made (a command's output,
#: a Parquet cell) counts for when partitions are balanced.
UNKNOWN_SIZE_BYTES: Final = 1 << 20

PLAN_RECORDINGS_SCHEMA: Final = pa.schema(
    [
        ("recording_id", pa.string()),
        ("path", pa.string()),
        ("command", pa.string()),
        ("described_in", pa.string()),
        ("offset_bytes", pa.int64()),
        ("length_bytes", pa.int64()),
        ("parquet_column", pa.string()),
        ("declared_sample_rate", pa.int64()),
        ("declared_channels", pa.int64()),
        ("declared_frames", pa.int64()),
        ("planned_bytes", pa.int64()),
        ("url", pa.string()),
    ]
)


@dataclass(frozen=True)
class PackPlan:
    """What ``_plan/plan.json`` says (see the module docstring)."""

    version: int
    digest: str
    source_kind: str
    max_shard_bytes: int
    recordings: int
    cuts: int
    #: Per partition: recordings, source bytes, and declared seconds of audio (what the
    #: sources' manifests say; 0 where they say nothing).
    partition_recordings: tuple[int, ...]
    partition_bytes: tuple[int, ...]
    partition_seconds: tuple[float, ...]
    #: Per partition: its record batches in ``_plan/cuts.arrow`` (the batches of
    #: partition ``i`` follow those of partitions ``0..i-1``).
    partition_cut_batches: tuple[int, ...]

    @property
    def partitions(self) -> int:
        return len(self.partition_recordings)

    def to_json(self) -> bytes:
        return (json.dumps(asdict(self), indent=1) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> PackPlan:
        """Read and range-check a plan description; :class:`SourceError` if it is not one."""
        try:
            fields = json.loads(data)
            plan = cls(
                version=int(fields["version"]),
                digest=str(fields["digest"]),
                source_kind=str(fields["source_kind"]),
                max_shard_bytes=int(fields["max_shard_bytes"]),
                recordings=int(fields["recordings"]),
                cuts=int(fields["cuts"]),
                partition_recordings=tuple(int(n) for n in fields["partition_recordings"]),
                partition_bytes=tuple(int(n) for n in fields["partition_bytes"]),
                partition_seconds=tuple(float(n) for n in fields["partition_seconds"]),
                partition_cut_batches=tuple(int(n) for n in fields["partition_cut_batches"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise SourceError(f"not a cutfs pack plan: {exc}", where=where) from exc
        if plan.version != PLAN_VERSION:
            raise SourceError(f"plan version {plan.version}, expected {PLAN_VERSION}", where=where)
        counts = (
            plan.partition_recordings,
            plan.partition_bytes,
            plan.partition_seconds,
            plan.partition_cut_batches,
        )
        if (
            not 0 < plan.partitions <= MAX_PARTITIONS
            or len({len(column) for column in counts}) != 1
            or min(plan.partition_recordings) < 1
            or sum(plan.partition_recordings) != plan.recordings
            or min(plan.partition_bytes) < 0
            or min(plan.partition_cut_batches) < 0
            or sum(plan.partition_cut_batches) > plan.cuts
            or not all(math.isfinite(s) and s >= 0 for s in plan.partition_seconds)
            or plan.cuts < 0
            or plan.max_shard_bytes <= 0
        ):
            raise SourceError("the plan's counts are inconsistent", where=where)
        return plan


def make_plan(
    sources: list[str],
    output: PackOutput,
    max_shard_bytes: int,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
    on_progress: ProgressCallback | None = None,
) -> PackPlan:
    """Read ``sources``, check them, and write the plan of packing them into ``output``,
    in about ``memory_bytes`` whatever the number of cuts.

    Safe to rerun: when ``output`` already holds the same plan it is kept as it
    is (partitions already packed stay valid).  Raises :class:`SourceError` for
    bad input, and when ``output`` holds a shard directory or the plan of other
    sources or options.
    """
    if max_shard_bytes <= 0:
        raise SourceError("the shard size must be positive", where=output.uri)
    if output.exists(MANIFEST_FILE):
        raise SourceError(
            "already holds a shard directory; choose a new output or remove it",
            where=output.uri,
        )
    report = on_progress or _ignore
    report(PackProgress.of_rows(READING, 0, 0))
    catalogue = read_source(sources, Refusals(sort_memory_bytes=buffer_bytes(memory_bytes)))
    report(PackProgress.of_rows(PLANNING, 0, len(catalogue.cuts)))
    check_recordings_exist(catalogue)
    recordings = _recordings_table(catalogue.recordings, object_sizes(catalogue.recordings))
    partition_of = _partitions(recordings.column("planned_bytes").to_numpy(), max_shard_bytes)
    with output.scratch() as scratch:
        digest = hashlib.sha256(f"{PLAN_VERSION} {max_shard_bytes}".encode())
        recordings_path = _write_batches(scratch, recordings, partition_of, digest)
        cuts_path, cut_batches = _write_cut_batches(
            scratch, catalogue, partition_of, buffer_bytes(memory_bytes), report
        )
        _hash_file(cuts_path, digest)
        plan = _summary(
            catalogue, recordings, partition_of, max_shard_bytes, digest.hexdigest(), cut_batches
        )
        if output.exists(PLAN_FILE):
            existing = read_plan(output)
            if existing.digest == plan.digest:
                return existing
            raise SourceError(
                "already holds the plan of other sources or options; choose a new output, or "
                "remove it to plan again",
                where=output.uri,
            )
        output.put_file(PLAN_RECORDINGS, recordings_path)
        output.put_file(PLAN_CUTS, cuts_path)
    output.write_small(PLAN_FILE, plan.to_json())
    return plan


def read_plan(output: PackOutput) -> PackPlan:
    """The plan of ``output``; :class:`SourceError` when there is none."""
    if not output.exists(PLAN_FILE):
        raise SourceError("holds no pack plan: run 'cutfs pack plan' first", where=output.uri)
    return PackPlan.from_json(output.read_small(PLAN_FILE), output.where(PLAN_FILE))


def partition_inputs(
    output: PackOutput, plan: PackPlan, partition: int
) -> tuple[list[SourceRecording], Iterator[pa.RecordBatch]]:
    """The recordings and cuts (batches of :data:`CUT_COLUMNS_SCHEMA`, read as they are
    asked for) of one partition, read from its record batches alone."""
    if not 0 <= partition < plan.partitions:
        raise SourceError(
            f"no partition {partition}: the plan has {plan.partitions} (0 to "
            f"{plan.partitions - 1})",
            where=output.uri,
        )
    output.check_trusted(
        PLAN_RECORDINGS,
        "a plan names the files a run reads and the commands it runs, so only its owner's "
        "plans are run",
    )
    reader = _plan_table(output, PLAN_RECORDINGS, PLAN_RECORDINGS_SCHEMA, plan.partitions)
    recordings = _batch(output, PLAN_RECORDINGS, reader, partition)
    if recordings.num_rows != plan.partition_recordings[partition]:
        raise SourceError(
            f"partition {partition} lists {recordings.num_rows} recordings, the plan "
            f"{plan.partition_recordings[partition]}",
            where=output.where(PLAN_RECORDINGS),
        )
    cuts = _plan_table(output, PLAN_CUTS, CUT_COLUMNS_SCHEMA, sum(plan.partition_cut_batches))
    first = sum(plan.partition_cut_batches[:partition])
    numbers = range(first, first + plan.partition_cut_batches[partition])
    batches = (_batch(output, PLAN_CUTS, cuts, number) for number in numbers)
    return [_source_recording(row) for row in recordings.to_pylist()], batches


def refuse_uncommitted(directory: str) -> None:
    """Refuse a local directory holding a pack that is not committed: it holds shards, but
    nothing may serve them before the manifest says they are complete."""
    if os.path.exists(os.path.join(directory, PLAN_FILE)) and not os.path.exists(
        os.path.join(directory, MANIFEST_FILE)
    ):
        raise SourceError(
            "holds a pack that is not committed: not mountable until 'cutfs pack commit' "
            "(see 'cutfs pack status')",
            where=directory,
        )


def check_recordings_exist(catalogue: SourceCatalogue) -> None:
    """Refuse a catalogue naming audio files that are not there (before any work is done)."""
    for recording in catalogue.recordings:
        if recording.path is not None and not os.path.isfile(recording.path):
            raise SourceError(
                f"recording {recording.recording_id!r}: audio file not found: {recording.path}",
                where=recording.described_in,
            )


def object_sizes(recordings: list[SourceRecording]) -> dict[str, int]:
    """The size of each recording's object in object storage: one HEAD each, a few at
    once, one store per bucket.  Raises :class:`SourceError` naming a recording whose
    object cannot be read (before any work is done, as for a missing file)."""
    wanted = {recording.url: recording for recording in recordings if recording.url}
    if not wanted:
        return {}
    stores: dict[ObjectLocation, ObjectStore] = {}
    objects = {}
    try:
        for url, recording in wanted.items():
            location, key = split_object_url(url)
            if location not in stores:
                stores[location] = ObjectStore(location, deadline_seconds=_HEAD_DEADLINE_SECONDS)
            objects[url] = (stores[location], key, recording)

        def size_of(url: str) -> int:
            store, key, recording = objects[url]
            try:
                return store.size(key)
            except CutfsError as exc:
                raise SourceError(
                    f"recording {recording.recording_id!r}: cannot fetch it: {exc.message}",
                    where=f"{url} (listed in {recording.described_in})",
                ) from exc

        with ThreadPoolExecutor(max_workers=_PARALLEL_HEADS) as pool:
            return dict(zip(objects, pool.map(size_of, objects), strict=True))
    finally:
        for store in stores.values():
            store.close()


def _planned_bytes(recording: SourceRecording, object_sizes: dict[str, int]) -> int:
    """The source bytes a recording brings to its shard, as far as they are known now."""
    if recording.url is not None:
        return object_sizes[recording.url]
    if recording.command is not None or recording.parquet_column is not None:
        declared = recording.declared
        if declared is not None:
            return declared.num_frames * declared.channels * 2
        return UNKNOWN_SIZE_BYTES
    if recording.length_bytes is not None:
        return recording.length_bytes
    assert recording.path is not None
    return max(os.path.getsize(recording.path) - recording.offset_bytes, 0)


def _recordings_table(recordings: list[SourceRecording], object_sizes: dict[str, int]) -> pa.Table:
    declared = [recording.declared for recording in recordings]
    return pa.table(
        {
            "recording_id": [r.recording_id for r in recordings],
            "path": [r.path for r in recordings],
            "command": [r.command for r in recordings],
            "described_in": [r.described_in for r in recordings],
            "offset_bytes": [r.offset_bytes for r in recordings],
            "length_bytes": [r.length_bytes for r in recordings],
            "parquet_column": [r.parquet_column for r in recordings],
            "declared_sample_rate": [d.sample_rate if d else None for d in declared],
            "declared_channels": [d.channels if d else None for d in declared],
            "declared_frames": [d.num_frames if d else None for d in declared],
            "planned_bytes": [_planned_bytes(r, object_sizes) for r in recordings],
            "url": [r.url for r in recordings],
        },
        schema=PLAN_RECORDINGS_SCHEMA,
    )


def _partitions(planned_bytes: np.ndarray, max_shard_bytes: int) -> np.ndarray:
    """Each recording's partition: in order, a new one once the last holds
    ``max_shard_bytes`` or more."""
    partition_of = np.empty(len(planned_bytes), dtype=np.int64)
    partition, held = 0, 0
    for row, size in enumerate(planned_bytes.tolist()):
        if held >= max_shard_bytes:
            partition, held = partition + 1, 0
        partition_of[row] = partition
        held += size
    if partition + 1 > MAX_PARTITIONS:
        raise SourceError(
            f"{partition + 1} partitions is more than {MAX_PARTITIONS}: choose a larger "
            "--shard-size"
        )
    return partition_of


def _write_cut_batches(
    scratch: str,
    catalogue: SourceCatalogue,
    partition_of: np.ndarray,
    memory_bytes: int,
    report: ProgressCallback,
) -> tuple[str, list[int]]:
    """Write the cuts grouped by partition (in input order within each when the input
    lists them in recording order, as nearly every input does; sorted externally by
    partition otherwise) in batches of at most :data:`_CUT_BATCH_ROWS`; returns the
    file's path and each partition's number of batches."""
    table = catalogue.cuts.table()
    ids = pa.array([recording.recording_id for recording in catalogue.recordings], pa.string())
    path = os.path.join(scratch, f"plan-{len(os.listdir(scratch))}.arrow")
    counts = [0] * (int(partition_of[-1]) + 1)
    written = 0
    with contextlib.ExitStack() as stack:
        grouped = _in_partition_order(table, ids, partition_of)
        batches: Iterator[tuple[pa.RecordBatch, np.ndarray]]
        if grouped:
            batches = _with_partitions(table.to_batches(_CUT_BATCH_ROWS), ids, partition_of)
        else:
            batches = _sorted_by_partition(table, ids, partition_of, scratch, memory_bytes, stack)
        sink = stack.enter_context(pa.OSFile(path, "wb"))
        writer = stack.enter_context(pa.ipc.new_file(sink, CUT_COLUMNS_SCHEMA))
        for batch, partitions in batches:
            edges = np.flatnonzero(np.diff(partitions)) + 1
            for start, stop in zip([0, *edges], [*edges, len(partitions)], strict=True):
                if stop > start:
                    writer.write_batch(batch.slice(start, stop - start))
                    counts[int(partitions[start])] += 1
            written += len(partitions)
            report(PackProgress.of_rows(PLANNING, written, table.num_rows))
            release_mapped_pages()
    return path, counts


def _partitions_of(
    recording_ids: pa.Array, ids: pa.Array, partition_of: np.ndarray
) -> npt.NDArray[np.int64]:
    positions = pc.index_in(recording_ids, value_set=ids)
    return np.asarray(partition_of[np.asarray(positions.to_numpy(zero_copy_only=False))], np.int64)


def _with_partitions(
    batches: list[pa.RecordBatch], ids: pa.Array, partition_of: np.ndarray
) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
    for batch in batches:
        yield batch, _partitions_of(batch.column("recording_id"), ids, partition_of)


def _in_partition_order(table: pa.Table, ids: pa.Array, partition_of: np.ndarray) -> bool:
    """Whether the cuts' partitions never decrease from one row to the next."""
    last = 0
    for batch, partitions in _with_partitions(table.to_batches(1 << 20), ids, partition_of):
        if len(partitions) and (partitions[0] < last or np.any(np.diff(partitions) < 0)):
            return False
        last = int(partitions[-1]) if len(partitions) else last
        del batch
    release_mapped_pages()
    return True


def _sorted_by_partition(
    table: pa.Table,
    ids: pa.Array,
    partition_of: np.ndarray,
    scratch: str,
    memory_bytes: int,
    stack: contextlib.ExitStack,
) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
    """The cuts sorted by partition (stable: input order within each), in batches."""
    keyed = CUT_COLUMNS_SCHEMA.append(pa.field(_PARTITION_KEY, pa.binary()))
    ordered = stack.enter_context(ExternalSort(keyed, _PARTITION_KEY, scratch, memory_bytes))
    for batch, partitions in _with_partitions(table.to_batches(_CUT_BATCH_ROWS), ids, partition_of):
        keys = np.asarray(partitions, dtype=">u4").tobytes()
        key = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(4), len(partitions), [None, pa.py_buffer(keys)]
        ).cast(pa.binary())
        ordered.add(batch.append_column(_PARTITION_KEY, key))
        release_mapped_pages()
    for batch in ordered.sorted_batches():
        rows = batch.drop_columns([_PARTITION_KEY])
        for start in range(0, rows.num_rows, _CUT_BATCH_ROWS):
            piece = rows.slice(start, _CUT_BATCH_ROWS)
            yield piece, _partitions_of(piece.column("recording_id"), ids, partition_of)


def _write_batches(scratch: str, table: pa.Table, partition_of_row: np.ndarray, digest: Any) -> str:
    """Write ``table`` (rows grouped by partition) with one record batch per partition,
    hashing what is written into ``digest``; returns the file's path."""
    count = int(partition_of_row.max()) + 1
    edges = np.searchsorted(partition_of_row, np.arange(count + 1), side="left")
    path = os.path.join(scratch, f"plan-{len(os.listdir(scratch))}.arrow")
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        for partition in range(count):
            start, stop = int(edges[partition]), int(edges[partition + 1])
            part = table.slice(start, stop - start).combine_chunks()
            writer.write_batch(
                part.to_batches()[0] if part.num_rows else _empty_batch(table.schema)
            )
    _hash_file(path, digest)
    return path


def _hash_file(path: str, digest: Any) -> None:
    with open(path, "rb") as written:
        for block in iter(lambda: written.read(1 << 20), b""):
            digest.update(block)


def _empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=schema)


def _summary(
    catalogue: SourceCatalogue,
    recordings: pa.Table,
    partition_of: np.ndarray,
    max_shard_bytes: int,
    digest: str,
    cut_batches: list[int],
) -> PackPlan:
    count = int(partition_of.max()) + 1
    planned = np.asarray(recordings.column("planned_bytes").to_numpy(), dtype=np.int64)
    seconds = [
        d.num_frames / d.sample_rate if d is not None and d.sample_rate > 0 else 0.0
        for d in (recording.declared for recording in catalogue.recordings)
    ]
    return PackPlan(
        version=PLAN_VERSION,
        digest=digest,
        source_kind=catalogue.kind,
        max_shard_bytes=max_shard_bytes,
        recordings=len(catalogue.recordings),
        cuts=len(catalogue.cuts),
        partition_recordings=tuple(np.bincount(partition_of, minlength=count).tolist()),
        partition_bytes=tuple(
            np.bincount(partition_of, weights=planned, minlength=count).astype(np.int64).tolist()
        ),
        partition_seconds=tuple(
            round(s, 3) for s in np.bincount(partition_of, weights=seconds, minlength=count)
        ),
        partition_cut_batches=tuple(cut_batches),
    )


def _plan_table(
    output: PackOutput, name: str, schema: pa.Schema, batches: int
) -> pa.ipc.RecordBatchFileReader:
    reader = output.open_table(name)
    if reader.num_record_batches != batches or not reader.schema.equals(schema):
        raise SourceError(
            f"does not match the plan ({reader.num_record_batches} batches where the plan "
            f"has {batches})",
            where=output.where(name),
        )
    return reader


def _batch(
    output: PackOutput, name: str, reader: pa.ipc.RecordBatchFileReader, number: int
) -> pa.RecordBatch:
    try:
        return reader.get_batch(number)
    except pa.ArrowException as exc:
        raise SourceError(f"cannot read batch {number}: {exc}", where=output.where(name)) from exc


def _source_recording(row: dict[str, Any]) -> SourceRecording:
    declared = None
    if row["declared_sample_rate"] is not None:
        declared = DeclaredAudio(
            int(row["declared_sample_rate"]),
            int(row["declared_channels"]),
            int(row["declared_frames"]),
        )
    return SourceRecording(
        recording_id=row["recording_id"],
        path=row["path"],
        command=row["command"],
        described_in=row["described_in"],
        offset_bytes=int(row["offset_bytes"]),
        length_bytes=row["length_bytes"],
        declared=declared,
        parquet_column=row["parquet_column"],
        url=row["url"],
    )


def _ignore(progress: PackProgress) -> None:
    pass
