"""One partition of a pack: its recordings indexed and stored in its shard.

``cutfs pack run OUT --partition I`` reads partition I's recordings and cuts
from the plan (:mod:`cutfs.codec.packing.plan`), decodes each recording once
(exact length, seek index; in a pool of ``jobs`` processes), appends its bytes
to ``shard-IIIII.arrow``, checks every cut against the exact lengths, and
writes the partition's partial tables.  Everything is built in a scratch
directory and put in place whole; the ``done`` marker goes last:

    _parts/part-IIIIII.running.json    while a run is under way (host, pid, start)
    _parts/part-IIIIII.failed.json     after a run failed (its error line)
    _parts/part-IIIIII.recordings.arrow, .cuts.arrow    the partial tables
    _parts/part-IIIIII.done.json       written last: counts, the shard's size and version

A rerun of a partition whose ``done`` marker matches the plan does nothing; a
rerun of one that crashed starts again from its sources and puts the same
bytes in place.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from cutfs.codec.audio.cut import seconds_to_frames
from cutfs.codec.audio.recording import Recording
from cutfs.codec.audio.recording_indexer import IndexedRecording, index_recording
from cutfs.codec.catalogue.shard_format import CUTS_SCHEMA, shard_file_name, write_table
from cutfs.codec.catalogue.shard_writer import ShardWriter
from cutfs.codec.errors import CutfsError, SourceError
from cutfs.codec.packing.output import PackOutput
from cutfs.codec.packing.plan import PackPlan, partition_inputs, read_plan
from cutfs.codec.packing.progress import PackProgress, ProgressCallback
from cutfs.codec.sources import SourceRecording
from cutfs.codec.sources.arrow_dataset import read_parquet_cell
from cutfs.codec.storage.object_location import split_object_url
from cutfs.codec.storage.object_store import ObjectStore
from cutfs.codec.trust.command_runner import CommandLimits, run_command

#: The largest object a recording in object storage may be (a sanity bound against a
#: manifest naming some huge object; 36 hours of 48 kHz stereo FLAC is about 15 GB).
MAX_OBJECT_BYTES: Final = 64 << 30
#: A partition's partial tables.
_PART_TABLES: Final = ("recordings.arrow", "cuts.arrow")
#: Bytes copied at a time from a container (a tar member) to a file of its own.
_COPY_BYTES: Final = 8 << 20

#: Markers read at once by :func:`finished_partitions`.
_MARKER_READERS: Final = 16
#: A partition's shard is never split: it holds all of the partition's recordings.
_ONE_SHARD: Final = 1 << 62


def part_name(partition: int, kind: str) -> str:
    """The name of a partition's marker or table: ``kind`` is ``done.json``,
    ``running.json``, ``failed.json``, ``recordings.arrow`` or ``cuts.arrow``."""
    return f"_parts/part-{partition:06d}.{kind}"


@dataclass
class PartitionResult:
    """What a partition run wrote (its ``done`` marker)."""

    digest: str
    partition: int
    shard: dict[str, Any]
    recordings: int
    cuts: int
    stored_bytes: int
    audio_seconds: float
    transcoded: dict[str, str] = field(default_factory=dict)
    started: float = 0.0
    finished: float = 0.0
    host: str = ""
    #: True when the run found the partition already done and did nothing.
    skipped: bool = False

    def to_json(self) -> bytes:
        fields = asdict(self)
        del fields["skipped"]
        return (json.dumps(fields, indent=1) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> PartitionResult:
        try:
            fields = json.loads(data)
            result = cls(
                digest=str(fields["digest"]),
                partition=int(fields["partition"]),
                shard={
                    "file": str(fields["shard"]["file"]),
                    "recordings": int(fields["shard"]["recordings"]),
                    "bytes": int(fields["shard"]["bytes"]),
                    **({"etag": str(fields["shard"]["etag"])} if "etag" in fields["shard"] else {}),
                },
                recordings=int(fields["recordings"]),
                cuts=int(fields["cuts"]),
                stored_bytes=int(fields["stored_bytes"]),
                audio_seconds=float(fields["audio_seconds"]),
                transcoded={str(k): str(v) for k, v in dict(fields["transcoded"]).items()},
                started=float(fields["started"]),
                finished=float(fields["finished"]),
                host=str(fields["host"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SourceError(f"not a partition's done marker: {exc}", where=where) from exc
        if min(result.recordings, result.cuts, result.stored_bytes, result.shard["bytes"]) < 0:
            raise SourceError("negative counts in a done marker", where=where)
        if result.shard["file"] != shard_file_name(result.partition):
            # The name goes into the manifest: only the partition's own shard may be named.
            raise SourceError(
                f"names shard {result.shard['file']!r}, not its partition's", where=where
            )
        return result


def finished_partition(
    output: PackOutput, plan: PackPlan, partition: int
) -> PartitionResult | None:
    """The partition's ``done`` marker when it is there and belongs to ``plan``."""
    name = part_name(partition, "done.json")
    if not output.exists(name):
        return None
    result = PartitionResult.from_json(output.read_small(name), output.where(name))
    if result.digest != plan.digest or result.partition != partition:
        return None  # left by a plan since replaced
    return result


