"""The manifests at a mount's root, in the formats users' tools read.

* ``wav.scp``, ``segments``, ``text``, ``utt2spk``, ``spk2utt``: a Kaldi data
  directory whose recordings are the cut files (each segment spans its whole
  file); ``text`` and the speaker maps exist only where cuts carry that
  metadata.  Lines are sorted by key, as Kaldi's tools require.
* ``cuts.jsonl.gz``: a Lhotse cuts manifest whose recordings are the cut
  files, so ``CutSet.from_file`` and ``cut.load_audio()`` work unchanged; the
  declared sample counts are the files' exact lengths.
* ``cuts/metadata.jsonl``: HuggingFace ``audiofolder`` metadata (``file_name``
  relative to ``cuts/``, plus text, speaker and the other supervision fields).
* ``nemo.jsonl``: a NeMo manifest of the cut files (``audio_filepath``,
  ``duration``, ``offset`` 0, and ``text`` where the cut has one).
* ``recordings.uem`` and ``supervisions.rttm``: for pyannote, the whole
  recordings (``<uri> 1 0.000 <end>``) and the speaker turns of the
  supervisions in recording time (``SPEAKER <uri> 1 <start> <duration> <NA>
  <NA> <speaker> <NA> <NA>``, only where cuts carry speakers); a uri is the
  recording's id, whitespace percent-encoded as in the Kaldi files.

Files that need every cut's length (``segments``, ``cuts.jsonl.gz``) are
rendered once all recordings are indexed; the others need only the catalogue.
"""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import math
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final

from cutfs.codec.audio.wav_layout import WavLayout
from cutfs.codec.catalogue.kaldi_order import KaldiOrder, kaldi_key
from cutfs.codec.errors import CutfsError
from cutfs.codec.library import Library

log = logging.getLogger("cutfs.manifest_files")

WAV_SCP: Final = "wav.scp"
SEGMENTS: Final = "segments"
TEXT: Final = "text"
UTT2SPK: Final = "utt2spk"
SPK2UTT: Final = "spk2utt"
LHOTSE_CUTS: Final = "cuts.jsonl.gz"
AUDIOFOLDER_METADATA: Final = "metadata.jsonl"
NEMO: Final = "nemo.jsonl"
UEM: Final = "recordings.uem"
RTTM: Final = "supervisions.rttm"
#: Files served gzip-compressed.
COMPRESSED: Final = frozenset({LHOTSE_CUTS})
#: Lines rendered at once by :meth:`ManifestFiles.chunks`.
_LINES_PER_CHUNK: Final = 4096
#: Root files whose content needs the exact length of every cut.
NEEDS_LENGTHS: Final = frozenset({SEGMENTS, LHOTSE_CUTS, NEMO, UEM, RTTM})
_SUPERVISION_FIELDS: Final = ("text", "speaker", "language", "gender")


