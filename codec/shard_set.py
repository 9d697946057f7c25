"""Reading a shard directory: recordings, cuts and zero-copy blob views."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from cutfs.codec.cut import Cut
from cutfs.codec.cut_table import CutTable
from cutfs.codec.decoder import DecodeTrace, decode_frames
from cutfs.codec.errors import ShardFormatError
from cutfs.codec.library import AudioShape
from cutfs.codec.limits import check_shape
from cutfs.codec.pcm import Int16Array, sample_bytes
from cutfs.codec.recording import DecodeMethod, FrameTiming, Recording
from cutfs.codec.seek_index import SeekIndex
from cutfs.codec.shard_format import (
    CUTS_FILE,
    CUTS_SCHEMA,
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_FILE,
    RECORDINGS_FILE,
    int_column,
    read_table,
)
from cutfs.codec.storage import LocalStorage, Storage, file_stamp


class ShardSet:
    """An opened shard directory.

    Opening reads the manifest and the two tables and checks that they agree
    with each other; blobs are located lazily, on first use, and handed out as
    ``memoryview`` slices of the memory-mapped shard: reading a cut touches
    only the pages the decoder asks for.
    """

    def __init__(
        self, directory: str, storage: Storage | None = None, *, load_cuts: bool = True
    ) -> None:
        """Open a shard directory; ``load_cuts=False`` skips the cuts table (decoding only)."""
        self.directory = directory
        self.storage: Storage = storage or LocalStorage(directory)
        self.manifest = _read_manifest(directory)
        self._shard_names = [str(shard["file"]) for shard in self.manifest["shards"]]
        recordings = read_table(os.path.join(directory, RECORDINGS_FILE))
        self._blob_places = list(
            zip(
                recordings.column("shard").to_pylist(),
                recordings.column("batch").to_pylist(),
                recordings.column("stored_bytes").to_pylist(),
                strict=True,
            )
        )
        self.recordings = [recording_from_row(row) for row in recordings.to_pylist()]
        self._recording_ids = [recording.recording_id for recording in self.recordings]
        self.recording_sources: list[str] = recordings.column("source").to_pylist()
        cuts = read_table(os.path.join(directory, CUTS_FILE)) if load_cuts else _empty_cuts()
        self._cuts = CutTable(cuts)
        self.cut_ids = self._cuts.ids
        self.cut_recordings = self._cuts.recordings
        self.cut_start_frames: npt.NDArray[np.int64] = int_column(cuts, "start_frame")
        self.cut_num_frames: npt.NDArray[np.int64] = int_column(cuts, "num_frames")
        self._readers: dict[int, tuple[memoryview, Any]] = {}
        self._blobs: dict[int, tuple[int, int, int]] = {}
        self._check()
        self._shard_stamps = [file_stamp(os.path.join(directory, n)) for n in self._shard_names]
        self.identity = _identity(directory, self._shard_stamps)

    def close(self) -> None:
        self._readers.clear()
        self.storage.close()

    def __enter__(self) -> ShardSet:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def num_cuts(self) -> int:
        return len(self.cut_ids)

    @property
    def recording_ids(self) -> list[str]:
        return self._recording_ids

    def describe(self) -> dict[str, Any]:
        return {
            "directory": os.path.abspath(self.directory),
            "recordings": len(self.recordings),
            "cuts": self.num_cuts,
        }

    def shape(self, recording_index: int) -> AudioShape:
        recording = self.recordings[recording_index]
        return AudioShape(recording.sample_rate, recording.channels, recording.num_frames)

    def frame_limit(self, recording_index: int) -> int:
        return self.recordings[recording_index].num_frames

    def index(self, recording_index: int) -> Recording:
        """Plans were computed by ``pack``: nothing to do."""
        return self.recordings[recording_index]

    def adopt(self, recording_index: int, recording: Recording) -> None:
        """Plans were computed by ``pack``: nothing to take."""

    def cut_recording(self, index: int) -> int:
        return int(self.cut_recordings[index])

    def metadata_mentions(self, text: str) -> bool:
        return self._cuts.metadata_mentions(text)

    def cut_metadata(self, index: int) -> dict[str, Any]:
        return self._cuts.metadata(index)

    def cut(self, index: int) -> Cut:
        """The cut at ``index`` of the cuts table."""
        return Cut(
            cut_id=self.cut_ids[index],
            recording_index=int(self.cut_recordings[index]),
            start_frame=int(self.cut_start_frames[index]),
            num_frames=int(self.cut_num_frames[index]),
            channels=self.cut_channels(index),
            metadata_json=self._cuts.metadata_json(index),
        )

    def cut_channels(self, index: int) -> tuple[int, ...]:
        """The recording channels a cut carries; empty for all of them."""
        return self._cuts.channels(index)

    def blob(self, recording_index: int) -> memoryview:
        """The stored bytes of a recording, as a view of the mapped shard (no copy)."""
        shard, start, end = self._place(recording_index)
        return self._shard(shard)[0][start:end]

    def blob_location(self, recording_index: int) -> tuple[str, int, int]:
        """Where a recording's bytes are: the shard file name and the byte range in it."""
        shard, start, end = self._place(recording_index)
        return self._shard_names[shard], start, end

    def _place(self, recording_index: int) -> tuple[int, int, int]:
        """(shard number, start, end) of a recording's blob in its shard; located once."""
        place = self._blobs.get(recording_index)
        if place is None:
            place = self._locate_blob(recording_index)
            self._blobs[recording_index] = place
        return place

    def read_frames(
        self, recording_index: int, first: int, end: int, trace: DecodeTrace | None = None
    ) -> Int16Array:
        """Frames ``[first, end)`` of the full decode of a recording."""
        recording = self.recordings[recording_index]
        self._check_unchanged(recording_index)
        self._prefetch(recording_index, recording, first, end)
        if trace is not None and trace.profile:
            started = time.perf_counter()
            blob = self.blob(recording_index)
            trace.add_phase("shard_slice", time.perf_counter() - started)
        else:
            blob = self.blob(recording_index)
        return decode_frames(blob, recording, first, end, trace)

    def _prefetch(self, recording_index: int, recording: Recording, first: int, end: int) -> None:
        """Ask storage for the bytes a decode of ``[first, end)`` will read, in one request.

        The maps are advised MADV_RANDOM (no read-ahead on a fault), so without
        this every 4 KiB page of the span would be a separate synchronous read.
        """
        name, start, stop = self.blob_location(recording_index)
        if recording.method is DecodeMethod.PCM:
            frame_bytes = sample_bytes(recording.pcm_format) * recording.channels
            span_start = recording.header_bytes + first * frame_bytes
            span_end = recording.header_bytes + end * frame_bytes
        else:
            index = recording.seek_index
            span_start = index.point_at_or_before(first - recording.preroll_frames).byte_offset
            after = index.first_point_after(end)
            span_end = after.byte_offset if after is not None else stop - start
            self.storage.prefetch(name, start, recording.header_bytes)
        self.storage.prefetch(name, start + span_start, span_end - span_start)

    def _check_unchanged(self, recording_index: int) -> None:
        """Refuse to decode from a shard file that changed since the directory was opened.

        One ``stat`` per decode: a shard rewritten or replaced under a live
        mount would otherwise serve other audio under the old names.
        """
        shard = self._blob_places[recording_index][0]
        name = self._shard_names[shard]
        if file_stamp(os.path.join(self.directory, name)) != self._shard_stamps[shard]:
            raise ShardFormatError(
                "the shard changed since the directory was mounted (rewritten or replaced?): "
                "remount to serve the new one",
                where=f"{name}, recording {self.recordings[recording_index].recording_id}",
            )

    def _locate_blob(self, recording_index: int) -> tuple[int, int, int]:
        shard, batch_number, stored_bytes = self._blob_places[recording_index]
        where = (
            f"{self._shard_names[shard]}, recording {self.recordings[recording_index].recording_id}"
        )
        view, reader = self._shard(shard)
        try:
            blobs = reader.get_batch(batch_number).column(1)
            _, offsets_buffer, values = blobs.buffers()
            offsets = np.frombuffer(offsets_buffer, dtype=np.int64)
            start = int(offsets[blobs.offset])
            end = int(offsets[blobs.offset + 1])
        except (pa.ArrowException, IndexError, ValueError) as exc:
            raise ShardFormatError(f"cannot locate the blob: {exc}", where=where) from exc
        base = pa.py_buffer(view).address
        absolute = values.address - base + start
        if end - start != stored_bytes or absolute < 0 or absolute + stored_bytes > len(view):
            raise ShardFormatError("the blob is not where the recordings table says", where=where)
        return shard, absolute, absolute + stored_bytes

    def _shard(self, number: int) -> tuple[memoryview, Any]:
        opened = self._readers.get(number)
        if opened is None:
            name = self._shard_names[number]
            try:
                view = self.storage.open_shard(name)
                reader = pa.ipc.open_file(pa.BufferReader(pa.py_buffer(view)))
            except (OSError, ValueError, pa.ArrowException) as exc:
                raise ShardFormatError(f"cannot open shard: {exc}", where=name) from exc
            opened = (view, reader)
            self._readers[number] = opened
        return opened

    def _check(self) -> None:
        """Refuse tables that contradict each other or the manifest."""
        num_recordings = len(self.recordings)
        for number, (shard, _, stored) in enumerate(self._blob_places):
            recording = self.recordings[number]
            if not 0 <= shard < len(self._shard_names) or stored < 0:
                raise ShardFormatError(
                    f"recording {recording.recording_id} points at shard {shard}",
                    where=self.directory,
                )
            offsets = recording.seek_index.byte_offsets
            if recording.header_bytes > stored or offsets[0] < 0 or offsets[-1] >= max(stored, 1):
                raise ShardFormatError(
                    f"recording {recording.recording_id}: its seek index points outside its "
                    f"{stored} bytes",
                    where=self.directory,
                )
        if len(self.cut_recordings) and (
            self.cut_recordings.min() < 0 or self.cut_recordings.max() >= num_recordings
        ):
            raise ShardFormatError(
                "a cut refers to a recording that does not exist", where=self.directory
            )
        frames = np.array([rec.num_frames for rec in self.recordings], dtype=np.int64)
        ends = self.cut_start_frames + self.cut_num_frames
        bad = (self.cut_start_frames < 0) | (self.cut_num_frames < 0)
        if len(ends):
            bad |= ends > frames[self.cut_recordings]
        if bad.any():
            index = int(np.flatnonzero(bad)[0])
            raise ShardFormatError(
                f"cut {self.cut_ids[index]!r} lies outside its recording", where=self.directory
            )
        if len(set(self.cut_ids)) != len(self.cut_ids):
            raise ShardFormatError("cut ids are not unique", where=self.directory)


