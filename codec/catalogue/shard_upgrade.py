"""A shard directory of format 1 rewritten as format 2 in place, its audio untouched.

Format 1 (the first releases) recorded neither where each recording's bytes lie in its
shard nor the file trees: a mount finds every blob through the shard's Arrow metadata,
builds the trees and the Kaldi order at every start (minutes for millions of cuts), and
cannot serve the directory from object storage.  :func:`upgrade_shards` writes what
format 2 adds, and never opens a shard for writing:

1. the directory is opened as a mount opens it (every table checked);
2. each recording's blob is located through its shard's Arrow metadata, as a format-1
   mount locates it;
3. the format-2 catalogue (the recordings table with ``blob_offset``, the cuts table
   with 64-bit offsets, the file trees, the Kaldi order) and manifest are written to a
   private scratch directory inside the shard directory, so that moving them into place
   is a rename;
4. the new catalogue is opened as format 2 over the same shards and checked against the
   old one: the same recordings at the same byte ranges, every other column of both
   tables unchanged;
5. the catalogue files are renamed into place, the manifest last.

Until the manifest is replaced the directory is still format 1 (a format-1 mount uses
``blob_offset`` when the recordings table has it, and builds its own trees), so an
upgrade that is interrupted leaves a directory that mounts, and running it again
finishes it.  Mounts that are running keep the files they mapped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from cutfs.codec.catalogue.catalogue_copy import CATALOGUE_FILES
from cutfs.codec.catalogue.cut_table import mentions_of
from cutfs.codec.catalogue.shard_format import (
    CUTS_FILE,
    CUTS_SCHEMA,
    FORMAT_VERSION,
    MANIFEST_FILE,
    RECORDINGS_FILE,
    RECORDINGS_SCHEMA,
    read_table,
)
from cutfs.codec.catalogue.shard_set import ShardSet
from cutfs.codec.catalogue.shard_writer import manifest_of, write_catalogue
from cutfs.codec.errors import ShardFormatError, SourceError

_SCRATCH_PREFIX = ".cutfs-upgrade-"
#: Manifest keys format 2 writes itself (the rest of a format-1 manifest is kept).
_WRITTEN_KEYS = frozenset({"format", "version", "shards", "recordings", "cuts", "mentions"})


@dataclass(frozen=True, slots=True)
class UpgradeReport:
    """What :func:`upgrade_shards` did."""

    directory: str
    #: The format the directory had (``FORMAT_VERSION`` when there was nothing to do).
    from_version: int
    recordings: int
    cuts: int
    #: Bytes of catalogue written (the shards are never written).
    catalogue_bytes: int
    seconds: float

    @property
    def upgraded(self) -> bool:
        return self.from_version != FORMAT_VERSION


def upgrade_shards(directory: str) -> UpgradeReport:
    """Rewrite the shard directory ``directory`` as format 2 (see the module docstring).

    A directory already of format 2 is left alone.  Raises :class:`ShardFormatError`
    when it is not a readable shard directory, or when the new catalogue would not
    find the recordings where the old one does (nothing is moved into place then), and
    :class:`SourceError` when it cannot be written.
    """
    started = time.monotonic()
    with ShardSet(directory) as old:
        if old.version == FORMAT_VERSION:
            return UpgradeReport(
                directory, old.version, len(old.recording_ids), old.num_cuts, 0, 0.0
            )
        recordings = _located_recordings(old, directory)
        cuts = read_table(os.path.join(directory, CUTS_FILE)).cast(CUTS_SCHEMA)
        manifest = _upgraded_manifest(old, directory, recordings, cuts)
        with _scratch(directory) as scratch:
            try:
                write_catalogue(scratch, recordings, cuts)
                _write_manifest(scratch, manifest)
                _check_against(old, directory, scratch)
                written = _move_into_place(directory, scratch)
            except OSError as exc:
                raise SourceError(
                    f"cannot write the new catalogue: {exc.strerror or exc}", where=directory
                ) from exc
        return UpgradeReport(
            directory,
            old.version,
            recordings.num_rows,
            cuts.num_rows,
            written,
            time.monotonic() - started,
        )


def _located_recordings(old: ShardSet, directory: str) -> pa.Table:
    """The recordings table with each blob's offset in its shard (format 2's column)."""
    table = read_table(os.path.join(directory, RECORDINGS_FILE))
    offsets = np.fromiter(
        (old.blob_location(index)[1] for index in range(table.num_rows)),
        dtype=np.int64,
        count=table.num_rows,
    )
    if "blob_offset" in table.schema.names:  # an upgrade that stopped before the manifest
        table = table.drop_columns(["blob_offset"])
    table = table.append_column("blob_offset", pa.array(offsets, pa.int64()))
    try:
        return table.select(RECORDINGS_SCHEMA.names).cast(RECORDINGS_SCHEMA)
    except (KeyError, pa.ArrowException) as exc:
        raise ShardFormatError(
            f"the recordings table is not of format 1: {exc}", where=directory
        ) from exc


def _upgraded_manifest(
    old: ShardSet, directory: str, recordings: pa.Table, cuts: pa.Table
) -> dict[str, object]:
    shards = []
    for entry in old.manifest["shards"]:
        shard = dict(entry)
        shard["bytes"] = os.stat(os.path.join(directory, str(entry["file"]))).st_size
        shards.append(shard)
    kept = {key: value for key, value in old.manifest.items() if key not in _WRITTEN_KEYS}
    mentions = mentions_of(cuts.column("metadata"))
    extra = kept | {"upgraded_from": old.version}
    return manifest_of(shards, recordings.num_rows, len(cuts), mentions, extra)


def _write_manifest(directory: str, manifest: dict[str, object]) -> None:
    with open(os.path.join(directory, MANIFEST_FILE), "w", encoding="utf-8") as out:
        out.write(json.dumps(manifest, indent=2) + "\n")


def _check_against(old: ShardSet, directory: str, scratch: str) -> None:
    """Open the new catalogue as format 2 over the same shards; refuse it unless it finds
    every recording where the old one does and keeps every other column as it was."""
    with ShardSet(directory, catalogue=scratch) as new:
        if new.version != FORMAT_VERSION or list(new.recording_ids) != list(old.recording_ids):
            raise ShardFormatError("the upgraded catalogue lists other recordings", where=scratch)
        for index in range(len(old.recording_ids)):
            if new.blob_location(index) != old.blob_location(index):
                raise ShardFormatError(
                    "the upgraded catalogue places a recording elsewhere",
                    where=old.recording_ids[index],
                )
        if new.num_cuts != old.num_cuts:
            raise ShardFormatError("the upgraded catalogue lists other cuts", where=scratch)
    before = read_table(os.path.join(directory, RECORDINGS_FILE))
    after = read_table(os.path.join(scratch, RECORDINGS_FILE))
    for name in before.schema.names:
        if name != "blob_offset" and not after.column(name).equals(
            before.column(name).cast(after.schema.field(name).type)
        ):
            raise ShardFormatError(f"the upgrade changed column {name!r}", where=RECORDINGS_FILE)
    cuts_before = read_table(os.path.join(directory, CUTS_FILE)).cast(CUTS_SCHEMA)
    if not read_table(os.path.join(scratch, CUTS_FILE)).equals(cuts_before):
        raise ShardFormatError("the upgrade changed the cuts table", where=CUTS_FILE)


def _move_into_place(directory: str, scratch: str) -> int:
    """Rename the new catalogue into ``directory``, the manifest last, with the old
    manifest's permission bits and owner; the bytes moved."""
    manifest = os.stat(os.path.join(directory, MANIFEST_FILE))
    moved = 0
    for name in (*CATALOGUE_FILES, MANIFEST_FILE):
        path = os.path.join(scratch, name)
        os.chmod(path, manifest.st_mode & 0o7777)
        if os.geteuid() == 0:
            os.chown(path, manifest.st_uid, manifest.st_gid)
        moved += os.stat(path).st_size
        os.replace(path, os.path.join(directory, name))
    return moved


@contextlib.contextmanager
def _scratch(directory: str) -> Iterator[str]:
    try:
        scratch = tempfile.mkdtemp(prefix=_SCRATCH_PREFIX, dir=directory)
    except OSError as exc:
        raise SourceError(
            f"cannot write in the shard directory: {exc.strerror}", where=directory
        ) from exc
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
