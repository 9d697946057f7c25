"""Writing a shard directory (see :mod:`cutfs.codec.catalogue.shard_format`)."""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np
import pyarrow as pa

from cutfs.codec.audio.recording import Recording
from cutfs.codec.catalogue.file_tree import served_paths, write_file_tree
from cutfs.codec.catalogue.kaldi_order import KALDI_ORDER_FILE, write_kaldi_order
from cutfs.codec.catalogue.mapped_table import release_mapped_pages
from cutfs.codec.catalogue.recording_table import recording_row
from cutfs.codec.catalogue.shard_format import (
    CUTS_FILE,
    CUTS_SCHEMA,
    CUTS_TREE,
    FORMAT_NAME,
    FORMAT_VERSION,
    RECORDINGS_FILE,
    RECORDINGS_SCHEMA,
    RECORDINGS_TREE,
    SHARD_SCHEMA,
    shard_file_name,
    write_table,
)
from cutfs.codec.errors import ShardFormatError

DEFAULT_SHARD_BYTES = 1 << 30


class ShardWriter:
    """Appends recordings to shards of about ``max_shard_bytes``.

    A shard is closed once it holds ``max_shard_bytes`` or more, so a shard
    exceeds that size by at most one recording.  Shards are numbered from
    ``first_shard`` (a partition of a pack writes the shard of its own number).
    :meth:`close` gives the recordings table; the catalogue and the manifest are
    written by the pack's commit (:mod:`cutfs.codec.packing.commit`).
    """

    def __init__(
        self, directory: str, max_shard_bytes: int = DEFAULT_SHARD_BYTES, first_shard: int = 0
    ) -> None:
        if max_shard_bytes <= 0:
            raise ValueError("the shard size must be positive")
        self._directory = directory
        self._max_shard_bytes = max_shard_bytes
        self._first_shard = first_shard
        self._writer: pa.ipc.RecordBatchFileWriter | None = None
        self._sink: pa.OSFile | None = None
        self._shard_bytes = 0
        self._shard_batches = 0
        #: The shards written: ``{"file", "recordings", "bytes"}`` each, as the manifest lists them.
        self.shards: list[dict[str, Any]] = []
        self._rows: list[dict[str, Any]] = []

    def add_recording(self, recording: Recording, blob: memoryview, source: str) -> int:
        """Store one recording's bytes; returns its index in the recordings table."""
        if self._writer is None or self._shard_bytes >= self._max_shard_bytes:
            self._open_next_shard()
        assert self._writer is not None
        self._writer.write_batch(_blob_batch(recording.recording_id, blob))
        shard = self._first_shard + len(self.shards) - 1
        self._rows.append(
            recording_row(recording, shard, self._shard_batches, len(blob), source, -1)
        )
        self._shard_bytes += len(blob)
        self._shard_batches += 1
        return len(self._rows) - 1

    def close(self) -> pa.Table:
        """Close the last shard; returns the recordings table (of :data:`RECORDINGS_SCHEMA`,
        blob offsets filled in), in the order the recordings were added."""
        self._close_shard()
        return pa.Table.from_pylist(self._rows, schema=RECORDINGS_SCHEMA)

    def abort(self) -> None:
        """Close open files without writing the tables."""
        self._close_shard()

    def _open_next_shard(self) -> None:
        self._close_shard()
        name = shard_file_name(self._first_shard + len(self.shards))
        self._sink = pa.OSFile(os.path.join(self._directory, name), "wb")
        self._writer = pa.ipc.new_file(self._sink, SHARD_SCHEMA)
        self.shards.append({"file": name, "recordings": 0, "bytes": 0})
        self._shard_bytes = 0
        self._shard_batches = 0

    def _close_shard(self) -> None:
        if self._writer is not None and self._sink is not None:
            self._writer.close()
            self._sink.close()
            path = os.path.join(self._directory, self.shards[-1]["file"])
            self.shards[-1]["recordings"] = self._shard_batches
            self.shards[-1]["bytes"] = os.path.getsize(path)
            first_row = len(self._rows) - self._shard_batches
            for row, (offset, _) in zip(self._rows[first_row:], blob_spans(path), strict=True):
                row["blob_offset"] = offset
        self._writer = None
        self._sink = None


