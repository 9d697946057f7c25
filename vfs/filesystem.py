"""The filesystem's behaviour, as a plain class that tests call without a mount.

Layout of a mount::

    cuts/<cut id>.wav              one file per cut (ids with "/" make directories)
    cuts/metadata.jsonl            HuggingFace audiofolder metadata of the cuts
    recordings/<recording id>.wav  every recording, whole, all channels
    recordings/<recording id>/<start>-<end>.wav
                                   any time range in seconds, made on lookup, never listed
    windows/<recording id>/<start>-<end>.wav
                                   fixed windows with overlap (with ``--window``)
    wav.scp, segments, text, utt2spk, spk2utt, cuts.jsonl.gz
                                   manifests of the cut files (see cutfs.vfs.manifest_files)
    .cutfs/stats                   the daemon's counters, as JSON (when enabled)
    .cutfs/metrics                 the same in Prometheus' text exposition format

Every file is immutable for the life of the mount.  Errors the kernel should
see are raised as :class:`FsError` with an errno value; failures to produce
audio propagate as :class:`cutfs.codec.errors.CutfsError`.  Turning those into
errno values is the job of :mod:`cutfs.vfs.operations`, the one boundary.

A library served in place may not know a recording's length until it is
indexed: sizes are then found on lookup (``getattr``), which has a worker
index the recording, while listings give provisional attributes.
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final, overload

import numpy as np
import trio

from cutfs.codec.cut import seconds_to_frames
from cutfs.codec.library import AudioShape, Library
from cutfs.codec.output_format import OutputFormat
from cutfs.codec.wav_layout import HEADER_BYTES, WavLayout
from cutfs.vfs.decode_pool import DecodeDeadlineError
from cutfs.vfs.frame_source import FrameSource
from cutfs.vfs.fs_error import FsError
from cutfs.vfs.inode_table import (
    CUT_INODE_BASE,
    RECORDING_INODE_BASE,
    ROOT_INODE,
    SPAN_INODE_BASE,
    WINDOW_BITS,
    WINDOW_INODE_BASE,
    Directory,
    InodeTable,
    NodeKind,
    window_inode,
    window_of,
)
from cutfs.vfs.manifest_files import AUDIOFOLDER_METADATA, NEEDS_LENGTHS, ManifestFiles
from cutfs.vfs.span_table import SpanTable

CONTROL_DIR: Final = ".cutfs"
STATS_FILE: Final = "stats"
METRICS_FILE: Final = "metrics"
CUTS_DIR: Final = "cuts"
RECORDINGS_DIR: Final = "recordings"
WINDOWS_DIR: Final = "windows"
#: ``<start>-<end>.wav`` in decimal seconds, for time ranges made on lookup.
_RANGE_NAME: Final = re.compile(rb"(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)\.wav")
#: Recordings indexed at once when a manifest needs every length.
_INDEXING_AT_ONCE: Final = 4
#: How far past a read a decode may go, within the file: a whole cut of up to a
#: minute at 48 kHz, and the next stretch of a long recording read in order.
_READAHEAD_FRAMES: Final = 48000 * 60
_DIRECTORY_MODE: Final = stat.S_IFDIR | 0o555
_FILE_MODE: Final = stat.S_IFREG | 0o444


@dataclass(frozen=True, slots=True)
class Attributes:
    """What ``stat`` shows for a node."""

    inode: int
    mode: int
    size_bytes: int
    links: int = 1
    #: Content that changes while mounted (``.cutfs/stats``): the kernel must
    #: neither cache it nor trust its size.
    volatile: bool = False
    #: A listing's stand-in for a file whose size is not known until its
    #: recording is indexed: the kernel must ask again (lookup) before using it.
    provisional: bool = False


@dataclass(frozen=True, slots=True)
class Windows:
    """Fixed windows of every recording: ``length_seconds`` long, starting every
    ``length_seconds - overlap_seconds``; the last one ends with the recording.

    Windows are arithmetic: window ``k`` starts at ``k * step`` frames; none is
    stored.
    """

    length_seconds: float
    overlap_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.overlap_seconds < self.length_seconds:
            raise ValueError("windows need 0 <= overlap < length")

    def _frames(self, shape: AudioShape) -> tuple[int, int]:
        """(length, step) in frames at the recording's rate."""
        length = max(seconds_to_frames(self.length_seconds, shape.sample_rate), 1)
        step = length - seconds_to_frames(self.overlap_seconds, shape.sample_rate)
        return length, max(step, 1)

    def count(self, shape: AudioShape) -> int:
        """How many windows a recording has (the last is the first to reach its end)."""
        if shape.num_frames == 0:
            return 0
        length, step = self._frames(shape)
        return max(0, -(-(shape.num_frames - length) // step)) + 1

    def span(self, shape: AudioShape, number: int) -> tuple[int, int]:
        """(start frame, end frame) of window ``number``."""
        length, step = self._frames(shape)
        start = number * step
        return start, min(start + length, shape.num_frames)

    def number_at(self, shape: AudioShape, start: int, end: int) -> int | None:
        """The window that is exactly ``[start, end)``, if any."""
        _, step = self._frames(shape)
        number, remainder = divmod(start, step)
        if remainder or not 0 <= number < self.count(shape):
            return None
        return number if self.span(shape, number) == (start, end) else None


class WindowListing(Sequence[tuple[bytes, int]]):
    """The entries of a recording's window directory, made as they are read."""

    def __init__(self, windows: Windows, recording_index: int, shape: AudioShape) -> None:
        self._windows = windows
        self._recording_index = recording_index
        self._shape = shape
        self._count = min(windows.count(shape), 1 << WINDOW_BITS)

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, position: int) -> tuple[bytes, int]: ...

    @overload
    def __getitem__(self, position: slice) -> Sequence[tuple[bytes, int]]: ...

    def __getitem__(self, position: int | slice) -> tuple[bytes, int] | Sequence[tuple[bytes, int]]:
        if isinstance(position, slice):
            return [self[number] for number in range(*position.indices(self._count))]
        if not 0 <= position < self._count:
            raise IndexError(position)
        start, end = self._windows.span(self._shape, position)
        rate = self._shape.sample_rate
        name = f"{_seconds_label(start, rate)}-{_seconds_label(end, rate)}.wav".encode()
        return name, window_inode(self._recording_index, position)


@dataclass(frozen=True, slots=True)
class WavSource:
    """Which frames and channels of which recording a WAV file serves, and how.

    ``start_frame`` is in the recording's frames; ``output_start`` is where the
    file starts in the recording as served (resampled or not), and ``layout``
    describes the file as served (see :class:`cutfs.codec.output_format.OutputFormat`).
    """

    recording_index: int
    start_frame: int
    channels: tuple[int, ...]  # empty: all channels of the recording
    layout: WavLayout
    output_start: int
    shape: AudioShape


class Filesystem:
    """Lookups, listings and reads of one mounted library (packed shards or in place)."""

    def __init__(
        self,
        library: Library,
        frame_source: FrameSource,
        mountpoint: str,
        status: Callable[[], bytes] | None = None,
        windows: Windows | None = None,
        output_format: OutputFormat | None = None,
        metrics: Callable[[], bytes] | None = None,
    ) -> None:
        """``status`` renders ``.cutfs/stats`` (JSON) and ``metrics`` ``.cutfs/metrics``
        (Prometheus' text format); without ``status`` there is no ``.cutfs``."""
        self._library = library
        self._format = output_format or OutputFormat()
        self._frames = frame_source
        self._mountpoint = os.path.abspath(mountpoint)
        self._table = table = InodeTable()
        cuts = table.add_directory(table.root, CUTS_DIR)
        self._cut_paths = table.add_files(cuts, library.cut_ids, CUT_INODE_BASE)
        recordings = table.add_directory(table.root, RECORDINGS_DIR)
        recording_paths = table.add_files(recordings, library.recording_ids, RECORDING_INODE_BASE)
        self._manifests = ManifestFiles(
            library, self._cut_paths, os.path.join(self._mountpoint, CUTS_DIR), self._cut_layout
        )
        self._text_inodes: dict[int, str] = {}
        for name in self._manifests.root_names():
            self._text_inodes[table.add_text(table.root, name)] = name
        if library.num_cuts:
            self._text_inodes[table.add_text(cuts, AUDIOFOLDER_METADATA)] = AUDIOFOLDER_METADATA
        self._volatile: dict[int, Callable[[], bytes]] = {}
        if status is not None:
            control = table.add_directory(table.root, CONTROL_DIR)
            self._volatile[table.add_text(control, STATS_FILE)] = status
            if metrics is not None:
                self._volatile[table.add_text(control, METRICS_FILE)] = metrics
        self._texts: dict[int, bytes] = {}
        self._listings: dict[int, list[tuple[bytes, int]]] = {}
        # Spans (time ranges, windows): hidden range directories per recording, made on
        # lookup, and span files numbered as they are first needed.
        self._range_parents = _stems(table, recordings, recording_paths)
        self._hidden: dict[tuple[int, bytes], int] = {}  # (parent, name) -> range directory
        self._range_directories: dict[int, int] = {}  # directory inode -> recording
        self._spans = SpanTable(SPAN_INODE_BASE)
        self._windows = windows
        self._window_directories: dict[int, int] = {}  # directory inode -> recording
        self._window_listings: dict[int, WindowListing] = {}
        if windows is not None:
            windows_root = table.add_directory(table.root, WINDOWS_DIR)
            for number, path in recording_paths.items():
                directory = windows_root
                for component in path.removesuffix(".wav").split("/"):
                    directory = table.add_directory(directory, component)
                self._window_directories[directory.inode] = number

    # -- metadata ---------------------------------------------------------------------------

    async def lookup(self, parent_inode: int, name: bytes, user: int = 0) -> Attributes:
        """The attributes of ``name`` in a directory; ``user`` (the caller's uid) is charged
        for a time range made by this lookup."""
        with self._request():
            return await self._lookup(parent_inode, name, user)

    async def _lookup(self, parent_inode: int, name: bytes, user: int) -> Attributes:
        directory = self._directory(parent_inode)
        if name == b".":
            return await self._getattr(parent_inode)
        if name == b"..":
            return await self._getattr(directory.parent)
        await self._open_directory(parent_inode)
        inode = directory.children.get(name)
        if inode is None:
            inode = await self._span_lookup(directory, name, user)
        return await self._getattr(inode)

    async def open_directory(self, inode: int) -> None:
        """Check that ``inode`` is a directory; fill a window directory on first use."""
        with self._request():
            await self._open_directory(inode)

    async def _open_directory(self, inode: int) -> None:
        self._directory(inode)
        recording_index = self._window_directories.get(inode)
        if recording_index is not None and self._windows is not None:
            await self._shape(recording_index)  # its windows need its length

    async def _span_lookup(self, directory: Directory, name: bytes, user: int) -> int:
        """A recording's hidden range directory, or a time range file in one."""
        recording_index = self._range_parents.get((directory.inode, name))
        if recording_index is not None:
            inode = self._hidden.get((directory.inode, name))
            if inode is None:
                inode = self._table.add_hidden_directory(directory).inode
                self._hidden[(directory.inode, name)] = inode
                self._range_directories[inode] = recording_index
            return inode
        window_recording = self._window_directories.get(directory.inode)
        recording_index = self._range_directories.get(directory.inode)
        matched = _RANGE_NAME.fullmatch(name)
        if matched is None or (recording_index is None and window_recording is None):
            raise FsError(errno.ENOENT)
        recording = recording_index if recording_index is not None else window_recording
        assert recording is not None
        shape = await self._shape(recording)
        start = seconds_to_frames(float(matched[1]), shape.sample_rate)
        end = seconds_to_frames(float(matched[2]), shape.sample_rate)
        if not 0 <= start < end <= shape.num_frames:
            raise FsError(errno.ENOENT)
        if window_recording is not None:
            assert self._windows is not None
            number = self._windows.number_at(shape, start, end)
            if number is None or number >= 1 << WINDOW_BITS:
                raise FsError(errno.ENOENT)
            return window_inode(window_recording, number)
        assert recording_index is not None
        return self._spans.acquire((recording_index, start, end), user)

    @property
    def time_ranges(self) -> int:
        """Time-range files the kernel still holds (they are freed when it forgets them)."""
        return len(self._spans)

    def forget(self, inode: int, references: int) -> None:
        """The kernel dropped ``references`` lookups of ``inode`` (only time ranges care)."""
        if self._table.kind(inode) is NodeKind.SPAN:
            self._spans.forget(inode, references)

    async def _shape(self, recording_index: int) -> AudioShape:
        """A recording's shape, having it indexed first if the library does not know it."""
        shape = self._library.shape(recording_index)
        if shape is not None:
            return shape
        with self._waiting("indexing the recording", recording_index):
            await self._frames.index(recording_index)
        shape = self._library.shape(recording_index)
        assert shape is not None, "indexing did not make the shape known"
        return shape

    async def getattr(self, inode: int) -> Attributes:
        """A node's attributes; a WAV file's size may need its recording indexed first."""
        with self._request():
            return await self._getattr(inode)

    async def _getattr(self, inode: int) -> Attributes:
        kind = self._table.kind(inode)
        if kind in _WAV_KINDS:
            source = await self.wav_source(inode)
            return Attributes(inode, _FILE_MODE, source.layout.size_bytes)
        if kind is NodeKind.TEXT:
            text = await self._ensure_text(inode)
            return Attributes(inode, _FILE_MODE, len(text), volatile=inode in self._volatile)
        return self.listed_attributes(inode)

    def listed_attributes(self, inode: int) -> Attributes:
        """Attributes for a directory listing, without indexing anything.

        A WAV file whose size is not known yet is listed as ``provisional``.
        """
        kind = self._table.kind(inode)
        if kind is NodeKind.DIRECTORY:
            return Attributes(inode, _DIRECTORY_MODE, 0, 2 + self._directory(inode).subdirectories)
        if kind is NodeKind.TEXT:
            if inode in self._volatile:
                return Attributes(inode, _FILE_MODE, len(self._text(inode)), volatile=True)
            text = self._texts.get(inode)
            if text is None:
                return Attributes(inode, _FILE_MODE, 0, provisional=True)
            return Attributes(inode, _FILE_MODE, len(text))
        if kind in _WAV_KINDS:
            source = self._known_wav_source(inode)
            if source is None:
                return Attributes(inode, _FILE_MODE, 0, provisional=True)
            return Attributes(inode, _FILE_MODE, source.layout.size_bytes)
        raise FsError(errno.ENOENT)

    def listing(self, inode: int) -> Sequence[tuple[bytes, int]]:
        """A directory's entries as (name, inode), in a fixed order.

        A window directory's entries are made as they are read (after
        :meth:`open_directory`, which learns the recording's length).
        """
        recording_index = self._window_directories.get(inode)
        if recording_index is not None and self._windows is not None:
            shape = self._library.shape(recording_index)
            if shape is None:
                return []
            return WindowListing(self._windows, recording_index, shape)
        entries = self._listings.get(inode)
        if entries is None:
            entries = list(self._directory(inode).children.items())
            self._listings[inode] = entries
        return entries

    def check_open(self, inode: int, flags: int) -> None:
        """Refuse writes and opening what is not a file."""
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise FsError(errno.EROFS)
        kind = self._table.kind(inode)
        if kind is None:
            raise FsError(errno.ENOENT)
        if kind is NodeKind.DIRECTORY:
            raise FsError(errno.EISDIR)
        if kind is NodeKind.CUT and inode - CUT_INODE_BASE >= self._library.num_cuts:
            raise FsError(errno.ENOENT)
        if kind is NodeKind.RECORDING and inode - RECORDING_INODE_BASE >= len(
            self._library.recording_ids
        ):
            raise FsError(errno.ENOENT)
        if kind is NodeKind.SPAN and self._spans.get(inode) is None:
            raise FsError(errno.ENOENT)
        if kind is NodeKind.WINDOW:
            self._window(inode)  # ENOENT for a window that does not exist

    def is_volatile(self, inode: int) -> bool:
        return inode in self._volatile

    # -- data -------------------------------------------------------------------------------

    async def read(self, inode: int, offset: int, size: int) -> bytes:
        """Exactly the bytes ``[offset, offset + size)`` of a file, fewer only at its end.

        The whole read (waiting for a worker, indexing, decoding) takes at most
        the read deadline; past it, :class:`DecodeDeadlineError` (EIO).
        """
        with self._request():
            return await self._read(inode, offset, size)

    async def _read(self, inode: int, offset: int, size: int) -> bytes:
        if offset < 0 or size < 0:
            raise FsError(errno.EINVAL)
        kind = self._table.kind(inode)
        if kind is NodeKind.TEXT:
            return (await self._ensure_text(inode))[offset : offset + size]
        if kind not in _WAV_KINDS:
            raise FsError(errno.EISDIR if kind is NodeKind.DIRECTORY else errno.ENOENT)
        return await self._read_wav(await self.wav_source(inode), offset, size)

    async def wav_source(self, inode: int) -> WavSource:
        """What a WAV file serves, indexing its recording first if the library must."""
        source = self._known_wav_source(inode)
        if source is None:
            await self._shape(self._recording_of(inode))
            source = self._known_wav_source(inode)
            assert source is not None, "indexing did not make the shape known"
        return source

    def _recording_of(self, inode: int) -> int:
        if inode >= WINDOW_INODE_BASE:
            return window_of(inode)[0]
        if inode >= SPAN_INODE_BASE:
            span = self._spans.get(inode)
            if span is None:
                raise FsError(errno.ENOENT)
            return span[0]
        if inode >= RECORDING_INODE_BASE:
            return inode - RECORDING_INODE_BASE
        return self._library.cut_recording(inode - CUT_INODE_BASE)

    def _known_wav_source(self, inode: int) -> WavSource | None:
        library = self._library
        if inode >= WINDOW_INODE_BASE:
            recording_index = window_of(inode)[0]
            if library.shape(recording_index) is None:
                return None
            recording_index, start, end = self._window(inode)
            return self._served(recording_index, start, end - start, ())
        if inode >= SPAN_INODE_BASE:
            span = self._spans.get(inode)
            if span is None:
                raise FsError(errno.ENOENT)
            recording_index, start, end = span
            return self._served(recording_index, start, end - start, ())
        if inode >= RECORDING_INODE_BASE:
            index = inode - RECORDING_INODE_BASE
            if index >= len(library.recording_ids):
                raise FsError(errno.ENOENT)
            shape = library.shape(index)
            return None if shape is None else self._served(index, 0, shape.num_frames, ())
        index = inode - CUT_INODE_BASE
        if not 0 <= index < library.num_cuts:
            raise FsError(errno.ENOENT)
        cut = library.cut(index)
        if cut is None:
            return None
        return self._served(cut.recording_index, cut.start_frame, cut.num_frames, cut.channels)

    def _served(
        self, recording_index: int, start: int, frames: int, channels: tuple[int, ...]
    ) -> WavSource:
        """Frames ``[start, start + frames)`` of a recording (its shape known) as served."""
        shape = self._library.shape(recording_index)
        assert shape is not None, "a file is served once its recording's shape is known"
        output_start, output_frames = self._format.span(
            shape.sample_rate, start, frames, shape.num_frames
        )
        layout = self._format.layout(
            shape.sample_rate, len(channels) or shape.channels, output_frames
        )
        return WavSource(recording_index, start, channels, layout, output_start, shape)

    def _window(self, inode: int) -> tuple[int, int, int]:
        """(recording, start, end) of a window inode; ENOENT if there is no such window."""
        recording_index, number = window_of(inode)
        shape = None
        if self._windows is not None and recording_index < len(self._library.recording_ids):
            shape = self._library.shape(recording_index)
        if shape is None or self._windows is None or number >= self._windows.count(shape):
            raise FsError(errno.ENOENT)
        start, end = self._windows.span(shape, number)
        return recording_index, start, end

    def _cut_layout(self, index: int) -> WavLayout | None:
        """A cut file's layout for the manifests, ``None`` until its recording is indexed."""
        source = self._known_wav_source(CUT_INODE_BASE + index)
        return None if source is None else source.layout

    async def _read_wav(self, source: WavSource, offset: int, size: int) -> bytes:
        layout = source.layout
        end = min(offset + size, layout.size_bytes)
        if offset >= end:
            return b""
        parts: list[bytes] = []
        if offset < HEADER_BYTES:
            parts.append(layout.header()[offset:end])
        first, last = layout.frames_for_bytes(offset, size)
        if last > first:
            data = self._format.encode(await self._samples(source, first, last))
            data_start = HEADER_BYTES + first * layout.frame_bytes
            parts.append(data[max(offset, HEADER_BYTES) - data_start : end - data_start])
        return b"".join(parts)

    async def _samples(self, source: WavSource, first: int, last: int) -> np.ndarray:
        """The file's frames ``[first, last)`` before encoding (16-bit scale).

        Cached frames are served without waiting; anything that may wait
        (decoding, indexing, resampling) runs under the request's deadline.
        """
        source_rate = source.shape.sample_rate
        if not self._format.resamples(source_rate):
            start = source.start_frame
            frames = self._frames.cached_frames(source.recording_index, start + first, start + last)
            if frames is None:
                with self._waiting("reading", source.recording_index):
                    frames = await self._frames.frames(
                        source.recording_index,
                        start + first,
                        start + last,
                        readahead_end=start
                        + min(source.layout.num_frames, last + _READAHEAD_FRAMES),
                    )
            return frames[:, list(source.channels)] if source.channels else frames
        with self._waiting("resampling", source.recording_index):
            return await self._resampled(source, first, last)

    async def _resampled(self, source: WavSource, first: int, last: int) -> np.ndarray:
        """Frames ``[first, last)`` of a file served at another rate (slow: off the loop)."""
        source_rate = source.shape.sample_rate
        # Designing a filter takes a while: off the loop.
        resampler = await trio.to_thread.run_sync(self._format.resampler, source_rate)
        assert resampler is not None, "called only when the rate changes"
        wanted_first, wanted_end = source.output_start + first, source.output_start + last
        total = source.shape.num_frames
        low, high = resampler.input_span(wanted_first, wanted_end, total)
        file_end = source.output_start + source.layout.num_frames
        _, input_end = resampler.input_span(file_end - 1, file_end, total)
        frames = await self._frames.frames(
            source.recording_index,
            low,
            high,
            readahead_end=min(input_end, high + _READAHEAD_FRAMES),
        )
        if source.channels:
            frames = frames[:, list(source.channels)]
        mixed = np.asarray(self._format.downmix(frames), dtype=np.float64)
        return await trio.to_thread.run_sync(
            resampler.resample, mixed, low, wanted_first, wanted_end
        )

    # -- helpers ----------------------------------------------------------------------------

    @contextmanager
    def _request(self) -> Iterator[None]:
        """The span of one kernel request: its deadline starts now (see :meth:`_waiting`)."""
        token = _REQUEST_DEADLINE.set(trio.current_time() + self._frames.deadline_seconds)
        try:
            yield
        finally:
            _REQUEST_DEADLINE.reset(token)

    @contextmanager
    def _waiting(self, what: str, recording_index: int | None) -> Iterator[None]:
        """Run a step that may wait (indexing, decoding) under the request's deadline.

        Past it, :class:`DecodeDeadlineError` (EIO) naming the recording; work the
        step started for others (indexing a recording) goes on in the background.
        Only steps that may wait pay for a cancel scope (several microseconds):
        requests answered from memory do not.
        """
        with trio.move_on_at(_REQUEST_DEADLINE.get()) as scope:
            yield
        if scope.cancelled_caught:
            raise DecodeDeadlineError(
                f"{what} took longer than {self._frames.deadline_seconds:g} s in all "
                "(--read-timeout; storage not answering, or every decoder busy?)",
                where=None
                if recording_index is None
                else self._library.recording_ids[recording_index],
            )

    def _directory(self, inode: int) -> Directory:
        directory = self._table.directory(inode)
        if directory is None:
            raise FsError(errno.ENOTDIR if self._table.kind(inode) else errno.ENOENT)
        return directory

    def _text(self, inode: int) -> bytes:
        """A volatile text, or a rendered one (see :meth:`_ensure_text`)."""
        volatile = self._volatile.get(inode)
        if volatile is not None:
            return volatile()
        return self._texts[inode]

    async def _ensure_text(self, inode: int) -> bytes:
        """A text file's content, rendered on first use (after indexing, if it needs lengths)."""
        if inode in self._volatile or inode in self._texts:
            return self._text(inode)
        name = self._text_inodes[inode]
        if name in NEEDS_LENGTHS:
            with self._waiting(f"indexing every recording for {name}", None):
                await self._index_all()
        text = self._texts.get(inode)  # another request may have rendered it meanwhile
        if text is None:
            text = self._manifests.render(name)
            self._texts[inode] = text
        return text

    async def _index_all(self) -> None:
        """Index every recording whose shape is unknown, a few at a time."""
        pending = [
            number
            for number in range(len(self._library.recording_ids))
            if self._library.shape(number) is None
        ]
        if not pending:
            return
        limiter = trio.CapacityLimiter(_INDEXING_AT_ONCE)

        async def index(number: int) -> None:
            async with limiter:
                await self._frames.index(number)

        async with trio.open_nursery() as nursery:
            for number in pending:
                nursery.start_soon(index, number)


#: When the kernel request being answered must be done (trio runs each request in a task
#: of its own, so each has its own value); infinity outside requests.
_REQUEST_DEADLINE: ContextVar[float] = ContextVar("request_deadline", default=math.inf)

_WAV_KINDS: Final = frozenset({NodeKind.CUT, NodeKind.RECORDING, NodeKind.SPAN, NodeKind.WINDOW})


def _stems(
    table: InodeTable, recordings: Directory, paths: dict[int, str]
) -> dict[tuple[int, bytes], int]:
    """(directory inode, name) of each recording's range directory -> recording number.

    ``recordings/a/b.wav`` has its time ranges under ``recordings/a/b/``.
    """
    stems = {}
    for number, path in paths.items():
        parent_path, _, name = path.removesuffix(".wav").rpartition("/")
        parent = table.find(recordings, parent_path) if parent_path else recordings.inode
        assert parent is not None, "add_files made the directories of every path"
        stems[(parent, name.encode("utf-8", "surrogateescape"))] = number
    return stems


def _seconds_label(frames: int, rate: int) -> str:
    """Seconds as a short decimal that converts back to exactly ``frames``."""
    return f"{frames / rate:.6f}".rstrip("0").rstrip(".")


__all__ = ["ROOT_INODE", "Attributes", "Filesystem", "FsError", "WavSource"]
