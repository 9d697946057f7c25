"""The order of the lines of per-cut Kaldi files, and where each line starts, on disk.

Kaldi's tools want ``wav.scp`` sorted by key (bytes, as ``LC_ALL=C sort``).
Sorting ten million ids when a mount opens would take seconds and
gigabytes, so the order is computed when the catalogue is written and
stored as a table (``<name>.arrow``): ``cut`` (the cut on each line, in key
order) and ``text_end`` (the running total of the bytes of each line's
variable parts, its key and its file's relative path, through that line).

A mount at ``M`` serves line ``i`` of ``wav.scp`` as ``key + " " + M/cuts/
+ path + "\\n"``: with ``c = len(M/cuts/) + 2`` it starts at byte
``text_end[i - 1] + i * c``, so any byte range of the file is found by a
binary search and rendered alone, and the exact size is known at once.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from cutfs.codec.catalogue.mapped_table import int_view, read_mapped
from cutfs.codec.catalogue.row_order import rows_in_order
from cutfs.codec.catalogue.shard_format import write_table
from cutfs.codec.errors import ShardFormatError

KALDI_ORDER_FILE: Final = "kaldi-order.arrow"
KALDI_ORDER_SCHEMA: Final = pa.schema([("cut", pa.int64()), ("text_end", pa.int64())])
#: More text than any order of cuts could need (a terabyte).
_MOST_TEXT_BYTES: Final = 1 << 40
#: Python's whitespace (``str.isspace``), which :func:`kaldi_key` encodes, in RE2 syntax.
_WHITESPACE: Final = (
    r"[\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\x{1680}\x{2000}-\x{200a}"
    r"\x{2028}\x{2029}\x{202f}\x{205f}\x{3000}]"
)


def kaldi_key(identifier: str) -> str:
    """An id as a Kaldi key: whitespace (which would split the line) is percent-encoded."""
    if identifier and not any(character.isspace() for character in identifier):
        return identifier
    encoded = (f"%{ord(c):02X}" if c.isspace() or c == "%" else c for c in identifier)
    return "".join(encoded) or "%"


def kaldi_keys(ids: pa.Array) -> pa.Array:
    """:func:`kaldi_key` of every id of a string array: ids without whitespace are kept
    by one vectorised kernel, the others encoded one by one."""
    ids = ids.cast(pa.large_string())
    odd = pc.or_(pc.match_substring_regex(ids, _WHITESPACE), pc.equal(pc.binary_length(ids), 0))
    if not pc.any(odd).as_py():
        return ids
    rows = np.flatnonzero(np.asarray(odd.to_numpy(zero_copy_only=False), dtype=bool))
    encoded = pa.array([kaldi_key(i) for i in ids.take(pa.array(rows)).to_pylist()], ids.type)
    positions = np.zeros(len(ids), dtype=np.int64)
    positions[rows] = np.arange(len(rows))
    return pc.if_else(odd, encoded.take(pa.array(positions)), ids)


def write_kaldi_order(
    path: str, cut_ids: pa.Array, cut_paths: pa.Array, mode: int | None = None
) -> None:
    """Write the order table of cuts with these ids and served paths (see the module
    docstring); ``mode`` sets the file's permission bits."""
    keys = kaldi_keys(cut_ids)
    if rows_in_order(keys):
        order = pa.array(np.arange(len(keys), dtype=np.uint64))
    else:
        order = pc.sort_indices(keys.cast(pa.large_binary()))
    lengths = pc.add(
        pc.binary_length(keys).cast(pa.int64()),
        pc.binary_length(cut_paths.cast(pa.large_string())).cast(pa.int64()),
    )  # taken in order as numbers, not as strings
    line_bytes = np.asarray(lengths.to_numpy(zero_copy_only=False), dtype=np.int64)
    text_end = np.cumsum(line_bytes[np.asarray(order.to_numpy(), dtype=np.int64)])
    table = pa.table(
        [pa.array(np.asarray(order.to_numpy(), dtype=np.int64)), pa.array(text_end)],
        schema=KALDI_ORDER_SCHEMA,
    )
    write_table(path, table, mode)


class KaldiOrder:
    """An order table, mapped (see the module docstring)."""

    def __init__(self, path: str, cut_count: int) -> None:
        table = read_mapped(path, KALDI_ORDER_SCHEMA)
        self.cuts: npt.NDArray[np.int64] = int_view(table, "cut")
        self.text_ends: npt.NDArray[np.int64] = int_view(table, "text_end")
        self._cut_count = cut_count
        if len(self.cuts) != cut_count or len(self.text_ends) != cut_count:
            raise ShardFormatError("the Kaldi order has another number of cuts", where=path)
        if cut_count and not 0 <= int(self.text_ends[-1]) < _MOST_TEXT_BYTES:
            raise ShardFormatError("the Kaldi order's text is of no possible size", where=path)

    def __len__(self) -> int:
        return len(self.cuts)

    def cut_at(self, line: int) -> int:
        """The cut on line ``line``, checked against the number of cuts here rather than
        for every line at open (the column is mapped; a check of all would read it all)."""
        if not 0 <= line < len(self.cuts):  # text ends that do not match the lines
            raise ShardFormatError(f"the Kaldi order has no line {line}")
        cut = int(self.cuts[line])
        if not 0 <= cut < self._cut_count:
            raise ShardFormatError(f"line {line} of the Kaldi order names no cut ({cut})")
        return cut

    def line_start(self, line: int, constant_bytes: int) -> int:
        """Where line ``line`` starts when each line adds ``constant_bytes`` to its key and
        path; ``line == len(self)`` gives the file's size."""
        before = int(self.text_ends[line - 1]) if line > 0 else 0
        return before + line * constant_bytes

    def line_at(self, offset: int, constant_bytes: int) -> int:
        """The line holding byte ``offset`` (a binary search over the mapped column)."""
        low, high = 0, len(self.cuts)
        while low < high:  # the first line starting after offset, less one
            middle = (low + high) // 2
            if self.line_start(middle + 1, constant_bytes) <= offset:
                low = middle + 1
            else:
                high = middle
        return low
