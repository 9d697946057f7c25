"""What cutfs knows about one stored recording, and how to decode it.

A :class:`Recording` is computed once at pack time by
:mod:`cutfs.codec.audio.recording_indexer` and stored beside the encoded bytes.  It is
everything the decoder needs to produce any frame range of the full decode
without touching the rest of the blob.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction

from cutfs.codec.audio.seek_index import SeekIndex


class DecodeMethod(StrEnum):
    """How frames are produced from the stored bytes."""

    #: WAV with plain PCM or float samples: bytes are sliced and converted.
    PCM = "pcm"
    #: Raw or Ogg streams (FLAC, MP3, ADTS AAC, Vorbis, Opus): the container
    #: header bytes are spliced in front of the bytes from a seek point, and a
    #: demuxer reads on from there.
    SPLICE = "splice"
    #: Containers with their own sample tables (MP4/M4A): the demuxer seeks.
    SEEK = "seek"
    #: FLAC through libsndfile (python-soundfile), which decodes faster than
    #: PyAV: spliced like ``SPLICE`` at a seek point (whose frame header is checked)
    #: and decoded straight through from there, without libFLAC's seek.
    SNDFILE = "sndfile"


class FrameTiming(StrEnum):
    """How the position of a decoded frame is known."""

    #: From its timestamp, which is on the stream's timeline (FLAC, Opus, MP4).
    ABSOLUTE = "absolute"
    #: From its timestamp, which the demuxer counts from zero at the splice
    #: point (raw MP3 and ADTS streams carry no timestamps of their own).
    RELATIVE = "relative"
    #: By counting decoded frames from the seek point (Vorbis: the Ogg
    #: demuxer's per-packet timestamps are off around block-size changes,
    #: only page granules are exact).
    COUNTED = "counted"


@dataclass(frozen=True, slots=True, eq=False)
class Recording:
    """Layout and decoding plan of one recording.

    Sample positions are frames of the full decode of the recording, counted
    from its first output frame.  Timestamps reported by the demuxer, once
    converted to frames, are positions on the stream's timeline; position =
    timeline frames - ``timeline_origin``.  See :class:`FrameTiming` for the
    other ways a decoded frame's position is known; in all of them a seek
    point's sample is the position of the first frame a decoder produces
    when started there.
    """

    recording_id: str
    sample_rate: int
    channels: int
    num_frames: int
    method: DecodeMethod
    container_format: str
    codec_name: str
    seek_index: SeekIndex
    header_bytes: int = 0
    pcm_format: str = "s16"
    timing: FrameTiming = FrameTiming.ABSOLUTE
    timeline_origin: int = 0
    time_base: Fraction = Fraction(0)
    preroll_frames: int = 0
    transcoded_from: str = ""

    @property
    def duration_seconds(self) -> float:
        return self.num_frames / self.sample_rate

    def pts_scale(self) -> tuple[int, int]:
        """Frames per timestamp unit, as a fraction (numerator, denominator)."""
        scale = self.time_base * self.sample_rate
        return scale.numerator, scale.denominator

    def position_of(self, pts: int) -> int:
        """Sample position of a demuxer timestamp on the stream's timeline."""
        return pts_to_frames(pts, *self.pts_scale()) - self.timeline_origin


def pts_to_frames(pts: int, numerator: int, denominator: int) -> int:
    """``pts * numerator / denominator`` rounded half up, in integers (no Fraction per frame)."""
    return (2 * pts * numerator + denominator) // (2 * denominator)
