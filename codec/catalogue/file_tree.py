"""The directory tree of served files, written once and searched in place, memory-mapped.

A tree serves items (cuts, recordings) numbered ``0..n-1`` as files whose
relative paths come from their ids (:mod:`cutfs.codec.catalogue.path_escape`).  It is
written as two uncompressed Arrow IPC files:

``<name>.entries.arrow``
    one row per directory entry, sorted by (``directory``, ``name``):
    ``directory`` (uint32: the directory holding it), ``name`` (binary: the
    entry's name, as the kernel passes it), ``child`` (int64: the directory it
    is, or -1) and ``item`` (int64: the item it serves, or -1);
``<name>.directories.arrow``
    one row per directory, directory 0 being the tree's root:
    ``first_entry`` and ``entry_count`` (its rows in the entries file),
    ``parent`` and ``subdirectories`` (for ``..`` and link counts).

Opening maps both; nothing is read per entry.  A lookup is a binary search
over one directory's rows of the mapped name column; a listing is a range of
rows, so a ``readdir`` offset is a row; memory grows with the number of
directories, not of files.  Item paths, for manifests, are a third file,
``<name>.paths.arrow`` (``path``: utf-8, item order).

Paths that would clash (an id ``a`` wants the file ``a.wav`` where the id
``a.wav/b`` needs a directory) are resolved as the first item to claim a
name keeps it and later ones are escaped whole (``escape_id(force=True)``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from cutfs.codec.catalogue.mapped_table import (
    BinaryColumn,
    RowSequence,
    int_view,
    native_int_view,
    read_mapped,
    single_chunk,
)
from cutfs.codec.catalogue.path_escape import PLAIN_ID_PATTERN, SUFFIX, escape_id, unescape_path
from cutfs.codec.catalogue.row_order import rows_in_order
from cutfs.codec.catalogue.shard_format import write_table
from cutfs.codec.errors import ShardFormatError, SourceError

ROOT: Final = 0
ENTRIES: Final = ".entries.arrow"
DIRECTORIES: Final = ".directories.arrow"
PATHS: Final = ".paths.arrow"
#: The files a tree of prefix ``p`` is made of: ``p + suffix`` for each.
TREE_FILES: Final = (ENTRIES, DIRECTORIES, PATHS)
#: Ids escaped per Arrow chunk.
_BATCH: Final = 1 << 20

ENTRY_SCHEMA: Final = pa.schema(
    [
        ("directory", pa.uint32()),
        ("name", pa.large_binary()),
        ("child", pa.int64()),
        ("item", pa.int64()),
    ]
)
#: The first eight bytes of each name as a big-endian number (zero-padded): the order of
#: names, searched with numpy before the few names that share a key are compared.
KEY_SCHEMA: Final = pa.schema([("name_key", pa.uint64())])
DIRECTORY_SCHEMA: Final = pa.schema(
    [
        ("first_entry", pa.int64()),
        ("entry_count", pa.int64()),
        ("parent", pa.int64()),
        ("subdirectories", pa.int64()),
    ]
)
PATH_SCHEMA: Final = pa.schema([("path", pa.large_string())])


@dataclass(frozen=True, slots=True)
class Entry:
    """One name in a directory: a subdirectory (``child``) or a file (``item``)."""

    name: bytes
    child: int  # -1 for a file
    item: int  # -1 for a directory

    @property
    def is_directory(self) -> bool:
        return self.child >= 0


def served_paths(ids: Iterable[str] | pa.Array | pa.ChunkedArray) -> pa.Array:
    """The relative path of every id (a large_string array), clashes resolved.

    Plain ids (the common case: see :mod:`cutfs.codec.catalogue.path_escape`) get their
    ``.wav`` with one vectorised kernel per batch; others are escaped one by
    one.  No Python string per id is kept.  Clashes are found with vectorised
    kernels and, being rare, resolved one by one (see the module docstring).
    """
    chunks = list(_path_batches(ids))
    paths = pa.concat_arrays(chunks) if chunks else pa.array([], pa.large_string())
    for _ in range(3):  # escaped paths start with "%", which no plain path does
        losers = _clashing_items(paths)
        if not losers:
            return paths
        rows = pa.array(losers, pa.int64())
        escaped = [escape_id(unescape_path(p), force=True) for p in paths.take(rows).to_pylist()]
        index = np.arange(len(paths), dtype=np.int64)  # the losers' rows point at their new paths
        index[losers] = len(paths) + np.arange(len(losers))
        combined = pa.concat_arrays([paths, pa.array(escaped, pa.large_string())])
        paths = combined.take(pa.array(index))
    raise SourceError(f"ids give clashing paths, for example {paths[losers[0]].as_py()!r}")


def _path_batches(ids: Iterable[str] | pa.Array | pa.ChunkedArray) -> Iterator[pa.Array]:
    """Escaped paths of ids (before clashes), as large_string arrays of :data:`_BATCH` values.

    Python ids are escaped one by one (they may hold surrogates, which Arrow
    cannot); Arrow ids with vectorised kernels.
    """
    if isinstance(ids, pa.ChunkedArray | pa.Array):
        ids = ids.cast(pa.large_string())
        for start in range(0, len(ids), _BATCH):
            piece = ids.slice(start, _BATCH)
            yield escaped_paths(
                piece.combine_chunks() if isinstance(piece, pa.ChunkedArray) else piece
            )
        return
    batch: list[str] = []
    for identifier in ids:
        batch.append(escape_id(identifier))
        if len(batch) == _BATCH:
            yield pa.array(batch, pa.large_string())
            batch = []
    yield pa.array(batch, pa.large_string())


def escaped_paths(ids: pa.Array) -> pa.Array:
    """``escape_id`` of every id of a large_string array: one kernel for the plain ones."""
    plain = pc.match_substring_regex(ids, PLAIN_ID_PATTERN)
    suffix = pa.scalar(SUFFIX, pa.large_string())
    paths = pc.binary_join_element_wise(ids, suffix, pa.scalar("", pa.large_string()))
    if pc.all(plain).as_py() is not False:
        return paths
    others = np.flatnonzero(~np.asarray(plain.to_numpy(zero_copy_only=False), dtype=bool))
    escaped = [escape_id(identifier) for identifier in ids.take(pa.array(others)).to_pylist()]
    replacement = np.zeros(len(ids), dtype=np.int64)
    replacement[others] = np.arange(len(others))
    return pc.if_else(plain, paths, pa.array(escaped, pa.large_string()).take(replacement))


def write_file_tree(prefix: str, paths: Sequence[str] | pa.Array, mode: int | None = None) -> None:
    """Write the tree of ``paths`` (item ``i`` at ``paths[i]``, as :func:`served_paths` makes
    them) to ``<prefix>.entries.arrow``, ``.directories.arrow`` and ``.paths.arrow``, with
    permission bits ``mode`` (default: as the umask makes them).

    Built with Arrow's vectorised kernels, a few million paths at a time and level by
    level of directories within them; what is kept across batches is the directories and
    one row per entry, sorted once at the end (about 100 bytes per path at the peak), or
    not at all when the rows already are in order (ids made in order).
    """
    path_array = pa.array(paths, pa.large_string()) if not isinstance(paths, pa.Array) else paths
    path_array = path_array.cast(pa.large_string())
    found = TreeDirectories()
    batches = range(0, len(path_array), TREE_BATCH)
    files = [found.add_files(path_array.slice(start, TREE_BATCH), start) for start in batches]
    parent, directory_entries = found.parents(), found.entries
    entries = pa.concat_tables([*directory_entries, *files] or [ENTRY_SCHEMA.empty_table()])
    del files, directory_entries
    entries = entries.combine_chunks()
    group = np.asarray(entries.column("directory").to_numpy(), dtype=np.uint32)
    if not rows_in_order(entries.column("name").combine_chunks(), group):
        order = pc.sort_indices(entries, [("directory", "ascending"), ("name", "ascending")])
        entries = entries.take(order).combine_chunks()
    del group
    entries = entries.append_column(
        KEY_SCHEMA.field(0), pa.array(name_keys(entries.column("name")))
    )
    directory_column = np.asarray(entries.column("directory").to_numpy(), dtype=np.int64)
    numbers = np.arange(len(parent))
    first = np.searchsorted(directory_column, numbers, side="left")
    end = np.searchsorted(directory_column, numbers, side="right")
    children = np.asarray(entries.column("child").to_numpy(), dtype=np.int64)
    subdirectories = np.bincount(directory_column[children >= 0], minlength=len(parent))
    directories = pa.table([first, end - first, parent, subdirectories], schema=DIRECTORY_SCHEMA)
    write_table(prefix + ENTRIES, entries, mode)
    write_table(prefix + DIRECTORIES, directories, mode)
    write_table(prefix + PATHS, pa.table([path_array], schema=PATH_SCHEMA), mode)


def name_keys(names: pa.ChunkedArray | pa.Array) -> npt.NDArray[np.uint64]:
    """The first eight bytes of every name as a big-endian number, zero-padded (see
    :data:`KEY_SCHEMA`), a million names at a time."""
    array = names.combine_chunks() if isinstance(names, pa.ChunkedArray) else names
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64)[
        array.offset : array.offset + len(array) + 1
    ]
    values = np.frombuffer(array.buffers()[2] or b"", dtype=np.uint8)
    keys = np.zeros(len(array), dtype=np.uint64)
    columns = np.arange(8)
    for start in range(0, len(array), _BATCH):
        stop = min(start + _BATCH, len(array))
        begin = offsets[start:stop]
        length = np.minimum(offsets[start + 1 : stop + 1] - begin, 8)
        wanted = columns[None, :] < length[:, None]
        block = np.zeros((len(begin), 8), dtype=np.uint8)
        block[wanted] = values[(begin[:, None] + columns[None, :])[wanted]]
        keys[start : start + len(begin)] = block.view(">u8").reshape(-1)
    return keys


def name_key(name: bytes) -> int:
    """The key of one name (see :data:`KEY_SCHEMA`)."""
    return int.from_bytes(name[:8].ljust(8, b"\0"), "big")


#: Paths whose directories are found at once by :func:`write_file_tree`.  Directories are
#: numbered in the order batches of this many paths reveal them, so every writer of a tree
#: (:mod:`cutfs.codec.spill.catalogue_writer` too) batches its paths alike.
TREE_BATCH: Final = 1 << 18


class TreeDirectories:
    """The directories of a tree as batches of paths reveal them, numbered in order of
    discovery (the root is 0), each known by its path."""

    def __init__(self) -> None:
        self.known = pa.array([], pa.large_string())
        self.numbers = np.zeros(0, dtype=np.int64)
        self._parents: list[npt.NDArray[np.int64]] = [np.array([-1], dtype=np.int64)]
        self.entries: list[pa.Table] = []
        self._next = 1

    def parents(self) -> npt.NDArray[np.int64]:
        return np.concatenate(self._parents)

    def add_files(self, batch: pa.Array, start: int) -> pa.Table:
        """The file entries of the paths in ``batch`` (items numbered from ``start``),
        adding the directories they need."""
        parts = pc.split_pattern(batch, "/")
        depth = np.asarray(pc.list_value_length(parts).to_numpy(zero_copy_only=False), np.int64)
        directory = np.zeros(len(batch), dtype=np.int64)  # the deepest directory seen so far
        separator = pa.scalar("/", pa.large_string())
        for level in range(1, int(depth.max()) if len(batch) else 1):
            items = np.flatnonzero(depth > level)
            level_parts = parts.take(pa.array(items))
            prefixes = pc.binary_join(pc.list_slice(level_parts, 0, level), separator)
            found = self._number(prefixes, level_parts, level, directory[items])
            directory[items] = found
        names = pc.replace_substring_regex(batch, r"^.*/", "")
        count = len(batch)
        return entry_table(
            directory, names, np.full(count, -1), np.arange(start, start + count, dtype=np.int64)
        )

    def _number(
        self,
        prefixes: pa.Array,
        level_parts: pa.Array,
        level: int,
        parents: npt.NDArray[np.int64],
    ) -> npt.NDArray[np.int64]:
        """The number of each directory path in ``prefixes``; new ones are numbered and
        their entries (in ``parents``, named by component ``level - 1``) recorded."""
        position = pc.index_in(prefixes, value_set=self.known)
        new = pc.is_null(position)
        if pc.any(new).as_py():
            fresh = pc.unique(prefixes.filter(new))
            rows = np.asarray(pc.index_in(fresh, value_set=prefixes).to_numpy(), np.int64)
            numbers = self._next + np.arange(len(fresh), dtype=np.int64)
            names = pc.list_element(level_parts.take(pa.array(rows)), level - 1)
            self._parents.append(parents[rows])
            self.entries.append(entry_table(parents[rows], names, numbers, np.full(len(fresh), -1)))
            self._next += len(fresh)
            self.known = pa.concat_arrays([self.known, fresh])
            self.numbers = np.concatenate([self.numbers, numbers])
            position = pc.index_in(prefixes, value_set=self.known)
        return self.numbers[np.asarray(position.to_numpy(zero_copy_only=False), np.int64)]


def entry_table(
    directory: npt.NDArray[np.int64],
    names: pa.Array,
    child: npt.NDArray[np.int64],
    item: npt.NDArray[np.int64],
) -> pa.Table:
    return pa.table(
        [
            pa.array(directory, pa.uint32()),
            names.cast(pa.large_string()).cast(pa.large_binary()),
            pa.array(child, pa.int64()),
            pa.array(item, pa.int64()),
        ],
        schema=ENTRY_SCHEMA,
    )


class FileTree:
    """A tree written by :func:`write_file_tree`, mapped (see the module docstring).

    Raises :class:`ShardFormatError` when the files are missing, of another
    schema, or inconsistent (rows out of order, ranges outside the file, no root, or
    another number of items than ``item_count``, the rows of the table the items name,
    when given).
    """

    def __init__(self, prefix: str, item_count: int | None = None) -> None:
        self._prefix = prefix
        entries = read_mapped(prefix + ENTRIES, pa.unify_schemas([ENTRY_SCHEMA, KEY_SCHEMA]))
        directories = read_mapped(prefix + DIRECTORIES, DIRECTORY_SCHEMA)
        paths = read_mapped(prefix + PATHS, PATH_SCHEMA)
        self._names = BinaryColumn(single_chunk(entries, "name"))
        self._keys = native_int_view(entries, "name_key")
        self._children = int_view(entries, "child")
        self._items = int_view(entries, "item")
        self._first = int_view(directories, "first_entry")
        self._counts = int_view(directories, "entry_count")
        self._parents = int_view(directories, "parent")
        self._subdirectories = int_view(directories, "subdirectories")
        self._paths = BinaryColumn(single_chunk(paths, "path"))
        self._check(len(entries))
        if item_count is not None and len(self._paths) != item_count:
            raise ShardFormatError(
                f"the file tree serves {len(self._paths)} items for a table of {item_count}",
                where=self._prefix,
            )

    @property
    def directory_count(self) -> int:
        return len(self._first)

    @property
    def item_count(self) -> int:
        return len(self._paths)

    def parent(self, directory: int) -> int:
        """The parent of a directory (the root is its own parent)."""
        parent = int(self._parents[directory])
        return directory if parent < 0 else parent

    def subdirectories(self, directory: int) -> int:
        return int(self._subdirectories[directory])

    def lookup(self, directory: int, name: bytes) -> Entry | None:
        """The entry ``name`` of ``directory``, or ``None``: a binary search over mapped rows."""
        first = int(self._first[directory])
        end = first + int(self._counts[directory])
        keys = self._keys[first:end]
        key = np.uint64(name_key(name))
        low = first + int(np.searchsorted(keys, key, side="left"))
        high = first + int(np.searchsorted(keys, key, side="right"))
        row = bisect_left(self._names, name, low, high)  # the few names sharing the key
        if row == high or self._names[row] != name:
            return None
        return self.entry_at(row)

    def entries(self, directory: int) -> Sequence[Entry]:
        """A directory's entries in name order; position ``k`` is its ``k``-th row."""
        first = int(self._first[directory])
        return RowSequence(int(self._counts[directory]), lambda k: self.entry_at(first + k))

    def entry_at(self, row: int) -> Entry:
        """The entry at a row, its numbers checked here rather than for all rows at open
        (a check of every row would touch every page of a catalogue of millions)."""
        child, item = int(self._children[row]), int(self._items[row])
        if not (-1 <= child < self.directory_count and -1 <= item < self.item_count) or (
            (child < 0) == (item < 0)
        ):
            raise ShardFormatError(f"file tree row {row} is inconsistent", where=self._prefix)
        return Entry(self._names[row], child, item)

    def find(self, path: str) -> int | None:
        """The item served at a relative path (``a/b.wav``), or ``None``."""
        directory = ROOT
        *directories, name = path.split("/")
        for component in directories:
            entry = self.lookup(directory, _name_bytes(component))
            if entry is None or not entry.is_directory:
                return None
            directory = entry.child
        entry = self.lookup(directory, _name_bytes(name))
        return None if entry is None or entry.is_directory else entry.item

    def find_directory(self, path: str) -> int | None:
        """The directory at a relative path (``""`` is the root), or ``None``."""
        directory = ROOT
        for component in path.split("/") if path else ():
            entry = self.lookup(directory, _name_bytes(component))
            if entry is None or not entry.is_directory:
                return None
            directory = entry.child
        return directory

    def item_directory(self, item: int) -> int:
        """The directory holding an item's file (a walk down its path: for ``..``, not hot)."""
        directory = self.find_directory(self.path(item).rpartition("/")[0])
        if directory is None:
            raise ShardFormatError(f"item {item}'s path is not in the tree", where=self._prefix)
        return directory

    def path(self, item: int) -> str:
        """The relative path of an item's file (``a/b.wav``)."""
        return self._paths[item].decode("utf-8", "surrogateescape")

    def _check(self, entry_count: int) -> None:
        first, counts = self._first, self._counts
        if (
            len(first) == 0  # not even the root
            or (counts < 0).any()
            or (first < 0).any()
            or ((first + counts) > entry_count).any()
            or (self._parents[1:] < 0).any()
            or (self._parents >= len(first)).any()
            or len(self._children) != entry_count
            or len(self._items) != entry_count
        ):
            raise ShardFormatError("the file tree's rows are inconsistent", where=self._prefix)


