"""``windows/``: fixed windows of every recording (with ``--window``).

``windows/<recording id>/<start>-<end>.wav`` are windows ``length`` seconds
long starting every ``length - overlap`` seconds; the last one ends with
the recording.  The tree mirrors ``recordings/``: each recording file
``<id>.wav`` becomes the directory ``<id>/`` of its windows.  Windows are
arithmetic (window ``k`` starts at ``k * step`` frames): none is stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from cutfs.codec.audio.cut import seconds_to_frames
from cutfs.codec.catalogue.file_tree import FileTree
from cutfs.codec.catalogue.mapped_table import RowSequence
from cutfs.codec.catalogue.path_escape import SUFFIX
from cutfs.codec.library import AudioShape, Library
from cutfs.vfs.tree.view import (
    ROOT_INODE,
    WINDOW_BITS,
    WINDOW_DIRECTORY_BASE,
    WINDOW_INODE_BASE,
    WINDOW_TREE_BASE,
    AudioSpan,
    Entry,
    NodeKind,
    ShapeOf,
    View,
    parse_range_name,
    seconds_label,
)

WINDOWS_DIR: Final = "windows"
_SUFFIX: Final = SUFFIX.encode()


@dataclass(frozen=True, slots=True)
class Windows:
    """Fixed windows of every recording: ``length_seconds`` long, starting every
    ``length_seconds - overlap_seconds``; the last one ends with the recording."""

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
        """How many windows a recording has (the last is the first to reach its end),
        at most ``1 << WINDOW_BITS``."""
        if shape.num_frames == 0:
            return 0
        length, step = self._frames(shape)
        return min(max(0, -(-(shape.num_frames - length) // step)) + 1, 1 << WINDOW_BITS)

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


def window_inode(recording_index: int, number: int) -> int:
    return WINDOW_INODE_BASE + (recording_index << WINDOW_BITS) + number


def window_of(inode: int) -> tuple[int, int]:
    """(recording, window number) of a window inode."""
    offset = inode - WINDOW_INODE_BASE
    return offset >> WINDOW_BITS, offset & ((1 << WINDOW_BITS) - 1)


class WindowsView(View):
    """Window directories and files (see the module docstring)."""

    def __init__(
        self, library: Library, tree: FileTree, windows: Windows, shape_of: ShapeOf
    ) -> None:
        """``tree`` is the recordings' file tree."""
        self._library = library
        self._tree = tree
        self._windows = windows
        self._shape_of = shape_of
        count = tree.item_count
        self.inode_ranges = (
            range(WINDOW_TREE_BASE, WINDOW_TREE_BASE + tree.directory_count),
            range(WINDOW_DIRECTORY_BASE, WINDOW_DIRECTORY_BASE + count),
            range(WINDOW_INODE_BASE, window_inode(count, 0)),
        )

    def root_entries(self) -> Sequence[Entry]:
        return ((WINDOWS_DIR.encode(), WINDOW_TREE_BASE),)

    def kind(self, inode: int) -> NodeKind | None:
        if inode >= WINDOW_INODE_BASE:
            return NodeKind.WAV if self._window(inode) is not None else None
        if inode >= WINDOW_DIRECTORY_BASE:
            return (
                NodeKind.DIRECTORY
                if inode - WINDOW_DIRECTORY_BASE < self._tree.item_count
                else None
            )
        if WINDOW_TREE_BASE <= inode < WINDOW_TREE_BASE + self._tree.directory_count:
            return NodeKind.DIRECTORY
        return None

    def parent(self, directory: int) -> int:
        if directory >= WINDOW_DIRECTORY_BASE:
            return WINDOW_TREE_BASE + self._tree.item_directory(directory - WINDOW_DIRECTORY_BASE)
        number = directory - WINDOW_TREE_BASE
        return ROOT_INODE if number == 0 else WINDOW_TREE_BASE + self._tree.parent(number)

    def subdirectories(self, directory: int) -> int:
        if directory >= WINDOW_DIRECTORY_BASE:
            return 0
        return len(self._tree.entries(directory - WINDOW_TREE_BASE))  # every entry is one

    async def lookup(self, directory: int, name: bytes, user: int) -> int | None:
        if directory >= WINDOW_DIRECTORY_BASE:
            recording = directory - WINDOW_DIRECTORY_BASE
            shape = await self._shape_of(recording)
            span = parse_range_name(name, shape)
            number = None if span is None else self._windows.number_at(shape, *span)
            return None if number is None else window_inode(recording, number)
        number = directory - WINDOW_TREE_BASE
        entry = self._tree.lookup(number, name)
        if entry is not None and entry.is_directory:
            return WINDOW_TREE_BASE + entry.child
        entry = self._tree.lookup(number, name + _SUFFIX)
        if entry is None or entry.is_directory:
            return None
        return WINDOW_DIRECTORY_BASE + entry.item

    async def open_directory(self, directory: int) -> None:
        if directory >= WINDOW_DIRECTORY_BASE:
            await self._shape_of(directory - WINDOW_DIRECTORY_BASE)  # its windows need its length

    def listing(self, directory: int) -> Sequence[Entry]:
        if directory >= WINDOW_DIRECTORY_BASE:
            recording = directory - WINDOW_DIRECTORY_BASE
            shape = self._library.shape(recording)
            if shape is None:
                return ()
            return RowSequence(
                self._windows.count(shape), lambda k: self._window_entry(recording, shape, k)
            )
        entries = self._tree.entries(directory - WINDOW_TREE_BASE)

        def entry(position: int) -> Entry:
            found = entries[position]
            if found.is_directory:
                return found.name, WINDOW_TREE_BASE + found.child
            return found.name.removesuffix(_SUFFIX), WINDOW_DIRECTORY_BASE + found.item

        return RowSequence(len(entries), entry)

    def _window_entry(self, recording: int, shape: AudioShape, number: int) -> Entry:
        start, end = self._windows.span(shape, number)
        rate = shape.sample_rate
        name = f"{seconds_label(start, rate)}-{seconds_label(end, rate)}.wav".encode()
        return name, window_inode(recording, number)

    def audio(self, inode: int) -> AudioSpan | None:
        recording = self.recording_of(inode)
        if self._library.shape(recording) is None:
            return None
        window = self._window(inode)
        if window is None:
            return super().audio(inode)  # ENOENT
        return AudioSpan(recording, window[0], window[1] - window[0])

    def recording_of(self, inode: int) -> int:
        recording, _ = window_of(inode)
        if recording >= self._tree.item_count:
            return super().recording_of(inode)  # ENOENT
        return recording

    def _window(self, inode: int) -> tuple[int, int] | None:
        """(start, end) frames of a window inode, or ``None`` (no such window, or its
        recording's length is not known yet: it cannot have been looked up)."""
        recording, number = window_of(inode)
        if recording >= self._tree.item_count:
            return None
        shape = self._library.shape(recording)
        if shape is None or number >= self._windows.count(shape):
            return None
        return self._windows.span(shape, number)
