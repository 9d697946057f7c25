"""What ``pack`` reads from any input: recordings to store and cuts of them."""

from __future__ import annotations

import json
import math
import mmap
import tempfile
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from cutfs.codec.catalogue.mapped_table import release_mapped_pages, track_map
from cutfs.codec.errors import SourceError
from cutfs.codec.spill.external_sort import ExternalSort, repeats_of_previous
from cutfs.codec.spill.memory_budget import DEFAULT_MEMORY_BYTES, buffer_bytes
from cutfs.codec.trust.limits import InputLimits


@dataclass
class Refusals:
    """What becomes of an entry of a source (a recording, a cut, a line) that is invalid.

    ``cutfs pack`` is strict: the first invalid entry stops it, so nothing is
    packed half right.  A mount serving a source in place is lenient: the
    entry is left out, its message is kept in :attr:`messages`, and every
    other recording and cut is served.  Errors that concern the whole source
    (an unreadable file, no recordings at all) are raised in both modes.
    """

    strict: bool = True
    messages: list[str] = field(default_factory=list)
    #: How large the source's text files and their lines may be (see :class:`InputLimits`).
    limits: InputLimits = field(default_factory=InputLimits)
    #: Lines read so far, of all the source's files.
    lines_read: int = 0
    #: What the checks may buffer of the cut ids when they sort them (more is spilled to disk).
    sort_memory_bytes: int = buffer_bytes(DEFAULT_MEMORY_BYTES)

    def count_line(self, where: str) -> None:
        """One more line read; a source past :attr:`InputLimits.entries` is refused whole."""
        self.lines_read += 1
        if self.lines_read > self.limits.entries:
            raise SourceError(
                f"more than {self.limits.entries} entries: refused (a larger source needs a "
                "higher --max-entries)",
                where=where,
            )

    @contextmanager
    def entry(self) -> Iterator[None]:
        """Run the reading of one entry; a :class:`SourceError` in it refuses the entry."""
        try:
            yield
        except SourceError as exc:
            if self.strict:
                raise
            self.messages.append(str(exc))

    def refuse(self, error: SourceError) -> None:
        """Refuse an entry found invalid outside :meth:`entry`."""
        with self.entry():
            raise error

    def note(self, message: str) -> None:
        """Record something left out that is never an error (a FIFO in an audio folder)."""
        self.messages.append(message)


@dataclass(frozen=True, slots=True)
class DeclaredAudio:
    """What a manifest says about a recording's audio, before anyone decodes it."""

    sample_rate: int
    channels: int
    num_frames: int


@dataclass(frozen=True, slots=True)
class SourceRecording:
    """A recording: a file, bytes inside a file (a tar member, an Arrow blob), a shell
    command whose output is the file, or an object in object storage (``url``:
    ``s3://``, ``gs://`` or ``az://``, fetched whole when packed).

    ``length_bytes`` of ``None`` means up to the end of the file.
    """

    recording_id: str
    path: str | None = None
    command: str | None = None
    described_in: str = ""
    offset_bytes: int = 0
    length_bytes: int | None = None
    declared: DeclaredAudio | None = None
    #: A Parquet row's audio: ``offset_bytes`` is then the row group and
    #: ``length_bytes`` the row in it (the bytes are extracted on first use).
    parquet_column: str | None = None
    url: str | None = None

    @property
    def origin(self) -> str:
        """The file, command or object, as a user would recognise it."""
        if self.url is not None:
            return self.url
        if self.path is None:
            return f"{self.command} |"
        if self.offset_bytes or self.length_bytes is not None:
            return f"{self.path} (bytes from {self.offset_bytes}, {self.length_bytes} long)"
        return self.path


@dataclass(frozen=True, slots=True)
class SourceCut:
    """A cut as the input describes it, in seconds.

    ``start_seconds`` and ``duration_seconds`` of ``None`` mean the whole
    recording; ``channels`` of ``None`` means all of its channels.
    """

    cut_id: str
    recording_id: str
    start_seconds: float = 0.0
    duration_seconds: float | None = None
    channels: tuple[int, ...] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    described_in: str = ""


#: The columns :class:`CutColumns` keeps: a :class:`SourceCut` per row.
CUT_COLUMNS_SCHEMA: Final = pa.schema(
    [
        ("cut_id", pa.string()),
        ("recording_id", pa.string()),
        ("start_seconds", pa.float64()),
        ("duration_seconds", pa.float64()),  # NaN: to the end of the recording
        ("channels", pa.list_(pa.int16())),  # null: all
        ("metadata", pa.string()),  # JSON, keys sorted
        ("described_in", pa.string()),
    ]
)
#: Cuts converted to Arrow at once.
_BATCH_ROWS: Final = 1 << 16
#: Cuts checked at once.
_CHECK_ROWS: Final = 1 << 20