def _identity(directory: str, shard_stamps: list[tuple[int, int, int]]) -> str:
    """What the directory held when it was opened: its manifest, tables and shard files."""
    digest = hashlib.sha256()
    with contextlib.suppress(OSError), open(os.path.join(directory, MANIFEST_FILE), "rb") as file:
        digest.update(file.read())
    for name in (RECORDINGS_FILE, CUTS_FILE):
        digest.update(repr(file_stamp(os.path.join(directory, name))).encode())
    digest.update(repr(shard_stamps).encode())
    return digest.hexdigest()


def _empty_cuts() -> pa.Table:
    return CUTS_SCHEMA.empty_table()


def _read_manifest(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, MANIFEST_FILE)
    try:
        with open(path, encoding="utf-8") as manifest_file:
            manifest = json.load(manifest_file)
    except FileNotFoundError as exc:
        raise ShardFormatError("not a shard directory (no manifest.json)", where=directory) from exc
    except (OSError, ValueError) as exc:
        raise ShardFormatError(f"unreadable manifest: {exc}", where=path) from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise ShardFormatError("not a cutfs shard manifest", where=path)
    if manifest.get("version") != FORMAT_VERSION:
        raise ShardFormatError(
            f"shard format version {manifest.get('version')} is not supported "
            f"(this cutfs reads version {FORMAT_VERSION})",
            where=path,
        )
    shards = manifest.get("shards")
    if not isinstance(shards, list) or not all(isinstance(shard, dict) for shard in shards):
        raise ShardFormatError("the manifest lists no shards", where=path)
    for shard in shards:
        name = shard.get("file")
        if not isinstance(name, str) or not _is_plain_file_name(name):
            raise ShardFormatError(
                f"shard file name {name!r} is not a plain name in the shard directory", where=path
            )
    return manifest