def write_catalogue(directory: str, recordings: pa.Table, cuts: pa.Table) -> None:
    """Write the recordings table (:func:`write_recordings`) and the cut catalogue
    (:func:`write_cut_catalogue`) of a shard directory into ``directory``, in memory and in
    the cuts' order (``cutfs upgrade``; a pack writes its cuts with
    :class:`cutfs.codec.spill.catalogue_writer.CatalogueWriter`)."""
    write_recordings(directory, recordings)
    write_cut_catalogue(directory, cuts)


def write_recordings(directory: str, recordings: pa.Table) -> None:
    """Write the recordings table and the recordings' file tree into ``directory``."""
    write_table(os.path.join(directory, RECORDINGS_FILE), recordings)
    write_file_tree(
        os.path.join(directory, RECORDINGS_TREE),
        served_paths(recordings.column("recording_id")),
    )


def manifest_of(
    shards: list[dict[str, Any]],
    recordings: int,
    cuts: int,
    mentions: dict[str, bool],
    extra: dict[str, Any],
) -> dict[str, Any]:
    """The manifest of a shard directory of ``cuts`` cuts whose metadata mentions the
    fields ``mentions`` says (:func:`~cutfs.codec.catalogue.cut_table.mentions_of`)."""
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "shards": shards,
        "recordings": recordings,
        "cuts": cuts,
        "mentions": mentions,
        **extra,
    }


def _blob_batch(recording_id: str, blob: memoryview) -> pa.RecordBatch:
    offsets = pa.py_buffer(np.array([0, len(blob)], dtype=np.int64).tobytes())
    values = pa.py_buffer(blob)  # no copy: the writer streams it to the file
    blobs = pa.LargeBinaryArray.from_buffers(pa.large_binary(), 1, [None, offsets, values])
    return pa.RecordBatch.from_arrays([pa.array([recording_id]), blobs], schema=SHARD_SCHEMA)


def write_cut_catalogue(directory: str, cuts: pa.Table) -> None:
    """Write ``cuts`` (of :data:`CUTS_SCHEMA`) as the cuts table of a shard directory, with
    the file tree and the Kaldi order the mount searches in place."""
    cuts = cuts.cast(CUTS_SCHEMA)
    write_table(os.path.join(directory, CUTS_FILE), cuts)
    release_mapped_pages()  # the columns may be maps of a pack's spilled input
    cut_paths = served_paths(cuts.column("cut_id"))
    write_file_tree(os.path.join(directory, CUTS_TREE), cut_paths)
    write_kaldi_order(os.path.join(directory, KALDI_ORDER_FILE), cuts.column("cut_id"), cut_paths)


def blob_spans(path: str) -> list[tuple[int, int]]:
    """(start, end) byte offsets of each record batch's blob in a shard file, in batch order.

    Read from the file's Arrow IPC metadata (a map of the file; the blobs are not read).
    Raises :class:`ShardFormatError` when a batch is not one blob.
    """
    try:
        with open(path, "rb") as file:
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        buffer = pa.py_buffer(mapped)  # the map closes with the last buffer that uses it
        reader = pa.ipc.open_file(buffer)
        spans = []
        for number in range(reader.num_record_batches):
            blobs = reader.get_batch(number).column(1)
            if len(blobs) != 1:
                raise ValueError(f"batch {number} holds {len(blobs)} blobs")
            _, offsets_buffer, values = blobs.buffers()
            offsets = np.frombuffer(offsets_buffer, dtype=np.int64)
            first, end = int(offsets[blobs.offset]), int(offsets[blobs.offset + 1])
            start = values.address - buffer.address + first
            spans.append((start, start + end - first))
        return spans
    except (OSError, ValueError, IndexError, pa.ArrowException) as exc:
        raise ShardFormatError(f"cannot locate the blobs: {exc}", where=path) from exc
