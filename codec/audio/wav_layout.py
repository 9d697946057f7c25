"""The byte layout of the WAV files cutfs serves.

Every virtual file is a canonical 44-byte RIFF/WAVE header followed by
16-bit little-endian PCM (or, with ``float32``, 32-bit IEEE float, format tag
3), interleaved by frame.  Its size is known from the frame count alone, so
it is exact before anything is decoded::

    size_bytes = 44 + num_frames * channels * 2   (4 for float32)

RIFF sizes are 32-bit.  A file whose data exceeds what they can express
(4 GiB, for example 38 hours of 16 kHz mono) carries 0xFFFFFFFF in both
size fields, the convention readers such as FFmpeg and libsndfile accept for
"up to the end of the file"; ``st_size`` stays exact.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

HEADER_BYTES = 44
SAMPLE_BYTES = 2
_MAX_RIFF_SIZE = 0xFFFFFFFF
_FORMAT_PCM = 1
_FORMAT_IEEE_FLOAT = 3


@dataclass(frozen=True, slots=True)
class WavLayout:
    """Header and sizes of one virtual WAV file of ``num_frames`` frames."""

    sample_rate: int
    channels: int
    num_frames: int
    float32: bool = False

    @property
    def sample_bytes(self) -> int:
        return 4 if self.float32 else SAMPLE_BYTES

    @property
    def frame_bytes(self) -> int:
        """Bytes per frame: one sample per channel."""
        return self.channels * self.sample_bytes

    @property
    def data_bytes(self) -> int:
        return self.num_frames * self.frame_bytes

    @property
    def size_bytes(self) -> int:
        """The exact file size, header included."""
        return HEADER_BYTES + self.data_bytes

    def header(self) -> bytes:
        """The 44 header bytes."""
        data_size = min(self.data_bytes, _MAX_RIFF_SIZE)
        riff_size = min(self.data_bytes + HEADER_BYTES - 8, _MAX_RIFF_SIZE)
        return struct.pack(
            "<4sI4s4sIHHIIHH4sI",
            b"RIFF",
            riff_size,
            b"WAVE",
            b"fmt ",
            16,  # fmt chunk size
            _FORMAT_IEEE_FLOAT if self.float32 else _FORMAT_PCM,
            self.channels,
            self.sample_rate,
            self.sample_rate * self.frame_bytes,  # byte rate
            self.frame_bytes,  # block align
            self.sample_bytes * 8,  # bits per sample
            b"data",
            data_size,
        )

    def frames_for_bytes(self, offset_bytes: int, size_bytes: int) -> tuple[int, int]:
        """The frame range ``[first, end)`` whose PCM covers the byte range.

        The byte range is first clipped to the data part of the file; the
        result is empty (``first == end``) when nothing of the data is covered.
        """
        start = max(offset_bytes, HEADER_BYTES) - HEADER_BYTES
        stop = min(offset_bytes + size_bytes, self.size_bytes) - HEADER_BYTES
        if stop <= start:
            return (0, 0)
        first = start // self.frame_bytes
        end = -(-stop // self.frame_bytes)
        return (first, end)
