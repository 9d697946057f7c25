"""Lhotse manifests: recordings plus supervisions or cuts, as JSONL (optionally gzipped).

Read without Lhotse itself.  Each recording needs a single audio source of
type ``file`` or ``command``.  Recordings with ``transforms`` (speed or
volume perturbation, resampling) are refused: cutfs serves the audio as it is
stored, and serving it untransformed under a transformed cut's id would be
wrong audio with no error.  Cuts come from a cuts manifest (MonoCut and
MultiCut; their supervisions become metadata) or, without one, one cut per
supervision.  Recordings embedded in a cuts manifest are used when no
recordings manifest is given.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from cutfs.codec.errors import SourceError
from cutfs.codec.sources.catalogue import (
    CutColumns,
    DeclaredAudio,
    Refusals,
    SourceCatalogue,
    SourceCut,
    SourceRecording,
)
from cutfs.codec.sources.json_lines import json_lines
from cutfs.codec.storage.object_location import is_remote, split_object_url
from cutfs.codec.trust.clean_start import absolute
from cutfs.codec.trust.limits import MAX_CHANNELS, check_seconds, check_shape

_SUPERVISION_FIELDS = ("speaker", "text", "language", "gender")


def is_lhotse_manifest(path: str) -> bool:
    name = os.path.basename(path)
    return name.endswith((".jsonl", ".jsonl.gz"))


def find_manifests(directory: str) -> list[str]:
    """The Lhotse manifests in a directory (not searched recursively)."""
    return sorted(
        os.path.join(directory, name)
        for name in os.listdir(directory)
        if is_lhotse_manifest(name)
        and any(kind in name for kind in ("recordings", "supervisions", "cuts"))
    )


def read_lhotse(paths: list[str], refusals: Refusals | None = None) -> SourceCatalogue:
    """Read recordings, supervisions and cuts manifests, told apart by their names."""
    refusals = refusals if refusals is not None else Refusals()
    recordings: dict[str, SourceRecording] = {}
    supervision_files: list[str] = []
    cuts = CutColumns()
    for path in paths:
        name = os.path.basename(path)
        if "recordings" in name:
            for item, where in _items(path, refusals):
                with refusals.entry():
                    _add_recording(recordings, item, where, os.path.dirname(path))
        elif "supervisions" in name:
            supervision_files.append(path)  # read after the cuts: used only without them
        elif "cuts" in name:
            for item, where in _items(path, refusals):
                with refusals.entry():
                    cuts.append(_cut(item, where, recordings, os.path.dirname(path)))
        else:
            raise SourceError(
                "cannot tell what this manifest holds: its name should contain "
                "'recordings', 'supervisions' or 'cuts'",
                where=path,
            )
    if not cuts:
        for path in supervision_files:
            for item, where in _items(path, refusals):
                with refusals.entry():
                    cuts.append(_supervision_cut(item, where))
    if not cuts:
        cuts = CutColumns(
            SourceCut(rec.recording_id, rec.recording_id, described_in=rec.described_in)
            for rec in recordings.values()
        )
    catalogue = SourceCatalogue(list(recordings.values()), cuts, "Lhotse manifests")
    catalogue.check(refusals)
    return catalogue


def _items(path: str, refusals: Refusals) -> Iterator[tuple[dict[str, Any], str]]:
    for item, where in json_lines(path, refusals):
        if not isinstance(item, dict):
            refusals.refuse(SourceError("each line must be a JSON object", where=where))
            continue
        yield item, where


def _add_recording(
    recordings: dict[str, SourceRecording], item: dict[str, Any], where: str, base: str
) -> SourceRecording:
    recording_id = _text(item, "id", where)
    sources = item.get("sources")
    if not isinstance(sources, list) or len(sources) != 1 or not isinstance(sources[0], dict):
        raise SourceError(
            f"recording {recording_id!r} must have exactly one audio source", where=where
        )
    source = sources[0]
    kind = source.get("type")
    location = source.get("source")
    if not isinstance(location, str):
        raise SourceError(f"recording {recording_id!r} has no source location", where=where)
    declared = _declared(item, where)
    transforms = item.get("transforms")
    if transforms:
        raise SourceError(
            f"recording {recording_id!r} has transforms ({_describe_transforms(transforms)}): "
            "cutfs serves stored audio as it is and cannot apply them; serve the "
            "untransformed cuts, or save the transformed audio and pack that",
            where=where,
        )
    if kind == "file":
        recording = SourceRecording(
            recording_id, path=_resolve(location, base), described_in=where, declared=declared
        )
    elif kind == "command":
        recording = SourceRecording(
            recording_id, command=location, described_in=where, declared=declared
        )
    elif kind == "url" and is_remote(location):
        split_object_url(location)  # refused now, not when packed
        recording = SourceRecording(
            recording_id, url=location, described_in=where, declared=declared
        )
    elif kind == "url":
        raise SourceError(
            f"recording {recording_id!r}: only URLs of object storage (s3://, gs://, az://) "
            f"are fetched, not {location.split(':', 1)[0]}:// ones",
            where=where,
        )
    else:
        raise SourceError(
            f"recording {recording_id!r}: source type {kind!r} is not supported "
            "(use 'file', 'command', or 'url' in object storage)",
            where=where,
        )
    previous = recordings.get(recording_id)
    if previous is not None and previous.origin != recording.origin:
        raise SourceError(f"duplicate recording id {recording_id!r}", where=where)
    recordings[recording_id] = recording
    return recording


def _cut(
    item: dict[str, Any], where: str, recordings: dict[str, SourceRecording], base: str
) -> SourceCut:
    cut_id = _text(item, "id", where)
    kind = item.get("type", "MonoCut")
    if kind not in ("MonoCut", "MultiCut"):
        raise SourceError(
            f"cut {cut_id!r}: {kind} is not supported (MonoCut, MultiCut)", where=where
        )
    recording = item.get("recording")
    if isinstance(recording, dict):
        try:
            recording_id = _add_recording(recordings, recording, where, base).recording_id
        except SourceError as exc:
            raise SourceError(f"cut {cut_id!r}: {exc.message}", where=where) from exc
    else:
        recording_id = _text(item, "recording_id", where)
    supervisions = [
        _supervision_metadata(sup)
        for sup in item.get("supervisions") or []
        if isinstance(sup, dict)
    ]
    metadata: dict[str, Any] = {"supervisions": supervisions}
    if len(supervisions) == 1:
        metadata.update(
            {key: supervisions[0][key] for key in _SUPERVISION_FIELDS if key in supervisions[0]}
        )
    if "custom" in item:
        metadata["custom"] = item["custom"]
    return SourceCut(
        cut_id=cut_id,
        recording_id=recording_id,
        start_seconds=_seconds(item, "start", where),
        duration_seconds=_seconds(item, "duration", where),
        channels=_channels(item.get("channel"), where),
        metadata=metadata,
        described_in=where,
    )


def _declared(item: dict[str, Any], where: str) -> DeclaredAudio | None:
    """The rate, channels and length a recording manifest declares, if it declares them all."""
    rate, frames, channel_ids = (
        item.get("sampling_rate"),
        item.get("num_samples"),
        item.get("channel_ids"),
    )
    if rate is None or frames is None:
        return None
    channels = len(channel_ids) if isinstance(channel_ids, list) and channel_ids else 1
    return DeclaredAudio(*check_shape(rate, channels, frames, where=where))


def _supervision_cut(item: dict[str, Any], where: str) -> SourceCut:
    metadata = {**_supervision_metadata(item), "start": 0.0}  # the cut starts where it starts
    return SourceCut(
        cut_id=_text(item, "id", where),
        recording_id=_text(item, "recording_id", where),
        start_seconds=_seconds(item, "start", where),
        duration_seconds=_seconds(item, "duration", where),
        channels=_channels(item.get("channel"), where),
        metadata={
            **{k: metadata[k] for k in _SUPERVISION_FIELDS if k in metadata},
            "supervisions": [metadata],
        },
        described_in=where,
    )


def _supervision_metadata(item: dict[str, Any]) -> dict[str, Any]:
    keep = ("id", "start", "duration", "channel", *_SUPERVISION_FIELDS, "custom")
    return {key: item[key] for key in keep if item.get(key) is not None}


def _channels(value: Any, where: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    values = value if isinstance(value, list) else [value]
    if not values or not all(
        isinstance(channel, int) and not isinstance(channel, bool) and 0 <= channel < MAX_CHANNELS
        for channel in values
    ):
        raise SourceError(f"invalid channel {value!r}", where=where)
    return tuple(values)


def _text(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise SourceError(f"missing or non-string {key!r}", where=where)
    return value


def _seconds(item: dict[str, Any], key: str, where: str) -> float:
    return check_seconds(item.get(key), repr(key), where=where)


def _describe_transforms(transforms: Any) -> str:
    """``Speed(factor=1.1), Volume(factor=0.5)`` from Lhotse's serialised transforms."""
    if not isinstance(transforms, list):
        return repr(transforms)[:200]
    described = []
    for transform in transforms[:5]:
        if isinstance(transform, dict):
            arguments = transform.get("kwargs")
            arguments = arguments if isinstance(arguments, dict) else {}
            listed = ", ".join(f"{key}={value!r}" for key, value in list(arguments.items())[:4])
            described.append(f"{transform.get('name', '?')}({listed})")
        else:
            described.append(repr(transform)[:80])
    return ", ".join(described) + (", ..." if len(transforms) > 5 else "")


def _resolve(location: str, base: str) -> str:
    """A source's path: absolute as given; relative, beside the manifest if it is there, else
    from the directory the command was run from (where Lhotse itself would look: see
    :func:`caller_directory`), so that what is served does not depend on that directory
    whenever the manifest's own directory has it."""
    if os.path.isabs(location):
        return os.path.abspath(location)
    beside = os.path.join(base, location)
    return os.path.abspath(beside) if os.path.exists(beside) else absolute(location)
