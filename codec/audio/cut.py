"""Cuts: frame ranges of one recording, and the rounding that defines them."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal


def seconds_to_frames(seconds: float, sample_rate: int) -> int:
    """Frames in ``seconds`` at ``sample_rate``, rounded as Lhotse rounds.

    Lhotse's ``compute_num_samples`` rounds the product to 8 decimals, then
    half up; using the same rule makes every cut exactly as long as Lhotse
    expects it to be, so its sample-count checks pass.
    """
    product = round(seconds * sample_rate, ndigits=8)
    return int(Decimal(product).quantize(Decimal(0), rounding=ROUND_HALF_UP))


@dataclass(frozen=True, slots=True)
class Cut:
    """Frames ``[start_frame, start_frame + num_frames)`` of one recording.

    ``channels`` lists the recording's channels the cut carries, in order; an
    empty tuple means all of them.
    """

    cut_id: str
    recording_index: int
    start_frame: int
    num_frames: int
    channels: tuple[int, ...] = ()
    metadata_json: str = "{}"

    @property
    def end_frame(self) -> int:
        return self.start_frame + self.num_frames