def _clashing_items(paths: pa.Array) -> list[int]:
    """Items whose path clashes with an earlier item's, ascending; empty in the common case.

    Every file's name ends in ``.wav``, so a file where a directory is needed means
    some path holds ``.wav/``: without one (the common case, checked in one pass
    that allocates nothing per path) there is no clash.

    A clash is a file where another item needs a directory.  The first item
    to claim the name keeps it: a later file is escaped, or, when the file
    came first, every item below the directory it would need.  The work is a
    few vectorised passes per directory level, however many clashes there are
    (ids come from other people: a scan per clash would be quadratic).
    """
    if not pc.any(pc.match_substring(paths, SUFFIX + "/")).as_py():
        return []
    levels = _directory_levels(paths)
    if not levels:
        return []
    directories = pa.concat_arrays([unique for _, _, unique, _ in levels])
    first_claims = np.concatenate([first for _, _, _, first in levels])
    position = np.asarray(pc.index_in(paths, value_set=directories).to_numpy(zero_copy_only=False))
    files = np.flatnonzero(~np.isnan(position.astype(np.float64)))
    if len(files) == 0:
        return []
    claimed_by = first_claims[position[files].astype(np.int64)]
    losers = set(files[claimed_by < files].tolist())  # the directory came first
    lost = pc.take(paths, pa.array(files[claimed_by > files]))  # the file came first
    if len(lost):
        for items, prefixes, _, _ in levels:
            below = np.asarray(pc.is_in(prefixes, value_set=lost).to_numpy(zero_copy_only=False))
            losers.update(items[below].tolist())
    return sorted(losers)


def _directory_levels(
    paths: pa.Array,
) -> list[tuple[npt.NDArray[np.int64], pa.Array, pa.Array, npt.NDArray[np.int64]]]:
    """Per directory level: the items deep enough, their prefix at that level, the distinct
    prefixes (directories), and the first item needing each."""
    parts = pc.split_pattern(paths, "/")
    depth = np.asarray(pc.list_value_length(parts).to_numpy(zero_copy_only=False), np.int64)
    separator = pa.scalar("/", pa.large_string())
    levels = []
    for level in range(1, int(depth.max()) if len(paths) else 1):
        items = np.flatnonzero(depth > level)
        prefixes = pc.binary_join(pc.list_slice(parts.take(items), 0, level), separator)
        unique = pc.unique(prefixes)
        first = items[np.asarray(pc.index_in(unique, value_set=prefixes).to_numpy())]
        levels.append((items, prefixes, unique, first))
    return levels


def _name_bytes(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")