def _is_plain_file_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def recording_from_row(row: dict[str, Any]) -> Recording:
    where = str(row.get("recording_id"))
    check_shape(
        row.get("sample_rate"),
        row.get("channels"),
        row.get("num_frames"),
        where=where,
        error=ShardFormatError,
    )
    try:
        if not 0 <= row["header_bytes"] < 1 << 40 or not 0 <= row["preroll_frames"] < 1 << 40:
            raise ValueError("header size or pre-roll out of range")
        if not -(1 << 62) < row["timeline_origin"] < 1 << 62:
            raise ValueError("timeline origin out of range")
        if row["time_base_numerator"] < 0 or row["time_base_denominator"] < 0:
            raise ValueError("negative time base")
        return Recording(
            recording_id=row["recording_id"],
            sample_rate=row["sample_rate"],
            channels=row["channels"],
            num_frames=row["num_frames"],
            method=DecodeMethod(row["method"]),
            container_format=row["container_format"],
            codec_name=row["codec_name"],
            seek_index=SeekIndex.from_points(row["seek_samples"], row["seek_byte_offsets"]),
            header_bytes=row["header_bytes"],
            pcm_format=row["pcm_format"],
            timing=FrameTiming(row["timing"]),
            timeline_origin=row["timeline_origin"],
            time_base=Fraction(row["time_base_numerator"], row["time_base_denominator"] or 1),
            preroll_frames=row["preroll_frames"],
            transcoded_from=row["transcoded_from"],
        )
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise ShardFormatError(f"invalid recording row: {exc}", where=where) from exc