def finished_partitions(output: PackOutput, plan: PackPlan) -> list[PartitionResult | None]:
    """:func:`finished_partition` of every partition: one listing, then the ``done``
    markers there, read a few at once (in object storage each is a GET)."""
    present = output.sizes("_parts/part-")
    done = [p for p in range(plan.partitions) if part_name(p, "done.json") in present]
    results: list[PartitionResult | None] = [None] * plan.partitions
    with ThreadPoolExecutor(max_workers=_MARKER_READERS) as readers:
        for partition, result in zip(
            done, readers.map(lambda p: finished_partition(output, plan, p), done), strict=True
        ):
            results[partition] = result
    return results


def pack_partition(
    output: PackOutput,
    partition: int,
    *,
    jobs: int = 1,
    on_progress: ProgressCallback | None = None,
) -> PartitionResult:
    """Pack partition ``partition`` of the plan in ``output`` (see the module docstring).

    Raises :class:`SourceError` (and other :class:`CutfsError`) for bad input,
    after writing the partition's ``failed`` marker.
    """
    plan = read_plan(output)
    done = finished_partition(output, plan, partition)
    if done is not None:
        done.skipped = True
        return done
    started = time.time()
    running = {"digest": plan.digest, "host": socket.gethostname(), "pid": os.getpid()}
    output.write_small(
        part_name(partition, "running.json"), json.dumps({**running, "started": started}).encode()
    )
    output.remove(part_name(partition, "failed.json"))
    try:
        with output.scratch() as scratch:
            result = _pack(output, plan, partition, scratch, jobs, on_progress)
    except BaseException as exc:
        failure = {
            **running,
            "started": started,
            "finished": time.time(),
            "error": str(exc) or type(exc).__name__,
            "data_error": isinstance(exc, CutfsError),
        }
        with contextlib.suppress(Exception):
            output.write_small(part_name(partition, "failed.json"), json.dumps(failure).encode())
            output.remove(part_name(partition, "running.json"))
        raise
    result.started = started
    output.write_small(part_name(partition, "done.json"), result.to_json())
    output.remove(part_name(partition, "running.json"))
    return result


def run_partition_task(output_uri: str, partition: int, jobs: int = 1) -> dict[str, Any]:
    """:func:`pack_partition` on the output named ``output_uri``, for an engine's worker
    (a Slurm array task, a Ray task, a pool process); returns the ``done`` marker's fields."""
    from cutfs.codec.packing.output import open_pack_output  # noqa: PLC0415

    output = open_pack_output(output_uri)
    try:
        result = pack_partition(output, partition, jobs=jobs)
    finally:
        output.close()
    return asdict(result)


