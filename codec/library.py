"""What the filesystem serves from: recordings and cuts, packed or in place.

Two kinds of library exist.  A :class:`cutfs.codec.catalogue.shard_set.ShardSet` is the output
of ``cutfs pack``: every recording was indexed ahead, so everything is known
at open.  A :class:`cutfs.codec.sources.source_index.SourceIndex` serves audio files where
they are (Lhotse manifests, Kaldi directories, tars, Arrow and Parquet
datasets); it indexes a recording the first time it is needed and keeps the
result in an on-disk cache.  The filesystem talks to both through
:class:`Library`, and asks for :meth:`Library.index` (slow: it may decode a
whole recording) in a decoder worker, never on its event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cutfs.codec.audio.cut import Cut
from cutfs.codec.audio.decoder import DecodeTrace
from cutfs.codec.audio.pcm import Int16Array
from cutfs.codec.audio.recording import Recording
from cutfs.codec.catalogue.file_tree import FileTree
from cutfs.codec.catalogue.kaldi_order import KaldiOrder
from cutfs.codec.trust.source_policy import SourcePolicy


@dataclass(frozen=True, slots=True)
class AudioShape:
    """What a recording's WAV file needs before any decoding: rate, channels, length."""

    sample_rate: int
    channels: int
    num_frames: int


@dataclass(frozen=True, slots=True)
class RecordingOrigin:
    """Where a recording's audio comes from, as far as it is known without decoding:
    what a cut file's provenance names.  Empty strings are what is not known (the codec of
    a recording served in place before it is indexed) or does not apply."""

    #: The file (relative to the source, where it lies beneath it), object URI, or
    #: ``command`` that the audio was read from; for shards, what ``pack`` read it from.
    source: str
    #: The shard file holding the audio (packed libraries only).
    shard: str = ""
    container: str = ""
    codec: str = ""
    #: The codec the audio was transcoded from when served ("": not transcoded).
    transcoded_from: str = ""


class LibrarySpec(Protocol):
    """A picklable description from which another process (a decoder worker) opens the
    same library, for decoding only (no cuts table)."""

    @property
    def where(self) -> str:
        """The library's location, for messages."""
        ...

    def open(self, policy: SourcePolicy | None) -> Library:
        """Open the library; ``policy`` is what a source served in place was prepared with."""
        ...


class Library(Protocol):
    """Recordings and cuts the filesystem serves; see the module docstring."""

    #: How a decoder process opens the same library.
    spec: LibrarySpec
    #: A digest of what the library held when opened; a process that opens the
    #: directory later and finds another identity must not serve from it.
    identity: str

    @property
    def recording_ids(self) -> Sequence[str]: ...

    @property
    def cut_ids(self) -> Sequence[str]: ...

    @property
    def num_cuts(self) -> int: ...

    def trees(self) -> tuple[FileTree, FileTree]:
        """The file trees of the cut files and the recording files (cut ``i`` and
        recording ``r`` are the trees' items)."""
        ...

    def kaldi_order(self) -> KaldiOrder:
        """The cuts' Kaldi key order (:mod:`cutfs.codec.catalogue.kaldi_order`)."""
        ...

    def describe(self) -> dict[str, Any]:
        """What ``.cutfs/stats`` shows about the library."""
        ...

    def shape(self, recording_index: int) -> AudioShape | None:
        """The recording's WAV shape, or ``None`` until :meth:`index` has run for it."""
        ...

    def frame_limit(self, recording_index: int) -> int:
        """No decode asks for frames at or past this (the length plus any tolerance)."""
        ...

    def cut(self, index: int) -> Cut | None:
        """The cut at ``index``, or ``None`` until its recording's shape is known.

        Raises :class:`cutfs.codec.errors.DurationMismatchError` when the cut cannot
        be served from its recording (it ends after the audio, beyond tolerance).
        """
        ...

    def cut_frames(self, index: int) -> tuple[int, int, int, tuple[int, ...]] | None:
        """(recording, start frame, frames, channels) of the cut at ``index``, as :meth:`cut`
        gives them (and raises), without its id or metadata: what serving it needs."""
        ...

    def cut_recording(self, index: int) -> int:
        """The recording a cut is of (known without indexing)."""
        ...

    def metadata_mentions(self, field: str) -> bool:
        """Whether any cut's metadata has the field ``field``."""
        ...

    def origin(self, recording_index: int) -> RecordingOrigin:
        """Where a recording's audio comes from (never decodes, never reads the audio)."""
        ...

    def cut_metadata(self, index: int) -> dict[str, Any]:
        """What the source said about a cut besides its time range (text, speaker, ...)."""
        ...

    def index(self, recording_index: int, trace: DecodeTrace | None = None) -> Recording:
        """The decoding plan of a recording, computed on first use (slow) and cached;
        ``trace`` counts a plan read from an on-disk cache (``plans_loaded``)."""
        ...

    def adopt(self, recording_index: int, recording: Recording) -> None:
        """Take a plan that :meth:`index` computed in another process."""
        ...

    def expect_read(self, recording_index: int, first: int) -> None:
        """Frames from ``first`` are likely to be read soon (a file was looked up): start
        fetching what finding them needs (the pages of the seek index a decode will
        search) without waiting for storage and without reading or decoding audio.  It
        may build the recording's plan, as a read would, and read the index columns'
        ends.  Only a hint: it raises nothing (a failure is the read's to report); a
        recording not indexed yet is left alone."""
        ...

    def read_frames(
        self,
        recording_index: int,
        first: int,
        end: int,
        trace: DecodeTrace | None = None,
        *,
        ahead_frames: int = 0,
    ) -> Int16Array:
        """Frames ``[first, end)`` of a recording; fewer only where the audio ends early.

        ``ahead_frames`` asks the store, without waiting, for the bytes of that many frames
        after ``end`` too: the caller is reading the recording in order and will want them
        next (a library whose store gains nothing by it may ignore the hint)."""
        ...

    def counters(self) -> dict[str, int]:
        """Running totals of the work of the store the library reads (requests, bytes, hits)."""
        ...

    def close(self) -> None: ...
