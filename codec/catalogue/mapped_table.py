"""Arrow tables read in place from memory-mapped files, and typed views of their columns.

Catalogues (file trees, cuts and recordings tables) hold millions of rows.
Opening one maps the file and reads nothing per row: columns are numpy
views of the mapped buffers or sequences that decode one value when asked,
so a lookup touches the few pages it reads and memory does not grow with
the number of rows.  ``combine_chunks`` and ``to_numpy`` would touch (or
copy) every page, which is why they are avoided here.
"""

from __future__ import annotations

import contextlib
import mmap
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, overload

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from cutfs.codec.errors import ShardFormatError

#: Every map made by :func:`read_mapped` that is still alive (see :func:`release_mapped_pages`).
_MAPS: weakref.WeakSet[mmap.mmap] = weakref.WeakSet()


def release_mapped_pages() -> None:
    """Drop the pages of every table map from this process's page tables (MADV_DONTNEED).

    The pages stay in the kernel's page cache, as any file's; the next access
    faults them back in from there (a minor fault).  Called now and then by a
    mount, so that what a scan of the catalogue touched (rendering all of
    ``wav.scp`` reads every id) is not counted as the daemon's memory for the
    rest of its life.  ``cutfs pack`` calls it between passes over its spilled
    columns for the same reason.
    """
    for mapped in list(_MAPS):
        with contextlib.suppress(ValueError, OSError):  # closed meanwhile
            mapped.madvise(mmap.MADV_DONTNEED)


def track_map(mapped: mmap.mmap) -> None:
    """Have :func:`release_mapped_pages` release ``mapped`` too."""
    _MAPS.add(mapped)


def read_mapped(path: str, required: pa.Schema | None = None) -> pa.Table:
    """The table in an Arrow IPC file, over a read-only map advised random access.

    A fault then reads the page it needs, not the kernel's read-ahead around
    it (128 KiB or more).  ``required`` lists fields the table must have, with
    their types (it may have others).  Raises :class:`ShardFormatError`.
    """
    try:
        with open(path, "rb") as file:
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        if hasattr(mmap, "MADV_RANDOM"):
            mapped.madvise(mmap.MADV_RANDOM)
        _MAPS.add(mapped)
        table = pa.ipc.open_file(pa.py_buffer(mapped)).read_all()
    except (OSError, ValueError, pa.ArrowException) as exc:
        raise ShardFormatError(f"cannot read table: {exc}", where=path) from exc
    for field in required or ():
        found = table.schema.field(field.name) if field.name in table.schema.names else None
        if found is None or not _compatible(found.type, field.type):
            raise ShardFormatError(
                f"column {field.name!r} is missing or of another type", where=path
            )
    return table


def _compatible(found: pa.DataType, wanted: pa.DataType) -> bool:
    """Whether a column of type ``found`` can be read as ``wanted``: the same type, or
    strings (binaries) with the other offset width, which :class:`BinaryColumn` reads alike
    (cuts tables of shard format 1 have 32-bit ones)."""
    if found.equals(wanted):
        return True
    strings = (pa.string(), pa.large_string())
    binaries = (pa.binary(), pa.large_binary())
    return any(found in group and wanted in group for group in (strings, binaries))


def single_chunk(table: pa.Table, name: str) -> pa.Array:
    """A column's values as one array, in place when the table was written as one batch.

    Tables built in memory may have several chunks; they are combined (a copy,
    of memory that is already resident).  Nulls are refused.
    """
    if name not in table.schema.names:
        raise ShardFormatError(f"column {name!r} is missing")
    column = table.column(name)
    if column.null_count:
        raise ShardFormatError(f"column {name!r} has missing values")
    if column.num_chunks == 1:
        return column.chunk(0)
    if column.num_chunks == 0:
        return pa.array([], type=column.type)
    return column.combine_chunks()


def int_view(table: pa.Table, name: str) -> npt.NDArray[np.int64]:
    """An integer column as int64: a view of the mapped buffer when it is stored as int64,
    else a widened copy (for small tables: see :func:`native_int_view`)."""
    values = native_int_view(table, name)
    return values if values.dtype == np.int64 else values.astype(np.int64)


def native_int_view(table: pa.Table, name: str) -> npt.NDArray[Any]:
    """An integer column as stored (int32, uint32, ...), a view of the mapped buffer: no
    copy, whatever its width (a column of millions is not read at open)."""
    array = single_chunk(table, name)
    if not pa.types.is_integer(array.type):
        raise ShardFormatError(f"column {name!r} is not of integers")
    width = np.dtype(array.type.to_pandas_dtype())
    return np.frombuffer(array.buffers()[1], dtype=width)[array.offset : array.offset + len(array)]


