"""The directory tree of served files, written once and searched in place, memory-mapped.

A tree serves items (cuts, recordings) numbered ``0..n-1`` as files whose
relative paths come from their ids (:mod:`cutfs.codec.path_escape`).  It is
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

import mmap
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, overload

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from cutfs.codec.errors import ShardFormatError, SourceError
from cutfs.codec.path_escape import escape_id, unescape_path
from cutfs.codec.shard_format import write_table

ROOT: Final = 0
_ENTRIES: Final = ".entries.arrow"
_DIRECTORIES: Final = ".directories.arrow"
_PATHS: Final = ".paths.arrow"
#: Ids escaped per Arrow chunk.
_BATCH: Final = 1 << 20

_ENTRY_SCHEMA: Final = pa.schema(
    [
        ("directory", pa.uint32()),
        ("name", pa.large_binary()),
        ("child", pa.int64()),
        ("item", pa.int64()),
    ]
)
_DIRECTORY_SCHEMA: Final = pa.schema(
    [
        ("first_entry", pa.int64()),
        ("entry_count", pa.int64()),
        ("parent", pa.int64()),
        ("subdirectories", pa.int64()),
    ]
)
_PATH_SCHEMA: Final = pa.schema([("path", pa.large_string())])


@dataclass(frozen=True, slots=True)
class Entry:
    """One name in a directory: a subdirectory (``child``) or a file (``item``)."""

    name: bytes
    child: int  # -1 for a file
    item: int  # -1 for a directory

    @property
    def is_directory(self) -> bool:
        return self.child >= 0


def served_paths(ids: Iterable[str]) -> pa.Array:
    """The relative path of every id (a large_string array), clashes resolved.

    Ids are escaped in batches into Arrow memory (no Python string per id is
    kept); clashes are found with vectorised kernels and, being rare,
    resolved one by one (see the module docstring).
    """
    chunks: list[pa.Array] = []
    batch: list[str] = []
    for identifier in ids:
        batch.append(escape_id(identifier))
        if len(batch) == _BATCH:
            chunks.append(pa.array(batch, pa.large_string()))
            batch = []
    chunks.append(pa.array(batch, pa.large_string()))
    paths = pa.concat_arrays(chunks)
    for _ in range(3):  # escaped paths start with "%", which no plain path does
        losers = _clashing_items(paths)
        if not losers:
            return paths
        replaced = paths.to_pylist()
        for item in losers:
            replaced[item] = escape_id(unescape_path(replaced[item]), force=True)
        paths = pa.array(replaced, pa.large_string())
    raise SourceError(f"ids give clashing paths, for example {paths[losers[0]].as_py()!r}")


def write_file_tree(prefix: str, paths: Sequence[str] | pa.Array) -> None:
    """Write the tree of ``paths`` (item ``i`` at ``paths[i]``, as :func:`served_paths` makes
    them) to ``<prefix>.entries.arrow``, ``.directories.arrow`` and ``.paths.arrow``.

    Built with Arrow's vectorised kernels, level by level of directories: memory is a few
    times the paths' own bytes, whatever their number.
    """
    path_array = pa.array(paths, pa.large_string()) if not isinstance(paths, pa.Array) else paths
    path_array = path_array.cast(pa.large_string())
    count = len(path_array)
    parts = pc.split_pattern(path_array, "/")
    depth = np.asarray(pc.list_value_length(parts).to_numpy(zero_copy_only=False), np.int64)
    item_directory = np.zeros(count, dtype=np.int64)  # the deepest directory seen so far
    parents: list[npt.NDArray[np.int64]] = [np.array([-1], dtype=np.int64)]
    directory_entries: list[pa.Table] = []
    separator = pa.scalar("/", pa.large_string())
    next_number = 1
    for level in range(1, int(depth.max()) if count else 1):
        items = np.flatnonzero(depth > level)
        prefixes = pc.binary_join(pc.list_slice(parts.take(items), 0, level), separator)
        unique = pc.unique(prefixes)
        numbers = next_number + np.arange(len(unique), dtype=np.int64)
        first_seen = items[np.asarray(pc.index_in(unique, value_set=prefixes).to_numpy())]
        names = pc.list_element(parts.take(first_seen), level - 1)
        parents.append(item_directory[first_seen])
        directory_entries.append(
            _entry_table(item_directory[first_seen], names, numbers, np.full(len(unique), -1))
        )
        positions = np.asarray(pc.index_in(prefixes, value_set=unique).to_numpy())
        item_directory[items] = numbers[positions]
        next_number += len(unique)
    file_names = pc.replace_substring_regex(path_array, r"^.*/", "")
    files = _entry_table(
        item_directory, file_names, np.full(count, -1), np.arange(count, dtype=np.int64)
    )
    entries = pa.concat_tables([*directory_entries, files])
    order = pc.sort_indices(entries, [("directory", "ascending"), ("name", "ascending")])
    entries = entries.take(order)
    directory_column = np.asarray(entries.column("directory").to_numpy(), dtype=np.int64)
    parent = np.concatenate(parents)
    numbers = np.arange(len(parent))
    first = np.searchsorted(directory_column, numbers, side="left")
    end = np.searchsorted(directory_column, numbers, side="right")
    children = np.asarray(entries.column("child").to_numpy(), dtype=np.int64)
    subdirectories = np.bincount(directory_column[children >= 0], minlength=len(parent))
    directories = pa.table([first, end - first, parent, subdirectories], schema=_DIRECTORY_SCHEMA)
    write_table(prefix + _ENTRIES, entries.combine_chunks())
    write_table(prefix + _DIRECTORIES, directories)
    write_table(prefix + _PATHS, pa.table([path_array], schema=_PATH_SCHEMA))


def _entry_table(
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
        schema=_ENTRY_SCHEMA,
    )


class FileTree:
    """A tree written by :func:`write_file_tree`, mapped (see the module docstring).

    Raises :class:`ShardFormatError` when the files are missing, of another
    schema, or inconsistent (rows out of order, ranges outside the file).
    """

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        entries = _read_mapped(prefix + _ENTRIES, _ENTRY_SCHEMA)
        directories = _read_mapped(prefix + _DIRECTORIES, _DIRECTORY_SCHEMA)
        paths = _read_mapped(prefix + _PATHS, _PATH_SCHEMA)
        self._names = _BinaryColumn(_single_chunk(entries, "name"))
        self._children = _int_view(entries, "child")
        self._items = _int_view(entries, "item")
        self._first = _int_view(directories, "first_entry")
        self._counts = _int_view(directories, "entry_count")
        self._parents = _int_view(directories, "parent")
        self._subdirectories = _int_view(directories, "subdirectories")
        self._paths = _BinaryColumn(_single_chunk(paths, "path"))
        self._check(len(entries))

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
        row = bisect_left(self._names, name, first, end)
        if row == end or self._names[row] != name:
            return None
        return self.entry_at(row)

    def entries(self, directory: int) -> Sequence[Entry]:
        """A directory's entries in name order; position ``k`` is its ``k``-th row."""
        return _Listing(self, int(self._first[directory]), int(self._counts[directory]))

    def entry_at(self, row: int) -> Entry:
        """The entry at a row, its numbers checked here rather than for all rows at open
        (a check of every row would touch every page of a catalogue of millions)."""
        child, item = int(self._children[row]), int(self._items[row])
        if not (-1 <= child < self.directory_count and -1 <= item < self.item_count) or (
            (child < 0) == (item < 0)
        ):
            raise ShardFormatError(f"file tree row {row} is inconsistent", where=self._prefix)
        return Entry(self._names[row], child, item)

    def path(self, item: int) -> str:
        """The relative path of an item's file (``a/b.wav``)."""
        return self._paths[item].decode("utf-8", "surrogateescape")

    def _check(self, entry_count: int) -> None:
        first, counts = self._first, self._counts
        if (
            (counts < 0).any()
            or (first < 0).any()
            or ((first + counts) > entry_count).any()
            or (self._parents[1:] < 0).any()
            or (self._parents >= len(first)).any()
            or len(self._children) != entry_count
            or len(self._items) != entry_count
        ):
            raise ShardFormatError("the file tree's rows are inconsistent", where=self._prefix)


