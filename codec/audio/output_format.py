"""What the served WAV files hold: the recording's own samples, or a view of them.

A mount may serve every file at one sample rate, downmixed to mono, or as
32-bit float (``cutfs mount --sample-rate 16000 --mono --float32``).  The
contract stays exact:

* Resampling: a file's frames are those of the whole recording resampled by
  :class:`cutfs.codec.audio.resampler.Resampler` (``ceil(n * rate / source_rate)``
  frames in all).  A file that starts at source frame ``s`` and is ``n``
  frames long starts at output frame ``round(s * rate / source_rate)`` and is
  ``round(n * rate / source_rate)`` frames long (halves rounded up, as
  Lhotse rounds durations), within the resampled recording.
* Mono: the mean of the file's channels (after channel selection).
* 16-bit output rounds to the nearest integer (halves to even) and clips;
  float32 output is the 16-bit scale divided by 32768, without rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import gcd
from typing import Final

import numpy as np
import numpy.typing as npt

from cutfs.codec.audio.resampler import Resampler
from cutfs.codec.audio.wav_layout import WavLayout
from cutfs.codec.errors import UnsupportedAudioError
from cutfs.codec.trust.limits import MAX_SAMPLE_RATE_HZ

#: The largest term of a reduced rate ratio cutfs resamples (44.1 kHz to 16 kHz is 441/160;
#: the filter has 20 taps per unit of the larger term, 40 001 here at most: 320 KB).
MAX_RESAMPLING_RATIO_TERM: Final = 2000


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """The mount-wide view applied to every WAV file (the default changes nothing)."""

    sample_rate: int | None = None
    mono: bool = False
    float32: bool = False

    def __post_init__(self) -> None:
        if self.sample_rate is not None and not 0 < self.sample_rate <= MAX_SAMPLE_RATE_HZ:
            raise ValueError(f"the sample rate must lie in [1, {MAX_SAMPLE_RATE_HZ}] Hz")

    def rate(self, source_rate: int) -> int:
        return self.sample_rate or source_rate

    def resampler(self, source_rate: int) -> Resampler | None:
        """The resampler from ``source_rate``, or ``None`` when the rate is kept.

        Designing one can take milliseconds: call this off an event loop.
        Raises :class:`UnsupportedAudioError` when the two rates have no
        common divisor that keeps the filter small (16001 Hz to 16000 Hz, say).
        """
        if self.sample_rate is None or self.sample_rate == source_rate:
            return None
        return _resampler(source_rate, self.sample_rate)

    def resamples(self, source_rate: int) -> bool:
        """Whether files of a recording at ``source_rate`` are resampled."""
        return self.sample_rate is not None and self.sample_rate != source_rate

    def span(
        self, source_rate: int, start_frame: int, num_frames: int, recording_frames: int
    ) -> tuple[int, int]:
        """(first output frame, output frames) of a file, within the resampled recording."""
        if not self.resamples(source_rate):
            return start_frame, num_frames
        rate = self.rate(source_rate)
        start = _scaled(start_frame, rate, source_rate)
        total = -(-recording_frames * rate // source_rate)  # Resampler.output_frames
        return start, max(0, min(_scaled(num_frames, rate, source_rate), total - start))

    def layout(self, source_rate: int, channels: int, output_frames: int) -> WavLayout:
        served_channels = 1 if self.mono else channels
        return WavLayout(self.rate(source_rate), served_channels, output_frames, self.float32)

    def downmix(self, samples: npt.NDArray[np.generic]) -> npt.NDArray[np.generic]:
        """The mean of the channels when mono is asked for (float64), else unchanged."""
        if not self.mono or samples.shape[1] == 1:
            return samples
        mean: npt.NDArray[np.float64] = samples.mean(axis=1, keepdims=True)
        return mean

    def encode(self, samples: npt.NDArray[np.generic]) -> memoryview:
        """Interleaved little-endian samples in the 16-bit scale, as the file stores them:
        the bytes of ``samples`` themselves (no copy) when they are contiguous 16-bit
        samples served as they are."""
        samples = self.downmix(samples)
        if self.float32 and samples.dtype == np.int16:
            # Exact in float32 (16 bits of mantissa, a power-of-two scale), and one array
            # made, where going through float64 made two of four times the size (for a 10 s
            # cut at 48 kHz, 7.7 MB of fresh pages where 1.9 are needed).
            encoded = np.empty(samples.shape, dtype="<f4")
            np.multiply(samples, np.float32(1 / 32768), out=encoded)
        elif self.float32:
            encoded = (np.asarray(samples, dtype=np.float64) / 32768.0).astype("<f4")
        elif samples.dtype != np.int16:
            encoded = np.clip(np.rint(samples), -32768, 32767).astype("<i2")
        else:
            encoded = np.ascontiguousarray(samples).astype("<i2", copy=False)
        return encoded.data.cast("B")


#: Resamplers kept designed: one per source rate in use (speech corpora have a handful).
_RESAMPLERS_KEPT = 16


@lru_cache(maxsize=_RESAMPLERS_KEPT)
def _resampler(source_rate: int, target_rate: int) -> Resampler:
    reduced = max(source_rate, target_rate) // gcd(source_rate, target_rate)
    if reduced > MAX_RESAMPLING_RATIO_TERM:
        raise UnsupportedAudioError(
            f"cannot resample {source_rate} Hz to {target_rate} Hz exactly: their ratio "
            f"reduces to terms up to {reduced} (at most {MAX_RESAMPLING_RATIO_TERM}), whose "
            f"filter would have {20 * reduced + 1} taps"
        )
    return Resampler(source_rate, target_rate)


def _scaled(frames: int, rate: int, source_rate: int) -> int:
    """``frames * rate / source_rate`` rounded half up, in integers."""
    return (2 * frames * rate + source_rate) // (2 * source_rate)
