"""A map from text keys to text values larger than memory, asked in ascending key order.

Kaldi's ``utt2spk`` and ``text`` give a value per utterance; joining them to millions
of cuts with a dict would hold a Python object per line.  :class:`SortedLookup` sorts
the (key, value) rows with an :class:`ExternalSort` instead, and answers lookups for
batches of keys that ascend from one call to the next (a sort-merge join): each call
reads the sorted rows only as far as its highest key, so what is held at once is a
batch of rows, whatever the number of lines.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutfs.codec.spill.external_sort import ExternalSort

#: The rows of a lookup.
LOOKUP_SCHEMA: Final = pa.schema([("key", pa.string()), ("value", pa.string())])


class SortedLookup:
    """Values by key, from rows added in any order (see the module docstring).

    Where a key is added more than once, the row added last wins, as in a dict built
    from the rows.  Add every row, then call :meth:`values_of` with batches of keys in
    ascending byte order (each batch's first key at least the previous batch's last).
    Use as a context manager, or call :meth:`close`: it removes the spilled runs.
    """

    def __init__(self, scratch: str | None, memory_bytes: int) -> None:
        self._sort = ExternalSort(LOOKUP_SCHEMA, "key", scratch, memory_bytes)
        self._sorted: Iterator[pa.RecordBatch] | None = None
        #: Sorted rows read but above every key asked so far.
        self._ahead: pa.RecordBatch | None = None
        self._highest_asked: bytes | None = None

    def __enter__(self) -> SortedLookup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def add(self, keys: list[str], values: list[str]) -> None:
        """Add rows; only before the first :meth:`values_of`."""
        if self._sorted is not None:
            raise RuntimeError("rows cannot be added after a lookup")
        self._sort.add(
            pa.record_batch(
                [pa.array(keys, pa.string()), pa.array(values, pa.string())], schema=LOOKUP_SCHEMA
            )
        )

    def values_of(self, keys: pa.Array) -> pa.Array:
        """The value of each of ``keys`` (sorted, and not below the keys of the previous
        call), null where no row has the key."""
        values = pa.nulls(len(keys), pa.string())
        if len(keys) == 0:
            return values
        highest = _as_bytes(keys[-1].as_py())
        lowest = _as_bytes(keys[0].as_py())
        if self._highest_asked is not None and lowest < self._highest_asked:
            raise ValueError("keys looked up out of order")
        self._highest_asked = highest
        if self._sorted is None:
            self._sorted = self._sort.sorted_batches()
        bound = pa.scalar(highest, pa.large_binary())
        while True:
            rows = self._ahead if self._ahead is not None else next(self._sorted, None)
            if rows is None:
                return values
            within = pc.less_equal(rows.column("key").cast(pa.large_binary()), bound)
            count = pc.sum(within).as_py() or 0
            if count:
                values = _overlaid(values, keys, rows.slice(0, count))
            if count < rows.num_rows:
                self._ahead = rows.slice(count)
                return values
            self._ahead = None

    def close(self) -> None:
        self._ahead = None
        self._sorted = None
        self._sort.close()


def _overlaid(values: pa.Array, keys: pa.Array, rows: pa.RecordBatch) -> pa.Array:
    """``values`` with the value of each key that ``rows`` (sorted by key) hold: the last
    row of a key wins over earlier ones, and over what ``values`` held for it."""
    row_keys = rows.column("key")
    if rows.num_rows > 1:
        repeated = pc.equal(row_keys.slice(0, rows.num_rows - 1), row_keys.slice(1))
        last = np.ones(rows.num_rows, dtype=bool)
        last[:-1] = ~np.asarray(repeated.to_numpy(zero_copy_only=False), dtype=bool)
        rows = rows.filter(pa.array(last))
    found = pc.index_in(keys, value_set=rows.column("key"))
    taken = pc.take(rows.column("value"), found)
    return pc.if_else(pc.is_valid(found), taken, values)


def _as_bytes(key: str | bytes) -> bytes:
    return key.encode("utf-8") if isinstance(key, str) else key
