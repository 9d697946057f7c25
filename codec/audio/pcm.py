"""Conversion of decoded or stored samples to interleaved 16-bit PCM.

The conversions are the ones FFmpeg's command line applies when asked for
``-f s16le`` (libswresample without dithering), so that served samples equal
an independent ``ffmpeg`` decode:

* integer samples keep their 16 most significant bits (an arithmetic shift);
* unsigned 8-bit samples are re-centred and shifted up;
* floating-point samples are scaled by 32768, rounded half to even and clipped.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

Int16Array = npt.NDArray[np.int16]

#: Sample formats cutfs reads directly from WAV data, with their numpy dtype.
PCM_DTYPES: Final[dict[str, str]] = {
    "u8": "u1",
    "s16": "<i2",
    "s24": "V3",
    "s32": "<i4",
    "f32": "<f4",
    "f64": "<f8",
}


def float_to_s16(
    samples: npt.NDArray[np.floating], out: Int16Array | None = None, *, in_place: bool = False
) -> Int16Array:
    """Scale, round half to even and clip, as ``lrintf(x * 32768)`` does; into ``out``
    (of the same shape) when given.  With ``in_place`` (32-bit samples only) the
    scaling and rounding are done in ``samples`` themselves, which are lost: no
    temporary array.

    32-bit samples are converted in 32-bit arithmetic, which gives the same integers:
    scaling by a power of two is exact (a value that overflows to infinity clips as
    it would have), and so are rounding and clipping.  That is a third of the time
    of the 64-bit way for a decoder's output (measured: 0.33 against 1.12 ms for 10 s
    at 48 kHz), the float decoders' (Opus, AAC, Vorbis, MP3) largest cost after
    decoding.  Other samples are converted in 64-bit arithmetic.
    """
    precision = np.float32 if samples.dtype == np.float32 else np.float64
    if in_place and samples.dtype != np.float32:
        raise ValueError("only 32-bit samples are converted in place")
    with np.errstate(over="ignore"):
        if in_place:
            scaled = np.multiply(samples, precision(32768.0), out=samples)
        else:
            scaled = np.multiply(samples, precision(32768.0), dtype=precision)
    np.rint(scaled, out=scaled)
    np.clip(scaled, -32768, 32767, out=scaled)
    if out is None:
        converted: Int16Array = scaled.astype(np.int16)
        return converted
    np.copyto(out, scaled, casting="unsafe")
    return out


def int_to_s16(samples: npt.NDArray[np.integer], bits: int) -> Int16Array:
    """Keep the top 16 bits of signed ``bits``-bit samples."""
    if bits == 16:
        return np.asarray(samples, dtype=np.int16)
    return (np.asarray(samples, dtype=np.int64) >> (bits - 16)).astype(np.int16)


def packed_to_s16(raw: bytes | memoryview, sample_format: str) -> Int16Array:
    """Interpret little-endian packed samples of ``sample_format`` as int16.

    ``raw`` must hold a whole number of samples.  The result is flat
    (interleaved frames).  For ``s16`` the result is a read-only view of
    ``raw`` with no copy.
    """
    if sample_format == "s16":
        return np.frombuffer(raw, dtype="<i2")
    if sample_format == "u8":
        values = np.frombuffer(raw, dtype=np.uint8).astype(np.int16)
        return ((values - 128) << 8).astype(np.int16)
    if sample_format == "s24":
        triples = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3)
        # The top two bytes of a little-endian 24-bit sample are its top 16 bits.
        return (triples[:, 1].astype(np.int16) | (triples[:, 2].astype(np.int16) << 8)).astype(
            np.int16
        )
    if sample_format == "s32":
        return int_to_s16(np.frombuffer(raw, dtype="<i4"), 32)
    if sample_format in ("f32", "f64"):
        return float_to_s16(np.frombuffer(raw, dtype=PCM_DTYPES[sample_format]))
    raise ValueError(f"unknown sample format {sample_format!r}")


def sample_bytes(sample_format: str) -> int:
    """Bytes per sample of a packed sample format; ValueError for one it does not know."""
    dtype = PCM_DTYPES.get(sample_format)
    if dtype is None:
        raise ValueError(f"unknown sample format {sample_format!r}")
    return np.dtype(dtype).itemsize
