"""``cuts/``: one WAV file per cut, at the path its id gives (ids with ``/`` make
directories), served from the library's mapped file tree."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from cutfs.codec.catalogue.file_tree import FileTree
from cutfs.codec.catalogue.mapped_table import RowSequence
from cutfs.codec.library import Library
from cutfs.vfs.tree.view import (
    CUT_DIRECTORY_BASE,
    CUT_INODE_BASE,
    ROOT_INODE,
    AudioSpan,
    Entry,
    NodeKind,
    View,
)

CUTS_DIR: Final = "cuts"


class CutsView(View):
    """Cut files and their directories.  ``extras`` are files of other views listed in
    ``cuts/`` itself (``metadata.jsonl``); they win over a cut directory of the same name."""

    def __init__(self, library: Library, tree: FileTree, extras: Sequence[Entry] = ()) -> None:
        self._library = library
        self._tree = tree
        self._extras = tuple(extras)
        self._extra_inodes = dict(self._extras)
        self.inode_ranges = (
            range(CUT_DIRECTORY_BASE, CUT_DIRECTORY_BASE + tree.directory_count),
            range(CUT_INODE_BASE, CUT_INODE_BASE + tree.item_count),
        )

    def root_entries(self) -> Sequence[Entry]:
        return ((CUTS_DIR.encode(), CUT_DIRECTORY_BASE),)

    def kind(self, inode: int) -> NodeKind | None:
        if CUT_INODE_BASE <= inode < CUT_INODE_BASE + self._tree.item_count:
            return NodeKind.WAV
        if CUT_DIRECTORY_BASE <= inode < CUT_DIRECTORY_BASE + self._tree.directory_count:
            return NodeKind.DIRECTORY
        return None

    def parent(self, directory: int) -> int:
        number = directory - CUT_DIRECTORY_BASE
        return ROOT_INODE if number == 0 else CUT_DIRECTORY_BASE + self._tree.parent(number)

    def subdirectories(self, directory: int) -> int:
        return self._tree.subdirectories(directory - CUT_DIRECTORY_BASE)

    async def lookup(self, directory: int, name: bytes, user: int) -> int | None:
        number = directory - CUT_DIRECTORY_BASE
        if number == 0 and name in self._extra_inodes:
            return self._extra_inodes[name]
        entry = self._tree.lookup(number, name)
        if entry is None:
            return None
        return (
            CUT_DIRECTORY_BASE + entry.child if entry.is_directory else CUT_INODE_BASE + entry.item
        )

    def listing(self, directory: int) -> Sequence[Entry]:
        number = directory - CUT_DIRECTORY_BASE
        entries = self._tree.entries(number)

        def entry(position: int) -> Entry:
            found = entries[position]
            if found.is_directory:
                return found.name, CUT_DIRECTORY_BASE + found.child
            return found.name, CUT_INODE_BASE + found.item

        return RowSequence(len(entries), entry, self._extras if number == 0 else ())

    def audio(self, inode: int) -> AudioSpan | None:
        found = self._library.cut_frames(inode - CUT_INODE_BASE)
        return None if found is None else AudioSpan(*found)

    def recording_of(self, inode: int) -> int:
        return self._library.cut_recording(inode - CUT_INODE_BASE)
