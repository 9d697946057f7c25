"""Views: the parts a mount's tree is composed of.

A view (the cut files, the recordings and their time ranges, fixed windows,
the manifests, the control directory) owns ranges of inode numbers and
answers for them: what a node is, its entries and their order, and what a
file serves (:class:`AudioSpan` for a WAV file, a :class:`TextFile` for a
text).  It puts its top entries in the mount's root with
:meth:`View.root_entries`.  :class:`cutfs.vfs.tree.filesystem.Filesystem` composes
views and does what is common to them (WAV layout, reading, deadlines), so
a new view is one new module and one line in the filesystem.

Views are plain classes: tests call them without a mount.  Inode numbers
are arithmetic (a base plus a row of a mapped table), so nothing is
allocated per file:

========================  ==============================================
``1``                     the root
``2`` .. ``63``           manifests (:mod:`cutfs.vfs.tree.manifests_view`)
``64`` .. ``127``         the control directory and its files
``k << 36`` + row         directories of view ``k`` (see the constants)
``1 << 40`` + cut         cut files
``1 << 41`` + recording   recording files
``1 << 42`` ..            time ranges, numbered while the kernel holds them
``1 << 48`` + ...         windows: ``(recording << 24) + window number``
========================  ==============================================
"""

from __future__ import annotations

import errno
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Final, Protocol

from cutfs.codec.audio.cut import seconds_to_frames
from cutfs.codec.library import AudioShape
from cutfs.vfs.fuse.fs_error import FsError

ROOT_INODE: Final = 1
MANIFEST_INODE_BASE: Final = 2
CONTROL_INODE_BASE: Final = 64
CUT_DIRECTORY_BASE: Final = 1 << 36
RECORDING_DIRECTORY_BASE: Final = 2 << 36
RANGE_DIRECTORY_BASE: Final = 3 << 36
WINDOW_TREE_BASE: Final = 4 << 36
WINDOW_DIRECTORY_BASE: Final = 5 << 36
CUT_INODE_BASE: Final = 1 << 40
RECORDING_INODE_BASE: Final = 1 << 41
SPAN_INODE_BASE: Final = 1 << 42
WINDOW_INODE_BASE: Final = 1 << 48
#: A recording has at most ``1 << WINDOW_BITS`` windows (16.7 million).
WINDOW_BITS: Final = 24

#: ``<start>-<end>.wav`` in decimal seconds, for time ranges and windows.
_RANGE_NAME: Final = re.compile(rb"(\d+(?:\.\d+)?)-(\d+(?:\.\d+)?)\.wav")

#: A directory entry: (name as the kernel passes it, inode).
Entry = tuple[bytes, int]
#: A recording's shape, having it indexed first if need be (under the request's deadline).
ShapeOf = Callable[[int], Awaitable[AudioShape]]


class NodeKind(Enum):
    DIRECTORY = "directory"
    TEXT = "text"
    WAV = "wav"


@dataclass(frozen=True, slots=True)
class AudioSpan:
    """Frames ``[start_frame, start_frame + num_frames)`` of a recording, as a WAV file serves
    them; ``channels`` are the recording's channels it carries (empty: all)."""

    recording_index: int
    start_frame: int
    num_frames: int
    channels: tuple[int, ...] = ()


class TextFile(Protocol):
    """A text file's content.  ``volatile`` content changes while mounted (the kernel
    must not cache it); other texts may need work (indexing) before they are ``ready``."""

    volatile: bool

    def ready(self) -> bool:
        """Whether size and content are known without waiting."""
        ...

    async def prepare(self) -> None:
        """Do what :meth:`ready` waits for (may be slow: called under the deadline)."""
        ...

    def size_bytes(self) -> int:
        """The exact size (once ready)."""
        ...

    def read(self, offset: int, size: int) -> bytes:
        """Bytes ``[offset, offset + size)`` (once ready), fewer only at the end."""
        ...


class View:
    """One part of the tree (see the module docstring).  Defaults answer "no such node";
    a view overrides what it has."""

    #: The inode numbers this view answers for.
    inode_ranges: Sequence[range] = ()

    def root_entries(self) -> Sequence[Entry]:
        """Entries this view puts in the mount's root."""
        return ()

    def kind(self, inode: int) -> NodeKind | None:
        """What an owned inode is, or ``None`` if there is no such node (cheap: no waiting)."""
        return None

    def parent(self, directory: int) -> int:
        """The directory holding ``directory`` (for ``..``)."""
        return ROOT_INODE

    def subdirectories(self, directory: int) -> int:
        """How many directories ``directory`` holds (for its link count)."""
        return 0

    async def lookup(self, directory: int, name: bytes, user: int) -> int | None:
        """The inode of ``name`` in ``directory``, or ``None``; ``user`` is charged for
        anything the lookup creates."""
        return None

    async def open_directory(self, directory: int) -> None:
        """Learn what a listing of ``directory`` needs (for example a recording's length)."""

    def listing(self, directory: int) -> Sequence[Entry]:
        """``directory``'s entries in a fixed order: position ``k`` is readdir's offset ``k``."""
        return ()

    def audio(self, inode: int) -> AudioSpan | None:
        """What a WAV file serves, or ``None`` until :meth:`recording_of`'s recording is
        indexed.  FsError(ENOENT) for a file that does not exist."""
        raise FsError(errno.ENOENT)

    def recording_of(self, inode: int) -> int:
        """The recording a WAV file is of (known without indexing)."""
        raise FsError(errno.ENOENT)

    def text(self, inode: int) -> TextFile:
        raise FsError(errno.ENOENT)

    def forget(self, inode: int, references: int) -> None:
        """The kernel dropped ``references`` lookups of ``inode``."""


def parse_range_name(name: bytes, shape: AudioShape) -> tuple[int, int] | None:
    """(start, end) frames of a ``<start>-<end>.wav`` name within a recording, or ``None``."""
    matched = _RANGE_NAME.fullmatch(name)
    if matched is None:
        return None
    start = seconds_to_frames(float(matched[1]), shape.sample_rate)
    end = seconds_to_frames(float(matched[2]), shape.sample_rate)
    if not 0 <= start < end <= shape.num_frames:
        return None
    return start, end


def seconds_label(frames: int, rate: int) -> str:
    """Seconds as a short decimal that converts back to exactly ``frames``."""
    return f"{frames / rate:.6f}".rstrip("0").rstrip(".")
