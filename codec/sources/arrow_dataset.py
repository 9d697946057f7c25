"""Recordings stored as rows of Arrow or Parquet files: HuggingFace datasets and episode shards.

A row holds one recording's encoded bytes in an audio column: a binary column
(``audio``, or the only binary column) or HuggingFace's ``Audio`` struct
``{bytes, path}``; a struct row without bytes is the file its ``path`` names
(relative to the Arrow file's directory).  Other string and number columns
become the cut's metadata (``text``, ``speaker``, ...).

* Arrow IPC files (``*.arrow``: HuggingFace ``save_to_disk`` writes the
  stream format, episode shards often the file format) are not compressed,
  so each row's bytes are a range of the file: they are located once by
  reading the record batches over a memory map, and served in place.
* Parquet pages are usually compressed: a row's bytes are extracted into the
  index cache the first time its recording is needed (the catalogue keeps the
  row group and row).

Without a segment list every row is one cut.  A segment list beside the files
(``segments.jsonl``, ``segments.csv`` or ``segments.tsv``, with columns
``id``, ``recording``, ``start``, ``end`` in seconds) makes the cuts instead,
each of a recording named by the id column (``id``, ``recording_id``,
``key`` or ``__key__``) or by the stem of the Audio struct's ``path``.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from cutfs.codec.errors import SourceError
from cutfs.codec.sources.catalogue import (
    CutColumns,
    Refusals,
    SourceCatalogue,
    SourceCut,
    SourceRecording,
)
from cutfs.codec.sources.json_lines import json_lines
from cutfs.codec.sources.tree import files_under
from cutfs.codec.trust.limits import parse_seconds

_ID_COLUMNS = ("id", "recording_id", "key", "__key__")
_SEGMENT_LISTS = ("segments.jsonl", "segments.csv", "segments.tsv")
#: The fields every segment has; the others are kept as its metadata.
_SEGMENT_FIELDS = ("id", "recording", "start", "end")


def is_arrow_dataset(path: str) -> bool:
    return os.path.isdir(path) and bool(_files(path, "arrow") or _files(path, "parquet"))


def read_arrow_dataset(directory: str, refusals: Refusals | None = None) -> SourceCatalogue:
    refusals = refusals if refusals is not None else Refusals()
    rows = [row for path in _files(directory, "arrow") for row in _arrow_rows(path, refusals)]
    rows += [row for path in _files(directory, "parquet") for row in _parquet_rows(path)]
    recordings = [recording for recording, _ in rows]
    segment_list = next(
        (
            os.path.join(directory, n)
            for n in _SEGMENT_LISTS
            if os.path.isfile(os.path.join(directory, n))
        ),
        None,
    )
    if segment_list is None:
        cuts = CutColumns(
            SourceCut(r.recording_id, r.recording_id, metadata=m, described_in=r.described_in)
            for r, m in rows
        )
    else:
        cuts = CutColumns(_segments(segment_list, refusals))
    catalogue = SourceCatalogue(recordings, cuts, "Arrow/Parquet dataset")
    catalogue.check(refusals)
    return catalogue


def _files(directory: str, extension: str) -> list[str]:
    found = files_under(directory, (f".{extension}",))
    return [path for path in found if not os.path.basename(path).startswith("cache-")]


def _arrow_rows(path: str, refusals: Refusals) -> Iterator[tuple[SourceRecording, dict[str, Any]]]:
    """Each row's recording (its audio cell's bytes in place, or the file its Audio struct
    names) and metadata; a row without usable audio is refused, the others kept."""
    try:
        buffer = pa.memory_map(path).read_buffer()
        reader = _open_ipc(buffer)
    except (OSError, pa.ArrowException) as exc:
        raise SourceError(f"cannot read Arrow file: {exc}", where=path) from exc
    start, end = buffer.address, buffer.address + buffer.size
    row = 0
    for batch in _batches(reader, path):
        audio, paths = _audio_column(batch, path)
        ids = _ids(batch, paths)
        _, offsets_buffer, values = audio.buffers()
        width = np.int64 if pa.types.is_large_binary(audio.type) else np.int32
        offsets = np.frombuffer(offsets_buffer, dtype=width)[
            audio.offset : audio.offset + len(audio) + 1
        ]
        missing = audio.is_null().to_numpy(zero_copy_only=False)
        stored = not missing.all() and offsets[-1] > offsets[0]
        if stored and (values is None or not start <= values.address <= end - values.size):
            raise SourceError(
                "the audio bytes are not stored in place (compressed IPC?): pack it instead",
                where=path,
            )
        for number in range(len(audio)):
            where = f"{path}, row {row + number}"
            recording_id = ids[number] or f"{os.path.basename(path)}-{row + number}"
            recording = None
            with refusals.entry():
                if missing[number]:
                    base = os.path.dirname(path)
                    recording = _external(recording_id, paths[number], base, where)
                else:
                    first_byte, end_byte = int(offsets[number]), int(offsets[number + 1])
                    if values is None or not 0 <= first_byte < end_byte <= values.size:
                        raise SourceError(
                            "the row's audio bytes are empty or out of place", where=where
                        )
                    recording = SourceRecording(
                        recording_id,
                        path=os.path.abspath(path),
                        described_in=where,
                        offset_bytes=values.address - start + first_byte,
                        length_bytes=end_byte - first_byte,
                    )
            if recording is not None:
                yield recording, _metadata(batch, number)
        row += batch.num_rows


def _batches(reader: Iterator[pa.RecordBatch], path: str) -> Iterator[pa.RecordBatch]:
    """The record batches of a reader; a file that breaks off midway is a SourceError."""
    while True:
        try:
            batch = next(reader)
        except StopIteration:
            return
        except (OSError, pa.ArrowException) as exc:
            raise SourceError(f"cannot read Arrow file: {exc}", where=path) from exc
        yield batch


def _external(recording_id: str, path: str | None, base: str, where: str) -> SourceRecording:
    """A row whose Audio struct has no bytes but a path: the file it names."""
    if path:
        resolved = path if os.path.isabs(path) else os.path.join(base, path)
        if os.path.isfile(resolved):
            return SourceRecording(recording_id, path=os.path.abspath(resolved), described_in=where)
    raise SourceError(f"row has no audio bytes, and its path {path!r} is not a file", where=where)


def _open_ipc(buffer: pa.Buffer) -> Iterator[pa.RecordBatch]:
    """The record batches of an Arrow IPC file or stream, zero-copy over ``buffer``."""
    try:
        reader = pa.ipc.open_file(buffer)
    except pa.ArrowInvalid:
        return iter(pa.ipc.open_stream(buffer))
    return (reader.get_batch(number) for number in range(reader.num_record_batches))


def _parquet_rows(path: str) -> Iterator[tuple[SourceRecording, dict[str, Any]]]:
    """Rows of a Parquet file, reading every column but the audio bytes."""
    try:
        parquet = pq.ParquetFile(path)
        audio_name = next((f.name for f in parquet.schema_arrow if _is_audio(f.type)), None)
        if audio_name is None:
            raise SourceError("no audio column (binary, or an Audio struct)", where=path)
        others = [f.name for f in parquet.schema_arrow if f.name != audio_name]
        audio_type = parquet.schema_arrow.field(audio_name).type
        with_paths = (
            isinstance(audio_type, pa.StructType) and audio_type.get_field_index("path") >= 0
        )
        row = 0
        for group in range(parquet.num_row_groups):
            table = parquet.read_row_group(group, columns=others)
            paths: list[str | None] = [None] * table.num_rows
            if with_paths:
                column = parquet.read_row_group(group, columns=[f"{audio_name}.path"]).column(0)
                column = column.combine_chunks()
                if isinstance(column.type, pa.StructType):  # selected as audio: {path}
                    column = column.field("path")
                paths = column.to_pylist()
            batch = table.combine_chunks().to_batches()
            ids = _ids(batch[0], paths) if batch else paths
            for number in range(table.num_rows):
                recording = SourceRecording(
                    ids[number] or f"{os.path.basename(path)}-{row + number}",
                    path=os.path.abspath(path),
                    described_in=f"{path}, row {row + number}",
                    offset_bytes=group,
                    length_bytes=number,
                    parquet_column=audio_name,
                )
                yield recording, _metadata(batch[0], number) if batch else {}
            row += table.num_rows
    except (OSError, pa.ArrowException) as exc:
        raise SourceError(f"cannot read Parquet file: {exc}", where=path) from exc


def read_parquet_cell(path: str, column: str, group: int, row: int) -> bytes:
    """The bytes of one row's audio, for recordings that are extracted on first use."""
    try:
        table = pq.ParquetFile(path).read_row_group(group, columns=[column])
        cell = table.column(column).combine_chunks()
        if isinstance(cell.type, pa.StructType):
            cell = cell.field("bytes")
        value = cell[row].as_py()
    except (OSError, pa.ArrowException, IndexError, KeyError) as exc:
        raise SourceError(f"cannot read row {row} of row group {group}: {exc}", where=path) from exc
    if not isinstance(value, bytes):
        raise SourceError(f"row {row} of row group {group} holds no audio bytes", where=path)
    return value


