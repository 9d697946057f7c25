"""The directory tree of a mount and its inode numbers.

Inodes are fixed for the life of the mount and derived from table positions,
so nothing is allocated per lookup:

* directories and generated text files: small numbers from 1 (the root);
* cut ``i``: ``CUT_INODE_BASE + i``; recording ``r``: ``RECORDING_INODE_BASE + r``;
* time ranges made on lookup: ``SPAN_INODE_BASE`` and up, numbered while the kernel
  remembers them (:class:`cutfs.vfs.span_table.SpanTable`);
* window ``k`` of recording ``r``: ``WINDOW_INODE_BASE + (r << WINDOW_BITS) + k``.

Only directories are objects; a directory maps entry names (bytes, as the
kernel passes them) to inodes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from cutfs.codec.path_escape import escape_id

ROOT_INODE: Final = 1
CUT_INODE_BASE: Final = 1 << 40
RECORDING_INODE_BASE: Final = 1 << 41
SPAN_INODE_BASE: Final = 1 << 42
WINDOW_INODE_BASE: Final = 1 << 48
#: A recording has at most ``1 << WINDOW_BITS`` windows (16.7 million).
WINDOW_BITS: Final = 24


class NodeKind(Enum):
    DIRECTORY = "directory"
    TEXT = "text"
    CUT = "cut"
    RECORDING = "recording"
    SPAN = "span"
    WINDOW = "window"


@dataclass
class Directory:
    inode: int
    parent: int
    children: dict[bytes, int] = field(default_factory=dict)
    subdirectories: int = 0


class InodeTable:
    """Directories, text files and their names; cut and recording files by number."""

    def __init__(self) -> None:
        self._directories: dict[int, Directory] = {}
        self._texts: dict[int, str] = {}
        self._next_inode = ROOT_INODE
        self.root = self._new_directory(ROOT_INODE)

    def kind(self, inode: int) -> NodeKind | None:
        """What the inode is, or ``None`` if it does not exist."""
        if inode >= WINDOW_INODE_BASE:
            return NodeKind.WINDOW
        if inode >= SPAN_INODE_BASE:
            return NodeKind.SPAN
        if inode >= RECORDING_INODE_BASE:
            return NodeKind.RECORDING
        if inode >= CUT_INODE_BASE:
            return NodeKind.CUT
        if inode in self._directories:
            return NodeKind.DIRECTORY
        if inode in self._texts:
            return NodeKind.TEXT
        return None

    def directory(self, inode: int) -> Directory | None:
        return self._directories.get(inode)

    def text_name(self, inode: int) -> str:
        return self._texts[inode]

    def add_directory(self, parent: Directory, name: str) -> Directory:
        """The directory ``name`` in ``parent``, created if missing."""
        key = name.encode("utf-8", "surrogateescape")
        existing = parent.children.get(key)
        if existing is not None:
            directory = self._directories.get(existing)
            if directory is None:
                raise FileExistsError(name)
            return directory
        directory = self._new_directory(parent.inode)
        parent.children[key] = directory.inode
        parent.subdirectories += 1
        return directory

    def add_hidden_directory(self, parent: Directory) -> Directory:
        """A directory that its parent does not list (found by lookup only)."""
        return self._new_directory(parent.inode)

    def find(self, start: Directory, path: str) -> int | None:
        """The inode at ``path`` (``/``-separated, as :meth:`add_files` returns) below ``start``."""
        directory: Directory | None = start
        *directories, name = path.split("/")
        for component in directories:
            assert directory is not None
            child = directory.children.get(component.encode("utf-8", "surrogateescape"))
            directory = self._directories.get(child) if child is not None else None
            if directory is None:
                return None
        assert directory is not None
        return directory.children.get(name.encode("utf-8", "surrogateescape"))

    def add_text(self, parent: Directory, name: str) -> int:
        inode = self._allocate()
        self._texts[inode] = name
        parent.children[name.encode()] = inode
        return inode

    def add_files(self, parent: Directory, ids: Iterable[str], inode_base: int) -> dict[int, str]:
        """Add one file per id under ``parent``, id ``i`` at ``inode_base + i``.

        Returns the relative path (from ``parent``) of every file.  Ids whose
        path clashes with an earlier one's are escaped (see
        :mod:`cutfs.codec.path_escape`).
        """
        paths: dict[int, str] = {}
        for number, identifier in enumerate(ids):
            path = escape_id(identifier)
            if not self._try_add_file(parent, path, inode_base + number):
                path = escape_id(identifier, force=True)
                if not self._try_add_file(parent, path, inode_base + number):
                    raise FileExistsError(f"two files at {path!r}")
            paths[number] = path
        return paths

    def _try_add_file(self, parent: Directory, path: str, inode: int) -> bool:
        if "/" not in path:  # the common case, without the walk below
            key = path.encode("utf-8", "surrogateescape")
            if key in parent.children:
                return False
            parent.children[key] = inode
            return True
        *directories, name = path.split("/")
        directory = parent
        try:
            for component in directories:
                directory = self.add_directory(directory, component)
        except FileExistsError:
            return False
        key = name.encode("utf-8", "surrogateescape")
        if key in directory.children:
            return False
        directory.children[key] = inode
        return True

    def _new_directory(self, parent: int) -> Directory:
        inode = self._allocate()
        directory = Directory(inode, parent)
        self._directories[inode] = directory
        return directory

    def _allocate(self) -> int:
        inode = self._next_inode
        self._next_inode += 1
        return inode


def window_inode(recording_index: int, number: int) -> int:
    return WINDOW_INODE_BASE + (recording_index << WINDOW_BITS) + number


def window_of(inode: int) -> tuple[int, int]:
    """(recording, window number) of a window inode."""
    offset = inode - WINDOW_INODE_BASE
    return offset >> WINDOW_BITS, offset & ((1 << WINDOW_BITS) - 1)