def _pack(
    output: PackOutput,
    plan: PackPlan,
    partition: int,
    scratch: str,
    jobs: int,
    on_progress: ProgressCallback | None,
) -> PartitionResult:
    sources, cuts = partition_inputs(output, plan, partition)
    writer = ShardWriter(scratch, _ONE_SHARD, first_shard=partition)
    packed: dict[str, tuple[int, Recording]] = {}
    result = PartitionResult(plan.digest, partition, {}, 0, 0, 0, 0.0, host=socket.gethostname())
    try:
        for source, indexed in zip(sources, _indexed(sources, scratch, jobs), strict=True):
            stored_path = indexed.stored_path or source.path
            assert stored_path is not None
            with _mapped(stored_path) as blob:
                number = writer.add_recording(indexed.recording, blob, source.origin)
                result.stored_bytes += len(blob)
            if indexed.stored_path is not None:
                os.unlink(indexed.stored_path)
            packed[source.recording_id] = (number, indexed.recording)
            result.audio_seconds += indexed.recording.duration_seconds
            if indexed.recording.transcoded_from:
                result.transcoded[source.recording_id] = "; ".join(indexed.notes)
            if on_progress is not None:
                on_progress(
                    PackProgress(
                        len(packed), len(sources), result.stored_bytes, result.audio_seconds
                    )
                )
        recordings = writer.close()
    except BaseException:
        writer.abort()
        raise
    tables = {kind: os.path.join(scratch, f"part.{kind}") for kind in _PART_TABLES}
    write_table(tables["recordings.arrow"], recordings)
    result.cuts = _write_cuts(tables["cuts.arrow"], cuts, sources, packed)
    (shard,) = writer.shards
    etag = output.put_file(shard["file"], os.path.join(scratch, shard["file"]))
    result.shard = {**shard, "etag": etag} if etag else dict(shard)
    for kind, path in tables.items():
        output.put_file(part_name(partition, kind), path)
    result.recordings = recordings.num_rows
    result.finished = time.time()
    return result


def _indexed(sources: list[SourceRecording], staging: str, jobs: int) -> Iterator[IndexedRecording]:
    tasks = [(recording, staging) for recording in sources]
    if jobs <= 1 or len(tasks) <= 1:
        yield from (_index_task(task) for task in tasks)
        return
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        yield from pool.map(_index_task, tasks)


def _index_task(task: tuple[SourceRecording, str]) -> IndexedRecording:
    source, staging = task
    path = source.path
    if source.command is not None:
        path = _run_command(source, staging)
    elif source.url is not None:
        path = _download(source, staging)
    elif (
        source.parquet_column is not None or source.offset_bytes or source.length_bytes is not None
    ):
        path = _extract(source, staging)
    assert path is not None
    copied = path != source.path  # a file of our own in the staging directory
    with _mapped(path, source) as blob:
        try:
            indexed = index_recording(blob, source.recording_id, staging)
        except CutfsError as exc:
            raise SourceError(
                f"recording {source.recording_id!r}: {exc.message}",
                where=f"{source.origin} (listed in {source.described_in})",
            ) from exc
    if copied and indexed.stored_path is None:
        indexed.stored_path = path
    elif copied:
        os.unlink(path)
    return indexed


def _extract(source: SourceRecording, staging: str) -> str:
    """Copy a recording stored inside another file (tar member, Arrow or Parquet row)."""
    assert source.path is not None
    if source.parquet_column is not None:
        data = read_parquet_cell(
            source.path, source.parquet_column, source.offset_bytes, source.length_bytes or 0
        )
        descriptor, path = tempfile.mkstemp(prefix="member-", suffix=".audio", dir=staging)
        with os.fdopen(descriptor, "wb") as output:
            output.write(data)
        return path
    descriptor, path = tempfile.mkstemp(prefix="member-", suffix=".audio", dir=staging)
    try:
        with open(source.path, "rb") as container, os.fdopen(descriptor, "wb") as output:
            container.seek(source.offset_bytes)
            left = -1 if source.length_bytes is None else source.length_bytes
            while left != 0:  # in pieces: memory stays bounded whatever the member's size
                piece = container.read(_COPY_BYTES if left < 0 else min(left, _COPY_BYTES))
                if not piece:
                    break
                output.write(piece)
                left = left - len(piece) if left > 0 else left
    except OSError as exc:
        raise SourceError(f"cannot read: {exc.strerror}", where=source.origin) from exc
    return path


