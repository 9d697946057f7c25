"""Kaldi data directories: ``wav.scp``, with ``segments``, ``utt2spk`` and ``text``.

``wav.scp`` lines are ``<recording-id> <path>`` or ``<recording-id> <command> |``;
commands are run once at pack time and their output stored.  Without
``segments`` every recording is one cut named after it.  A segment end of
``-1`` (or one at or before its start) means "to the end of the recording".
Fields are separated by spaces or tabs, as Kaldi's own readers accept.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Final

import pyarrow as pa

from cutfs.codec.errors import SourceError
from cutfs.codec.sources.catalogue import (
    CUT_COLUMNS_SCHEMA,
    CutColumns,
    Refusals,
    SourceCatalogue,
    SourceCut,
    SourceRecording,
    metadata_text,
)
from cutfs.codec.sources.json_lines import bounded_lines
from cutfs.codec.spill.external_sort import ExternalSort
from cutfs.codec.spill.sorted_lookup import SortedLookup
from cutfs.codec.trust.limits import parse_seconds


def is_kaldi_dir(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "wav.scp"))


def read_kaldi_dir(directory: str, refusals: Refusals | None = None) -> SourceCatalogue:
    refusals = refusals if refusals is not None else Refusals()
    recordings = [
        _recording(key, value, where)
        for key, value, where in _entries(os.path.join(directory, "wav.scp"), refusals)
    ]
    cuts = CutColumns()
    segments_path = os.path.join(directory, "segments")
    if os.path.isfile(segments_path):
        for utterance, value, where in _entries(segments_path, refusals):
            with refusals.entry():
                cuts.append(_segment(utterance, value, where))
    else:
        for recording in recordings:
            key = recording.recording_id
            cuts.append(SourceCut(key, key, described_in=recording.described_in))
    cuts = _with_metadata(cuts, directory, refusals)
    catalogue = SourceCatalogue(recordings, cuts, f"Kaldi data directory {directory}")
    catalogue.check(refusals)
    return catalogue


def _recording(key: str, value: str, where: str) -> SourceRecording:
    if value.endswith("|"):
        return SourceRecording(key, command=value[:-1].strip(), described_in=where)
    base = os.path.dirname(where.rsplit(":", 1)[0])
    path = value if os.path.isabs(value) else os.path.join(base, value)
    if not os.path.exists(path) and os.path.exists(value):
        path = value
    return SourceRecording(key, path=os.path.abspath(path), described_in=where)


def _segment(utterance: str, value: str, where: str) -> SourceCut:
    fields = value.split()
    if len(fields) != 3:
        raise SourceError("a segments line is '<utt> <recording> <start> <end>'", where=where)
    recording_id, start_text, end_text = fields
    start = parse_seconds(start_text, f"the start of segment {utterance!r}", where=where)
    if end_text.startswith("-") and _is_number(end_text):  # -1, -1.00: to the end
        duration = None
    else:
        end = parse_seconds(end_text, f"the end of segment {utterance!r}", where=where)
        duration = None if end <= start else end - start
    return SourceCut(
        utterance,
        recording_id,
        start,
        duration,
        described_in=where,
    )


#: The files that give each utterance (or recording, without ``segments``) a value, and
#: the metadata key the value is kept under.
_METADATA_FILES: Final = (("utt2spk", "speaker"), ("text", "text"))
#: Lines of a metadata file added to its lookup at once.
_LOOKUP_ROWS: Final = 1 << 16


def _with_metadata(cuts: CutColumns, directory: str, refusals: Refusals) -> CutColumns:
    """The cuts with the values ``utt2spk`` and ``text`` give their ids, as metadata.

    A sort-merge join in bounded memory (no dict of utterances): the cuts sorted by id,
    each file's lines sorted by key, read side by side.  The cuts come back in id order
    (duplicate ids in the order they were read, so the check refuses the same ones).
    """
    present = [
        (os.path.join(directory, name), key)
        for name, key in _METADATA_FILES
        if os.path.isfile(os.path.join(directory, name))
    ]
    if not present:
        return cuts
    memory_bytes = refusals.sort_memory_bytes // (len(present) + 1)
    with contextlib.ExitStack() as stack:
        lookups = []
        for path, key in present:
            lookup = stack.enter_context(SortedLookup(None, memory_bytes))
            _fill(lookup, path, refusals)
            lookups.append((key, lookup))
        ordered = stack.enter_context(
            ExternalSort(CUT_COLUMNS_SCHEMA, "cut_id", None, memory_bytes)
        )
        for batch in cuts.table().to_batches(max_chunksize=_LOOKUP_ROWS):
            ordered.add(batch)
        del cuts  # its rows are in the sort: the map of the first copy can go
        joined = CutColumns()
        metadata_column = CUT_COLUMNS_SCHEMA.get_field_index("metadata")
        for batch in ordered.sorted_batches():
            ids = batch.column("cut_id")
            found = [(key, lookup.values_of(ids).to_pylist()) for key, lookup in lookups]
            metadata = [
                metadata_text(
                    {key: values[row] for key, values in found if values[row] is not None}
                )
                for row in range(batch.num_rows)
            ]
            joined.append_batch(
                batch.set_column(
                    metadata_column,
                    CUT_COLUMNS_SCHEMA.field(metadata_column),
                    pa.array(metadata, pa.string()),
                )
            )
    return joined


def _fill(lookup: SortedLookup, path: str, refusals: Refusals) -> None:
    keys: list[str] = []
    values: list[str] = []
    for key, value, _ in _entries(path, refusals, allow_empty_value=True):
        keys.append(key)
        values.append(value)
        if len(keys) >= _LOOKUP_ROWS:
            lookup.add(keys, values)
            keys, values = [], []
    if keys:
        lookup.add(keys, values)


def _entries(
    path: str, refusals: Refusals, allow_empty_value: bool = False
) -> Iterator[tuple[str, str, str]]:
    """``(key, rest of the line, where)`` per non-empty line; a line without a value is refused."""
    for raw_line, where in bounded_lines(path, refusals):
        try:
            line = raw_line.decode("utf-8")
        except UnicodeDecodeError as exc:
            refusals.refuse(SourceError(f"not UTF-8 text: {exc}", where=where))
            continue
        fields = line.strip().split(None, 1)
        if not fields:
            continue
        key, value = fields[0], fields[1] if len(fields) > 1 else ""
        if not value and not allow_empty_value:
            refusals.refuse(SourceError(f"line for {key!r} has no value", where=where))
            continue
        yield key, value, where


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
