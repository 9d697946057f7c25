"""Kaldi data directories: ``wav.scp``, with ``segments``, ``utt2spk`` and ``text``.

``wav.scp`` lines are ``<recording-id> <path>`` or ``<recording-id> <command> |``;
commands are run once at pack time and their output stored.  Without
``segments`` every recording is one cut named after it.  A segment end of
``-1`` (or one at or before its start) means "to the end of the recording".
Fields are separated by spaces or tabs, as Kaldi's own readers accept.
"""

from __future__ import annotations

import os

from cutfs.codec.errors import SourceError
from cutfs.codec.sources.catalogue import (
    CutColumns,
    Refusals,
    SourceCatalogue,
    SourceCut,
    SourceRecording,
)
from cutfs.codec.sources.json_lines import bounded_lines
from cutfs.codec.trust.limits import parse_seconds


def is_kaldi_dir(path: str) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "wav.scp"))


def read_kaldi_dir(directory: str, refusals: Refusals | None = None) -> SourceCatalogue:
    refusals = refusals if refusals is not None else Refusals()
    recordings = [
        _recording(key, value, where)
        for key, value, where in _table(os.path.join(directory, "wav.scp"), refusals)
    ]
    speakers = _optional_map(os.path.join(directory, "utt2spk"), refusals)
    texts = _optional_map(os.path.join(directory, "text"), refusals)
    segments_path = os.path.join(directory, "segments")
    cuts = CutColumns()
    if os.path.isfile(segments_path):
        for utterance, value, where in _table(segments_path, refusals):
            with refusals.entry():
                cuts.append(_segment(utterance, value, where, speakers, texts))
    else:
        for recording in recordings:
            key = recording.recording_id
            cuts.append(
                SourceCut(
                    key,
                    key,
                    metadata=_metadata(key, speakers, texts),
                    described_in=recording.described_in,
                )
            )
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


def _segment(
    utterance: str, value: str, where: str, speakers: dict[str, str], texts: dict[str, str]
) -> SourceCut:
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
        metadata=_metadata(utterance, speakers, texts),
        described_in=where,
    )


def _metadata(key: str, speakers: dict[str, str], texts: dict[str, str]) -> dict[str, str]:
    metadata = {}
    if key in speakers:
        metadata["speaker"] = speakers[key]
    if key in texts:
        metadata["text"] = texts[key]
    return metadata


def _optional_map(path: str, refusals: Refusals) -> dict[str, str]:
    if not os.path.isfile(path):
        return {}
    return {key: value for key, value, _ in _table(path, refusals, allow_empty_value=True)}


def _table(
    path: str, refusals: Refusals, allow_empty_value: bool = False
) -> list[tuple[str, str, str]]:
    """``(key, rest of the line, where)`` per non-empty line; a line without a value is refused."""
    rows = []
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
        rows.append((key, value, where))
    return rows


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
