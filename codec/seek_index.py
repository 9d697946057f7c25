"""The seek index of a recording: where in its bytes decoding may start.

Each point pairs a sample position (frames of the full decode, which may be
negative before the first output frame: an MP3 encoder delay, an Opus
pre-skip) with the byte offset of a packet or page at which a demuxer can
start.  Points are sorted by both columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cutfs.codec.errors import ShardFormatError

Int64Array = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class SeekPoint:
    """One place to start decoding: ``sample`` is where its output begins."""

    sample: int
    byte_offset: int


@dataclass(frozen=True, slots=True, eq=False)
class SeekIndex:
    """Sorted seek points of one recording, held as two numpy columns.

    Built with ``sorted_checked=False`` (views of a mapped table: a two-hour
    recording's index is 240 KB, and checking it whole would read it whole
    for one cut), the order is checked around each point a search finds
    instead: the point found is at or before the sample asked for, and the
    next one after it in both columns.  A search of unsorted columns then
    fails with ValueError rather than giving a point that breaks those.
    """

    samples: Int64Array
    byte_offsets: Int64Array
    sorted_checked: bool = True

    def __post_init__(self) -> None:
        if self.samples.shape != self.byte_offsets.shape or self.samples.ndim != 1:
            raise ValueError("seek index columns must be one-dimensional and of equal length")
        if len(self.samples) == 0:
            raise ValueError("a seek index needs at least one point")
        if not self.sorted_checked:
            return
        if np.any(np.diff(self.samples) < 0) or np.any(np.diff(self.byte_offsets) < 0):
            raise ValueError("seek index points must be sorted")

    @classmethod
    def from_points(cls, samples: list[int], byte_offsets: list[int]) -> SeekIndex:
        return cls(np.asarray(samples, dtype=np.int64), np.asarray(byte_offsets, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.samples)

    def point_at_or_before(self, sample: int) -> SeekPoint:
        """The last point whose sample is at or before ``sample``, else the first."""
        position = int(np.searchsorted(self.samples, sample, side="right")) - 1
        position = max(position, 0)
        self._check_around(position)
        after = position + 1
        if (position > 0 and self.samples[position] > sample) or (
            after < len(self.samples) and self.samples[after] <= sample
        ):
            raise ShardFormatError("seek index points are not sorted")
        return SeekPoint(int(self.samples[position]), int(self.byte_offsets[position]))

    def first_point_after(self, sample: int) -> SeekPoint | None:
        """The first point whose sample is after ``sample``, if any."""
        position = int(np.searchsorted(self.samples, sample, side="right"))
        if position >= len(self.samples):
            return None
        self._check_around(position)
        if self.samples[position] <= sample or (
            position > 0 and self.samples[position - 1] > sample
        ):
            raise ShardFormatError("seek index points are not sorted")
        return SeekPoint(int(self.samples[position]), int(self.byte_offsets[position]))

    def _check_around(self, position: int) -> None:
        """Point ``position`` is in order with its neighbours (see the class docstring)."""
        if self.sorted_checked:
            return
        for first in (position - 1, position):
            if (
                first >= 0
                and first + 1 < len(self.samples)
                and (
                    self.samples[first] > self.samples[first + 1]
                    or self.byte_offsets[first] > self.byte_offsets[first + 1]
                )
            ):
                raise ShardFormatError("seek index points are not sorted")