class ManifestFiles:
    """Renders the root manifests of one mount (see the module docstring)."""

    def __init__(
        self,
        library: Library,
        cut_paths: Sequence[str] | Callable[[int], str],
        cuts_directory: str,
        cut_layout: Callable[[int], WavLayout | None],
        order: KaldiOrder,
    ) -> None:
        """``cut_paths`` gives each cut file's path relative to ``cuts_directory`` (absolute);
        ``cut_layout`` gives a cut file's layout as served (``None`` before indexing);
        ``order`` is the cuts' Kaldi key order."""
        self._library = library
        self._cut_path = cut_paths if callable(cut_paths) else cut_paths.__getitem__
        self._cuts_directory = cuts_directory
        self._cut_layout = cut_layout
        self._order = order
        self._has_text = library.metadata_mentions("text")
        self._has_speaker = library.metadata_mentions("speaker")

    def root_names(self) -> list[str]:
        """The root manifests this mount has, in listing order."""
        names = [WAV_SCP, SEGMENTS, LHOTSE_CUTS, NEMO, UEM]
        if self._has_text:
            names.append(TEXT)
        if self._has_speaker:
            names += [UTT2SPK, SPK2UTT, RTTM]
        return names

    def render(self, name: str) -> bytes:
        """The whole content of a root manifest or of ``cuts/metadata.jsonl``."""
        data = b"".join(self.chunks(name))
        return gzip.compress(data, mtime=0) if name in COMPRESSED else data

    def chunks(self, name: str) -> Iterator[bytes]:
        """The content of a manifest (uncompressed: see :data:`COMPRESSED`) in pieces of a
        few thousand lines, so that a caller can write it out with memory to spare."""
        renderers: dict[str, Callable[[], Iterator[str]]] = {
            WAV_SCP: self._wav_scp,
            SEGMENTS: self._segments,
            TEXT: lambda: self._kaldi_map("text"),
            UTT2SPK: lambda: self._kaldi_map("speaker"),
            SPK2UTT: self._spk2utt,
            LHOTSE_CUTS: self._lhotse_cuts,
            AUDIOFOLDER_METADATA: self._audiofolder,
            NEMO: self._nemo,
            UEM: self._uem,
            RTTM: self._rttm,
        }
        lines = renderers[name]()
        while True:
            batch = list(itertools.islice(lines, _LINES_PER_CHUNK))
            if not batch:
                return
            yield _lines(batch)

    # -- Kaldi ------------------------------------------------------------------------------

    def _keys(self) -> Iterator[tuple[str, int]]:
        """(Kaldi key, cut) in key order, read from the stored order."""
        ids = self._library.cut_ids
        for cut in self._order.cuts:
            index = int(cut)
            yield kaldi_key(ids[index]), index

    def _wav_scp(self) -> Iterator[str]:
        return (f"{key} {self._cut_file(index)}" for key, index in self._keys())

    def _segments(self) -> Iterator[str]:
        for key, index in self._keys():
            found = self._cut_frames(index)
            if found is not None:
                frames, rate, _ = found
                yield f"{key} {key} 0.000 {frames / rate:.6f}"

    def _kaldi_map(self, field: str) -> Iterator[str]:
        for key, index in self._keys():
            value = self._library.cut_metadata(index).get(field)
            if isinstance(value, str) and value:
                yield f"{key} {' '.join(value.split())}"

    def _spk2utt(self) -> Iterator[str]:
        speakers: dict[str, list[str]] = {}
        for key, index in self._keys():
            speaker = self._library.cut_metadata(index).get("speaker")
            if isinstance(speaker, str) and speaker:
                speakers.setdefault(kaldi_key(speaker), []).append(key)
        return (f"{speaker} {' '.join(keys)}" for speaker, keys in sorted(speakers.items()))

    # -- Lhotse and HuggingFace -------------------------------------------------------------

    def _lhotse_cuts(self) -> Iterator[str]:
        for index, cut_id in enumerate(self._library.cut_ids):
            cut = self._lhotse_cut(index, cut_id)
            if cut is not None:
                yield json.dumps(cut, ensure_ascii=False)

    def _lhotse_cut(self, index: int, cut_id: str) -> dict[str, Any] | None:
        found = self._cut_frames(index)
        if found is None:
            return None
        frames, rate, channels = found
        duration = frames / rate
        channel_ids = list(range(channels))
        metadata = self._library.cut_metadata(index)
        cut: dict[str, Any] = {
            "id": cut_id,
            "start": 0.0,
            "duration": duration,
            "channel": 0 if channels == 1 else channel_ids,
            "supervisions": _supervisions(cut_id, metadata, duration),
            "recording": {
                "id": cut_id,
                "sources": [
                    {"type": "file", "channels": channel_ids, "source": self._cut_file(index)}
                ],
                "sampling_rate": rate,
                "num_samples": frames,
                "duration": duration,
                "channel_ids": channel_ids,
            },
            "type": "MonoCut" if channels == 1 else "MultiCut",
        }
        custom = plain_custom(metadata.get("custom"))
        if custom:
            cut["custom"] = custom
        return cut

    def _audiofolder(self) -> Iterator[str]:
        for index in range(self._library.num_cuts):
            metadata = self._library.cut_metadata(index)
            row: dict[str, Any] = {"file_name": self._cut_path(index)}
            row.update({k: metadata.get(k) for k in _SUPERVISION_FIELDS if k in metadata})
            yield json.dumps(row, ensure_ascii=False)

    # -- NeMo and pyannote -----------------------------------------------------------------

    def _nemo(self) -> Iterator[str]:
        for index in range(self._library.num_cuts):
            found = self._cut_frames(index)
            if found is None:
                continue
            frames, rate, _ = found
            row: dict[str, Any] = {
                "audio_filepath": self._cut_file(index),
                "duration": round(frames / rate, 6),
                "offset": 0.0,
            }
            text = self._library.cut_metadata(index).get("text")
            if isinstance(text, str):
                row["text"] = text
            yield json.dumps(row, ensure_ascii=False)

    def _uem(self) -> Iterator[str]:
        lines = []
        for number, recording_id in enumerate(self._library.recording_ids):
            shape = self._library.shape(number)
            if shape is not None:
                end = shape.num_frames / shape.sample_rate
                lines.append(f"{kaldi_key(recording_id)} 1 0.000 {end:.6f}")
        return iter(sorted(lines))

    def _rttm(self) -> Iterator[str]:
        turns: list[tuple[str, float, float, str]] = []
        for index in range(self._library.num_cuts):
            found = self._cut_frames(index)
            cut = self._library.cut(index)
            if found is None or cut is None:
                continue
            shape = self._library.shape(cut.recording_index)
            assert shape is not None, "rendering lengths before the recordings are indexed"
            cut_start = cut.start_frame / shape.sample_rate
            uri = kaldi_key(self._library.recording_ids[cut.recording_index])
            metadata = self._library.cut_metadata(index)
            for supervision in _supervisions(cut.cut_id, metadata, found[0] / found[1]):
                speaker = supervision.get("speaker")
                if isinstance(speaker, str) and speaker:
                    start = cut_start + supervision["start"]
                    turns.append((uri, start, supervision["duration"], kaldi_key(speaker)))
        turns.sort()
        return (
            f"SPEAKER {uri} 1 {start:.3f} {duration:.3f} <NA> <NA> {speaker} <NA> <NA>"
            for uri, start, duration, speaker in turns
        )

    # -- helpers ----------------------------------------------------------------------------

    def _cut_file(self, index: int) -> str:
        return os.path.join(self._cuts_directory, self._cut_path(index))

    def _cut_frames(self, index: int) -> tuple[int, int, int] | None:
        """(frames, rate, channels) of a cut file, or ``None`` for a cut that cannot be
        served (it is left out, with a log line); every recording must be indexed."""
        try:
            layout = self._cut_layout(index)
        except CutfsError as exc:
            log.warning("%s: left out of the manifests: %s", self._library.cut_ids[index], exc)
            return None
        assert layout is not None, "rendering lengths before the recordings are indexed"
        return layout.num_frames, layout.sample_rate, layout.channels


