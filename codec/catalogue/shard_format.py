"""The on-disk format of a shard directory, version 2.

A shard directory holds:

``manifest.json``
    ``{"format": "cutfs-shards", "version": 2, "shards": [{"file", "bytes",
    "recordings"}, ...], "mentions": {...}, ...}``, written last: a directory
    without it is not a shard directory.
``shard-NNNNN.arrow``
    Arrow IPC files (uncompressed, so blobs can be memory-mapped and sliced
    without a copy) with columns ``recording_id`` and ``blob``; each record
    batch holds one recording's encoded bytes, unchanged from the source
    unless the recording was transcoded to FLAC.
``recordings.arrow``
    One row per recording: its shard, the absolute byte offset
    (``blob_offset``) and length of its bytes there, and its decoding plan
    (:class:`cutfs.codec.audio.recording.Recording`), seek index included.
``cuts.arrow``
    One row per cut: its id, recording, frame range, channels and metadata.
``cuts.{entries,directories,paths}.arrow``, ``recordings.{...}.arrow``
    The directory trees of the cut and recording files
    (:mod:`cutfs.codec.catalogue.file_tree`), searched in place by a mount.

Every table is one record batch, so a reader maps the file and reads
columns in place (:mod:`cutfs.codec.catalogue.mapped_table`).  Version 1 lacked
``blob_offset`` and the trees: a mount finds blobs through the shards'
Arrow metadata and builds the trees when it opens such a directory.
"""

from __future__ import annotations

import contextlib
import os
from typing import Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from cutfs.codec.errors import ShardFormatError

FORMAT_NAME: Final = "cutfs-shards"
FORMAT_VERSION: Final = 2
#: Versions this cutfs mounts.
READABLE_VERSIONS: Final = (1, 2)
MANIFEST_FILE: Final = "manifest.json"
RECORDINGS_FILE: Final = "recordings.arrow"
CUTS_FILE: Final = "cuts.arrow"
#: Prefixes of the file trees (:func:`cutfs.codec.catalogue.file_tree.write_file_tree`).
CUTS_TREE: Final = "cuts"
RECORDINGS_TREE: Final = "recordings"


def shard_file_name(number: int) -> str:
    return f"shard-{number:05d}.arrow"


SHARD_SCHEMA: Final = pa.schema([("recording_id", pa.string()), ("blob", pa.large_binary())])

RECORDINGS_SCHEMA: Final = pa.schema(
    [
        ("recording_id", pa.string()),
        ("shard", pa.int32()),
        ("batch", pa.int32()),
        ("stored_bytes", pa.int64()),
        ("source", pa.string()),
        ("sample_rate", pa.int32()),
        ("channels", pa.int32()),
        ("num_frames", pa.int64()),
        ("method", pa.string()),
        ("container_format", pa.string()),
        ("codec_name", pa.string()),
        ("header_bytes", pa.int64()),
        ("pcm_format", pa.string()),
        ("timing", pa.string()),
        ("timeline_origin", pa.int64()),
        ("time_base_numerator", pa.int64()),
        ("time_base_denominator", pa.int64()),
        ("preroll_frames", pa.int64()),
        ("transcoded_from", pa.string()),
        ("seek_samples", pa.large_list(pa.int64())),
        ("seek_byte_offsets", pa.large_list(pa.int64())),
        ("blob_offset", pa.int64()),
    ]
)

CUTS_SCHEMA: Final = pa.schema(
    [
        ("cut_id", pa.large_string()),
        ("recording", pa.int32()),
        ("start_frame", pa.int64()),
        ("num_frames", pa.int64()),
        ("channels", pa.list_(pa.int16())),
        ("metadata", pa.large_string()),
    ]
)


def read_table(path: str) -> pa.Table:
    """A whole Arrow IPC file into memory (tables are small); ShardFormatError if unreadable."""
    try:
        with pa.OSFile(path, "rb") as source:
            return pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowException) as exc:
        raise ShardFormatError(f"cannot read table: {exc}", where=path) from exc


def write_table(path: str, table: pa.Table, mode: int | None = None) -> None:
    """Write ``table`` as one uncompressed Arrow IPC file (a single record batch), atomically.

    The file is written under a temporary name beside ``path`` and renamed, so
    readers see the old file or the whole new one.  ``mode`` sets its permission
    bits (default: as the umask makes them).
    """
    partial = f"{path}.{os.getpid()}.partial"
    try:
        with pa.OSFile(partial, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=max(table.num_rows, 1))
        if mode is not None:
            os.chmod(partial, mode)
        os.replace(partial, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)


def int_column(table: pa.Table, name: str) -> npt.NDArray[np.int64]:
    return np.asarray(table.column(name).to_numpy(), dtype=np.int64)


def is_plain_file_name(name: str) -> bool:
    """Whether ``name`` (of a shard, from a manifest) names a file in the shard directory
    itself: not empty, not ``.`` or ``..``, no ``/`` and no NUL."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name
