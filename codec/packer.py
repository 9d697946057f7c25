"""``cutfs pack``: from recordings and cuts to a shard directory.

Packing runs in three steps.  Each recording is indexed (decoded once, in a
pool of worker processes when ``jobs > 1``), its bytes are appended to a shard
in input order, and at the end the cut frame ranges are computed and checked
against the exact recording lengths and the tables and manifest are written.

Everything is written into a temporary directory beside the output, renamed
into place only when complete: a failed pack leaves no partial output and
never touches an existing directory.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from cutfs.codec.command_runner import CommandLimits, run_command
from cutfs.codec.cut import seconds_to_frames
from cutfs.codec.errors import CutfsError, SourceError
from cutfs.codec.mapped_table import release_mapped_pages
from cutfs.codec.recording import Recording
from cutfs.codec.recording_indexer import IndexedRecording, index_recording
from cutfs.codec.shard_format import CUTS_SCHEMA
from cutfs.codec.shard_writer import DEFAULT_SHARD_BYTES, ShardWriter
from cutfs.codec.sources import SourceCatalogue, SourceRecording, read_source
from cutfs.codec.sources.arrow_dataset import read_parquet_cell


@dataclass(frozen=True, slots=True)
class PackProgress:
    """How far a pack is: recordings done of all, bytes stored, seconds of audio indexed."""

    recordings_done: int
    recordings: int
    stored_bytes: int
    audio_seconds: float


ProgressCallback = Callable[[PackProgress], None]


@dataclass
class PackReport:
    """What a pack wrote."""

    output_dir: str
    recordings: int = 0
    cuts: int = 0
    stored_bytes: int = 0
    audio_seconds: float = 0.0
    transcoded: dict[str, str] = field(default_factory=dict)  # recording id -> reason


def pack(
    sources: list[str],
    output_dir: str,
    *,
    jobs: int = 1,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    on_progress: ProgressCallback | None = None,
) -> PackReport:
    """Pack the recordings and cuts read from ``sources`` into ``output_dir``.

    Raises :class:`cutfs.codec.errors.CutfsError` subclasses for bad input, naming
    the file and the id; ``output_dir`` is then left as it was.
    """
    catalogue = read_source(sources)
    _check_output_dir(output_dir)
    for recording in catalogue.recordings:
        if recording.path is not None and not os.path.isfile(recording.path):
            raise SourceError(
                f"recording {recording.recording_id!r}: audio file not found: {recording.path}",
                where=recording.described_in,
            )
    parent = os.path.dirname(os.path.abspath(output_dir))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(output_dir)}.partial-", dir=parent)
    writer = ShardWriter(staging, max_shard_bytes)
    try:
        report = _pack_into(catalogue, staging, writer, jobs, on_progress)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes it private
        if os.path.isdir(output_dir):
            os.rmdir(output_dir)  # checked empty above
        os.rename(staging, output_dir)
    except BaseException:
        writer.abort()
        shutil.rmtree(staging, ignore_errors=True)
        raise
    report.output_dir = output_dir
    return report


def _check_output_dir(output_dir: str) -> None:
    if os.path.exists(output_dir) and (not os.path.isdir(output_dir) or os.listdir(output_dir)):
        raise SourceError(
            "the output exists and is not an empty directory; choose a new one or remove it",
            where=output_dir,
        )


def _pack_into(
    catalogue: SourceCatalogue,
    staging: str,
    writer: ShardWriter,
    jobs: int,
    on_progress: ProgressCallback | None,
) -> PackReport:
    report = PackReport(staging)
    recordings: dict[str, tuple[int, Recording]] = {}
    total = len(catalogue.recordings)
    for source, indexed in zip(
        catalogue.recordings, _indexed(catalogue, staging, jobs), strict=True
    ):
        stored_path = indexed.stored_path or source.path
        assert stored_path is not None
        with _mapped(stored_path) as blob:
            index = writer.add_recording(indexed.recording, blob, source.origin)
            report.stored_bytes += len(blob)
        if indexed.stored_path is not None:
            os.unlink(indexed.stored_path)
        recordings[source.recording_id] = (index, indexed.recording)
        report.audio_seconds += indexed.recording.duration_seconds
        if indexed.recording.transcoded_from:
            report.transcoded[source.recording_id] = "; ".join(indexed.notes)
        if on_progress is not None:
            on_progress(
                PackProgress(len(recordings), total, report.stored_bytes, report.audio_seconds)
            )
    cuts = _cuts_table(catalogue.cuts.table(), catalogue.recordings, recordings)
    release_mapped_pages()  # what the conversion touched of the spilled columns
    writer.finish(
        cuts,
        {"created_by": "cutfs", "source": catalogue.kind, "transcoded": len(report.transcoded)},
    )
    report.recordings = len(recordings)
    report.cuts = cuts.num_rows
    return report


def _indexed(catalogue: SourceCatalogue, staging: str, jobs: int) -> Iterator[IndexedRecording]:
    tasks = [(recording, staging) for recording in catalogue.recordings]
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
    else:
        try:
            with open(source.path, "rb") as container:
                container.seek(source.offset_bytes)
                data = container.read(-1 if source.length_bytes is None else source.length_bytes)
        except OSError as exc:
            raise SourceError(f"cannot read: {exc.strerror}", where=source.origin) from exc
    descriptor, path = tempfile.mkstemp(prefix="member-", suffix=".audio", dir=staging)
    with os.fdopen(descriptor, "wb") as output:
        output.write(data)
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


def _cuts_table(
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