def _supervisions(cut_id: str, metadata: dict[str, Any], duration: float) -> list[dict[str, Any]]:
    """The cut's supervisions with times relative to the cut file, as Lhotse writes them."""
    found = metadata.get("supervisions")
    items = [item for item in found if isinstance(item, dict)] if isinstance(found, list) else []
    if not items and any(key in metadata for key in _SUPERVISION_FIELDS):
        items = [{key: metadata[key] for key in _SUPERVISION_FIELDS if key in metadata}]
    supervisions = []
    for number, item in enumerate(items):
        start, length = _seconds(item.get("start", 0.0)), _seconds(item.get("duration", duration))
        if start is None or length is None:  # kept as metadata unchecked: left out here
            log.warning("%s: supervision %d has no usable times: left out", cut_id, number)
            continue
        supervision = {
            "id": str(item.get("id", f"{cut_id}-{number}")),
            "recording_id": cut_id,
            "start": start,
            "duration": length,
            "channel": 0,
        }
        supervision.update({k: item[k] for k in _SUPERVISION_FIELDS if k in item})
        custom = plain_custom(item.get("custom"))
        if custom:
            supervision["custom"] = custom
        supervisions.append(supervision)
    return supervisions


def _seconds(value: Any) -> float | None:
    """A supervision's time as a float, or ``None`` for what is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        seconds = float(value)
    except (OverflowError, ValueError):
        return None
    return seconds if math.isfinite(seconds) else None


def _lines(lines: Any) -> bytes:
    return "".join(f"{line}\n" for line in lines).encode("utf-8", "surrogateescape")


def plain_custom(custom: object) -> dict[str, Any]:
    """The values of a Lhotse ``custom`` field that are plain data: text, numbers, booleans,
    null, and lists of those.

    Lhotse deserialises a ``custom`` value that is a mapping (a Recording, whose sources
    may be shell commands run on load; an Array; an Image) when it loads a manifest, so a
    rendered manifest carries none: it is data for whoever loads it, never code.  The
    mount's own files are in ``recording``; what is dropped stays in the source."""
    if not isinstance(custom, dict):
        return {}
    return {str(key): value for key, value in custom.items() if _is_plain(value)}


def _is_plain(value: object) -> bool:
    if isinstance(value, list):
        return all(_is_plain(item) and not isinstance(item, list) for item in value)
    return value is None or isinstance(value, str | int | float | bool)