def _download(source: SourceRecording, staging: str) -> str:
    """Fetch a recording's object whole into the staging directory (in parts: memory
    stays bounded), refused past :data:`MAX_OBJECT_BYTES`."""
    assert source.url is not None
    descriptor, path = tempfile.mkstemp(prefix="object-", suffix=".audio", dir=staging)
    os.close(descriptor)
    try:
        location, name = split_object_url(source.url)
        store = ObjectStore(location)
        try:
            size = store.size(name)
            if size > MAX_OBJECT_BYTES:
                raise SourceError(
                    f"the object has {size} bytes, more than the {MAX_OBJECT_BYTES} a "
                    "recording may have",
                    where=source.url,
                )
            store.download(name, path)
        finally:
            store.close()
    except CutfsError as exc:
        os.unlink(path)
        raise SourceError(
            f"recording {source.recording_id!r}: cannot fetch it: {exc.message}",
            where=f"{source.url} (listed in {source.described_in})",
        ) from exc
    return path


def _run_command(source: SourceRecording, staging: str) -> str:
    """Run a recording's command as the user packing, within :class:`CommandLimits`."""
    descriptor, path = tempfile.mkstemp(prefix="command-", suffix=".audio", dir=staging)
    os.close(descriptor)
    try:
        run_command(source.command or "", path, CommandLimits(), source.described_in)
    except SourceError as exc:
        raise SourceError(
            f"recording {source.recording_id!r}: {exc.message}", where=source.described_in
        ) from exc
    return path


class _mapped:  # noqa: N801 - used as a context manager, like open()
    """A read-only memory map of a whole file, as a memoryview."""

    def __init__(self, path: str, source: SourceRecording | None = None) -> None:
        self._path = path
        self._source = source
        self._map: mmap.mmap | None = None
        self._view: memoryview | None = None

    def __enter__(self) -> memoryview:
        try:
            with open(self._path, "rb") as audio_file:
                if os.fstat(audio_file.fileno()).st_size == 0:
                    raise SourceError("the file is empty", where=self._describe())
                self._map = mmap.mmap(audio_file.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise SourceError(f"cannot read: {exc.strerror}", where=self._describe()) from exc
        self._view = memoryview(self._map)
        return self._view

    def __exit__(self, *exc_info: object) -> None:
        if self._view is not None:
            self._view.release()
        if self._map is not None:
            # A decoder that failed may still hold a view in its traceback: the map then
            # closes when the last view goes.
            with contextlib.suppress(BufferError):
                self._map.close()

    def _describe(self) -> str:
        if self._source is None:
            return self._path
        return f"{self._path} (recording {self._source.recording_id!r})"


def _write_cuts(
    path: str,
    cuts: Iterator[pa.RecordBatch],
    sources: list[SourceRecording],
    packed: dict[str, tuple[int, Recording]],
) -> int:
    """Write the partition's cuts table (:func:`cuts_table` of each batch of the plan's
    cuts, as it is read) to ``path``; returns the number of cuts."""
    count = 0
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, CUTS_SCHEMA) as writer:
        for batch in cuts:
            writer.write_table(cuts_table(pa.Table.from_batches([batch]), sources, packed))
            count += batch.num_rows
    return count


