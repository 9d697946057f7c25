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
                                   manifests of the cut files (see cutfs.vfs.tree.manifest_files)
    .cutfs/stats                   the daemon's counters, as JSON (when enabled)
    .cutfs/metrics                 the same in Prometheus' text exposition format

Each part is a view (:mod:`cutfs.vfs.tree.view`) that owns its inode numbers; this
class composes them, dispatches each request to the view owning its inode,
and does what every WAV file shares: its layout (rate, channels, format),
reading frames under the request's deadline, and resampling.

Every file is immutable for the life of the mount.  Errors the kernel should
see are raised as :class:`FsError` with an errno value; failures to produce
audio propagate as :class:`cutfs.codec.errors.CutfsError`.  Turning those into
errno values is the job of :mod:`cutfs.vfs.fuse.operations`, the one boundary.

A library served in place may not know a recording's length until it is
indexed: sizes are then found on lookup (``getattr``), which has a worker
index the recording, while listings give provisional attributes.
"""

from __future__ import annotations

import bisect
import errno
import math
import mmap
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Final

import numpy as np
import trio
from cachetools import LRUCache

from cutfs.codec.audio.output_format import OutputFormat
from cutfs.codec.audio.wav_layout import HEADER_BYTES, WavLayout
from cutfs.codec.library import AudioShape, Library
from cutfs.vfs.frames.decode_pool import DecodeDeadlineError
from cutfs.vfs.frames.frame_source import FrameSource
from cutfs.vfs.fuse.fs_error import FsError
from cutfs.vfs.tree.control_view import CONTROL_DIR, METRICS_FILE, STATS_FILE, ControlView
from cutfs.vfs.tree.cuts_view import CUTS_DIR, CutsView
from cutfs.vfs.tree.manifest_files import ManifestFiles
from cutfs.vfs.tree.manifests_view import ManifestsView, WavScp
from cutfs.vfs.tree.recordings_view import RecordingsView
from cutfs.vfs.tree.span_table import SharedSpanTable
from cutfs.vfs.tree.view import (
    CUT_INODE_BASE,
    RECORDING_INODE_BASE,
    ROOT_INODE,
    AudioSpan,
    Entry,
    NodeKind,
    View,
)
from cutfs.vfs.tree.windows_view import Windows, WindowsView

#: The kernel's page size, the unit of what it keeps of a file.
PAGE_BYTES: Final = mmap.PAGESIZE
#: Recordings indexed at once when a manifest needs every length.
_INDEXING_AT_ONCE: Final = 4
#: How far past a read a decode may go, within the file: a whole cut of up to a
#: minute at 48 kHz, and the next stretch of a long recording read in order.
_READAHEAD_FRAMES: Final = 48000 * 60
#: Files whose last read is remembered, to tell reads in order (a whole recording read
#: through) from others.
_READ_ENDS_KEPT: Final = 4096
_DIRECTORY_MODE: Final = stat.S_IFDIR | 0o555
_FILE_MODE: Final = stat.S_IFREG | 0o444

#: The bytes of a read, in pieces to be written out in order.
ReadBuffers = list[bytes | memoryview]


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
class WavSource:
    """Which frames and channels of which recording a WAV file serves, and how.

    ``start_frame`` is in the recording's frames; ``output_start`` is where the
    file starts in the recording as served (resampled or not), and ``layout``
    describes the file as served (see :class:`cutfs.codec.audio.output_format.OutputFormat`).
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
        shared_spans: SharedSpanTable | None = None,
    ) -> None:
        """``status`` renders ``.cutfs/stats`` (JSON) and ``metrics`` ``.cutfs/metrics``
        (Prometheus' text format); without ``status`` there is no ``.cutfs``.
        ``shared_spans`` is the time-range table shared by the processes serving the
        mount (see :class:`cutfs.vfs.tree.span_table.SharedSpanTable`), opened by the
        caller."""
        self._library = library
        self._format = output_format or OutputFormat()
        self._frames = frame_source
        #: inode -> where its last read ended: a read starting there reads the file in order
        self._read_ends: LRUCache[int, int] = LRUCache(maxsize=_READ_ENDS_KEPT)
        self._mountpoint = os.path.abspath(mountpoint)
        cut_tree, recording_tree = library.trees()
        cuts_directory = os.path.join(self._mountpoint, CUTS_DIR)
        order = library.kaldi_order()
        manifests = ManifestsView(
            ManifestFiles(library, cut_tree.path, cuts_directory, self._cut_layout, order),
            WavScp(order, library.cut_ids, cut_tree.path, cuts_directory),
            self._index_all,
            with_audiofolder=library.num_cuts > 0,
        )
        self._recordings = RecordingsView(library, recording_tree, self._shape, shared_spans)
        views: list[View] = [
            CutsView(library, cut_tree, manifests.cut_directory_entries()),
            self._recordings,
            manifests,
        ]
        if windows is not None:
            views.append(WindowsView(library, recording_tree, windows, self._shape))
        if status is not None:
            views.append(ControlView(status, metrics))
        self._root: list[Entry] = [entry for view in views for entry in view.root_entries()]
        self._root_inodes = dict(self._root)
        self._root_subdirectories = sum(
            1
            for _, inode in self._root
            if self._owner(inode, views).kind(inode) is NodeKind.DIRECTORY
        )
        owned = sorted(
            (span.start, span.stop, view) for view in views for span in view.inode_ranges
        )
        self._range_starts = [start for start, _, _ in owned]
        self._ranges = owned

    @staticmethod
    def _owner(inode: int, views: Sequence[View]) -> View:
        return next(view for view in views if any(inode in span for span in view.inode_ranges))

    def _view(self, inode: int) -> View:
        """The view owning ``inode``; ENOENT when none does."""
        position = bisect.bisect_right(self._range_starts, inode) - 1
        if position >= 0:
            _, stop, view = self._ranges[position]
            if inode < stop:
                return view
        raise FsError(errno.ENOENT)

    def _kind(self, inode: int) -> NodeKind | None:
        if inode == ROOT_INODE:
            return NodeKind.DIRECTORY
        try:
            return self._view(inode).kind(inode)
        except FsError:
            return None

    # -- metadata ---------------------------------------------------------------------------

    async def lookup(self, parent_inode: int, name: bytes, user: int = 0) -> Attributes:
        """The attributes of ``name`` in a directory; ``user`` (the caller's uid) is charged
        for a time range made by this lookup."""
        with self._request():
            return await self._lookup(parent_inode, name, user)

    async def _lookup(self, parent_inode: int, name: bytes, user: int) -> Attributes:
        self._check_directory(parent_inode)
        if name == b".":
            return await self._getattr(parent_inode)
        if name == b"..":
            return await self._getattr(self._parent(parent_inode))
        if parent_inode == ROOT_INODE:
            inode = self._root_inodes.get(name)
        else:
            inode = await self._view(parent_inode).lookup(parent_inode, name, user)
        if inode is None:
            raise FsError(errno.ENOENT)
        if self._kind(inode) is not NodeKind.WAV:
            return await self._getattr(inode)
        source = await self.wav_source(inode)
        # A file looked up is most often read next: the pages of the seek index its first
        # read will search are asked for now (a page of each column, without waiting),
        # so that they arrive while the reply goes back and the reader opens the file.
        # A cold read then waits for storage once (for the audio) rather than twice.
        self._library.expect_read(source.recording_index, source.start_frame)
        return self._wav_attributes(inode, source)

    def _parent(self, directory: int) -> int:
        return ROOT_INODE if directory == ROOT_INODE else self._view(directory).parent(directory)

    def _check_directory(self, inode: int) -> None:
        kind = self._kind(inode)
        if kind is not NodeKind.DIRECTORY:
            raise FsError(errno.ENOENT if kind is None else errno.ENOTDIR)

    async def open_directory(self, inode: int) -> None:
        """Check that ``inode`` is a directory; learn what its listing needs."""
        with self._request():
            self._check_directory(inode)
            if inode != ROOT_INODE:
                await self._view(inode).open_directory(inode)

    @property
    def time_ranges(self) -> int:
        """Time-range files the kernel still holds (they are freed when it forgets them)."""
        return self._recordings.time_ranges

    def forget(self, inode: int, references: int) -> None:
        """The kernel dropped ``references`` lookups of ``inode`` (only time ranges care)."""
        try:
            view = self._view(inode)
        except FsError:
            return
        view.forget(inode, references)

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
        kind = self._kind(inode)
        if kind is NodeKind.WAV:
            return self._wav_attributes(inode, await self.wav_source(inode))
        if kind is NodeKind.TEXT:
            text = self._view(inode).text(inode)
            if not text.ready():
                with self._waiting("preparing a manifest", None):
                    await text.prepare()
            return Attributes(inode, _FILE_MODE, text.size_bytes(), volatile=text.volatile)
        return self.listed_attributes(inode)

    def provenance(self, inode: int) -> dict[str, str]:
        """Where a WAV file's audio comes from, as its extended attributes show it
        (``user.cutfs.<name>``; see docs/operations.md): the recording, the cut, the
        source file or object and shard, the range in the recording's own samples, its
        rate and channels, the codec and any transcoding, and the rate served.  Known
        without decoding or reading audio: what needs the recording indexed first (the
        range of a cut of a source served in place, its codec) is left out until it is.
        Other nodes have none."""
        if self._kind(inode) is not NodeKind.WAV:
            return {}
        view = self._view(inode)
        recording = view.recording_of(inode)
        found = {"recording": self._library.recording_ids[recording]}
        if CUT_INODE_BASE <= inode < RECORDING_INODE_BASE:
            found["cut"] = self._library.cut_ids[inode - CUT_INODE_BASE]
        origin = self._library.origin(recording)
        found["source"] = origin.source
        for name, value in (
            ("shard", origin.shard),
            ("container", origin.container),
            ("codec", origin.codec),
            ("transcoded_from", origin.transcoded_from),
        ):
            if value:
                found[name] = value
        span, shape = view.audio(inode), self._library.shape(recording)
        if span is not None and shape is not None:
            found["start_sample"] = str(span.start_frame)
            found["num_samples"] = str(span.num_frames)
            found["sample_rate"] = str(shape.sample_rate)
            channels = span.channels or tuple(range(shape.channels))
            found["channels"] = ",".join(map(str, channels))
            found["served_rate"] = str(self._served(span).layout.sample_rate)
        return found

    @staticmethod
    def _wav_attributes(inode: int, source: WavSource) -> Attributes:
        return Attributes(inode, _FILE_MODE, source.layout.size_bytes)

    def listed_attributes(self, inode: int) -> Attributes:
        """Attributes for a directory listing, without indexing anything.

        A file whose size is not known yet is listed as ``provisional``.
        """
        kind = self._kind(inode)
        if kind is NodeKind.DIRECTORY:
            if inode == ROOT_INODE:
                return Attributes(inode, _DIRECTORY_MODE, 0, 2 + self._root_subdirectories)
            links = 2 + self._view(inode).subdirectories(inode)
            return Attributes(inode, _DIRECTORY_MODE, 0, links)
        if kind is NodeKind.TEXT:
            text = self._view(inode).text(inode)
            if not text.ready():
                return Attributes(inode, _FILE_MODE, 0, provisional=True)
            return Attributes(inode, _FILE_MODE, text.size_bytes(), volatile=text.volatile)
        if kind is NodeKind.WAV:
            source = self._known_wav_source(inode)
            if source is None:
                return Attributes(inode, _FILE_MODE, 0, provisional=True)
            return self._wav_attributes(inode, source)
        raise FsError(errno.ENOENT)

    def listing(self, inode: int) -> Sequence[tuple[bytes, int]]:
        """A directory's entries as (name, inode), in a fixed order, made as they are read
        (after :meth:`open_directory`, which learns what the listing needs)."""
        self._check_directory(inode)
        if inode == ROOT_INODE:
            return self._root
        return self._view(inode).listing(inode)

    def check_open(self, inode: int, flags: int) -> None:
        """Refuse writes and opening what is not a file."""
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            raise FsError(errno.EROFS)
        kind = self._kind(inode)
        if kind is None:
            raise FsError(errno.ENOENT)
        if kind is NodeKind.DIRECTORY:
            raise FsError(errno.EISDIR)

    # -- data -------------------------------------------------------------------------------

    async def read(self, inode: int, offset: int, size: int) -> bytes:
        """Exactly the bytes ``[offset, offset + size)`` of a file, fewer only at its end.

        The whole read (waiting for a worker, indexing, decoding) takes at most
        the read deadline; past it, :class:`DecodeDeadlineError` (EIO).
        """
        return b"".join(await self.read_buffers(inode, offset, size))

    async def read_buffers(
        self,
        inode: int,
        offset: int,
        size: int,
        *,
        decode_until: int | None = None,
        deadline: float | None = None,
    ) -> ReadBuffers:
        """The bytes of :meth:`read`, as buffers to be written out in order: the reply to
        the kernel gathers them in one ``writev``, so the samples go from the block cache
        to the kernel without being joined into a bytes object first (a copy of 320 KB
        per 10 s cut, into memory the process must fault in).  ``decode_until``: decode
        nothing for the bytes from this one on (where cells are decoded ahead of the
        reader, see :mod:`cutfs.vfs.fuse.read_ahead`); ``deadline``: a time (trio's clock)
        the read must end by, if sooner than its own deadline (the request it is done for
        began earlier)."""
        with self._request(deadline):
            return await self._read(inode, offset, size, decode_until)

    def wav_file(self, inode: int) -> tuple[int, int] | None:
        """The size in bytes of a WAV file whose recording is indexed, and a number that
        tells it from another file the same inode may name later (its recording, span,
        channels and layout, hashed); None for any other node (never indexes or waits)."""
        if self._kind(inode) is not NodeKind.WAV:
            return None
        source = self._known_wav_source(inode)
        if source is None:
            return None
        layout = source.layout
        described = (
            source.recording_index,
            source.start_frame,
            source.output_start,
            tuple(source.channels),
            layout.num_frames,
            layout.size_bytes,
        )
        return layout.size_bytes, hash(described) % (1 << 64)

    async def _read(
        self, inode: int, offset: int, size: int, decode_until: int | None = None
    ) -> ReadBuffers:
        if offset < 0 or size < 0:
            raise FsError(errno.EINVAL)
        kind = self._kind(inode)
        if kind is NodeKind.TEXT:
            text = self._view(inode).text(inode)
            if not text.ready():
                with self._waiting("preparing a manifest", None):
                    await text.prepare()
            return [text.read(offset, size)]
        if kind is not NodeKind.WAV:
            raise FsError(errno.EISDIR if kind is NodeKind.DIRECTORY else errno.ENOENT)
        in_order = self._read_ends.get(inode) == offset
        self._read_ends[inode] = offset + size
        source = await self.wav_source(inode)
        return await self._read_wav(source, offset, size, in_order, decode_until)

    async def wav_source(self, inode: int) -> WavSource:
        """What a WAV file serves, indexing its recording first if the library must."""
        source = self._known_wav_source(inode)
        if source is None:
            await self._shape(self._view(inode).recording_of(inode))
            source = self._known_wav_source(inode)
            assert source is not None, "indexing did not make the shape known"
        return source

    def _known_wav_source(self, inode: int) -> WavSource | None:
        span = self._view(inode).audio(inode)
        return None if span is None else self._served(span)

    def _served(self, span: AudioSpan) -> WavSource:
        """A span of a recording (its shape known) as served."""
        recording_index, start, frames, channels = (
            span.recording_index,
            span.start_frame,
            span.num_frames,
            span.channels,
        )
        shape = self._library.shape(recording_index)
        assert shape is not None, "a file is served once its recording's shape is known"
        output_start, output_frames = self._format.span(
            shape.sample_rate, start, frames, shape.num_frames
        )
        layout = self._format.layout(
            shape.sample_rate, len(channels) or shape.channels, output_frames
        )
        return WavSource(recording_index, start, channels, layout, output_start, shape)

    def _cut_layout(self, index: int) -> WavLayout | None:
        """A cut file's layout for the manifests, ``None`` until its recording is indexed."""
        source = self._known_wav_source(CUT_INODE_BASE + index)
        return None if source is None else source.layout

    async def _read_wav(
        self,
        source: WavSource,
        offset: int,
        size: int,
        in_order: bool = False,
        decode_until: int | None = None,
    ) -> ReadBuffers:
        """The bytes of the file, the samples not copied on their way from the cache to the
        reply where they need no conversion (a view of the cached block)."""
        first, last = source.layout.frames_for_bytes(offset, size)
        if last <= first:
            return self._wav_buffers(source, offset, size, first, None)
        until_frame = None
        if decode_until is not None:
            until_frame = source.layout.frames_for_bytes(0, max(decode_until, offset + size))[1]
        frames = await self._samples(source, first, last, in_order, until_frame)
        return self._wav_buffers(source, offset, size, first, frames)

    def _wav_buffers(
        self, source: WavSource, offset: int, size: int, first: int, frames: np.ndarray | None
    ) -> ReadBuffers:
        """Bytes ``[offset, offset + size)`` of a WAV file, from the frames they cover, from
        frame ``first`` on (None when they cover only the header)."""
        layout = source.layout
        end = min(offset + size, layout.size_bytes)
        header = layout.header()[offset:end] if offset < HEADER_BYTES else b""
        if frames is None:
            return [header]
        data = self._format.encode(frames)
        data_start = HEADER_BYTES + first * layout.frame_bytes
        skip = max(offset, HEADER_BYTES) - data_start
        samples = data[skip : skip + end - offset - len(header)]
        return [header, samples] if header else [samples]

    def cached_continuation(
        self, inode: int, offset: int, most_bytes: int
    ) -> Callable[[], ReadBuffers] | None:
        """The bytes of a WAV file from ``offset`` on, if the block cache holds all their
        frames now: at most ``most_bytes``, ending at a page boundary or at the end of the
        file; None otherwise.  Never decodes, indexes or waits.

        What it returns makes the bytes when called, from frames taken from the cache
        now: the conversion (an output format's float samples, a downmix) can run in
        another thread, off the loop.  A read decodes on to the end of its cut (see
        :meth:`_samples`), so after the first read of a cut this is the rest of it, for
        the kernel's page cache (see :class:`~cutfs.vfs.fuse.page_pusher.PagePusher`).
        """
        if offset < 0 or offset % PAGE_BYTES or self._kind(inode) is not NodeKind.WAV:
            return None
        source = self._known_wav_source(inode)
        if source is None or self._format.resamples(source.shape.sample_rate):
            return None
        size_bytes = source.layout.size_bytes
        end = min(size_bytes, offset + most_bytes)
        if end < size_bytes:
            end -= end % PAGE_BYTES  # the kernel keeps only whole pages, or the last one
        first, last = source.layout.frames_for_bytes(offset, end - offset)
        if end <= offset or last <= first:
            return None
        start = source.start_frame
        frames = self._frames.cached_frames(
            source.recording_index, start + first, start + last, for_read=False
        )
        if frames is None:
            return None

        def make() -> ReadBuffers:
            chosen = frames[:, list(source.channels)] if source.channels else frames
            return self._wav_buffers(source, offset, end - offset, first, chosen)

        return make

    async def _samples(
        self,
        source: WavSource,
        first: int,
        last: int,
        in_order: bool = False,
        until_frame: int | None = None,
    ) -> np.ndarray:
        """The file's frames ``[first, last)`` before encoding (16-bit scale); ``in_order``:
        the read continues the file's previous one (see :meth:`FrameSource.frames`);
        ``until_frame``: nothing decoded from this frame of the file on.

        Cached frames are served without waiting; anything that may wait
        (decoding, indexing, resampling) runs under the request's deadline.
        """
        source_rate = source.shape.sample_rate
        if not self._format.resamples(source_rate):
            start = source.start_frame
            frames = self._frames.cached_frames(source.recording_index, start + first, start + last)
            if frames is None:
                ahead_end = min(source.layout.num_frames, last + _READAHEAD_FRAMES)
                if until_frame is not None:
                    ahead_end = min(ahead_end, until_frame)
                with self._waiting("reading", source.recording_index):
                    frames = await self._frames.frames(
                        source.recording_index,
                        start + first,
                        start + last,
                        readahead_end=start + ahead_end,
                        in_order=in_order,
                    )
            return frames[:, list(source.channels)] if source.channels else frames
        with self._waiting("resampling", source.recording_index):
            return await self._resampled(source, first, last, in_order)

    async def _resampled(
        self, source: WavSource, first: int, last: int, in_order: bool
    ) -> np.ndarray:
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
            in_order=in_order,
        )
        if source.channels:
            frames = frames[:, list(source.channels)]
        mixed = np.asarray(self._format.downmix(frames), dtype=np.float64)
        return await trio.to_thread.run_sync(
            resampler.resample, mixed, low, wanted_first, wanted_end
        )

    # -- helpers ----------------------------------------------------------------------------

    @contextmanager
    def _request(self, deadline: float | None = None) -> Iterator[None]:
        """The span of one kernel request: its deadline starts now (see :meth:`_waiting`),
        or is ``deadline`` if that is sooner."""
        own = trio.current_time() + self._frames.deadline_seconds
        token = _REQUEST_DEADLINE.set(own if deadline is None else min(own, deadline))
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

__all__ = [
    "CONTROL_DIR",
    "METRICS_FILE",
    "ROOT_INODE",
    "STATS_FILE",
    "Attributes",
    "Filesystem",
    "FsError",
    "ReadBuffers",
    "WavSource",
    "Windows",
]
