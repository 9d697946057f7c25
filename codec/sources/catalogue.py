"""What ``pack`` reads from any input: recordings to store and cuts of them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from cutfs.codec.errors import SourceError


@dataclass
class Refusals:
    """What becomes of an entry of a source (a recording, a cut, a line) that is invalid.

    ``cutfs pack`` is strict: the first invalid entry stops it, so nothing is
    packed half right.  A mount serving a source in place is lenient: the
    entry is left out, its message is kept in :attr:`messages`, and every
    other recording and cut is served.  Errors that concern the whole source
    (an unreadable file, no recordings at all) are raised in both modes.
    """

    strict: bool = True
    messages: list[str] = field(default_factory=list)

    @contextmanager
    def entry(self) -> Iterator[None]:
        """Run the reading of one entry; a :class:`SourceError` in it refuses the entry."""
        try:
            yield
        except SourceError as exc:
            if self.strict:
                raise
            self.messages.append(str(exc))

    def refuse(self, error: SourceError) -> None:
        """Refuse an entry found invalid outside :meth:`entry`."""
        with self.entry():
            raise error

    def note(self, message: str) -> None:
        """Record something left out that is never an error (a FIFO in an audio folder)."""
        self.messages.append(message)


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
    #: Messages about entries left out (lenient reading only; see :class:`Refusals`).
    refused: list[str] = field(default_factory=list)

    def check(self, refusals: Refusals) -> None:
        """Refuse duplicate ids and cuts of unknown (or refused) recordings.

        Strict refusals raise :class:`SourceError`; lenient ones drop the later
        duplicate or the cut.  With no recordings left the source is refused whole.
        """
        recording_ids: set[str] = set()
        recordings = []
        for recording in self.recordings:
            if recording.recording_id in recording_ids:
                refusals.refuse(
                    SourceError(
                        f"duplicate recording id {recording.recording_id!r}",
                        where=recording.described_in,
                    )
                )
                continue
            recording_ids.add(recording.recording_id)
            recordings.append(recording)
        cut_ids: set[str] = set()
        cuts = []
        for cut in self.cuts:
            if cut.cut_id in cut_ids:
                refusals.refuse(
                    SourceError(f"duplicate cut id {cut.cut_id!r}", where=cut.described_in)
                )
                continue
            if cut.recording_id not in recording_ids:
                refusals.refuse(
                    SourceError(
                        f"cut {cut.cut_id!r} refers to unknown "
                        f"{'or refused ' if refusals.messages else ''}recording "
                        f"{cut.recording_id!r}",
                        where=cut.described_in,
                    )
                )
                continue
            cut_ids.add(cut.cut_id)
            cuts.append(cut)
        self.recordings, self.cuts = recordings, cuts
        self.refused = refusals.messages
        if not self.recordings:
            refused = ""
            if refusals.messages:
                refused = (
                    f" ({len(refusals.messages)} entries refused; the first: "
                    f"{refusals.messages[0]})"
                )
            raise SourceError(f"no recordings found{refused}", where=self.kind)
