"""Resampling any stretch of a recording exactly as if the whole recording were resampled.

A served file at another sample rate must hold the frames of the *whole*
recording resampled, cut where the file starts, so that cuts and windows
agree wherever they overlap and do not depend on where a read begins.  A
stateful resampler (libswresample) cannot give that from a seek; a
polyphase FIR filter can: each output frame is a fixed weighted sum of the
input frames around it, with zeros outside the recording.

The filter is the one ``scipy.signal.resample_poly`` designs by default
(rates reduced by their gcd; a Kaiser-windowed sinc, beta 5, of
``20 * max(up, down) + 1`` taps with cut-off ``1 / max(up, down)``, scaled
to unit gain and by ``up``), with the same alignment, so the output equals
``resample_poly`` of the full decode up to floating-point rounding.  A
recording of ``n`` frames has ``ceil(n * up / down)`` output frames.
"""

from __future__ import annotations

from math import gcd

import numpy as np
import numpy.typing as npt

Float64Array = npt.NDArray[np.float64]

#: Output frames computed per vectorised step (bounds the gather's memory).
_CHUNK_FRAMES = 8192


class Resampler:
    """From ``source_rate`` to ``target_rate``; see the module docstring."""

    def __init__(self, source_rate: int, target_rate: int) -> None:
        if source_rate <= 0 or target_rate <= 0:
            raise ValueError("sample rates must be positive")
        divisor = gcd(source_rate, target_rate)
        self.up = target_rate // divisor
        self.down = source_rate // divisor
        max_rate = max(self.up, self.down)
        half_length = 10 * max_rate
        taps = 2 * half_length + 1
        positions = np.arange(taps) - half_length
        cutoff = 1.0 / max_rate
        kernel = cutoff * np.sinc(cutoff * positions) * np.kaiser(taps, 5.0)
        kernel = kernel / kernel.sum() * self.up
        pre_pad = self.down - half_length % self.down
        self._pre_remove = (half_length + pre_pad) // self.down
        self._taps_per_phase = -(-(pre_pad + taps) // self.up)
        padded = np.zeros(self._taps_per_phase * self.up + self.up)
        padded[pre_pad : pre_pad + taps] = kernel
        self._kernel = padded

    @property
    def is_identity(self) -> bool:
        return self.up == self.down

    def output_frames(self, input_frames: int) -> int:
        """Frames of the resampled recording."""
        return -(-input_frames * self.up // self.down)

    def input_span(self, first: int, end: int, input_frames: int) -> tuple[int, int]:
        """The input frames ``[lo, hi)`` that output frames ``[first, end)`` depend on."""
        if end <= first:
            return (0, 0)
        low = self._base(first) - self._taps_per_phase + 1
        high = self._base(end - 1) + 1
        return (max(0, low), min(input_frames, high))

    def resample(self, span: Float64Array, span_start: int, first: int, end: int) -> Float64Array:
        """Output frames ``[first, end)`` from input frames ``span`` starting at ``span_start``.

        ``span`` is (frames, channels) and must cover :meth:`input_span`
        (frames outside the recording count as zero, as they are absent).
        """
        channels = span.shape[1]
        taps = self._taps_per_phase
        low = self._base(first) - taps + 1
        high = self._base(end - 1) + 1
        window = np.zeros((high - low, channels))
        take_from, take_to = max(low, span_start), min(high, span_start + len(span))
        if take_to > take_from:
            window[take_from - low : take_to - low] = span[
                take_from - span_start : take_to - span_start
            ]
        output = np.empty((end - first, channels))
        tap_numbers = np.arange(taps)
        for chunk_start in range(first, end, _CHUNK_FRAMES):
            frames = np.arange(chunk_start, min(end, chunk_start + _CHUNK_FRAMES))
            positions = (frames + self._pre_remove) * self.down
            bases = positions // self.up
            phases = positions - bases * self.up
            weights = self._kernel[phases[:, None] + tap_numbers[None, :] * self.up]
            inputs = window[(bases - low)[:, None] - tap_numbers[None, :]]
            output[chunk_start - first : chunk_start - first + len(frames)] = np.einsum(
                "kt,ktc->kc", weights, inputs
            )
        return output

    def _base(self, frame: int) -> int:
        """The newest input frame output ``frame`` depends on."""
        return (frame + self._pre_remove) * self.down // self.up