def _is_audio(data_type: pa.DataType) -> bool:
    if pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type):
        return True
    return isinstance(data_type, pa.StructType) and data_type.get_field_index("bytes") >= 0


def _audio_column(batch: pa.RecordBatch, where: str) -> tuple[pa.Array, list[str | None]]:
    names = [f.name for f in batch.schema if _is_audio(f.type)]
    if not names:
        raise SourceError("no audio column (binary, or an Audio struct)", where=where)
    name = "audio" if "audio" in names else names[0]
    column = batch.column(name)
    paths: list[str | None] = [None] * len(column)
    if isinstance(column.type, pa.StructType):
        if column.type.get_field_index("path") >= 0:
            paths = column.field("path").to_pylist()
        column = column.field("bytes")
    if not (pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type)):
        raise SourceError(f"the audio column holds {column.type}, not bytes", where=where)
    return column, paths


def _ids(batch: pa.RecordBatch, paths: list[str | None]) -> list[str | None]:
    for name in _ID_COLUMNS:
        if name in batch.schema.names:
            return [None if v is None else str(v) for v in batch.column(name).to_pylist()]
    return [os.path.splitext(os.path.basename(p))[0] if p else None for p in paths]


def _metadata(batch: pa.RecordBatch, row: int) -> dict[str, Any]:
    metadata = {}
    for field in batch.schema:
        if _is_audio(field.type) or field.name in _ID_COLUMNS:
            continue
        if (
            pa.types.is_string(field.type)
            or pa.types.is_integer(field.type)
            or pa.types.is_floating(field.type)
        ):
            metadata[field.name] = batch.column(field.name)[row].as_py()
    return metadata


