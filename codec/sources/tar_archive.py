"""Audio inside tar files, served as byte ranges of the tar: WebDataset and Lhotse Shar.

Tar members are stored whole and uncompressed, so each audio member is a
contiguous range of the tar (``TarInfo.offset_data``, ``size``): indexing the
members once is all it takes, nothing is extracted.

* WebDataset: members ``<key>.<ext>`` grouped by key (the name up to the first
  dot of its last component); each key with an audio member is a recording
  and a cut; ``<key>.json`` (an object) and ``<key>.txt`` give its metadata.
* Lhotse Shar: ``cuts.NNNNNN.jsonl.gz`` beside ``recording.NNNNNN.tar``; each
  cut's audio is the member named after the cut, and the cut's recording in
  the manifest declares its rate and length.
"""

from __future__ import annotations

import glob
import json
import os
import tarfile
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
from cutfs.codec.sources.tree import files_under
from cutfs.codec.trust.limits import check_seconds, check_shape

AUDIO_MEMBER_EXTENSIONS = frozenset(
    {"wav", "flac", "mp3", "ogg", "oga", "opus", "m4a", "aac", "mp4", "webm", "mka", "sph"}
)
_SUPERVISION_FIELDS = ("text", "speaker", "language", "gender")


def is_webdataset(path: str) -> bool:
    """A ``.tar`` file, or a directory of them (and no Shar manifests)."""
    if os.path.isfile(path):
        return path.endswith(".tar")
    return bool(_tars(path)) and not is_lhotse_shar(path)


def is_lhotse_shar(path: str) -> bool:
    return os.path.isdir(path) and bool(glob.glob(os.path.join(path, "cuts.*.jsonl*")))


def read_webdataset(path: str, refusals: Refusals | None = None) -> SourceCatalogue:
    refusals = refusals if refusals is not None else Refusals()
    recordings: list[SourceRecording] = []
    cuts = CutColumns()
    for tar_path in [path] if os.path.isfile(path) else _tars(path):
        samples: dict[str, dict[str, tarfile.TarInfo]] = {}
        for member in _members(tar_path, refusals):
            directory, _, name = member.name.rpartition("/")
            stem, _, extension = name.partition(".")
            key = f"{directory}/{stem}" if directory else stem
            samples.setdefault(key, {})[extension.lower()] = member
        for key, members in samples.items():
            audio = next((m for ext, m in members.items() if ext in AUDIO_MEMBER_EXTENSIONS), None)
            if audio is None:
                continue
            where = f"{tar_path}:{audio.name}"
            with refusals.entry():
                metadata = _webdataset_metadata(tar_path, members)
                cuts.append(SourceCut(key, key, metadata=metadata, described_in=where))
                recordings.append(
                    SourceRecording(
                        key,
                        path=os.path.abspath(tar_path),
                        described_in=where,
                        offset_bytes=audio.offset_data,
                        length_bytes=audio.size,
                    )
                )
    catalogue = SourceCatalogue(recordings, cuts, "WebDataset tars")
    catalogue.check(refusals)
    return catalogue


def read_lhotse_shar(directory: str, refusals: Refusals | None = None) -> SourceCatalogue:
    refusals = refusals if refusals is not None else Refusals()
    recordings: list[SourceRecording] = []
    cuts = CutColumns()
    for manifest in sorted(glob.glob(os.path.join(directory, "cuts.*.jsonl*"))):
        shard = os.path.basename(manifest).split(".")[1]
        tar_path = os.path.join(directory, f"recording.{shard}.tar")
        if not os.path.isfile(tar_path):
            raise SourceError(f"no recording.{shard}.tar beside it", where=manifest)
        members: dict[str, tarfile.TarInfo] = {}
        for member in _members(tar_path, refusals):
            stem, _, extension = member.name.rpartition(".")
            if extension.lower() in AUDIO_MEMBER_EXTENSIONS:
                members[stem] = member
        for item, where in json_lines(manifest, refusals):
            with refusals.entry():
                recording, cut = _shar_entry(item, where, tar_path, members)
                recordings.append(recording)
                cuts.append(cut)
    catalogue = SourceCatalogue(recordings, cuts, "Lhotse Shar")
    catalogue.check(refusals)
    return catalogue


