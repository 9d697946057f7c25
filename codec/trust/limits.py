"""Range checks for the numbers cutfs reads from data it did not write.

Manifests, Shar and Arrow rows, WAV headers, decoded streams, shard tables and
cached plans all come from other people.  Every rate, channel count, length
and time read from them passes through one of these checks before it is used
to size a file, allocate memory or index an array, so that a bad value fails
one recording or cut with a message instead of overflowing a listing or
exhausting memory.

The bounds are generous for speech and music and small enough that every
derived number (a file size in bytes, an inode, a frame position at the
highest rate) fits in a signed 64-bit integer with room to spare.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Final

from cutfs.codec.errors import CutfsError, SourceError

#: 768 kHz: the highest rate of any audio interface; speech is 8-48 kHz.
MAX_SAMPLE_RATE_HZ: Final = 768_000
#: WAV headers hold 16 bits; microphone arrays and ambisonics stay far below this.
MAX_CHANNELS: Final = 256
#: One recording lasts at most a week (the longest audiobooks run about 40 hours).
MAX_RECORDING_SECONDS: Final = 7 * 24 * 3600
#: The most frames a recording may have, at any rate.
MAX_FRAMES: Final = MAX_SAMPLE_RATE_HZ * MAX_RECORDING_SECONDS


def check_shape(
    sample_rate: object,
    channels: object,
    num_frames: object,
    *,
    where: str,
    error: type[CutfsError] = SourceError,
) -> tuple[int, int, int]:
    """``(sample_rate, channels, num_frames)`` as ints, or ``error`` saying which is out of range.

    The length may be zero; it may not exceed :data:`MAX_RECORDING_SECONDS` at
    the given rate.
    """
    rate = _whole(sample_rate, "sample rate", 1, MAX_SAMPLE_RATE_HZ, where, error)
    count = _whole(channels, "channel count", 1, MAX_CHANNELS, where, error)
    frames = _whole(num_frames, "length in frames", 0, rate * MAX_RECORDING_SECONDS, where, error)
    return rate, count, frames


def check_seconds(
    value: object, what: str, *, where: str, error: type[CutfsError] = SourceError
) -> float:
    """A time in seconds: a finite number in ``[0, MAX_RECORDING_SECONDS]``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(f"{what} must be a number of seconds, not {value!r}", where=where)
    try:
        seconds = float(value)
    except OverflowError:  # an integer too large for a float
        seconds = math.inf
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_RECORDING_SECONDS:
        raise error(
            f"{what} is {value!r} s: it must lie in [0, {MAX_RECORDING_SECONDS}] "
            "(a week, the longest recording cutfs serves)",
            where=where,
        )
    return seconds


def parse_seconds(
    text: str, what: str, *, where: str, error: type[CutfsError] = SourceError
) -> float:
    """:func:`check_seconds` of a decimal number written as text (Kaldi, CSV)."""
    try:
        value = float(text)
    except ValueError:
        raise error(f"{what} must be a number of seconds, not {text!r}", where=where) from None
    return check_seconds(value, what, where=where, error=error)


def _whole(
    value: object,
    what: str,
    low: int,
    high: int,
    where: str,
    error: type[CutfsError],
) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(f"the {what} must be a whole number, not {value!r}", where=where)
    number = int(value)
    if not low <= number <= high:
        raise error(f"the {what} {number} is outside [{low}, {high}]", where=where)
    return number


@dataclass(frozen=True)
class InputLimits:
    """How much a source's text files (manifests, Kaldi tables, segment lists) may make
    cutfs read: a line that is longer is one refused entry, a file that decompresses to
    more or a source with more entries is refused whole.  Reading stays within
    ``line_bytes`` of memory per line, whatever the input."""

    #: The longest line (a Lhotse cut with its supervisions is a few KB).
    line_bytes: int = 1 << 20
    #: The most bytes one file decompresses to (a gzip bomb is refused, not read for hours).
    file_bytes: int = 64 << 30
    #: The most lines (entries) of all a source's files together.
    entries: int = 200_000_000

    def __post_init__(self) -> None:
        for name in ("line_bytes", "file_bytes", "entries"):
            if not 1 <= getattr(self, name) <= 1 << 50:
                raise ValueError(f"the {name.replace('_', ' ')} limit must be positive")
