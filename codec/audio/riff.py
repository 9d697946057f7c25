"""Parsing of RIFF/WAVE headers, for WAV sources served without decoding.

Only what cutfs needs is read: the ``fmt `` chunk (PCM or IEEE float, plain or
WAVE_FORMAT_EXTENSIBLE) and where the ``data`` chunk starts.  Other WAV
encodings (ADPCM, mu-law, ...) are reported as not plain PCM and go through
the general decoding path instead.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_FORMAT_PCM = 0x0001
_FORMAT_FLOAT = 0x0003
_FORMAT_EXTENSIBLE = 0xFFFE
_UNKNOWN_SIZE = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class RiffWave:
    """Where a WAV file keeps its samples and how they are stored."""

    sample_rate: int
    channels: int
    sample_format: str  # one of cutfs.codec.audio.pcm.PCM_DTYPES
    data_offset_bytes: int
    num_frames: int


def parse_riff_wave(data: memoryview) -> RiffWave | None:
    """Describe ``data`` if it is a WAV file of plain PCM or float samples.

    Returns ``None`` for anything else, including WAV files of other
    encodings.  A ``data`` chunk whose declared size runs past the end of the
    file (or is the streaming value 0xFFFFFFFF) is taken to end with the file,
    as FFmpeg does; a trailing partial frame is ignored.
    """
    if len(data) < 12 or bytes(data[0:4]) != b"RIFF" or bytes(data[8:12]) != b"WAVE":
        return None
    position = 12
    fmt: tuple[int, int, int, int] | None = None
    while position + 8 <= len(data):
        chunk_id = bytes(data[position : position + 4])
        (chunk_size,) = struct.unpack_from("<I", data, position + 4)
        body = position + 8
        if chunk_id == b"fmt ":
            fmt = _parse_fmt(data[body : body + chunk_size])
            if fmt is None:
                return None
        elif chunk_id == b"data":
            if fmt is None:
                return None
            return _wave(fmt, body, chunk_size, len(data))
        position = body + chunk_size + (chunk_size & 1)
    return None


def _parse_fmt(body: memoryview) -> tuple[int, int, int, int] | None:
    if len(body) < 16:
        return None
    tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", body, 0)
    if tag == _FORMAT_EXTENSIBLE:
        if len(body) < 26:
            return None
        (tag,) = struct.unpack_from("<H", body, 24)
    if tag not in (_FORMAT_PCM, _FORMAT_FLOAT) or channels == 0 or rate == 0:
        return None
    return (tag, channels, rate, bits)


def _wave(
    fmt: tuple[int, int, int, int], data_offset: int, size: int, file_size: int
) -> RiffWave | None:
    tag, channels, rate, bits = fmt
    formats = {
        (_FORMAT_PCM, 8): "u8",
        (_FORMAT_PCM, 16): "s16",
        (_FORMAT_PCM, 24): "s24",
        (_FORMAT_PCM, 32): "s32",
        (_FORMAT_FLOAT, 32): "f32",
        (_FORMAT_FLOAT, 64): "f64",
    }
    sample_format = formats.get((tag, bits))
    if sample_format is None:
        return None
    available = file_size - data_offset
    if size == _UNKNOWN_SIZE or size > available:
        size = available
    frame_bytes = channels * (bits // 8)
    return RiffWave(rate, channels, sample_format, data_offset, size // frame_bytes)
