"""How far a pack is, as its steps report it to a progress display."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

#: The phases of a pack, in order.  Packing (recordings decoded and stored) reports
#: recordings; the others report cuts: read (as the sources are checked), grouped by
#: partition, sorted into runs, merged into the catalogue, and the file tree's entries.
READING: Final = "reading"
PLANNING: Final = "planning"
PACKING: Final = "packing"
SORTING: Final = "sorting"
MERGING: Final = "merging"
WRITING_TREES: Final = "writing trees"


@dataclass(frozen=True, slots=True)
class PackProgress:
    """How far a pack is: recordings done of all, bytes stored, seconds of audio indexed;
    in the phases other than :data:`PACKING`, rows (cuts, or tree entries) done of all
    (0 of 0 while unknown)."""

    recordings_done: int
    recordings: int
    stored_bytes: int
    audio_seconds: float
    phase: str = PACKING
    rows_done: int = 0
    rows: int = 0

    @classmethod
    def of_rows(cls, phase: str, rows_done: int, rows: int) -> PackProgress:
        """Progress in a phase that counts rows."""
        return cls(0, 0, 0, 0.0, phase, rows_done, rows)


ProgressCallback = Callable[[PackProgress], None]
