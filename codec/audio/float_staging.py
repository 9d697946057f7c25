"""Gathering the frames of a float decoder, for one conversion to 16 bits at the end.

The decoders of lossy codecs (Opus, MP3, AAC, Vorbis) put out float samples in small
frames: 20 ms for Opus, so about 500 frames for a 10 s cut.  What is done per frame is
kept to one byte copy per plane, a slice assignment between memoryviews (about 1 µs a
frame, against 2.5 µs through numpy views of each plane), and the conversion runs once,
in place, over the whole range.

The float buffer is kept by the thread and used again by its next decode.  A buffer
allocated per decode came as fresh pages from the kernel each time (large allocations
are mapped, and given back when freed), and faulting in those pages, with the
conversion's own temporary, was about a third of the time spent besides decoding on a
10 s Opus cut at 48 kHz (2 MB of floats: 1.6 of 4.7 ms).
"""

from __future__ import annotations

import threading
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from cutfs.codec.audio.pcm import Int16Array, float_to_s16
from cutfs.codec.errors import CorruptDataError

#: The sample formats (FFmpeg's names) gathered here: 32-bit float, planar or packed.
FLOAT_FORMATS: Final = frozenset({"flt", "fltp"})
#: The largest buffer a thread keeps between decodes (a 10 s cut of 48 kHz stereo is
#: 3.8 MB of floats); larger decodes (whole recordings) allocate theirs and let it go.
KEPT_STAGING_BYTES: Final = 8 << 20
_SAMPLE_BYTES: Final = 4


class FloatStaging:
    """The float samples of frames ``[0, frames)`` of one decode, ``channels`` each, in
    the layout the decoder puts out (``planar``: one plane per channel; else one plane of
    interleaved samples).

    :meth:`put` copies a decoded frame's samples in; :meth:`convert_into` converts all of
    them to int16 (frames, channels), as :func:`cutfs.codec.audio.pcm.float_to_s16` does.  Not
    to be shared between threads, nor kept past the decode: the buffer is the thread's.
    """

    def __init__(self, frames: int, channels: int, sample_format: str) -> None:
        if sample_format not in FLOAT_FORMATS:
            raise ValueError(f"not a float sample format: {sample_format}")
        self._frames = frames
        self._channels = channels
        self._format = sample_format
        self._planar = sample_format == "fltp"
        self._samples = _thread_buffer(frames * channels)
        self._bytes = self._samples.data.cast("B")
        #: Bytes from one frame to the next in a channel's run (planar) or in the buffer.
        self._frame_bytes = _SAMPLE_BYTES if self._planar else _SAMPLE_BYTES * channels
        self._plane_bytes = frames * _SAMPLE_BYTES

    def put(self, frame: Any, take_from: int, take: int, at: int) -> None:
        """Copy frames ``[take_from, take_from + take)`` of a decoded PyAV audio frame to
        frame ``at`` of this range.  Raises :class:`CorruptDataError` when the frame's
        sample format or channel count is not the one the range started with."""
        if frame.format.name != self._format or frame.layout.nb_channels != self._channels:
            raise CorruptDataError(
                f"the decoded audio changed to {frame.format.name} with "
                f"{frame.layout.nb_channels} channels"
            )
        width = self._frame_bytes
        source_start, source_end = take_from * width, (take_from + take) * width
        target = at * width
        if self._planar:
            for plane in frame.planes:
                self._bytes[target : target + source_end - source_start] = memoryview(plane)[
                    source_start:source_end
                ]
                target += self._plane_bytes
        else:
            self._bytes[target : target + source_end - source_start] = memoryview(frame.planes[0])[
                source_start:source_end
            ]

    def convert_into(self, output: Int16Array) -> None:
        """Convert every frame to int16 into ``output`` (frames, channels); the floats are
        scaled and rounded in place, so this is done once."""
        if self._planar:
            samples = self._samples.reshape(self._channels, self._frames).T
        else:
            samples = self._samples.reshape(self._frames, self._channels)
        float_to_s16(samples, out=output, in_place=True)


_threads = threading.local()


def _thread_buffer(count: int) -> npt.NDArray[np.float32]:
    """``count`` floats of this thread's kept buffer, grown as needed up to
    :data:`KEPT_STAGING_BYTES`; a fresh array beyond."""
    if count * _SAMPLE_BYTES > KEPT_STAGING_BYTES:
        return np.empty(count, dtype=np.float32)
    kept: npt.NDArray[np.float32] | None = getattr(_threads, "buffer", None)
    if kept is None or len(kept) < count:
        kept = _threads.buffer = np.empty(count, dtype=np.float32)
    return kept[:count]


__all__ = ["FLOAT_FORMATS", "KEPT_STAGING_BYTES", "FloatStaging"]