def cuts_table(
    cuts: pa.Table,
    sources: list[SourceRecording],
    packed: dict[str, tuple[int, Recording]],
) -> pa.Table:
    """The cuts table (frames, recording numbers) of the source's cuts, column by column.

    Times round to frames as Lhotse rounds them (:func:`seconds_to_frames`); each cut is
    checked to lie inside its recording and to ask only for channels it has.  Raises
    :class:`SourceError` naming the first cut that does not.
    """
    plans = [packed[source.recording_id] for source in sources]
    ids = pa.array([source.recording_id for source in sources], pa.string())
    position = np.asarray(
        pc.index_in(cuts.column("recording_id"), value_set=ids).to_numpy(zero_copy_only=False),
        dtype=np.int64,
    )  # every cut's recording is known: SourceCatalogue.check refused the others
    numbers = np.array([number for number, _ in plans], dtype=np.int64)[position]
    rates = np.array([plan.sample_rate for _, plan in plans], dtype=np.int64)[position]
    lengths = np.array([plan.num_frames for _, plan in plans], dtype=np.int64)[position]
    widths = np.array([plan.channels for _, plan in plans], dtype=np.int64)[position]
    starts = _frames(_float_column(cuts, "start_seconds"), rates)
    durations = _float_column(cuts, "duration_seconds")
    whole = np.isnan(durations)
    counts = np.where(whole, lengths - starts, _frames(np.where(whole, 0.0, durations), rates))
    outside = (starts + counts > lengths) | (counts < 0)
    if outside.any():
        row = int(np.flatnonzero(outside)[0])
        source = sources[int(position[row])]
        plan = plans[int(position[row])][1]
        raise SourceError(
            f"cut {cuts.column('cut_id')[row].as_py()!r} ends at "
            f"{(starts[row] + counts[row]) / rates[row]:.6f} s, after the end of recording "
            f"{source.recording_id!r} ({plan.duration_seconds:.6f} s, {plan.num_frames} frames "
            f"at {plan.sample_rate} Hz)",
            where=cuts.column("described_in")[row].as_py(),
        )
    channels = _checked_channels(
        cuts, widths, [source.recording_id for source in sources], position
    )
    return pa.table(
        [
            cuts.column("cut_id").cast(pa.large_string()),
            pa.array(numbers, pa.int32()),
            pa.array(starts),
            pa.array(counts),
            channels,
            cuts.column("metadata").cast(pa.large_string()),
        ],
        schema=CUTS_SCHEMA,
    )


def _float_column(table: pa.Table, name: str) -> npt.NDArray[np.float64]:
    values: npt.NDArray[np.float64] = np.asarray(table.column(name).to_numpy(), np.float64)
    return values


def _frames(
    seconds: npt.NDArray[np.float64], rates: npt.NDArray[np.int64]
) -> npt.NDArray[np.int64]:
    """:func:`seconds_to_frames` of every value: vectorised, and exact where it matters.

    Rounding half up only depends on the last bits of the product when its fraction is
    within a hair of one half; those few values are converted one by one.
    """
    product = np.round(seconds * rates, 8)
    frames: npt.NDArray[np.int64] = np.floor(product + 0.5).astype(np.int64)
    close = np.flatnonzero(np.abs(product - np.floor(product) - 0.5) < 1e-6)
    for row in close:
        frames[row] = seconds_to_frames(float(seconds[row]), int(rates[row]))
    return frames


def _checked_channels(
    cuts: pa.Table, widths: np.ndarray, recording_ids: list[str], position: np.ndarray
) -> pa.Array:
    """The cuts' channel lists, checked against their recordings; a list of every channel in
    order (or none given) becomes empty, meaning all."""
    column = cuts.column("channels").combine_chunks()
    lists = pc.if_else(pc.is_null(column), pa.scalar([], column.type), column)
    offsets = np.asarray(lists.offsets.to_numpy(), dtype=np.int64)
    values = np.asarray(lists.flatten().to_numpy(zero_copy_only=False), dtype=np.int64)
    owner = np.repeat(np.arange(len(lists)), np.diff(offsets))
    bad = (values < 0) | (values >= widths[owner])
    if bad.any():
        row = int(owner[np.flatnonzero(bad)[0]])
        raise SourceError(
            f"cut {cuts.column('cut_id')[row].as_py()!r} asks for channel "
            f"{int(values[np.flatnonzero(bad)[0]])} of recording "
            f"{recording_ids[int(position[row])]!r}, which has {int(widths[row])}",
            where=cuts.column("described_in")[row].as_py(),
        )
    in_order = values == np.arange(len(values)) - offsets[owner]
    mismatches = np.bincount(owner[~in_order], minlength=len(lists))
    everything = (np.diff(offsets) == widths) & (mismatches == 0)
    if not everything.any():
        return lists
    keep = np.where(everything, 0, np.diff(offsets))
    new_offsets = np.concatenate([[0], np.cumsum(keep)]).astype(np.int32)
    kept = values[np.repeat(~everything, np.diff(offsets))]
    return pa.ListArray.from_arrays(pa.array(new_offsets), pa.array(kept, pa.int16()))