def _shar_entry(
    item: Any, where: str, tar_path: str, members: dict[str, tarfile.TarInfo]
) -> tuple[SourceRecording, SourceCut]:
    """The recording (the tar member named after the cut) and the cut of one Shar line."""
    if not isinstance(item, dict) or not isinstance(item.get("id"), str):
        raise SourceError("a Shar cut must be a JSON object with a string 'id'", where=where)
    cut_id = item["id"]
    audio = members.get(cut_id)
    if audio is None:
        raise SourceError(f"cut {cut_id!r} has no audio in {tar_path}", where=where)
    recording = item.get("recording")
    recording = recording if isinstance(recording, dict) else {}
    if recording.get("transforms"):
        raise SourceError(
            f"cut {cut_id!r}: its recording has transforms, which cutfs cannot apply",
            where=where,
        )
    start = check_seconds(item.get("start", 0.0), f"the start of cut {cut_id!r}", where=where)
    duration = None
    if "duration" in item:
        duration = check_seconds(item["duration"], f"the duration of cut {cut_id!r}", where=where)
    source = SourceRecording(
        cut_id,
        path=os.path.abspath(tar_path),
        described_in=where,
        offset_bytes=audio.offset_data,
        length_bytes=audio.size,
        declared=_declared(recording, where),
    )
    cut = SourceCut(
        cut_id,
        cut_id,
        start_seconds=start,
        duration_seconds=duration,
        metadata=_shar_metadata(item),
        described_in=where,
    )
    return source, cut


def _tars(directory: str) -> list[str]:
    return files_under(directory, (".tar",))


def _members(tar_path: str, refusals: Refusals) -> list[tarfile.TarInfo]:
    """The regular files of a tar, whose bytes are stored in one piece (at ``offset_data``).

    Sparse members are refused: their bytes are stored in pieces, and served as one
    range they would be other audio. ``tarfile`` ends an archive at the first header it
    cannot read, without a word: a tar that goes on past it is noted, so that the members
    left out are not lost silently.
    """
    try:
        with tarfile.open(tar_path, "r:") as archive:  # "r:": compressed tars cannot be sliced
            members = archive.getmembers()
            ended_at = archive.offset
    except (OSError, tarfile.TarError) as exc:
        raise SourceError(
            f"cannot read the tar (uncompressed tars only): {exc}", where=tar_path
        ) from exc
    if _goes_on_after(tar_path, ended_at):
        refusals.refuse(
            SourceError(
                f"unreadable tar header at byte {ended_at}: the members after it are left out",
                where=tar_path,
            )
        )
    files = []
    for member in members:
        if member.issparse():
            refusals.refuse(
                SourceError(
                    "a sparse member (its bytes are stored in pieces): unpack and tar it "
                    "without --sparse",
                    where=f"{tar_path}:{member.name}",
                )
            )
        elif member.isfile():
            files.append(member)
    return files


def _goes_on_after(tar_path: str, offset: int) -> bool:
    """Whether the tar holds more than its end-of-archive zeros from ``offset`` on."""
    with open(tar_path, "rb") as tar_file:
        tar_file.seek(offset)
        block = tar_file.read(tarfile.BLOCKSIZE)
    return bool(block.strip(b"\0"))


def _webdataset_metadata(tar_path: str, members: dict[str, tarfile.TarInfo]) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    with open(tar_path, "rb") as tar_file:
        for extension, key in (("json", None), ("txt", "text")):
            member = members.get(extension)
            if member is None or member.size > 1 << 20:
                continue
            tar_file.seek(member.offset_data)
            text = tar_file.read(member.size).decode("utf-8", "replace")
            if key is not None:
                metadata[key] = text.strip()
                continue
            try:
                loaded = json.loads(text)
            except (ValueError, RecursionError):
                continue
            if isinstance(loaded, dict):
                metadata.update({k: v for k, v in loaded.items() if _is_plain(v)})
    return metadata


def _shar_metadata(item: dict[str, Any]) -> dict[str, Any]:
    supervisions = [sup for sup in item.get("supervisions") or [] if isinstance(sup, dict)]
    metadata: dict[str, Any] = {"supervisions": supervisions}
    if len(supervisions) == 1:
        metadata.update(
            {k: supervisions[0][k] for k in _SUPERVISION_FIELDS if k in supervisions[0]}
        )
    return metadata


def _declared(recording: dict[str, Any], where: str) -> DeclaredAudio | None:
    rate, frames = recording.get("sampling_rate"), recording.get("num_samples")
    if rate is None or frames is None:
        return None
    channel_ids = recording.get("channel_ids")
    channels = len(channel_ids) if isinstance(channel_ids, list) and channel_ids else 1
    return DeclaredAudio(*check_shape(rate, channels, frames, where=where))


def _is_plain(value: Any) -> bool:
    return isinstance(value, str | int | float | bool) or value is None