class CutColumns:
    """Cuts as an input describes them, kept as Arrow columns in an unnamed temporary file.

    Readers append one :class:`SourceCut` at a time; every 65 536 they are
    written out as a record batch, so memory does not grow with the number of
    cuts.  :meth:`table` maps what was written.  Iterating gives the cuts back
    as :class:`SourceCut` objects (for small inputs and tests).
    """

    def __init__(self, cuts: Iterable[SourceCut] = ()) -> None:
        self._file = tempfile.TemporaryFile(prefix="cutfs-cuts-")  # noqa: SIM115 - kept open
        weakref.finalize(self, self._file.close)  # an input refused midway leaves no file open
        self._sink = pa.PythonFile(self._file, mode="w")
        self._writer = pa.ipc.new_file(self._sink, CUT_COLUMNS_SCHEMA)
        self._pending: list[SourceCut] = []
        self._count = 0
        self._table: pa.Table | None = None
        for cut in cuts:
            self.append(cut)

    def append(self, cut: SourceCut) -> None:
        """Keep a cut; :class:`SourceError` (refusing it) when its ids cannot be stored as
        text, as names made from bytes that are not UTF-8 cannot."""
        if self._table is not None:
            raise RuntimeError("cuts cannot be added after table()")
        for text in (cut.cut_id, cut.recording_id):
            if not is_text(text):
                raise SourceError(f"the id {text!r} is not UTF-8 text", where=cut.described_in)
        self._pending.append(cut)
        self._count += 1
        if len(self._pending) >= _BATCH_ROWS:
            self._flush()

    def append_batch(self, batch: pa.RecordBatch) -> None:
        """Keep cuts already in columns (of :data:`CUT_COLUMNS_SCHEMA`, checked as
        :meth:`append` checks them: by the reader that made them)."""
        if self._table is not None:
            raise RuntimeError("cuts cannot be added after table()")
        if not batch.schema.equals(CUT_COLUMNS_SCHEMA):
            raise ValueError(f"cuts of schema {batch.schema}, not {CUT_COLUMNS_SCHEMA}")
        self._flush()
        self._writer.write_batch(batch)
        self._count += batch.num_rows

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def table(self) -> pa.Table:
        """Every cut appended, as a table of :data:`CUT_COLUMNS_SCHEMA` (mapped, not read)."""
        if self._table is None:
            self._flush()
            self._writer.close()
            self._file.flush()
            mapped = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
            track_map(mapped)  # a pass over millions of rows can release what it touched
            self._file.close()  # the map keeps what it maps
            self._table = pa.ipc.open_file(pa.py_buffer(mapped)).read_all()
        return self._table

    def replace(self, table: pa.Table) -> None:
        """Keep ``table`` (of the same schema; rows left out, say) instead."""
        self.table()
        self._table = table
        self._count = table.num_rows

    def __iter__(self) -> Iterator[SourceCut]:
        table = self.table()
        for batch in table.to_batches(_BATCH_ROWS):
            for row in batch.to_pylist():
                channels = row["channels"]
                duration = row["duration_seconds"]
                yield SourceCut(
                    cut_id=row["cut_id"],
                    recording_id=row["recording_id"],
                    start_seconds=row["start_seconds"],
                    duration_seconds=None if math.isnan(duration) else duration,
                    channels=None if channels is None else tuple(channels),
                    metadata=json.loads(row["metadata"]),
                    described_in=row["described_in"],
                )

    def _flush(self) -> None:
        if not self._pending:
            return
        cuts, self._pending = self._pending, []
        batch = pa.record_batch(
            [
                pa.array([cut.cut_id for cut in cuts], pa.string()),
                pa.array([cut.recording_id for cut in cuts], pa.string()),
                pa.array([cut.start_seconds for cut in cuts], pa.float64()),
                pa.array(
                    [math.nan if c.duration_seconds is None else c.duration_seconds for c in cuts],
                    pa.float64(),
                ),
                pa.array(
                    [None if c.channels is None else list(c.channels) for c in cuts],
                    pa.list_(pa.int16()),
                ),
                pa.array([metadata_text(c.metadata) for c in cuts], pa.string()),
                pa.array([cut.described_in for cut in cuts], pa.string()),
            ],
            schema=CUT_COLUMNS_SCHEMA,
        )
        self._writer.write_batch(batch)