def _segments(path: str, refusals: Refusals) -> Iterator[SourceCut]:
    """The cuts of a segment list: JSON lines, or a CSV or TSV table with a header."""
    rows = json_lines(path, refusals) if path.endswith(".jsonl") else _table_rows(path)
    for row, where in rows:
        with refusals.entry():
            yield _segment(row, where)


def _table_rows(path: str) -> Iterator[tuple[dict[str | None, Any], str]]:
    """The rows of a CSV or TSV table, as the header names them (values past the header's
    columns under ``None``); an unreadable table is a SourceError."""
    try:
        with open(path, encoding="utf-8", newline="") as table:
            delimiter = "\t" if path.endswith(".tsv") else ","
            rows = csv.DictReader(table, delimiter=delimiter)
            for row in rows:
                yield row, f"{path}:{rows.line_num}"
    except (OSError, ValueError, csv.Error) as exc:  # UnicodeDecodeError included
        raise SourceError(f"cannot read the segment list: {exc}", where=path) from exc


def _segment(row: Any, where: str) -> SourceCut:
    if not isinstance(row, dict) or not all(row.get(key) is not None for key in _SEGMENT_FIELDS):
        raise SourceError("a segment needs id, recording, start and end", where=where)
    cut_id, recording = str(row["id"]), str(row["recording"])
    start = parse_seconds(str(row["start"]), f"the start of segment {cut_id!r}", where=where)
    end = parse_seconds(str(row["end"]), f"the end of segment {cut_id!r}", where=where)
    if not start < end:
        raise SourceError(f"segment {cut_id!r} has start {start} and end {end}", where=where)
    metadata = {str(k): v for k, v in row.items() if k is not None and k not in _SEGMENT_FIELDS}
    return SourceCut(cut_id, recording, start, end - start, metadata=metadata, described_in=where)
