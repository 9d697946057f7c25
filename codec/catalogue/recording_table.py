"""The recordings table of a shard directory, read in place.

One row per recording: where its bytes are (shard, absolute offset, length)
and its decoding plan (:class:`cutfs.codec.audio.recording.Recording`), seek index
included.  Opening maps the table and reads no row.  A recording's plan,
whose seek index may hold tens of thousands of points, is built and checked
the first time it is needed and kept in a bounded cache, so a mount of 100 000 hours holds only
the plans it is serving.  A row's numbers are checked when the row is used.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import Any, Final, overload

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from cachetools import LRUCache

from cutfs.codec.audio.pcm import sample_bytes
from cutfs.codec.audio.recording import DecodeMethod, FrameTiming, Recording
from cutfs.codec.audio.seek_index import SeekIndex
from cutfs.codec.catalogue.mapped_table import ListColumn, StringColumn, int_view
from cutfs.codec.errors import ShardFormatError
from cutfs.codec.library import AudioShape
from cutfs.codec.trust.limits import MAX_CHANNELS, MAX_FRAMES, MAX_SAMPLE_RATE_HZ, check_shape

#: Plans kept built; each holds its seek index as views of the mapped table.
PLANS_KEPT: Final = 4096
_LIMIT: Final = 1 << 40


class RecordingTable(Sequence[Recording]):
    """Recordings of a shard directory (see the module docstring).

    ``shard_count`` bounds the shard numbers rows may name.  Raises
    :class:`ShardFormatError` for rows whose numbers the packer would never
    have written.
    """

    def __init__(self, table: pa.Table, shard_count: int, where: str) -> None:
        self._table = table
        self._where = where
        self.ids = StringColumn.of(table, "recording_id")
        self.sources = StringColumn.of(table, "source")
        self.shards = int_view(table, "shard")
        self.stored_bytes = int_view(table, "stored_bytes")
        self.sample_rates = int_view(table, "sample_rate")
        self.channels = int_view(table, "channels")
        self.num_frames = int_view(table, "num_frames")
        #: Absolute offsets of the blobs in their shards (format 2); ``None`` for format 1,
        #: whose blobs are located through the shard's Arrow IPC metadata.
        self.blob_offsets: npt.NDArray[np.int64] | None = (
            int_view(table, "blob_offset") if "blob_offset" in table.schema.names else None
        )
        self.batches = int_view(table, "batch")
        self._seek_samples = ListColumn.of(table, "seek_samples")
        self._seek_offsets = ListColumn.of(table, "seek_byte_offsets")
        self._plans: LRUCache[int, Recording] = LRUCache(maxsize=PLANS_KEPT)
        self._shard_count = shard_count

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, index: int) -> Recording: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Recording]: ...

    def __getitem__(self, index: int | slice) -> Recording | Sequence[Recording]:
        if isinstance(index, slice):
            return [self.recording(i) for i in range(*index.indices(len(self)))]
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self.recording(index)

    def shape(self, index: int) -> AudioShape:
        """Rate, channels and length of recording ``index``, its row checked first."""
        self.check_row(index)
        return AudioShape(
            int(self.sample_rates[index]), int(self.channels[index]), int(self.num_frames[index])
        )

    def recording(self, index: int) -> Recording:
        """The plan of recording ``index``, built on first use (seek index as mapped views)."""
        plan = self._plans.get(index)
        if plan is None:
            plan = self._build(index)
            self._plans[index] = plan
        return plan

    def _build(self, index: int) -> Recording:
        self.check_row(index)
        where = f"{self._where}, recording {self.ids[index]}"
        row = self._table.slice(index, 1).drop_columns(["seek_samples", "seek_byte_offsets"])
        try:
            # The table is mapped unvalidated: a string's offsets may point past the file,
            # and reading them through pyarrow would fault the process (SIGBUS).
            row.validate(full=True)
        except pa.ArrowException as exc:
            raise ShardFormatError(f"invalid recording row: {exc}", where=where) from exc
        try:
            seek_index = SeekIndex(
                self._seek_samples[index], self._seek_offsets[index], sorted_checked=False
            )
        except ValueError as exc:
            raise ShardFormatError(f"invalid seek index: {exc}", where=where) from exc
        recording = recording_from_row(row.to_pylist()[0], seek_index, where=where)
        stored = int(self.stored_bytes[index])
        offsets = seek_index.byte_offsets
        if recording.header_bytes > stored or offsets[0] < 0 or offsets[-1] >= max(stored, 1):
            raise ShardFormatError(f"its seek index points outside its {stored} bytes", where=where)
        return recording

    def check_row(self, index: int) -> None:
        """Refuse a row whose small numbers are out of range (checked where a row is used,
        not for every row at open: a table of millions of recordings is not read whole).
        ``index`` itself comes from data (a cut's recording number) and is checked too."""
        if not 0 <= index < len(self.ids):
            raise ShardFormatError(
                f"there is no recording {index} (the table has {len(self.ids)})", where=self._where
            )
        stored = int(self.stored_bytes[index])
        offset = 0 if self.blob_offsets is None else int(self.blob_offsets[index])
        if not (
            0 <= int(self.shards[index]) < self._shard_count
            and 0 <= stored < _LIMIT
            and 0 <= offset < _LIMIT
            and 0 < int(self.sample_rates[index]) <= MAX_SAMPLE_RATE_HZ
            and 0 < int(self.channels[index]) <= MAX_CHANNELS
            and 0 <= int(self.num_frames[index]) <= MAX_FRAMES
        ):
            raise ShardFormatError(
                f"recording {self.ids[index]!r}: its row holds numbers out of range "
                "(not written by cutfs?)",
                where=self._where,
            )


def recording_from_row(
    row: dict[str, Any], seek_index: SeekIndex | None = None, where: str | None = None
) -> Recording:
    """A plan from a row of a recordings table (as :func:`recording_row` writes it), every
    number range-checked; ``seek_index`` replaces the row's seek columns when given."""
    where = where or str(row.get("recording_id"))
    check_shape(
        row.get("sample_rate"),
        row.get("channels"),
        row.get("num_frames"),
        where=where,
        error=ShardFormatError,
    )
    try:
        if seek_index is None:
            seek_index = SeekIndex.from_points(row["seek_samples"], row["seek_byte_offsets"])
        header_bytes, preroll = row["header_bytes"], row["preroll_frames"]
        numerator, denominator = row["time_base_numerator"], row["time_base_denominator"]
        if not (0 <= header_bytes < _LIMIT and 0 <= preroll < _LIMIT):
            raise ValueError("header size or pre-roll out of range")
        if not -(1 << 62) < row["timeline_origin"] < 1 << 62:
            raise ValueError("timeline origin out of range")
        if not (0 <= numerator < _LIMIT and 0 <= denominator < _LIMIT):
            raise ValueError("time base out of range")
        method = DecodeMethod(row["method"])
        if method is DecodeMethod.SEEK and not (numerator > 0 and denominator > 0):
            raise ValueError("a recording found by the demuxer's seek needs a time base")
        if method is DecodeMethod.PCM:
            sample_bytes(str(row["pcm_format"]))  # a sample format the slicer knows
        return Recording(
            recording_id=str(row["recording_id"]),
            sample_rate=int(row["sample_rate"]),
            channels=int(row["channels"]),
            num_frames=int(row["num_frames"]),
            method=method,
            container_format=str(row["container_format"]),
            codec_name=str(row["codec_name"]),
            seek_index=seek_index,
            header_bytes=header_bytes,
            pcm_format=str(row["pcm_format"]),
            timing=FrameTiming(row["timing"]),
            timeline_origin=row["timeline_origin"],
            time_base=Fraction(numerator, denominator or 1),
            preroll_frames=preroll,
            transcoded_from=str(row["transcoded_from"] or ""),
        )
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise ShardFormatError(f"invalid recording row: {exc}", where=where) from exc


def recording_row(
    recording: Recording, shard: int, batch: int, stored_bytes: int, source: str, offset: int
) -> dict[str, Any]:
    """The row of a recordings table that :func:`recording_from_row` reads back."""
    return {
        "recording_id": recording.recording_id,
        "shard": shard,
        "batch": batch,
        "stored_bytes": stored_bytes,
        "source": source,
        "sample_rate": recording.sample_rate,
        "channels": recording.channels,
        "num_frames": recording.num_frames,
        "method": str(recording.method),
        "container_format": recording.container_format,
        "codec_name": recording.codec_name,
        "header_bytes": recording.header_bytes,
        "pcm_format": recording.pcm_format,
        "timing": str(recording.timing),
        "timeline_origin": recording.timeline_origin,
        "time_base_numerator": recording.time_base.numerator,
        "time_base_denominator": recording.time_base.denominator,
        "preroll_frames": recording.preroll_frames,
        "transcoded_from": recording.transcoded_from,
        "seek_samples": recording.seek_index.samples,
        "seek_byte_offsets": recording.seek_index.byte_offsets,
        "blob_offset": offset,
    }
