"""The filesystem's behaviour, as a plain class that tests call without a mount.

Layout of a mount::

    cuts/<cut id>.wav              one file per cut (ids with "/" make directories)
    recordings/<recording id>.wav  every recording, whole, all channels
    wav.scp                        "<cut id> <absolute path of its file>" per line
    .cutfs/stats                   the daemon's counters, as JSON (when enabled)

Every file is immutable for the life of the mount.  Errors the kernel should
see are raised as :class:`FsError` with an errno value; failures to produce
audio propagate as :class:`codec.errors.CutfsError`.  Turning those into
errno values is the job of :mod:`vfs.operations`, the one boundary.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np

from codec.library import Library
from codec.wav_layout import HEADER_BYTES, WavLayout
from vfs.frame_source import FrameSource
from vfs.inode_table import (
    CUT_INODE_BASE,
    RECORDING_INODE_BASE,
    ROOT_INODE,
    Directory,
    InodeTable,
    NodeKind,
)

WAV_SCP: Final = "wav.scp"
CONTROL_DIR: Final = ".cutfs"
STATS_FILE: Final = "stats"
CUTS_DIR: Final = "cuts"
RECORDINGS_DIR: Final = "recordings"
#: How far past a read a decode may go, within the file: a whole cut of up to a
#: minute at 48 kHz, and the next stretch of a long recording read in order.
_READAHEAD_FRAMES: Final = 48000 * 60
_DIRECTORY_MODE: Final = stat.S_IFDIR | 0o555
_FILE_MODE: Final = stat.S_IFREG | 0o444


class FsError(Exception):
    """An error for the kernel, carrying its errno value."""

    def __init__(self, error_number: int, message: str = "") -> None:
        super().__init__(error_number, message or os.strerror(error_number))
        self.errno = error_number


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
    """Which frames and channels of which recording a WAV file serves."""

    recording_index: int
    start_frame: int
    channels: tuple[int, ...]  # empty: all channels of the recording
    layout: WavLayout


class Filesystem:
    """Lookups, listings and reads of one mounted library (packed shards or in place)."""

    def __init__(
        self,
        library: Library,
        frame_source: FrameSource,
        mountpoint: str,
        status: Callable[[], bytes] | None = None,
    ) -> None:
        self._library = library
        self._frames = frame_source
        self._mountpoint = os.path.abspath(mountpoint)
        self._table = InodeTable()
        self._cut_paths = self._table.add_files(
            self._table.add_directory(self._table.root, CUTS_DIR),
            library.cut_ids,
            CUT_INODE_BASE,
        )
        self._table.add_files(
            self._table.add_directory(self._table.root, RECORDINGS_DIR),
            library.recording_ids,
            RECORDING_INODE_BASE,
        )
        self._wav_scp_inode = self._table.add_text(self._table.root, WAV_SCP)
        self._volatile: dict[int, Callable[[], bytes]] = {}
        if status is not None:
            control = self._table.add_directory(self._table.root, CONTROL_DIR)
            self._volatile[self._table.add_text(control, STATS_FILE)] = status
        self._texts: dict[int, bytes] = {}
        self._listings: dict[int, list[tuple[bytes, int]]] = {}

    # -- metadata ---------------------------------------------------------------------------

    async def lookup(self, parent_inode: int, name: bytes) -> Attributes:
        directory = self._directory(parent_inode)
        if name == b".":
            return await self.getattr(parent_inode)
        if name == b"..":
            return await self.getattr(directory.parent)
        inode = directory.children.get(name)
        if inode is None:
            raise FsError(errno.ENOENT)
        return await self.getattr(inode)

    async def getattr(self, inode: int) -> Attributes:
        """A node's attributes; a WAV file's size may need its recording indexed first."""
        kind = self._table.kind(inode)
        if kind in (NodeKind.CUT, NodeKind.RECORDING):
            source = await self.wav_source(inode)
            return Attributes(inode, _FILE_MODE, source.layout.size_bytes)
        return self.listed_attributes(inode)

    def listed_attributes(self, inode: int) -> Attributes:
        """Attributes for a directory listing, without indexing anything.

        A WAV file whose size is not known yet is listed as ``provisional``.
        """
        kind = self._table.kind(inode)
        if kind is NodeKind.DIRECTORY:
            return Attributes(inode, _DIRECTORY_MODE, 0, 2 + self._directory(inode).subdirectories)
        if kind is NodeKind.TEXT:
            volatile = inode in self._volatile
            return Attributes(inode, _FILE_MODE, len(self._text(inode)), volatile=volatile)
        if kind in (NodeKind.CUT, NodeKind.RECORDING):
            source = self._known_wav_source(inode)
            if source is None:
                return Attributes(inode, _FILE_MODE, 0, provisional=True)
            return Attributes(inode, _FILE_MODE, source.layout.size_bytes)
        raise FsError(errno.ENOENT)

    def listing(self, inode: int) -> list[tuple[bytes, int]]:
        """A directory's entries as (name, inode), in a fixed order."""
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

    def is_volatile(self, inode: int) -> bool:
        return inode in self._volatile

    def check_directory(self, inode: int) -> None:
        self._directory(inode)

    # -- data -------------------------------------------------------------------------------

    async def read(self, inode: int, offset: int, size: int) -> bytes:
        """Exactly the bytes ``[offset, offset + size)`` of a file, fewer only at its end."""
        if offset < 0 or size < 0:
            raise FsError(errno.EINVAL)
        kind = self._table.kind(inode)
        if kind is NodeKind.TEXT:
            return self._text(inode)[offset : offset + size]
        if kind not in (NodeKind.CUT, NodeKind.RECORDING):
            raise FsError(errno.EISDIR if kind is NodeKind.DIRECTORY else errno.ENOENT)
        return await self._read_wav(await self.wav_source(inode), offset, size)

    async def wav_source(self, inode: int) -> WavSource:
        """What a WAV file serves, indexing its recording first if the library must."""
        source = self._known_wav_source(inode)
        if source is None:
            await self._frames.index(self._recording_of(inode))
            source = self._known_wav_source(inode)
            assert source is not None, "indexing did not make the shape known"
        return source

    def _recording_of(self, inode: int) -> int:
        if inode >= RECORDING_INODE_BASE:
            return inode - RECORDING_INODE_BASE
        return self._library.cut_recording(inode - CUT_INODE_BASE)

    def _known_wav_source(self, inode: int) -> WavSource | None:
        library = self._library
        if inode >= RECORDING_INODE_BASE:
            index = inode - RECORDING_INODE_BASE
            if index >= len(library.recording_ids):
                raise FsError(errno.ENOENT)
            shape = library.shape(index)
            if shape is None:
                return None
            layout = WavLayout(shape.sample_rate, shape.channels, shape.num_frames)
            return WavSource(index, 0, (), layout)
        index = inode - CUT_INODE_BASE
        if not 0 <= index < library.num_cuts:
            raise FsError(errno.ENOENT)
        cut = library.cut(index)
        if cut is None:
            return None
        shape = library.shape(cut.recording_index)
        assert shape is not None
        channels = len(cut.channels) or shape.channels
        layout = WavLayout(shape.sample_rate, channels, cut.num_frames)
        return WavSource(cut.recording_index, cut.start_frame, cut.channels, layout)

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
            frames = await self._frames.frames(
                source.recording_index,
                source.start_frame + first,
                source.start_frame + last,
                readahead_end=source.start_frame + min(layout.num_frames, last + _READAHEAD_FRAMES),
            )
            if source.channels:
                frames = frames[:, list(source.channels)]
            data = np.ascontiguousarray(frames).tobytes()
            data_start = HEADER_BYTES + first * layout.frame_bytes
            parts.append(data[max(offset, HEADER_BYTES) - data_start : end - data_start])
        return b"".join(parts)

    # -- helpers ----------------------------------------------------------------------------

    def _directory(self, inode: int) -> Directory:
        directory = self._table.directory(inode)
        if directory is None:
            raise FsError(errno.ENOTDIR if self._table.kind(inode) else errno.ENOENT)
        return directory

    def _text(self, inode: int) -> bytes:
        volatile = self._volatile.get(inode)
        if volatile is not None:
            return volatile()
        text = self._texts.get(inode)
        if text is None:
            text = self._wav_scp() if inode == self._wav_scp_inode else b""
            self._texts[inode] = text
        return text

    def _wav_scp(self) -> bytes:
        base = os.path.join(self._mountpoint, CUTS_DIR)
        lines = [
            f"{_scp_key(cut_id)} {os.path.join(base, self._cut_paths[number])}\n"
            for number, cut_id in enumerate(self._library.cut_ids)
        ]
        return "".join(lines).encode("utf-8", "surrogateescape")


def _scp_key(cut_id: str) -> str:
    """The id as a wav.scp key: whitespace (which would split the line) is percent-encoded."""
    if cut_id and not any(character.isspace() for character in cut_id):
        return cut_id
    return "".join(f"%{ord(c):02X}" if c.isspace() or c == "%" else c for c in cut_id) or "%"


__all__ = ["ROOT_INODE", "Attributes", "Filesystem", "FsError", "WavSource"]
