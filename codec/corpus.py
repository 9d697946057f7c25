"""Reading cuts and recordings in-process, without a mount: what ``cutfs.open`` returns.

A :class:`Corpus` opens what a mount would serve (a shard directory, local or in object
storage as ``s3://bucket/prefix``, or any source served in place, read with the caller's
own rights as ``cutfs pack`` reads it) and
hands out exact samples: the same frames a mounted cut file holds,
as int16 numpy arrays of shape (frames, channels).  Nothing is decoded until asked for.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from types import TracebackType

import numpy as np

from cutfs.codec.audio.cut import Cut, seconds_to_frames
from cutfs.codec.audio.pcm import Int16Array
from cutfs.codec.catalogue.path_escape import escape_id
from cutfs.codec.errors import CutfsError, SourceError
from cutfs.codec.library import Library
from cutfs.codec.opener import open_source
from cutfs.codec.trust.source_policy import SourcePolicy


class Corpus:
    """Cuts and recordings of a shard directory or a source, read in this process.

    Use as a context manager, or call :meth:`close`.  Raises :class:`CutfsError`
    subclasses for sources that cannot be read and for cuts that cannot be served.
    """

    def __init__(self, source: str | os.PathLike[str], cache_dir: str | None = None) -> None:
        """``cache_dir`` keeps the index of a source served in place (default: as a mount)."""
        # Read with the caller's own rights, as `cutfs pack` reads: no confinement.  The
        # cache is absolute, as a mount makes it: the index names files by their paths.
        self._library: Library = open_source(
            os.fspath(source),
            os.path.abspath(cache_dir) if cache_dir else None,
            SourcePolicy.everything(),
        )

    @property
    def cut_ids(self) -> Sequence[str]:
        return self._library.cut_ids

    @property
    def num_cuts(self) -> int:
        return self._library.num_cuts

    @property
    def recording_ids(self) -> Sequence[str]:
        return self._library.recording_ids

    def sample_rate(self, recording_id: str) -> int:
        """The recording's rate, indexing it first if the source does not declare it."""
        return self._shape(self._recording_number(recording_id))[0]

    def read_cut(self, cut_id: str) -> tuple[Int16Array, int]:
        """The cut's samples, (frames, channels) int16, and its sample rate."""
        return self.read_cut_at(self._cut_number(cut_id))

    def read_cut_at(self, number: int) -> tuple[Int16Array, int]:
        """The samples and rate of the cut at position ``number`` of :attr:`cut_ids`."""
        if not 0 <= number < self.num_cuts:
            raise IndexError(f"cut {number} of {self.num_cuts}")
        recording = self._library.cut_recording(number)
        self._shape(recording)
        cut: Cut | None = self._library.cut(number)
        assert cut is not None, "the recording's shape is known"
        frames = self._library.read_frames(recording, cut.start_frame, cut.end_frame)
        if cut.channels:
            frames = np.ascontiguousarray(frames[:, list(cut.channels)])
        return frames, self._shape(recording)[0]

    def read_recording(
        self, recording_id: str, start_seconds: float = 0.0, end_seconds: float | None = None
    ) -> tuple[Int16Array, int]:
        """A recording's samples from ``start_seconds`` to ``end_seconds`` (default: its end),
        all channels, and its sample rate; times round to frames as Lhotse rounds them."""
        number = self._recording_number(recording_id)
        rate, frames = self._shape(number)
        first = seconds_to_frames(start_seconds, rate)
        end = frames if end_seconds is None else seconds_to_frames(end_seconds, rate)
        if not 0 <= first <= end <= frames:
            raise SourceError(
                f"[{start_seconds}, {end_seconds}) s lies outside the recording "
                f"({frames / rate:.6f} s)",
                where=recording_id,
            )
        return self._library.read_frames(number, first, end), rate

    def close(self) -> None:
        self._library.close()

    def __enter__(self) -> Corpus:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _shape(self, recording: int) -> tuple[int, int]:
        shape = self._library.shape(recording)
        if shape is None:
            self._library.index(recording)
            shape = self._library.shape(recording)
            assert shape is not None, "indexing made the shape known"
        return shape.sample_rate, shape.num_frames

    def _cut_number(self, cut_id: str) -> int:
        """The cut's row, found through the catalogue's file tree (as a mount finds it)."""
        tree, _ = self._library.trees()
        for force in (False, True):  # an id whose path clashed was escaped whole
            number = tree.find(escape_id(cut_id, force=force))
            if number is not None and self.cut_ids[number] == cut_id:
                return number
        raise CutfsError("no such cut", where=cut_id)

    def _recording_number(self, recording_id: str) -> int:
        _, tree = self._library.trees()
        for force in (False, True):
            number = tree.find(escape_id(recording_id, force=force))
            if number is not None and self.recording_ids[number] == recording_id:
                return number
        raise CutfsError("no such recording", where=recording_id)
