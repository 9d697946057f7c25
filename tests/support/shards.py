"""Shard directories for tests: damaged and old-format copies, Arrow files, page residency."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

from cutfs.codec.catalogue.shard_format import CUTS_FILE, MANIFEST_FILE, RECORDINGS_FILE
from cutfs.codec.catalogue.shard_set import ShardSet
from cutfs.codec.storage.memory_advice import address_of


def data_bytes(path: Path) -> int:
    """The bytes of ``path`` that hold data (its ranges between holes), which is what a
    cache bounds.  ``st_blocks`` counts more: ext4 adds a block of extent tree to a file
    whose holes split it into more than four extents, and a test of the bound that read
    ``st_blocks`` failed by those 4 KiB a file."""
    held, offset = 0, 0
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        while offset < size:
            try:
                start = os.lseek(file.fileno(), offset, os.SEEK_DATA)
            except OSError:  # ENXIO: nothing but a hole from here on
                break
            offset = os.lseek(file.fileno(), start, os.SEEK_HOLE)
            held += offset - start
    return held


def copy_and_damage(
    shard_dir: str, copy: Path, recording: str, damage: Callable[[int], list[tuple[int, bytes]]]
) -> None:
    """Copy the shards to ``copy`` and overwrite parts of one recording's blob.

    ``damage`` gets the blob's length and returns (offset in the blob, new bytes) pairs.
    """
    shutil.copytree(shard_dir, copy)
    with ShardSet(str(copy)) as shards:
        index = [r.recording_id for r in shards.recordings].index(recording)
        name, start, end = shards.blob_location(index)
    with open(copy / name, "r+b") as shard_file:
        for offset, data in damage(end - start):
            shard_file.seek(start + offset)
            shard_file.write(data)


def format_1_copy(shard_dir: str | Path, copy: Path) -> None:
    """Copy a shard directory to ``copy`` as the first releases wrote it (shard format 1):
    no blob offsets, no file trees or Kaldi order, 32-bit strings in the cuts table."""
    shutil.copytree(shard_dir, copy)
    kept = (MANIFEST_FILE, RECORDINGS_FILE, CUTS_FILE)
    for path in list(copy.iterdir()):
        if path.name not in kept and "shard-" not in path.name:
            path.unlink()
    manifest = json.loads((copy / MANIFEST_FILE).read_text())
    manifest["version"] = 1
    for shard in manifest["shards"]:
        shard.pop("bytes", None)
    (copy / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pa.OSFile(str(copy / RECORDINGS_FILE), "rb") as source:  # a copy: the file is rewritten
        recordings = pa.ipc.open_file(source).read_all()
    write_arrow_file(copy / RECORDINGS_FILE, recordings.drop_columns(["blob_offset"]))
    with pa.OSFile(str(copy / CUTS_FILE), "rb") as source:
        cuts = pa.ipc.open_file(source).read_all()
    for name in ("cut_id", "metadata"):
        index = cuts.schema.get_field_index(name)
        cuts = cuts.set_column(index, name, cuts.column(name).cast(pa.string()))
    write_arrow_file(copy / CUTS_FILE, cuts)


def write_arrow_file(path: Path, table: pa.Table) -> None:
    """Write ``table`` as an Arrow IPC file, one record batch per chunk of its columns."""
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def resident_pages(path: str | Path, first_page: int, end_page: int) -> list[bool]:
    """Which pages ``[first_page, end_page)`` of a file are in the page cache (``mincore``
    on a map of it that is never touched, so asking reads nothing; the kernel tells a
    file's residency only to a process that could write it or owns it, as root does)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    pages = end_page - first_page
    vector = (ctypes.c_ubyte * max(pages, 1))()
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        base = address_of(np.frombuffer(mapped, dtype=np.uint8))  # the array is let go at once
        assert base is not None
        if libc.mincore(base + first_page * mmap.PAGESIZE, pages * mmap.PAGESIZE, vector) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
    return [bool(vector[n] & 1) for n in range(pages)]
