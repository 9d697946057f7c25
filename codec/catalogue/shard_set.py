"""Reading a shard directory: recordings, cuts and zero-copy blob views."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from cutfs.codec.audio.cut import Cut
from cutfs.codec.audio.decoder import DecodeTrace, decode_frames, decode_spans
from cutfs.codec.audio.pcm import Int16Array
from cutfs.codec.audio.recording import Recording
from cutfs.codec.catalogue.catalogue_copy import catalogue_directory
from cutfs.codec.catalogue.cut_table import CutTable
from cutfs.codec.catalogue.file_tree import TREE_FILES, FileTree, served_paths, write_file_tree
from cutfs.codec.catalogue.kaldi_order import KALDI_ORDER_FILE, KaldiOrder, write_kaldi_order
from cutfs.codec.catalogue.mapped_table import int_view, read_mapped
from cutfs.codec.catalogue.recording_table import RecordingTable
from cutfs.codec.catalogue.shard_format import (
    CUTS_FILE,
    CUTS_SCHEMA,
    CUTS_TREE,
    FORMAT_NAME,
    MANIFEST_FILE,
    READABLE_VERSIONS,
    RECORDINGS_FILE,
    RECORDINGS_TREE,
    is_plain_file_name,
)
from cutfs.codec.errors import ShardFormatError
from cutfs.codec.library import AudioShape, LibrarySpec, RecordingOrigin
from cutfs.codec.storage.blob import Blob
from cutfs.codec.storage.byte_store import ByteStore
from cutfs.codec.storage.local_store import LocalStore, file_stamp
from cutfs.codec.trust.source_policy import SourcePolicy


@dataclass(frozen=True, slots=True)
class PackedShards:
    """How a decoder worker opens a local shard directory: without its cuts table
    (picklable)."""

    directory: str

    @property
    def where(self) -> str:
        return self.directory

    def open(self, policy: SourcePolicy | None) -> ShardSet:
        return ShardSet(self.directory, load_cuts=False)


class ShardSet:
    """An opened shard directory.

    Opening reads the manifest and maps the tables (:mod:`cutfs.codec.catalogue.mapped_table`):
    nothing is made per cut or per recording until it is asked for.  Numbers
    are checked where they are used (a cut's frame range against its
    recording when the cut is served, a recording's seek index when its plan
    is built); blobs are handed out as ``memoryview`` slices of the
    memory-mapped shard, so reading a cut touches only the pages the decoder
    asks for.
    """

    def __init__(
        self,
        directory: str,
        store: ByteStore | None = None,
        *,
        load_cuts: bool = True,
        cache_root: str | None = None,
        catalogue: str | None = None,
        spec: LibrarySpec | None = None,
    ) -> None:
        """Open a shard directory; ``load_cuts=False`` skips the cuts table (decoding only).

        ``store`` holds the shard files (default: the files of ``directory``).  The
        manifest and tables are read from ``catalogue`` when given (the local copy of a
        remote directory's, :mod:`cutfs.codec.catalogue.remote_shards`); otherwise from the
        directory, or with ``cache_root`` from a local copy when the directory is on
        network storage (:mod:`cutfs.codec.catalogue.catalogue_copy`).  ``spec`` is how a worker
        opens the same shards (default: this directory).
        """
        self.directory = directory
        self.spec: LibrarySpec = spec or PackedShards(os.path.abspath(directory))
        self.store: ByteStore = store or LocalStore(directory)
        self.manifest = _read_manifest(catalogue or directory)
        self.version = int(self.manifest["version"])
        self._shard_names = [str(shard["file"]) for shard in self.manifest["shards"]]
        if catalogue is not None:
            tables = catalogue
        else:
            tables = catalogue_directory(directory, cache_root) if load_cuts else directory
        self._tables = tables
        self._recordings = RecordingTable(
            read_mapped(os.path.join(tables, RECORDINGS_FILE)),
            len(self._shard_names),
            directory,
        )
        self._cuts: CutTable | None = None
        self.cut_start_frames: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self.cut_num_frames: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        if load_cuts:
            cuts = read_mapped(os.path.join(tables, CUTS_FILE), CUTS_SCHEMA)
            mentions = self.manifest.get("mentions")
            self._cuts = CutTable(cuts, mentions if isinstance(mentions, dict) else None)
            self.cut_start_frames = int_view(cuts, "start_frame")
            self.cut_num_frames = int_view(cuts, "num_frames")
        self._trees: tuple[FileTree, FileTree] | None = None
        self._order: KaldiOrder | None = None
        if load_cuts:
            self.trees()  # a catalogue that cannot be read is refused at open
            self.kaldi_order()
        self._readers: dict[int, tuple[memoryview, Any]] = {}
        self._blobs: dict[int, tuple[int, int, int]] = {}
        versions = [self._shard_version(name) for name in self._shard_names]
        self.identity = _identity(catalogue or directory, versions)

    def close(self) -> None:
        self._readers.clear()
        self.store.close()

    def __enter__(self) -> ShardSet:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def num_cuts(self) -> int:
        return len(self._cut_table().ids)

    @property
    def cut_ids(self) -> Sequence[str]:
        return self._cut_table().ids

    @property
    def recording_ids(self) -> Sequence[str]:
        return self._recordings.ids

    @property
    def recordings(self) -> RecordingTable:
        """Every recording's plan, built as it is read (a lazy sequence)."""
        return self._recordings

    @property
    def recording_sources(self) -> Sequence[str]:
        return self._recordings.sources

    def trees(self) -> tuple[FileTree, FileTree]:
        """The file trees of the cuts and the recordings, opened on first use.

        Format 1 directories have none: they are built once, in a private
        temporary directory that is removed as soon as they are mapped.
        """
        if self._trees is None:
            if self.version >= 2:
                self._trees = (
                    FileTree(os.path.join(self._tables, CUTS_TREE), self.num_cuts),
                    FileTree(os.path.join(self._tables, RECORDINGS_TREE), len(self._recordings)),
                )
            else:
                *trees, self._order = _built_catalogue(self.cut_ids, self.recording_ids)
                self._trees = (trees[0], trees[1])
        return self._trees

    def kaldi_order(self) -> KaldiOrder:
        """The cuts' Kaldi key order (:mod:`cutfs.codec.catalogue.kaldi_order`)."""
        if self._order is None:
            if self.version < 2:
                self.trees()  # builds the order too
            else:
                path = os.path.join(self._tables, KALDI_ORDER_FILE)
                self._order = KaldiOrder(path, self.num_cuts)
        assert self._order is not None
        return self._order

    def counters(self) -> dict[str, int]:
        return self.store.counters()

    def describe(self) -> dict[str, Any]:
        return {
            "directory": self.spec.where,
            "format_version": self.version,
            "recordings": len(self._recordings),
            "cuts": self.num_cuts,
        }

    def recording(self, recording_index: int) -> Recording:
        """A recording's plan (built on first use, kept in a bounded cache)."""
        return self._recordings.recording(recording_index)

    def shape(self, recording_index: int) -> AudioShape:
        return self._recordings.shape(recording_index)

    def frame_limit(self, recording_index: int) -> int:
        return self._recordings.shape(recording_index).num_frames

    def index(self, recording_index: int, trace: DecodeTrace | None = None) -> Recording:
        """Plans were computed by ``pack``: nothing to do."""
        return self.recording(recording_index)

    def adopt(self, recording_index: int, recording: Recording) -> None:
        """Plans were computed by ``pack``: nothing to take."""

    def cut_recording(self, index: int) -> int:
        return int(self._cut_table().recordings[index])

    def metadata_mentions(self, field: str) -> bool:
        return self._cut_table().metadata_mentions(field)

    def cut_metadata(self, index: int) -> dict[str, Any]:
        return self._cut_table().metadata(index)

    def origin(self, recording_index: int) -> RecordingOrigin:
        """What ``pack`` read the recording from, its shard and its codec (from its row)."""
        recording = self.recording(recording_index)
        return RecordingOrigin(
            source=self._recordings.sources[recording_index],
            shard=self._shard_names[int(self._recordings.shards[recording_index])],
            container=recording.container_format,
            codec=recording.codec_name,
            transcoded_from=recording.transcoded_from,
        )

    def cut(self, index: int) -> Cut:
        """The cut at ``index`` of the cuts table, its numbers checked against its recording."""
        recording, start, frames, channels = self.cut_frames(index)
        table = self._cut_table()
        return Cut(
            cut_id=table.ids[index],
            recording_index=recording,
            start_frame=start,
            num_frames=frames,
            channels=channels,
            metadata_json=table.metadata_json(index),
        )

    def cut_frames(self, index: int) -> tuple[int, int, int, tuple[int, ...]]:
        """(recording, start frame, frames, channels) of a cut, checked against its
        recording: what serving it needs, read from five columns (not its id or metadata)."""
        table = self._cut_table()
        recording = int(table.recordings[index])
        start, frames = int(self.cut_start_frames[index]), int(self.cut_num_frames[index])
        if not 0 <= recording < len(self._recordings):
            raise ShardFormatError(
                f"cut {table.ids[index]!r} lies outside its recording", where=self.directory
            )
        shape = self._recordings.shape(recording)
        if not (start >= 0 and frames >= 0 and start + frames <= shape.num_frames):
            raise ShardFormatError(
                f"cut {table.ids[index]!r} lies outside its recording", where=self.directory
            )
        channels = table.channels(index)
        if any(not 0 <= channel < shape.channels for channel in channels):
            raise ShardFormatError(
                f"cut {table.ids[index]!r} asks for channels its recording lacks",
                where=self.directory,
            )
        return recording, start, frames, channels

    def cut_channels(self, index: int) -> tuple[int, ...]:
        """The recording channels a cut carries; empty for all of them."""
        return self._cut_table().channels(index)

    def blob(self, recording_index: int) -> Blob:
        """The stored bytes of a recording: a range of its shard in the store."""
        shard, start, end = self._place(recording_index)
        return Blob(self.store, self._shard_names[shard], start, end)

    def blob_location(self, recording_index: int) -> tuple[str, int, int]:
        """Where a recording's bytes are: the shard file name and the byte range in it."""
        shard, start, end = self._place(recording_index)
        return self._shard_names[shard], start, end

    def _cut_table(self) -> CutTable:
        if self._cuts is None:
            raise ShardFormatError("opened without its cuts table", where=self.directory)
        return self._cuts

    def _place(self, recording_index: int) -> tuple[int, int, int]:
        """(shard number, start, end) of a recording's blob in its shard; located once."""
        place = self._blobs.get(recording_index)
        if place is None:
            place = self._locate_blob(recording_index)
            self._blobs[recording_index] = place
        return place

    def expect_read(self, recording_index: int, first: int) -> None:
        try:
            recording = self.recording(recording_index)
            recording.seek_index.expect(first - recording.preroll_frames)
        except Exception:  # a hint: the read builds the same plan and says why
            return

    def read_frames(
        self,
        recording_index: int,
        first: int,
        end: int,
        trace: DecodeTrace | None = None,
        *,
        ahead_frames: int = 0,
    ) -> Int16Array:
        """Frames ``[first, end)`` of the full decode of a recording (``ahead_frames``: see
        :meth:`Library.read_frames`; over object storage the frames ahead are fetched in
        the background while these decode)."""
        recording = self.recording(recording_index)
        self._check_unchanged(recording_index)
        started = time.perf_counter()
        blob = self.blob(recording_index)
        at_hand = blob.prefetch(decode_spans(recording, len(blob), first, end))
        ahead_end = min(end + max(ahead_frames, 0), recording.num_frames)
        if ahead_end > end:
            blob.prefetch(decode_spans(recording, len(blob), end, ahead_end, header=False))
        if trace is not None and trace.profile:
            trace.add_phase("fetch", time.perf_counter() - started)
        return decode_frames(blob, recording, first, end, trace, arriving=not at_hand)

    def _check_unchanged(self, recording_index: int) -> None:
        """Refuse to decode from a shard that changed since the directory was opened (for
        local files one ``stat`` per decode; remote reads are conditional anyway): a shard
        rewritten or replaced under a live mount would otherwise serve other audio."""
        self._recordings.check_row(recording_index)
        name = self._shard_names[int(self._recordings.shards[recording_index])]
        try:
            self.store.check_unchanged(name)
        except ShardFormatError as exc:
            raise ShardFormatError(
                "the shard changed since the directory was mounted (rewritten or replaced?): "
                "remount to serve the new one",
                where=f"{name}, recording {self._recordings.ids[recording_index]}",
            ) from exc

    def _shard_version(self, name: str) -> str:
        try:
            return self.store.version(name)
        except (ShardFormatError, OSError):
            return "missing"  # reads of it fail, one by one, with the reason

    def _locate_blob(self, recording_index: int) -> tuple[int, int, int]:
        """Where the recordings table says the blob is (format 2), or where the shard's Arrow
        metadata says (format 1); either way checked to lie inside the shard."""
        table = self._recordings
        table.check_row(recording_index)
        shard = int(table.shards[recording_index])
        stored = int(table.stored_bytes[recording_index])
        where = f"{self._shard_names[shard]}, recording {table.ids[recording_index]}"
        shard_bytes = self._shard_size(shard)
        if table.blob_offsets is not None:
            start = int(table.blob_offsets[recording_index])
        else:
            start = self._locate_in_batch(shard, int(table.batches[recording_index]), stored, where)
        if start < 0 or start + stored > shard_bytes:
            raise ShardFormatError("the blob is not where the recordings table says", where=where)
        return shard, start, start + stored

    def _locate_in_batch(self, shard: int, batch_number: int, stored: int, where: str) -> int:
        view, reader = self._shard(shard)
        try:
            blobs = reader.get_batch(batch_number).column(1)
            _, offsets_buffer, values = blobs.buffers()
            offsets = np.frombuffer(offsets_buffer, dtype=np.int64)
            start = int(offsets[blobs.offset])
            end = int(offsets[blobs.offset + 1])
        except (pa.ArrowException, IndexError, ValueError) as exc:
            raise ShardFormatError(f"cannot locate the blob: {exc}", where=where) from exc
        if end - start != stored:
            raise ShardFormatError("the blob is not where the recordings table says", where=where)
        return int(values.address - pa.py_buffer(view).address + start)

    def _shard_size(self, number: int) -> int:
        name = self._shard_names[number]
        try:
            return self.store.size(name)
        except (OSError, ValueError) as exc:
            raise ShardFormatError(f"cannot open shard: {exc}", where=name) from exc

    def _shard_view(self, number: int) -> memoryview:
        """The whole shard (format 1 only, whose blobs are found through the Arrow file;
        a local store maps it, so this copies nothing)."""
        return self.store.read(self._shard_names[number], 0, self._shard_size(number))

    def _shard(self, number: int) -> tuple[memoryview, Any]:
        """A format-1 shard's view and Arrow reader (for locating blobs)."""
        opened = self._readers.get(number)
        if opened is None:
            name = self._shard_names[number]
            view = self._shard_view(number)
            try:
                reader = pa.ipc.open_file(pa.BufferReader(pa.py_buffer(view)))
            except (ValueError, pa.ArrowException) as exc:
                raise ShardFormatError(f"cannot open shard: {exc}", where=name) from exc
            opened = (view, reader)
            self._readers[number] = opened
        return opened


def _built_catalogue(
    cut_ids: Sequence[str], recording_ids: Sequence[str]
) -> tuple[FileTree, FileTree, KaldiOrder]:
    """File trees and Kaldi order of a format-1 directory, written to a private temporary
    directory and mapped; the files are removed at once (the maps keep them while the
    mount lives)."""
    with tempfile.TemporaryDirectory(prefix="cutfs-catalogue-") as scratch:
        cuts, recordings = os.path.join(scratch, CUTS_TREE), os.path.join(scratch, RECORDINGS_TREE)
        ids = pa.array(list(cut_ids), pa.large_string())
        cut_paths = served_paths(iter(cut_ids))
        write_file_tree(cuts, cut_paths)
        write_file_tree(recordings, served_paths(iter(recording_ids)))
        order = os.path.join(scratch, KALDI_ORDER_FILE)
        write_kaldi_order(order, ids, cut_paths)
        return FileTree(cuts), FileTree(recordings), KaldiOrder(order, len(cut_ids))


def _identity(directory: str, shard_versions: list[str]) -> str:
    """What the directory held when it was opened: its manifest, tables and shard files."""
    digest = hashlib.sha256()
    with contextlib.suppress(OSError), open(os.path.join(directory, MANIFEST_FILE), "rb") as file:
        digest.update(file.read())
    tables = [RECORDINGS_FILE, CUTS_FILE, KALDI_ORDER_FILE]
    tables += [f"{tree}{suffix}" for tree in (CUTS_TREE, RECORDINGS_TREE) for suffix in TREE_FILES]
    for name in tables:
        digest.update(repr(file_stamp(os.path.join(directory, name))).encode())
    digest.update(repr(shard_versions).encode())
    return digest.hexdigest()


def _read_manifest(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, MANIFEST_FILE)
    try:
        with open(path, encoding="utf-8") as manifest_file:
            manifest = json.load(manifest_file)
    except FileNotFoundError as exc:
        raise ShardFormatError("not a shard directory (no manifest.json)", where=directory) from exc
    except (OSError, ValueError) as exc:
        raise ShardFormatError(f"unreadable manifest: {exc}", where=path) from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise ShardFormatError("not a cutfs shard manifest", where=path)
    if manifest.get("version") not in READABLE_VERSIONS:
        raise ShardFormatError(
            f"shard format version {manifest.get('version')} is not supported "
            f"(this cutfs reads versions {', '.join(map(str, READABLE_VERSIONS))})",
            where=path,
        )
    shards = manifest.get("shards")
    if not isinstance(shards, list) or not all(isinstance(shard, dict) for shard in shards):
        raise ShardFormatError("the manifest lists no shards", where=path)
    for shard in shards:
        name = shard.get("file")
        if not isinstance(name, str) or not is_plain_file_name(name):
            raise ShardFormatError(
                f"shard file name {name!r} is not a plain name in the shard directory", where=path
            )
    return manifest