def float_view(table: pa.Table, name: str) -> npt.NDArray[np.float64]:
    array = single_chunk(table, name)
    if not pa.types.is_float64(array.type):
        raise ShardFormatError(f"column {name!r} is not of float64")
    return np.frombuffer(array.buffers()[1], dtype=np.float64)[
        array.offset : array.offset + len(array)
    ]


class BinaryColumn(Sequence[bytes]):
    """A binary or string column read in place: value ``i`` as bytes, nothing decoded ahead."""

    def __init__(self, array: pa.Array) -> None:
        if pa.types.is_string(array.type) or pa.types.is_binary(array.type):
            offset_type: type[np.int32] | type[np.int64] = np.int32
        elif pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type):
            offset_type = np.int64
        else:
            raise ShardFormatError(f"a column of {array.type} is not of strings")
        _, offsets, values = array.buffers()[:3]
        self._offsets = np.frombuffer(offsets, dtype=offset_type)[
            array.offset : array.offset + len(array) + 1
        ]
        self._values = memoryview(values) if values is not None else memoryview(b"")
        self._length = len(array)
        if self._length and (
            int(self._offsets[0]) < 0 or int(self._offsets[-1]) > len(self._values)
        ):
            raise ShardFormatError("a string column points outside its values")

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | Sequence[bytes]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._length))]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError(index)
        start, end = int(self._offsets[index]), int(self._offsets[index + 1])
        if not 0 <= start <= end <= len(self._values):
            raise ShardFormatError(f"string {index} of a column is out of its bounds")
        return bytes(self._values[start:end])

    def byte_length(self, index: int) -> int:
        """The length in bytes of value ``index``, without reading it."""
        return int(self._offsets[index + 1]) - int(self._offsets[index])


class StringColumn(Sequence[str]):
    """A string column read in place, value ``i`` decoded when asked (undecodable bytes
    kept as surrogates, as file names are)."""

    def __init__(self, array: pa.Array) -> None:
        self.raw = BinaryColumn(array)

    def __len__(self) -> int:
        return len(self.raw)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...

    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self.raw)))]
        return self.raw[index].decode("utf-8", "surrogateescape")

    @classmethod
    def of(cls, table: pa.Table, name: str) -> StringColumn:
        return cls(single_chunk(table, name))


class ListColumn:
    """A list-of-integers column read in place: row ``i`` as a numpy view (no copy when the
    values are stored as int64)."""

    def __init__(self, array: pa.Array) -> None:
        if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
            raise ShardFormatError(f"a column of {array.type} is not of lists")
        if not pa.types.is_integer(array.type.value_type):
            raise ShardFormatError(f"a column of {array.type} is not of lists of integers")
        offset_type = np.int64 if pa.types.is_large_list(array.type) else np.int32
        self._offsets = np.frombuffer(array.buffers()[1], dtype=offset_type)[
            array.offset : array.offset + len(array) + 1
        ]
        values = array.values
        width = np.dtype(values.type.to_pandas_dtype())
        self._values = np.frombuffer(values.buffers()[1], dtype=width)[
            values.offset : values.offset + len(values)
        ]
        self._length = len(array)

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> npt.NDArray[np.int64]:
        if not 0 <= index < self._length:
            raise IndexError(index)
        start, end = int(self._offsets[index]), int(self._offsets[index + 1])
        if not 0 <= start <= end <= len(self._values):
            raise ShardFormatError(f"list {index} of a column is out of its bounds")
        values = self._values[start:end]
        return values if values.dtype == np.int64 else values.astype(np.int64)

    @classmethod
    def of(cls, table: pa.Table, name: str) -> ListColumn:
        return cls(single_chunk(table, name))


_Row = TypeVar("_Row")


class RowSequence(Sequence[_Row]):
    """A sequence made as it is read: ``row(k)`` for ``k < count``, then the fixed
    ``extras`` (listings of millions of entries, none made ahead)."""

    def __init__(self, count: int, row: Callable[[int], _Row], extras: Sequence[_Row] = ()):
        self._count = count
        self._row = row
        self._extras = extras

    def __len__(self) -> int:
        return self._count + len(self._extras)

    @overload
    def __getitem__(self, position: int) -> _Row: ...

    @overload
    def __getitem__(self, position: slice) -> Sequence[_Row]: ...

    def __getitem__(self, position: int | slice) -> _Row | Sequence[_Row]:
        if isinstance(position, slice):
            return [self[k] for k in range(*position.indices(len(self)))]
        if not 0 <= position < len(self):
            raise IndexError(position)
        if position < self._count:
            return self._row(position)
        return self._extras[position - self._count]
