"""Rows sorted by a key whatever their number: sorted runs spilled to disk, merged k ways.

This is how databases build indexes larger than memory.  Rows are added a batch at
a time; once the rows held reach the run budget they are sorted (Arrow's stable
``sort_indices``) and written to a run file (Arrow IPC, in small batches).
:meth:`ExternalSort.sorted_batches` then merges the runs: it reads one batch of each,
emits at once every row below the smallest of their last keys (those rows can only be
followed by greater ones) and the rows equal to it that no earlier run may still hold,
sorted among themselves, and reads on.  With
more runs than :data:`MAX_FAN_IN` the runs are first merged into longer ones, so that
the batches read at once stay within the budget.  When every row fits in one run,
nothing is written to disk.

The key is one column of strings or binaries, compared as bytes; a caller sorting by
several fields packs them into one key (big-endian numbers first).  Equal keys keep
the order the rows were added in, so a caller can keep the first of duplicates.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from cutfs.codec.spill.column_spill import is_binary_like

#: Runs merged at once at most (more are merged in passes).
MAX_FAN_IN: Final = 32
#: The least a run may hold, whatever the budget (a tiny budget must still make progress).
_LEAST_RUN_BYTES: Final = 1 << 14


class ExternalSort:
    """Rows of ``schema`` sorted by the column ``key`` in at most ``memory_bytes`` of
    buffered rows (see the module docstring); run files go in ``scratch``, or with
    ``None`` in a private temporary directory made when the first run is written.

    Use as a context manager, or call :meth:`close`: it removes the run files.
    """

    def __init__(self, schema: pa.Schema, key: str, scratch: str | None, memory_bytes: int) -> None:
        kind = schema.field(key).type
        if not is_binary_like(kind):
            raise TypeError(f"the sort key {key!r} is {kind}, not strings or binaries")
        self.schema = schema
        self.key = key
        self._scratch = scratch
        self._own_scratch: tempfile.TemporaryDirectory[str] | None = None
        #: Rows held before a run is sorted and written: a quarter of the budget (the sort
        #: copies them; a merge holds a batch of each run, sorted and copied again).
        self.run_bytes = max(memory_bytes // 4, _LEAST_RUN_BYTES)
        self._held: list[pa.RecordBatch] = []
        self._held_bytes = 0
        self._runs: list[str] = []
        self.rows = 0

    def __enter__(self) -> ExternalSort:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def runs_written(self) -> int:
        """Run files written so far (0 while every row fits in memory)."""
        return len(self._runs)

    def add(self, rows: pa.RecordBatch | pa.Table) -> None:
        """Add rows (of :attr:`schema`); a run is written when the budget is reached."""
        if not rows.schema.equals(self.schema):
            raise ValueError(f"rows of schema {rows.schema} added to a sort of {self.schema}")
        for batch in rows.to_batches() if isinstance(rows, pa.Table) else [rows]:
            self._held.append(batch)
            self._held_bytes += batch.nbytes
            self.rows += batch.num_rows
            if self._held_bytes >= self.run_bytes:
                self._runs.append(self._write_run(self._sorted_held()))

    def sorted_batches(self) -> Iterator[pa.RecordBatch]:
        """Every row added, in key order, as batches of varying size.  Call once."""
        if not self._runs:
            table = self._sorted_held()
            yield from table.to_batches(max_chunksize=self._batch_rows(table))
            return
        if self._held:
            self._runs.append(self._write_run(self._sorted_held()))
        while len(self._runs) > MAX_FAN_IN:
            # The first runs merged into one that takes their place: runs stay in the order
            # their rows were added, which keeps equal keys in that order.
            group, rest = self._runs[:MAX_FAN_IN], self._runs[MAX_FAN_IN:]
            self._runs = [self._write_run_batches(self._merged(group)), *rest]
            for path in group:
                _remove(path)
        yield from self._merged(self._runs)

    def close(self) -> None:
        self._held = []
        for path in self._runs:
            _remove(path)
        self._runs = []
        if self._own_scratch is not None:
            self._own_scratch.cleanup()
            self._own_scratch = None

    def _sorted_held(self) -> pa.Table:
        table = pa.Table.from_batches(self._held, schema=self.schema)
        self._held, self._held_bytes = [], 0
        if table.num_rows < 2:
            return table.combine_chunks()
        order = pc.sort_indices(table, sort_keys=[(self.key, "ascending")])
        return table.take(order)

    def _batch_rows(self, table: pa.Table) -> int:
        """Rows per batch of a run: small enough that MAX_FAN_IN of them fit the budget."""
        if table.num_rows == 0:
            return 1
        row_bytes = max(int(table.nbytes) // int(table.num_rows), 1)
        return max(self.run_bytes // (MAX_FAN_IN * row_bytes), 64)

    def _write_run(self, table: pa.Table) -> str:
        return self._write_run_batches(iter(table.to_batches()))

    def _write_run_batches(self, batches: Iterator[pa.RecordBatch]) -> str:
        """Write sorted batches as a run file, in pieces of :meth:`_batch_rows`."""
        file = tempfile.NamedTemporaryFile(  # noqa: SIM115 - named, kept until merged
            dir=self._run_directory(), prefix="run-", suffix=".arrow", delete=False
        )
        try:
            with pa.PythonFile(file, mode="w") as sink, pa.ipc.new_file(sink, self.schema) as out:
                for batch in batches:
                    table = pa.Table.from_batches([batch])
                    for piece in table.to_batches(self._batch_rows(table)):
                        out.write_batch(piece)
        except BaseException:
            file.close()
            _remove(file.name)
            raise
        file.close()
        return file.name

    def _run_directory(self) -> str:
        if self._scratch is not None:
            return self._scratch
        if self._own_scratch is None:
            self._own_scratch = tempfile.TemporaryDirectory(prefix="cutfs-sort-")
        return self._own_scratch.name

    def _merged(self, paths: list[str]) -> Iterator[pa.RecordBatch]:
        """The rows of sorted run files, merged into key order."""
        with contextlib.ExitStack() as stack:
            cursors = [_RunCursor(stack.enter_context(pa.OSFile(p, "rb")), self.key) for p in paths]
            active = [cursor for cursor in cursors if cursor.load()]
            while active:
                last_keys = [cursor.last_key() for cursor in active]
                bound = min(last_keys)
                # Rows equal to the bound may go on in the next batch of the first run that
                # ends on it: later runs keep theirs until that run has passed the bound.
                first = last_keys.index(bound)
                parts = [
                    cursor.take_through(bound, inclusive=number <= first)
                    for number, cursor in enumerate(active)
                ]
                merged = pa.Table.from_batches([p for p in parts if p.num_rows], self.schema)
                if merged.num_rows > 1:
                    merged = merged.take(pc.sort_indices(merged, [(self.key, "ascending")]))
                yield from merged.to_batches()
                active = [cursor for cursor in active if cursor.rows_left() or cursor.load()]


class _RunCursor:
    """Where a merge stands in one run file: the batch read, and how much of it is taken."""

    def __init__(self, source: pa.NativeFile, key: str) -> None:
        self._reader = pa.ipc.open_file(source)
        self._key = key
        self._next_batch = 0
        self._batch: pa.RecordBatch | None = None

    def load(self) -> bool:
        """Read the run's next (non-empty) batch; ``False`` at its end."""
        while self._next_batch < self._reader.num_record_batches:
            self._batch = self._reader.get_batch(self._next_batch)
            self._next_batch += 1
            if self._batch.num_rows:
                return True
        self._batch = None
        return False

    def rows_left(self) -> int:
        return 0 if self._batch is None else self._batch.num_rows

    def last_key(self) -> bytes:
        assert self._batch is not None
        value = self._batch.column(self._key)[-1].as_py()
        return value.encode("utf-8") if isinstance(value, str) else value

    def take_through(self, bound: bytes, *, inclusive: bool) -> pa.RecordBatch:
        """The batch's rows whose key is below ``bound``, or at most ``bound`` when
        ``inclusive`` (a prefix: the run is sorted)."""
        assert self._batch is not None
        keys = self._batch.column(self._key).cast(pa.large_binary())
        compare = pc.less_equal if inclusive else pc.less
        below = compare(keys, pa.scalar(bound, pa.large_binary()))
        count = pc.sum(below).as_py() or 0
        taken = self._batch.slice(0, count)
        self._batch = self._batch.slice(count)
        return taken


def repeats_of_previous(
    keys: pa.Array, previous: object | None
) -> tuple[npt.NDArray[np.bool_], object | None]:
    """For a batch of sorted keys: which rows repeat the row before them (the first row
    compared with ``previous``, the last key of the batch before), and this batch's last
    key, to pass on with the next batch."""
    count = len(keys)
    same = np.zeros(count, dtype=bool)
    if count == 0:
        return same, previous
    same[0] = previous is not None and keys[0].as_py() == previous
    if count > 1:
        equal = pc.equal(keys.slice(1), keys.slice(0, count - 1))
        same[1:] = np.asarray(equal.to_numpy(zero_copy_only=False), dtype=bool)
    return same, keys[-1].as_py()


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
