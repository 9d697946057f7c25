"""Readers of the inputs ``cutfs pack`` accepts; :func:`read_source` picks one."""

from __future__ import annotations

import os

from codec.errors import SourceError
from codec.sources.audio_dir import read_audio_dir
from codec.sources.catalogue import DeclaredAudio, SourceCatalogue, SourceCut, SourceRecording
from codec.sources.kaldi_dir import is_kaldi_dir, read_kaldi_dir
from codec.sources.lhotse_manifest import find_manifests, is_lhotse_manifest, read_lhotse

__all__ = ["DeclaredAudio", "SourceCatalogue", "SourceCut", "SourceRecording", "read_source"]


def read_source(paths: list[str]) -> SourceCatalogue:
    """Read Lhotse manifests, a Kaldi data directory or a directory of audio files.

    ``paths`` is either one directory or one or more Lhotse manifest files.
    A directory is a Kaldi data directory if it has ``wav.scp``, a Lhotse
    manifest directory if it holds ``*recordings*``, ``*supervisions*`` or
    ``*cuts*`` JSONL files, and otherwise a directory of audio files.
    """
    for path in paths:
        if not os.path.exists(path):
            raise SourceError("no such file or directory", where=path)
    if len(paths) == 1 and os.path.isdir(paths[0]):
        directory = paths[0]
        if is_kaldi_dir(directory):
            return read_kaldi_dir(directory)
        manifests = find_manifests(directory)
        if manifests:
            return read_lhotse(manifests)
        return read_audio_dir(directory)
    for path in paths:
        if not is_lhotse_manifest(path):
            raise SourceError(
                "expected a directory or Lhotse manifests (.jsonl or .jsonl.gz)", where=path
            )
    return read_lhotse(paths)
