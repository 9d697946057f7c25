"""The cut catalogue of a shard directory, written from cuts in any order in bounded memory.

A pack's cuts arrive in whatever order its sources list them, and there may be a
hundred million of them.  :class:`CatalogueWriter` takes them a batch at a time and
writes what :mod:`cutfs.codec.catalogue.shard_format` describes: ``cuts.arrow``, the
cuts' file tree and the Kaldi order.  The rows are put in one canonical order, by
cut id (as bytes), with an :class:`ExternalSort`, so a catalogue depends on its cuts
and not on the order they came in: two packs of the same cuts are byte-identical.

The sorted rows then stream through, in fixed batches of
:data:`~cutfs.codec.catalogue.file_tree.TREE_BATCH`: each batch's columns go to
``cuts.arrow`` and its paths to the tree's path file (both :class:`ColumnSpill`, one
record batch each at the end); its tree entries, found batch by batch as
:func:`~cutfs.codec.catalogue.file_tree.write_file_tree` finds them, go to a second
external sort by (directory, name); its Kaldi keys, in id order already unless some id
holds whitespace (its key then differs), give the Kaldi order's running text ends.
The files are byte for byte those the in-memory writers make of the same sorted rows.

Memory holds the sorts' budgets, one batch, and the tree's directories (about 100
bytes each: a corpus has far fewer directories than cuts).  Two rare inputs are
written by the in-memory writers instead, from the finished ``cuts.arrow``: ids whose
paths clash (``a`` and ``a.wav/b``), and ids holding whitespace (their Kaldi keys
sort apart from the ids).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cutfs.codec.catalogue.cut_table import MENTIONED_FIELDS, mentions_of
from cutfs.codec.catalogue.file_tree import (
    DIRECTORIES,
    DIRECTORY_SCHEMA,
    ENTRIES,
    ENTRY_SCHEMA,
    KEY_SCHEMA,
    PATH_SCHEMA,
    PATHS,
    TREE_BATCH,
    TreeDirectories,
    escaped_paths,
    name_keys,
    served_paths,
    write_file_tree,
)
from cutfs.codec.catalogue.kaldi_order import (
    KALDI_ORDER_FILE,
    KALDI_ORDER_SCHEMA,
    kaldi_keys,
    write_kaldi_order,
)
from cutfs.codec.catalogue.mapped_table import read_mapped, release_mapped_pages
from cutfs.codec.catalogue.path_escape import SUFFIX
from cutfs.codec.catalogue.shard_format import CUTS_FILE, CUTS_SCHEMA, CUTS_TREE, write_table
from cutfs.codec.errors import SourceError
from cutfs.codec.spill.column_spill import ColumnSpill
from cutfs.codec.spill.external_sort import ExternalSort, repeats_of_previous

#: Hears ``(phase, rows done, rows)`` as a catalogue is written.
RowsCallback = Callable[[str, int, int], None]
#: The sort key of a tree entry: its directory (4 bytes, big-endian), then its name.
_ENTRY_KEY: Final = "entry_key"
_SORTED_ENTRY_SCHEMA: Final = ENTRY_SCHEMA.append(pa.field(_ENTRY_KEY, pa.large_binary()))
_EMPTY: Final = pa.scalar(b"", pa.large_binary())


@dataclass
class CatalogueSummary:
    """What :meth:`CatalogueWriter.finish` wrote."""

    cuts: int = 0
    #: Per field of :data:`MENTIONED_FIELDS`: whether any cut's metadata has it.
    mentions: dict[str, bool] = field(default_factory=dict)
    #: Sorted runs the cuts were spilled in (0: they fitted in memory).
    runs: int = 0


class CatalogueWriter:
    """Writes the cut catalogue into ``directory`` from cuts added in any order (see the
    module docstring), using ``scratch`` for spilled rows and about ``memory_bytes``.

    ``add`` the cuts (batches of :data:`CUTS_SCHEMA`, or castable to it), then
    ``finish``; use as a context manager (or call :meth:`close`) so that the spilled
    files go in every case.  Raises :class:`SourceError` on two cuts of one id.
    """

    def __init__(
        self,
        directory: str,
        scratch: str,
        memory_bytes: int,
        on_rows: RowsCallback | None = None,
    ) -> None:
        """``on_rows(phase, done, total)`` hears how far :meth:`finish` is, now and then:
        phase ``"merging"`` counts cuts written, ``"writing trees"`` tree entries."""
        self._on_rows = on_rows or _ignore
        self._directory = directory
        self._scratch = scratch
        self._memory_bytes = memory_bytes
        self._sort = ExternalSort(CUTS_SCHEMA, "cut_id", scratch, memory_bytes // 2)

    def __enter__(self) -> CatalogueWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def add(self, cuts: pa.RecordBatch | pa.Table) -> None:
        """Add cuts (rows of :data:`CUTS_SCHEMA`)."""
        if not cuts.schema.equals(CUTS_SCHEMA):
            cuts = cuts.cast(CUTS_SCHEMA)
        self._sort.add(cuts)

    def finish(self, mode: int | None = None) -> CatalogueSummary:
        """Write the catalogue's files (permission bits ``mode``, default the umask's)."""
        summary = CatalogueSummary(mentions=dict.fromkeys(MENTIONED_FIELDS, False))
        cut_file = os.path.join(self._directory, CUTS_FILE)
        prefix = os.path.join(self._directory, CUTS_TREE)
        with (
            ColumnSpill(CUTS_SCHEMA, self._scratch) as cuts,
            ColumnSpill(PATH_SCHEMA, self._scratch) as paths,
            _KaldiSpill(self._scratch) as kaldi,
            _TreeSpill(self._scratch, self._memory_bytes // 2) as tree,
        ):
            previous: object | None = None
            for batch in _fixed_batches(self._sort.sorted_batches(), TREE_BATCH):
                ids = batch.column("cut_id")
                previous = _check_unique(ids, previous)
                for name, found in mentions_of(batch.column("metadata")).items():
                    summary.mentions[name] |= found
                batch_paths = escaped_paths(ids)
                cuts.append(batch)
                paths.append(pa.record_batch([batch_paths], schema=PATH_SCHEMA))
                tree.add_files(batch_paths, summary.cuts)
                kaldi.append(ids, batch_paths, summary.cuts)
                summary.cuts += batch.num_rows
                self._on_rows("merging", summary.cuts, self._sort.rows)
            summary.runs = self._sort.runs_written
            self._sort.close()
            cuts.finish(cut_file, mode)
            cuts.close()  # its spilled buffers: as large as the table
            if tree.clashes:
                _write_in_memory(cut_file, prefix, tree=True, mode=mode)
                return summary
            paths.finish(prefix + PATHS, mode)
            paths.close()
            tree.finish(
                prefix, mode, lambda done, total: self._on_rows("writing trees", done, total)
            )
            kaldi_file = os.path.join(self._directory, KALDI_ORDER_FILE)
            if kaldi.in_id_order:
                kaldi.finish(kaldi_file, mode)
            else:
                _write_in_memory(cut_file, prefix, tree=False, mode=mode)
        return summary

    def close(self) -> None:
        self._sort.close()


def _fixed_batches(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[pa.RecordBatch]:
    """The rows of ``batches`` again, in batches of exactly ``rows`` (the last one fewer)."""
    held: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        held.append(batch)
        count += batch.num_rows
        while count >= rows:
            table = pa.Table.from_batches(held).combine_chunks()
            yield table.slice(0, rows).to_batches()[0]
            rest = table.slice(rows)
            held, count = rest.to_batches(), rest.num_rows
    if count:
        yield pa.Table.from_batches(held).combine_chunks().to_batches()[0]


def _check_unique(ids: pa.Array, previous: object | None) -> object | None:
    """Refuse a sorted batch of ids holding one twice (or the last of the batch before);
    returns its last id."""
    same, last = repeats_of_previous(ids, previous)
    if same.any():
        raise SourceError(f"duplicate cut id {ids[int(np.flatnonzero(same)[0])].as_py()!r}")
    return last


class _TreeSpill:
    """The cuts' file tree as batches of paths reveal it: entries sorted externally by
    (directory, name), then written as :func:`write_file_tree` writes them."""

    def __init__(self, scratch: str, memory_bytes: int) -> None:
        self._scratch = scratch
        self._directories = TreeDirectories()
        self._sort = ExternalSort(_SORTED_ENTRY_SCHEMA, _ENTRY_KEY, scratch, memory_bytes)
        #: Whether some path may clash (holds ``.wav/``: see :func:`served_paths`).
        self.clashes = False

    def __enter__(self) -> _TreeSpill:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._sort.close()

    def add_files(self, paths: pa.Array, first_item: int) -> None:
        self.clashes = self.clashes or bool(pc.any(pc.match_substring(paths, SUFFIX + "/")).as_py())
        if self.clashes:
            return
        self._add(self._directories.add_files(paths, first_item))

    def _add(self, entries: pa.Table) -> None:
        directories = np.asarray(entries.column("directory").to_numpy(), dtype=">u4")
        prefixes = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(4), len(directories), [None, pa.py_buffer(directories.tobytes())]
        )
        names = entries.column("name").combine_chunks()
        key = pc.binary_join_element_wise(prefixes.cast(pa.large_binary()), names, _EMPTY)
        self._sort.add(entries.append_column(_ENTRY_KEY, key))

    def finish(self, prefix: str, mode: int | None, on_rows: Callable[[int, int], None]) -> None:
        for entries in self._directories.entries:
            self._add(entries)
        parents = self._directories.parents()
        counts = np.zeros(len(parents), dtype=np.int64)
        subdirectories = np.zeros(len(parents), dtype=np.int64)
        schema = pa.unify_schemas([ENTRY_SCHEMA, KEY_SCHEMA])
        with ColumnSpill(schema, self._scratch) as written:
            for batch in self._sort.sorted_batches():
                entries = batch.drop_columns([_ENTRY_KEY])
                keys = pa.array(name_keys(entries.column("name")), pa.uint64())
                written.append(entries.append_column(KEY_SCHEMA.field(0), keys))
                directory = np.asarray(entries.column("directory").to_numpy(), dtype=np.int64)
                counts += np.bincount(directory, minlength=len(parents))
                children = np.asarray(entries.column("child").to_numpy(), dtype=np.int64)
                subdirectories += np.bincount(directory[children >= 0], minlength=len(parents))
                on_rows(len(written), self._sort.rows)
            self._sort.close()
            written.finish(prefix + ENTRIES, mode)
        first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        table = pa.table([first, counts, parents, subdirectories], schema=DIRECTORY_SCHEMA)
        write_table(prefix + DIRECTORIES, table, mode)


class _KaldiSpill:
    """The Kaldi order while the keys come in id order: the identity, and running text
    ends (see :mod:`cutfs.codec.catalogue.kaldi_order`)."""

    def __init__(self, scratch: str) -> None:
        self._spill = ColumnSpill(KALDI_ORDER_SCHEMA, scratch)
        self._text_bytes = 0
        self._last_key: bytes | None = None
        self.in_id_order = True

    def __enter__(self) -> _KaldiSpill:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._spill.close()

    def append(self, ids: pa.Array, paths: pa.Array, first_cut: int) -> None:
        if not self.in_id_order or len(ids) == 0:
            return
        keys = kaldi_keys(ids).cast(pa.large_binary())
        first_key: bytes = keys[0].as_py()
        ordered = self._last_key is None or self._last_key <= first_key
        if len(keys) > 1:
            ordered = ordered and bool(
                pc.all(pc.less_equal(keys.slice(0, len(keys) - 1), keys.slice(1))).as_py()
            )
        if not ordered:
            self.in_id_order = False
            return
        self._last_key = keys[-1].as_py()
        line_bytes = np.asarray(
            pc.add(
                pc.binary_length(keys).cast(pa.int64()), pc.binary_length(paths).cast(pa.int64())
            ).to_numpy(),
            dtype=np.int64,
        )
        text_end = np.cumsum(line_bytes) + self._text_bytes
        self._text_bytes = int(text_end[-1])
        cuts = np.arange(first_cut, first_cut + len(ids), dtype=np.int64)
        self._spill.append(pa.record_batch([cuts, text_end], schema=KALDI_ORDER_SCHEMA))

    def finish(self, path: str, mode: int | None) -> None:
        self._spill.finish(path, mode)


def _write_in_memory(cut_file: str, prefix: str, *, tree: bool, mode: int | None) -> None:
    """The rare inputs (see the module docstring): the Kaldi order (and with ``tree`` the
    file tree) written in memory from the ids of the finished ``cuts.arrow``."""
    ids = read_mapped(cut_file, CUTS_SCHEMA).column("cut_id")
    paths = served_paths(ids)
    if tree:
        write_file_tree(prefix, paths, mode)
    write_kaldi_order(os.path.join(os.path.dirname(cut_file), KALDI_ORDER_FILE), ids, paths, mode)
    release_mapped_pages()


def _ignore(phase: str, done: int, total: int) -> None:
    pass
