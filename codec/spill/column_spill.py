"""A table written batch by batch and finished as one Arrow IPC record batch, in bounded memory.

The catalogue's tables are each one record batch (:mod:`cutfs.codec.catalogue.shard_format`),
so that a mount maps a file and reads every column in place.  Arrow's writer wants that
batch whole in memory; at 100 million cuts the cuts table alone is gigabytes.
:class:`ColumnSpill` appends each batch's column buffers to a file per buffer (offsets
rebased as they go), and :meth:`ColumnSpill.finish` lets Arrow's own writer lay out the
file, over placeholder arrays that are read-only maps of those files: Arrow hands each
body buffer to the sink as a zero-copy buffer, and the sink copies the bytes from the
spilled file in the kernel (``sendfile``), never through this process's memory.  The
result is byte for byte the file :func:`cutfs.codec.catalogue.shard_format.write_table`
writes for the same rows.

Columns may be fixed-width numbers, strings and binaries (32- or 64-bit offsets) and
lists of fixed-width numbers; they may hold no nulls (no catalogue column does).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
from dataclasses import dataclass
from typing import Final

import numpy as np
import pyarrow as pa

from cutfs.codec.catalogue.shard_format import write_table

#: Bytes copied by one ``sendfile`` call at most.
_COPY_BYTES: Final = 1 << 30


@dataclass
class _SpilledBuffer:
    """One buffer of one column, growing in its own file."""

    file: tempfile._TemporaryFileWrapper[bytes]
    bytes_written: int = 0

    def append(self, data: bytes | memoryview | pa.Buffer) -> None:
        view = memoryview(data)
        self.file.write(view)
        self.bytes_written += view.nbytes


#: A spilled buffer's read-only map (``None`` when it is empty) and the buffer.
_Mapped = tuple[mmap.mmap | None, _SpilledBuffer]


class _SpilledColumn:
    """A column's buffers: values for fixed widths; offsets and values for strings; offsets
    and child values for lists.  Offsets are kept rebased to the start of the column."""

    def __init__(self, field: pa.Field, scratch: str) -> None:
        self.field = field
        kind = field.type
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            child = kind.value_type
            if not _fixed_width(child):
                raise TypeError(f"column {field.name!r}: lists of {child} cannot be spilled")
            self._offset_type: np.dtype[np.integer] | None = np.dtype(
                np.int64 if pa.types.is_large_list(kind) else np.int32
            )
            self._value_width = child.bit_width // 8
        elif is_binary_like(kind):
            large = pa.types.is_large_string(kind) or pa.types.is_large_binary(kind)
            self._offset_type = np.dtype(np.int64 if large else np.int32)
            self._value_width = 1
        elif _fixed_width(kind):
            self._offset_type = None
            self._value_width = kind.bit_width // 8
        else:
            raise TypeError(f"column {field.name!r} of type {kind} cannot be spilled")
        count = 1 if self._offset_type is None else 2
        self.buffers = [
            _SpilledBuffer(tempfile.NamedTemporaryFile(dir=scratch, prefix="column-"))  # noqa: SIM115
            for _ in range(count)
        ]
        self._values_end = 0
        if self._offset_type is not None:
            self.buffers[0].append(np.zeros(1, self._offset_type).tobytes())

    def append(self, array: pa.Array) -> None:
        if array.null_count:
            raise ValueError(f"column {self.field.name!r} holds nulls, which cannot be spilled")
        if len(array) == 0:
            return
        if self._offset_type is None:
            values = array.buffers()[1]
            start = array.offset * self._value_width
            self.buffers[0].append(values[start : start + len(array) * self._value_width])
            return
        offsets = np.frombuffer(array.buffers()[1], dtype=self._offset_type)[
            array.offset : array.offset + len(array) + 1
        ]
        first, last = int(offsets[0]), int(offsets[-1])
        if self._values_end + last - first > np.iinfo(self._offset_type).max:
            raise ValueError(f"column {self.field.name!r} outgrows its {self._offset_type} offsets")
        rebased = offsets[1:].astype(np.int64) - first + self._values_end
        self.buffers[0].append(rebased.astype(self._offset_type).tobytes())
        if isinstance(array, pa.ListArray | pa.LargeListArray):
            child = array.values
            values = child.buffers()[1]
            first += child.offset
            last += child.offset
        else:
            values = array.buffers()[2]
        if last > first:
            assert values is not None
            width = self._value_width
            self.buffers[1].append(values[first * width : last * width])
        self._values_end += last - first

    def placeholder(self, rows: int, maps: list[_Mapped]) -> pa.Array:
        """The column as an array over read-only maps of its files (recorded in ``maps``)."""
        buffers = []
        for spilled in self.buffers:
            spilled.file.flush()
            mapped = None
            if spilled.bytes_written:
                mapped = mmap.mmap(spilled.file.fileno(), 0, access=mmap.ACCESS_READ)
            maps.append((mapped, spilled))
            buffers.append(pa.py_buffer(mapped if mapped is not None else b""))
        kind = self.field.type
        if self._offset_type is None:
            return pa.Array.from_buffers(kind, rows, [None, buffers[0]], null_count=0)
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            child = pa.Array.from_buffers(
                kind.value_type, self._values_end, [None, buffers[1]], null_count=0
            )
            return pa.Array.from_buffers(
                kind, rows, [None, buffers[0]], null_count=0, children=[child]
            )
        return pa.Array.from_buffers(kind, rows, [None, buffers[0], buffers[1]], null_count=0)

    def close(self) -> None:
        for spilled in self.buffers:
            spilled.file.close()


class ColumnSpill:
    """Rows of ``schema`` appended a batch at a time, kept in files under ``scratch``;
    :meth:`finish` writes them as one record batch (see the module docstring).

    Memory holds one appended batch at a time, whatever the number of rows.  The
    spilled files are removed by :meth:`close` (also on leaving a ``with`` block).
    """

    def __init__(self, schema: pa.Schema, scratch: str) -> None:
        self.schema = schema
        self._columns = [_SpilledColumn(field, scratch) for field in schema]
        self._rows = 0

    def __enter__(self) -> ColumnSpill:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __len__(self) -> int:
        return self._rows

    def append(self, rows: pa.RecordBatch | pa.Table) -> None:
        """Append ``rows`` (of :attr:`schema`, no nulls)."""
        if not rows.schema.equals(self.schema):
            raise ValueError(f"rows of schema {rows.schema} appended to {self.schema}")
        batches = rows.to_batches() if isinstance(rows, pa.Table) else [rows]
        for batch in batches:
            for column, array in zip(self._columns, batch.columns, strict=True):
                column.append(array)
            self._rows += batch.num_rows

    def finish(self, path: str, mode: int | None = None) -> None:
        """Write every row appended as ``path``, one record batch, atomically (as
        :func:`write_table`: a temporary name beside it, then a rename); ``mode`` sets its
        permission bits."""
        if self._rows == 0:
            write_table(path, self.schema.empty_table(), mode)
            return
        maps: list[_Mapped] = []
        partial = f"{path}.{os.getpid()}.partial"
        try:
            arrays = [column.placeholder(self._rows, maps) for column in self._columns]
            batch = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
            with open(partial, "wb") as out:
                sink = _CopyingSink(out.fileno(), maps)
                with pa.ipc.new_file(pa.PythonFile(sink, mode="w"), self.schema) as writer:
                    writer.write_batch(batch)
            del batch, arrays
            if mode is not None:
                os.chmod(partial, mode)
            os.replace(partial, path)
        finally:
            for mapped, _ in maps:
                if mapped is not None:
                    with contextlib.suppress(BufferError):  # still exported: freed with it
                        mapped.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)

    def close(self) -> None:
        for column in self._columns:
            column.close()


class _CopyingSink:
    """The file Arrow's writer writes to: metadata and padding are written as given; a body
    buffer that lies in a placeholder map is copied from its spilled file instead."""

    def __init__(self, fd: int, maps: list[_Mapped]) -> None:
        self._fd = fd
        self._position = 0
        self._spans: list[tuple[int, int, int]] = []  # (address, size, fd)
        for mapped, spilled in maps:
            if mapped is not None:
                address = pa.py_buffer(mapped).address
                self._spans.append((address, spilled.bytes_written, spilled.file.fileno()))
        self.closed = False

    def write(self, data: bytes | pa.Buffer) -> int:
        if isinstance(data, pa.Buffer):
            source = self._source_of(data)
            if source is not None:
                fd, offset = source
                size = int(data.size)
                self._copy(fd, offset, size)
                return size
            data = memoryview(data)
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
            self._position += written
        return len(data)

    def _source_of(self, data: pa.Buffer) -> tuple[int, int] | None:
        for address, size, fd in self._spans:
            if address <= data.address and data.address + data.size <= address + size:
                return fd, data.address - address
        return None

    def _copy(self, fd: int, offset: int, size: int) -> None:
        end = offset + size
        while offset < end:
            copied = os.sendfile(self._fd, fd, offset, min(end - offset, _COPY_BYTES))
            if copied == 0:
                raise OSError(f"a spilled column ended {end - offset} bytes early")
            offset += copied
            self._position += copied

    def tell(self) -> int:
        return self._position

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _fixed_width(kind: pa.DataType) -> bool:
    numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind)
    return bool(numeric and kind.bit_width % 8 == 0)


def is_binary_like(kind: pa.DataType) -> bool:
    """Whether ``kind`` is a string or binary type (32- or 64-bit offsets)."""
    return bool(
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    )