@dataclass
class SourceCatalogue:
    """Recordings and cuts read from one input, checked for duplicate ids."""

    recordings: list[SourceRecording]
    cuts: CutColumns
    kind: str
    #: Messages about entries left out (lenient reading only; see :class:`Refusals`).
    refused: list[str] = field(default_factory=list)

    def check(self, refusals: Refusals) -> None:
        """Refuse duplicate ids and cuts of unknown (or refused) recordings.

        Strict refusals raise :class:`SourceError`; lenient ones drop the later
        duplicate or the cut.  With no recordings left the source is refused whole.
        """
        recording_ids: set[str] = set()
        recordings = []
        for recording in self.recordings:
            if not is_text(recording.recording_id):
                refusals.refuse(
                    SourceError(
                        f"the id {recording.recording_id!r} is not UTF-8 text",
                        where=recording.described_in,
                    )
                )
                continue
            if recording.recording_id in recording_ids:
                refusals.refuse(
                    SourceError(
                        f"duplicate recording id {recording.recording_id!r}",
                        where=recording.described_in,
                    )
                )
                continue
            recording_ids.add(recording.recording_id)
            recordings.append(recording)
        self._check_cuts(recordings, refusals)
        self.recordings = recordings
        self.refused = refusals.messages
        if not self.recordings:
            refused = ""
            if refusals.messages:
                refused = (
                    f" ({len(refusals.messages)} entries refused; the first: "
                    f"{refusals.messages[0]})"
                )
            raise SourceError(f"no recordings found{refused}", where=self.kind)

    def _check_cuts(self, recordings: list[SourceRecording], refusals: Refusals) -> None:
        """Refuse cuts of unknown recordings and duplicate cut ids (the later ones), in
        bounded memory: vectorised kernels over chunks of the spilled columns, and an
        external sort of the ids (no Python object per cut)."""
        table = self.cuts.table()
        known = pa.array([recording.recording_id for recording in recordings], pa.string())
        refused: list[npt.NDArray[np.int64]] = []
        for start in range(0, table.num_rows, _CHECK_ROWS):
            chunk = table.column("recording_id").slice(start, _CHECK_ROWS)
            unknown = pc.is_null(pc.index_in(chunk, value_set=known))
            rows = np.flatnonzero(np.asarray(unknown.to_numpy(zero_copy_only=False), dtype=bool))
            if len(rows):
                refused.append(rows + start)
                self._refuse_rows(table, rows + start, refusals, unknown=True)
        release_mapped_pages()
        for rows in _later_duplicates(table.column("cut_id"), refusals.sort_memory_bytes):
            refused.append(rows)
            self._refuse_rows(table, rows, refusals, unknown=False)
        release_mapped_pages()
        if not refused:
            return
        rows = np.concatenate(refused)
        keep = np.ones(table.num_rows, dtype=bool)
        keep[rows] = False
        self.cuts.replace(table.filter(pa.array(keep)))

    def _refuse_rows(
        self, table: pa.Table, rows: npt.NDArray[np.int64], refusals: Refusals, *, unknown: bool
    ) -> None:
        """Refuse cut rows, of unknown recordings or duplicate ids: strict refusals raise at
        the first."""
        for row in rows.tolist():
            cut_id = table.column("cut_id")[row].as_py()
            where = table.column("described_in")[row].as_py()
            if unknown:
                recording_id = table.column("recording_id")[row].as_py()
                message = (
                    f"cut {cut_id!r} refers to unknown "
                    f"{'or refused ' if refusals.messages else ''}recording {recording_id!r}"
                )
            else:
                message = f"duplicate cut id {cut_id!r}"
            refusals.refuse(SourceError(message, where=where))


def is_text(value: str) -> bool:
    """Whether a string can be stored as UTF-8 (not when it holds lone surrogates: bytes
    that were not UTF-8, kept by ``surrogateescape``, or a JSON escape such as ``\\ud800``)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def metadata_text(metadata: dict[str, Any]) -> str:
    """A cut's metadata as JSON text, its keys sorted; characters that UTF-8 cannot hold
    (lone surrogates) are written as JSON escapes."""
    text = json.dumps(metadata, ensure_ascii=False, sort_keys=True)
    return text if is_text(text) else json.dumps(metadata, sort_keys=True)


def _later_duplicates(ids: pa.ChunkedArray, memory_bytes: int) -> Iterator[npt.NDArray[np.int64]]:
    """The rows whose id an earlier row already has, a group at a time (in id order): an
    external sort of (id, row), which keeps equal ids in row order, so the first row of
    each run of equal ids is the earliest."""
    schema = pa.schema([("cut_id", ids.type), ("row", pa.int64())])
    with ExternalSort(schema, "cut_id", None, memory_bytes) as ordered:  # TMPDIR if need be
        for start in range(0, len(ids), _CHECK_ROWS):
            chunk = ids.slice(start, _CHECK_ROWS).combine_chunks()
            rows = np.arange(start, start + len(chunk), dtype=np.int64)
            ordered.add(pa.record_batch([chunk, pa.array(rows)], schema=schema))
            release_mapped_pages()
        previous: object | None = None
        for batch in ordered.sorted_batches():
            same, previous = repeats_of_previous(batch.column(0), previous)
            if same.any():
                yield np.sort(np.asarray(batch.column(1).to_numpy(), dtype=np.int64)[same])
