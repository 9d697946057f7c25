"""The header of one FLAC frame: where in the stream its samples start.

A FLAC frame begins with a sync code and says which samples it holds: its
frame number (fixed-blocksize streams) or its first sample number
(variable-blocksize streams), followed by a CRC-8 of the header.  Decoding a
spliced FLAC stream from a seek point relies on that point being the start of
the frame it claims; :func:`frame_first_sample` lets the decoder check it
before it trusts the index (shards come from other people and from older
versions of cutfs), so that a wrong point fails a read instead of serving
shifted audio.  See https://xiph.org/flac/format.html#frame_header.
"""

from __future__ import annotations

from typing import Final

#: The longest frame header: 4 fixed bytes, a 7-byte coded number, a 16-bit block size,
#: a 16-bit sample rate and the CRC-8.
MAX_HEADER_BYTES: Final = 16

_SYNC_MASK: Final = 0xFFFE
_SYNC: Final = 0xFFF8


def frame_first_sample(header: bytes | memoryview) -> int | None:
    """The first sample of the frame whose header ``header`` starts with, or ``None``
    when it does not start with a valid frame header (sync code, reserved bits, block
    size, sample rate code and CRC-8 all checked).

    ``header`` needs at most :data:`MAX_HEADER_BYTES` bytes.  For fixed-blocksize
    streams the sample is the frame number times this frame's block size, which is
    right for every frame but a stream's last (never a seek point).
    """
    data = bytes(header[:MAX_HEADER_BYTES])
    if len(data) < 5 or (data[0] << 8 | data[1]) & _SYNC_MASK != _SYNC:
        return None
    variable_blocksize = bool(data[1] & 1)
    block_size_code, rate_code = data[2] >> 4, data[2] & 0x0F
    if block_size_code == 0 or rate_code == 0x0F or data[3] & 1 or (data[3] >> 4) > 10:
        return None
    decoded = _coded_number(data, 4)
    if decoded is None:
        return None
    number, at = decoded
    block_size, at = _block_size(data, at, block_size_code)
    at += {12: 1, 13: 2, 14: 2}.get(rate_code, 0)
    if at >= len(data) or _crc8(data[:at]) != data[at]:
        return None
    return number if variable_blocksize else number * block_size


def _coded_number(data: bytes, at: int) -> tuple[int, int] | None:
    """The UTF-8-like coded frame or sample number at ``at``, and the offset after it."""
    lead = data[at]
    if lead < 0x80:
        return lead, at + 1
    length = 8 - (lead ^ 0xFF).bit_length()  # the count of leading one bits
    if not 2 <= length <= 7 or at + length > len(data):
        return None
    value = lead & (0x7F >> length)
    for byte in data[at + 1 : at + length]:
        if byte & 0xC0 != 0x80:
            return None
        value = value << 6 | byte & 0x3F
    return value, at + length


def _block_size(data: bytes, at: int, code: int) -> tuple[int, int]:
    """This frame's block size (frames) from its code, and the offset after its bytes."""
    if code == 1:
        return 192, at
    if code <= 5:
        return 576 << (code - 2), at
    if code == 6:
        return (data[at] + 1 if at < len(data) else 0), at + 1
    if code == 7:
        return (int.from_bytes(data[at : at + 2], "big") + 1 if at + 1 < len(data) else 0), at + 2
    return 256 << (code - 8), at


def _crc8(data: bytes) -> int:
    """CRC-8 with polynomial x^8 + x^2 + x + 1, as FLAC frame headers carry it."""
    crc = 0
    for byte in data:
        crc = _CRC8_TABLE[crc ^ byte]
    return crc


def _crc8_table() -> tuple[int, ...]:
    table = []
    for value in range(256):
        crc = value
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
        table.append(crc)
    return tuple(table)


_CRC8_TABLE: Final = _crc8_table()
