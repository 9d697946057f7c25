"""How far a pack is, as its steps report it to a progress display."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PackProgress:
    """How far a pack is: recordings done of all, bytes stored, seconds of audio indexed."""

    recordings_done: int
    recordings: int
    stored_bytes: int
    audio_seconds: float


ProgressCallback = Callable[[PackProgress], None]
