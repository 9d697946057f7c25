"""Sources: the inputs ``cutfs pack`` reads, and audio served where it lies.

Readers, one per format, each making a :class:`SourceCatalogue` (:mod:`.catalogue`: the
recordings to store and the cuts of them); :func:`read_source` picks one:

- :mod:`.lhotse_manifest` (recordings plus supervisions or cuts), :mod:`.kaldi_dir`
  (``wav.scp``, ``segments``, ...), :mod:`.tar_archive` (WebDataset and Lhotse Shar),
  :mod:`.arrow_dataset` (HuggingFace datasets, Parquet, episode shards),
  :mod:`.audio_dir` (a folder of audio files);
- :mod:`.json_lines` reads JSON lines as others write them (one bad line, one refused
  entry); :mod:`.tree` walks a source's files without leaving it.

Served in place, without packing: :mod:`.source_index` (a catalogue plus plans made on
first use, cached per user).
"""

from __future__ import annotations

import os

from cutfs.codec.errors import SourceError
from cutfs.codec.sources.arrow_dataset import is_arrow_dataset, read_arrow_dataset
from cutfs.codec.sources.audio_dir import read_audio_dir
from cutfs.codec.sources.catalogue import (
    DeclaredAudio,
    Refusals,
    SourceCatalogue,
    SourceCut,
    SourceRecording,
)
from cutfs.codec.sources.kaldi_dir import is_kaldi_dir, read_kaldi_dir
from cutfs.codec.sources.lhotse_manifest import find_manifests, is_lhotse_manifest, read_lhotse
from cutfs.codec.sources.tar_archive import (
    is_lhotse_shar,
    is_webdataset,
    read_lhotse_shar,
    read_webdataset,
)

__all__ = [
    "DeclaredAudio",
    "Refusals",
    "SourceCatalogue",
    "SourceCut",
    "SourceRecording",
    "read_source",
]


def read_source(paths: list[str], refusals: Refusals | None = None) -> SourceCatalogue:
    """Read the recordings and cuts of any input cutfs understands.

    ``paths`` is one directory, one WebDataset ``.tar``, or one or more Lhotse
    manifest files.  A directory is, checked in this order: a Kaldi data
    directory (``wav.scp``), a Lhotse Shar directory (``cuts.N.jsonl.gz`` and
    ``recording.N.tar``), a Lhotse manifest directory (``*recordings*``,
    ``*supervisions*`` or ``*cuts*`` JSONL files), an Arrow or Parquet dataset
    (``*.arrow``, ``*.parquet``), WebDataset tars, and otherwise a directory
    of audio files.

    Invalid entries stop the reading unless ``refusals`` is lenient (see
    :class:`Refusals`); the catalogue's ``refused`` lists what was left out.
    """
    refusals = refusals if refusals is not None else Refusals()
    for path in paths:
        if not os.path.exists(path):
            raise SourceError("no such file or directory", where=path)
    if len(paths) == 1 and os.path.isdir(paths[0]):
        directory = paths[0]
        if is_kaldi_dir(directory):
            return read_kaldi_dir(directory, refusals)
        if is_lhotse_shar(directory):
            return read_lhotse_shar(directory, refusals)
        manifests = find_manifests(directory)
        if manifests:
            return read_lhotse(manifests, refusals)
        if is_arrow_dataset(directory):
            return read_arrow_dataset(directory, refusals)
        if is_webdataset(directory):
            return read_webdataset(directory, refusals)
        return read_audio_dir(directory, refusals)
    if len(paths) == 1 and is_webdataset(paths[0]):
        return read_webdataset(paths[0], refusals)
    for path in paths:
        if not is_lhotse_manifest(path):
            raise SourceError(
                "expected a directory or Lhotse manifests (.jsonl or .jsonl.gz)", where=path
            )
    return read_lhotse(paths, refusals)
