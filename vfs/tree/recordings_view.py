"""``recordings/``: every recording whole, and any time range of it.

``recordings/<id>.wav`` is the whole recording, all channels.
``recordings/<id>/<start>-<end>.wav`` is any range in seconds: the directory
``<id>/`` and its files are made on lookup and never listed.  Range files
are numbered while the kernel holds them (:class:`cutfs.vfs.tree.span_table.SpanTable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from cutfs.codec.catalogue.file_tree import FileTree
from cutfs.codec.catalogue.mapped_table import RowSequence
from cutfs.codec.catalogue.path_escape import SUFFIX
from cutfs.codec.library import Library
from cutfs.vfs.tree.span_table import SharedSpanTable, SpanTable
from cutfs.vfs.tree.view import (
    RANGE_DIRECTORY_BASE,
    RECORDING_DIRECTORY_BASE,
    RECORDING_INODE_BASE,
    ROOT_INODE,
    SPAN_INODE_BASE,
    WINDOW_INODE_BASE,
    AudioSpan,
    Entry,
    NodeKind,
    ShapeOf,
    View,
    parse_range_name,
)

RECORDINGS_DIR: Final = "recordings"
_SUFFIX: Final = SUFFIX.encode()


class RecordingsView(View):
    """Recording files, their directories, and their time ranges (see the module docstring)."""

    def __init__(
        self,
        library: Library,
        tree: FileTree,
        shape_of: ShapeOf,
        shared_spans: SharedSpanTable | None = None,
    ) -> None:
        """``shared_spans``: the :class:`SharedSpanTable` of the processes that serve the
        mount (None: the time ranges are this process's own)."""
        self._library = library
        self._tree = tree
        self._shape_of = shape_of
        self._spans: SpanTable | SharedSpanTable = (
            SpanTable(SPAN_INODE_BASE) if shared_spans is None else shared_spans
        )
        count = tree.item_count
        self.inode_ranges = (
            range(RECORDING_DIRECTORY_BASE, RECORDING_DIRECTORY_BASE + tree.directory_count),
            range(RANGE_DIRECTORY_BASE, RANGE_DIRECTORY_BASE + count),
            range(RECORDING_INODE_BASE, RECORDING_INODE_BASE + count),
            range(SPAN_INODE_BASE, WINDOW_INODE_BASE),
        )

    @property
    def time_ranges(self) -> int:
        """Time-range files the kernel still holds."""
        return len(self._spans)

    def root_entries(self) -> Sequence[Entry]:
        return ((RECORDINGS_DIR.encode(), RECORDING_DIRECTORY_BASE),)

    def kind(self, inode: int) -> NodeKind | None:
        if inode >= SPAN_INODE_BASE:
            return NodeKind.WAV if self._spans.get(inode) is not None else None
        if inode >= RECORDING_INODE_BASE:
            return NodeKind.WAV if inode - RECORDING_INODE_BASE < self._tree.item_count else None
        if inode >= RANGE_DIRECTORY_BASE:
            return (
                NodeKind.DIRECTORY if inode - RANGE_DIRECTORY_BASE < self._tree.item_count else None
            )
        if (
            RECORDING_DIRECTORY_BASE
            <= inode
            < RECORDING_DIRECTORY_BASE + self._tree.directory_count
        ):
            return NodeKind.DIRECTORY
        return None

    def parent(self, directory: int) -> int:
        if directory >= RANGE_DIRECTORY_BASE:
            recording = directory - RANGE_DIRECTORY_BASE
            return RECORDING_DIRECTORY_BASE + self._tree.item_directory(recording)
        number = directory - RECORDING_DIRECTORY_BASE
        return ROOT_INODE if number == 0 else RECORDING_DIRECTORY_BASE + self._tree.parent(number)

    def subdirectories(self, directory: int) -> int:
        if directory >= RANGE_DIRECTORY_BASE:
            return 0
        return self._tree.subdirectories(directory - RECORDING_DIRECTORY_BASE)

    async def lookup(self, directory: int, name: bytes, user: int) -> int | None:
        if directory >= RANGE_DIRECTORY_BASE:
            recording = directory - RANGE_DIRECTORY_BASE
            span = parse_range_name(name, await self._shape_of(recording))
            if span is None:
                return None
            return self._spans.acquire((recording, *span), user)
        number = directory - RECORDING_DIRECTORY_BASE
        entry = self._tree.lookup(number, name)
        if entry is not None:
            if entry.is_directory:
                return RECORDING_DIRECTORY_BASE + entry.child
            return RECORDING_INODE_BASE + entry.item
        # The hidden directory of a recording's time ranges: its file's name without .wav.
        entry = self._tree.lookup(number, name + _SUFFIX)
        if entry is None or entry.is_directory:
            return None
        return RANGE_DIRECTORY_BASE + entry.item

    def listing(self, directory: int) -> Sequence[Entry]:
        if directory >= RANGE_DIRECTORY_BASE:
            return ()
        entries = self._tree.entries(directory - RECORDING_DIRECTORY_BASE)

        def entry(position: int) -> Entry:
            found = entries[position]
            if found.is_directory:
                return found.name, RECORDING_DIRECTORY_BASE + found.child
            return found.name, RECORDING_INODE_BASE + found.item

        return RowSequence(len(entries), entry)

    def audio(self, inode: int) -> AudioSpan | None:
        recording = self.recording_of(inode)
        if inode >= SPAN_INODE_BASE:
            span = self._spans.get(inode)
            assert span is not None, "recording_of() checked it"
            return AudioSpan(recording, span[1], span[2] - span[1])
        shape = self._library.shape(recording)
        return None if shape is None else AudioSpan(recording, 0, shape.num_frames)

    def recording_of(self, inode: int) -> int:
        if inode >= SPAN_INODE_BASE:
            span = self._spans.get(inode)
            if span is None:
                return super().recording_of(inode)  # ENOENT
            return span[0]
        return inode - RECORDING_INODE_BASE

    def forget(self, inode: int, references: int) -> None:
        if inode >= SPAN_INODE_BASE:
            self._spans.forget(inode, references)