class _Listing(Sequence[Entry]):
    def __init__(self, tree: FileTree, first: int, count: int) -> None:
        self._tree = tree
        self._first = first
        self._count = count

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, position: int) -> Entry: ...

    @overload
    def __getitem__(self, position: slice) -> Sequence[Entry]: ...

    def __getitem__(self, position: int | slice) -> Entry | Sequence[Entry]:
        if isinstance(position, slice):
            return [self[k] for k in range(*position.indices(self._count))]
        if not 0 <= position < self._count:
            raise IndexError(position)
        return self._tree.entry_at(self._first + position)


class _BinaryColumn(Sequence[bytes]):
    """A binary or string Arrow array read in place: value ``i`` as bytes, nothing decoded."""

    def __init__(self, array: pa.Array) -> None:
        _, offsets, values = array.buffers()[:3]
        self._offsets = np.frombuffer(offsets, dtype=np.int64)[
            array.offset : array.offset + len(array) + 1
        ]
        self._values = memoryview(values) if values is not None else memoryview(b"")
        self._length = len(array)

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | Sequence[bytes]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._length))]
        start, end = int(self._offsets[index]), int(self._offsets[index + 1])
        return bytes(self._values[start:end])


def _clashing_items(paths: pa.Array) -> list[int]:
    """Items whose path clashes with an earlier item's, ascending; empty in the common case.

    A clash is a file where another item needs a directory.  The first item
    to claim the name keeps it: a later file is escaped, or, when the file
    came first, every item below the directory it would need.  The work is a
    few vectorised passes per directory level, however many clashes there are
    (ids come from other people: a scan per clash would be quadratic).
    """
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


def _single_chunk(table: pa.Table, name: str) -> pa.Array:
    """A column's one chunk, in place (``combine_chunks`` and ``to_numpy`` touch or copy
    every page of a mapped column: a catalogue of millions would be read whole)."""
    column = table.column(name)
    if column.num_chunks == 0:
        return pa.array([], type=column.type)
    if column.num_chunks != 1 or column.null_count:
        raise ShardFormatError(f"column {name!r} is not one chunk without nulls")
    return column.chunk(0)


def _int_view(table: pa.Table, name: str) -> npt.NDArray[np.int64]:
    array = _single_chunk(table, name)
    width = np.dtype(array.type.to_pandas_dtype())
    values = np.frombuffer(array.buffers()[1], dtype=width)[
        array.offset : array.offset + len(array)
    ]
    return values if width == np.int64 else values.astype(np.int64)


def _read_mapped(path: str, schema: pa.Schema) -> pa.Table:
    """A table over a read-only map of ``path``, advised random access: a lookup faults in
    the pages it reads, not the kernel's read-ahead around each (128 KiB or more)."""
    try:
        with open(path, "rb") as file:
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        if hasattr(mmap, "MADV_RANDOM"):
            mapped.madvise(mmap.MADV_RANDOM)
        table = pa.ipc.open_file(pa.py_buffer(mapped)).read_all()
    except (OSError, pa.ArrowException) as exc:
        raise ShardFormatError(f"cannot read the file tree: {exc}", where=path) from exc
    if not table.schema.equals(schema):
        raise ShardFormatError("the file tree has another schema", where=path)
    return table
