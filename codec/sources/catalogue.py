"""What ``pack`` reads from any input: recordings to store and cuts of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cutfs.codec.errors import SourceError


@dataclass(frozen=True, slots=True)
class DeclaredAudio:
    """What a manifest says about a recording's audio, before anyone decodes it."""

    sample_rate: int
    channels: int
    num_frames: int


@dataclass(frozen=True, slots=True)
class SourceRecording:
    """A recording: a file, bytes inside a file (a tar member, an Arrow blob), or a
    shell command whose output is the file.

    ``length_bytes`` of ``None`` means up to the end of the file.
    """

    recording_id: str
    path: str | None = None
    command: str | None = None
    described_in: str = ""
    offset_bytes: int = 0
    length_bytes: int | None = None
    declared: DeclaredAudio | None = None
    #: A Parquet row's audio: ``offset_bytes`` is then the row group and
    #: ``length_bytes`` the row in it (the bytes are extracted on first use).
    parquet_column: str | None = None

    @property
    def origin(self) -> str:
        """The file or command, as a user would recognise it."""
        if self.path is None:
            return f"{self.command} |"
        if self.offset_bytes or self.length_bytes is not None:
            return f"{self.path} (bytes from {self.offset_bytes}, {self.length_bytes} long)"
        return self.path


@dataclass(frozen=True, slots=True)
class SourceCut:
    """A cut as the input describes it, in seconds.

    ``start_seconds`` and ``duration_seconds`` of ``None`` mean the whole
    recording; ``channels`` of ``None`` means all of its channels.
    """

    cut_id: str
    recording_id: str
    start_seconds: float = 0.0
    duration_seconds: float | None = None
    channels: tuple[int, ...] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    described_in: str = ""


@dataclass
class SourceCatalogue:
    """Recordings and cuts read from one input, checked for duplicate ids."""

    recordings: list[SourceRecording]
    cuts: list[SourceCut]
    kind: str

    def check(self) -> None:
        """Raise :class:`SourceError` on duplicate ids or cuts of unknown recordings."""
        recording_ids: set[str] = set()
        for recording in self.recordings:
            if recording.recording_id in recording_ids:
                raise SourceError(
                    f"duplicate recording id {recording.recording_id!r}",
                    where=recording.described_in,
                )
            recording_ids.add(recording.recording_id)
        cut_ids: set[str] = set()
        for cut in self.cuts:
            if cut.cut_id in cut_ids:
                raise SourceError(f"duplicate cut id {cut.cut_id!r}", where=cut.described_in)
            cut_ids.add(cut.cut_id)
            if cut.recording_id not in recording_ids:
                raise SourceError(
                    f"cut {cut.cut_id!r} refers to unknown recording {cut.recording_id!r}",
                    where=cut.described_in,
                )
        if not self.recordings:
            raise SourceError("no recordings found", where=self.kind)
