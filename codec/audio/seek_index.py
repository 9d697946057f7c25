"""The seek index of a recording: where in its bytes decoding may start.

Each point pairs a sample position (frames of the full decode, which may be
negative before the first output frame: an MP3 encoder delay, an Opus
pre-skip) with the byte offset of a packet or page at which a demuxer can
start.  Points are sorted by both columns.
"""

from __future__ import annotations

import mmap
import operator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from cutfs.codec.errors import ShardFormatError
from cutfs.codec.storage.memory_advice import address_of, will_need

Int64Array = npt.NDArray[np.int64]

#: A search looks first within one page of a column (512 int64 points in 4 KiB pages).
_PAGE_BYTES = mmap.PAGESIZE
_POINT_BYTES = 8
_PAGE_POINTS = _PAGE_BYTES // _POINT_BYTES


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
    #: Where each column starts in memory (None: not contiguous), for the page-first search.
    _addresses: tuple[int | None, int | None] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.samples.shape != self.byte_offsets.shape or self.samples.ndim != 1:
            raise ValueError("seek index columns must be one-dimensional and of equal length")
        if len(self.samples) == 0:
            raise ValueError("a seek index needs at least one point")
        addresses = (_address(self.samples), _address(self.byte_offsets))
        object.__setattr__(self, "_addresses", addresses)
        if not self.sorted_checked:
            return
        if np.any(np.diff(self.samples) < 0) or np.any(np.diff(self.byte_offsets) < 0):
            raise ValueError("seek index points must be sorted")

    def __reduce__(self) -> tuple[type[SeekIndex], tuple[Int64Array, Int64Array, bool]]:
        """Pickled as its columns: the addresses belong to this process."""
        return (SeekIndex, (self.samples, self.byte_offsets, self.sorted_checked))

    @classmethod
    def from_points(cls, samples: list[int], byte_offsets: list[int]) -> SeekIndex:
        return cls(np.asarray(samples, dtype=np.int64), np.asarray(byte_offsets, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.samples)

    def point_at_or_before(self, sample: int) -> SeekPoint:
        """The last point whose sample is at or before ``sample``, else the first."""
        sample = operator.index(sample)
        guess = _guess(self.samples, sample)
        if guess is not None:  # its byte offset is read next: both pages are read at once
            self._will_need(1, guess)
        found = _guided_search(self.samples, sample, guess, self._addresses[0])
        position = max(found - 1, 0)
        self._check_around(position)
        after = position + 1
        if (position > 0 and self.samples[position] > sample) or (
            after < len(self.samples) and self.samples[after] <= sample
        ):
            raise ShardFormatError("seek index points are not sorted")
        return SeekPoint(int(self.samples[position]), int(self.byte_offsets[position]))

    def first_point_after(self, sample: int) -> SeekPoint | None:
        """The first point whose sample is after ``sample``, if any."""
        sample = operator.index(sample)
        position = self.points_through(sample)
        if position >= len(self.samples):
            return None
        self._check_around(position)
        if self.samples[position] <= sample or (
            position > 0 and self.samples[position - 1] > sample
        ):
            raise ShardFormatError("seek index points are not sorted")
        return SeekPoint(int(self.samples[position]), int(self.byte_offsets[position]))

    def points_through(self, sample: int) -> int:
        """How many points start at or before ``sample`` (``searchsorted``, side right)."""
        sample = operator.index(sample)
        return _guided_search(
            self.samples, sample, _guess(self.samples, sample), self._addresses[0]
        )

    def points_through_byte(self, byte_offset: int) -> int:
        """How many points are at or before ``byte_offset`` in the recording's bytes."""
        offsets = self.byte_offsets
        byte_offset = operator.index(byte_offset)
        guess = _guess(offsets, byte_offset)
        return _guided_search(offsets, byte_offset, guess, self._addresses[1])

    def expect(self, sample: int) -> None:
        """A search for ``sample`` is likely soon: ask for the pages it will read (of both
        columns) without waiting for them, so that they arrive while the caller does
        something else.  Only a hint: it reads nothing but the columns' ends (which
        stay in memory once read) and raises nothing."""
        try:
            sample = operator.index(sample)
        except TypeError:
            return
        guess = _guess(self.samples, sample)
        if guess is not None:
            positions: tuple[int, ...] = (guess,)
        elif len(self.samples) <= _PAGE_POINTS:  # searched whole: one or two pages
            positions = (0, len(self.samples) - 1)
        else:
            return  # before the first point or after the last: the ends, kept in memory
        for position in positions:
            self._will_need(0, position)
            self._will_need(1, position)

    def _will_need(self, column: int, position: int) -> None:
        address = self._addresses[column]
        if address is not None:
            will_need(address + position * _POINT_BYTES)

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


def _guess(column: Int64Array, value: int) -> int | None:
    """Where a straight line through a column's first and last values puts ``value``;
    ``None`` for a column that fits in a page (it is searched whole) or for a value
    outside its ends (the answer is one of them)."""
    count = len(column)
    if count <= _PAGE_POINTS:
        return None
    low, high = int(column[0]), int(column[count - 1])
    if not low <= value < high:
        return None
    return (value - low) * (count - 1) // (high - low)


def _guided_search(column: Int64Array, value: int, guess: int | None, address: int | None) -> int:
    """``np.searchsorted(column, value, side="right")`` of a sorted column, looked for
    first in the page of the column that holds ``guess`` (see :func:`_guess`); ``address``
    is where the column starts in memory (``None``: not contiguous, pages do not line up).

    A recording's seek points are close to evenly spaced (a FLAC or MP3 stream's frames
    are of a fixed length; a compressed stream's bytes grow about linearly), so the answer
    is nearly always in that page: a search touches the column's two ends, which stay in
    memory, and one page, where a binary search of a two-hour recording's index touches
    five or six.  On a cold node each page is a read from storage (0.1-0.2 ms on this
    project's test machine).  Where the guess misses, the whole column is searched.
    """
    count = len(column)
    if guess is None:
        if count > _PAGE_POINTS:
            if value < int(column[0]):
                return 0
            if value >= int(column[count - 1]):
                return count
        return int(np.searchsorted(column, value, side="right"))
    if address is None:
        start = max(guess - _PAGE_POINTS // 2, 0)
    else:
        start = guess - min(guess, (address + guess * _POINT_BYTES) % _PAGE_BYTES // _POINT_BYTES)
    end = min(start + _PAGE_POINTS, count)
    found = start + int(np.searchsorted(column[start:end], value, side="right"))
    if start < found < end:
        return found
    return int(np.searchsorted(column, value, side="right"))


def _address(column: Int64Array) -> int | None:
    """Where an int64 column starts in memory, when its points lie one after another
    (``None`` otherwise: the page-first search then centres its window on the guess)."""
    return address_of(column) if column.dtype == np.int64 else None
