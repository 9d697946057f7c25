"""A plain directory of audio files: each file one recording and one whole cut.

Files are found recursively by extension; a file's id is its path relative to
the directory, without the extension (``speaker1/take2.flac`` becomes
``speaker1/take2``).
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
from cutfs.codec.sources.tree import files_under

AUDIO_EXTENSIONS = frozenset(
    {
        ".wav",
        ".flac",
        ".mp3",
        ".ogg",
        ".oga",
        ".opus",
        ".m4a",
        ".mp4",
        ".aac",
        ".wv",
        ".aiff",
        ".aif",
        ".webm",
        ".mka",
        ".wma",
    }
)


def read_audio_dir(directory: str, refusals: Refusals | None = None) -> SourceCatalogue:
    """Every regular audio file below ``directory`` (links to directories are not followed)."""
    refusals = refusals if refusals is not None else Refusals()
    recordings: list[SourceRecording] = []
    cuts = CutColumns()
    ids: dict[str, str] = {}
    for path in files_under(directory, tuple(AUDIO_EXTENSIONS), refusals):
        stem = os.path.splitext(path)[0]
        recording_id = os.path.relpath(stem, directory).replace(os.sep, "/")
        if recording_id in ids:
            refusals.refuse(
                SourceError(
                    f"two files give the id {recording_id!r}: {ids[recording_id]} and {path}",
                    where=directory,
                )
            )
            continue
        ids[recording_id] = path
        with refusals.entry():
            cuts.append(SourceCut(recording_id, recording_id, described_in=path))
            recordings.append(
                SourceRecording(recording_id, path=os.path.abspath(path), described_in=path)
            )
    if not recordings:
        raise SourceError(
            "not a shard directory, and no manifests, datasets or audio files were found in it",
            where=directory,
        )
    catalogue = SourceCatalogue(recordings, cuts, f"audio directory {directory}")
    catalogue.check(refusals)
    return catalogue
