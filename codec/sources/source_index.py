"""Serving audio where it lies, without packing: a catalogue plus plans made on first use.

``cutfs mount SOURCE`` on anything but a shard directory reads the source's
catalogue (recordings and cuts: Lhotse manifests, a Kaldi directory, tars,
Arrow or Parquet datasets; see :mod:`cutfs.codec.sources`) and writes it into an
index directory under a cache root, named after the source's path::

    <cache root>/<key>/source-index.json   format, version, the source and its stamp
    <cache root>/<key>/recordings.arrow    where each recording's bytes are, what
                                           its manifest declares
    <cache root>/<key>/cuts.arrow          cuts in seconds, as the source gives them
    <cache root>/<key>/plans/<hash>.arrow  a recording's decoding plan, once computed

The stamp covers the names, sizes and modification times of the source's
files; a second mount with an unchanged stamp reuses the catalogue without
reading the source.  A plan (exact length, seek index, checked decoding
method: what ``pack`` computes ahead) is computed the first time a recording
is needed and kept under a name hashed from the audio bytes' identity (file,
byte range, size, modification time), so it survives changes to manifests
and is recomputed when the audio changes.  Plans are written to a temporary
name and renamed, so processes indexing the same recording at once are safe.

Manifests that declare a recording's rate, channels and length (Lhotse) give
file sizes without decoding anything.  When the audio disagrees, Lhotse's
rule applies (``LHOTSE_AUDIO_DURATION_MISMATCH_TOLERANCE`` from the
environment, else Lhotse's default of 0.5 s; see :func:`duration_tolerance_seconds`): a
recording up to that much shorter is padded by reflecting its last frames, as
Lhotse pads what it loads; longer audio is cut at the declared length; frames
beyond the tolerance fail with :class:`cutfs.codec.errors.ManifestMismatchError`.
An Opus recording declared at another rate than FFmpeg's 48 kHz (the rate that was
encoded, which Lhotse declares) is served at the declared rate, resampled (see
:func:`_served_at_declared_rate`); other rate or channel differences fail.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from cachetools import LRUCache

from cutfs.codec.audio.cut import Cut, seconds_to_frames
from cutfs.codec.audio.decoder import DecodeTrace, decode_frames, decode_spans
from cutfs.codec.audio.output_format import OutputFormat
from cutfs.codec.audio.pcm import Int16Array
from cutfs.codec.audio.recording import Recording
from cutfs.codec.audio.recording_indexer import index_recording
from cutfs.codec.audio.resampler import Resampler
from cutfs.codec.cache_root import default_cache_root
from cutfs.codec.catalogue.cut_table import CutTable, mentions_of
from cutfs.codec.catalogue.file_tree import FileTree, served_paths, write_file_tree
from cutfs.codec.catalogue.kaldi_order import KALDI_ORDER_FILE, KaldiOrder, write_kaldi_order
from cutfs.codec.catalogue.mapped_table import float_view, read_mapped
from cutfs.codec.catalogue.recording_table import recording_from_row, recording_row
from cutfs.codec.catalogue.shard_format import (
    CUTS_TREE,
    RECORDINGS_SCHEMA,
    RECORDINGS_TREE,
    int_column,
    read_table,
    write_table,
)
from cutfs.codec.errors import (
    CutfsError,
    ManifestMismatchError,
    ShardFormatError,
    SourceError,
    UnsupportedAudioError,
)
from cutfs.codec.library import AudioShape, LibrarySpec, RecordingOrigin
from cutfs.codec.sources import Refusals, SourceCatalogue, read_source
from cutfs.codec.sources.arrow_dataset import read_parquet_cell
from cutfs.codec.sources.audio_dir import AUDIO_EXTENSIONS
from cutfs.codec.storage.blob import Blob
from cutfs.codec.storage.cache_usage import DEFAULT_DISK_BYTES
from cutfs.codec.storage.local_store import LocalStore, file_version
from cutfs.codec.storage.object_location import is_remote
from cutfs.codec.storage.object_store import DEFAULT_STORE_DEADLINE_SECONDS
from cutfs.codec.storage.routing_store import RoutingStore
from cutfs.codec.trust.command_runner import run_command
from cutfs.codec.trust.limits import (
    MAX_CHANNELS,
    MAX_FRAMES,
    MAX_RECORDING_SECONDS,
    MAX_SAMPLE_RATE_HZ,
)
from cutfs.codec.trust.private_directory import private_directory
from cutfs.codec.trust.source_policy import SourcePolicy, check_may_run_commands_here

INDEX_FILE: Final = "source-index.json"
INDEX_FORMAT: Final = "cutfs-source-index"
#: Bumped when plans or tables change meaning: older index directories are rebuilt.
INDEX_VERSION: Final = 6
_RECORDINGS: Final = "recordings.arrow"
_CUTS: Final = "cuts.arrow"
_PLANS: Final = "plans"
#: The piece cache of the objects of url sources.
_PIECES: Final = "pieces"
#: The copy of an object that indexing reads, in its temporary directory.
_FETCHED: Final = "object.audio"
#: Messages about refused entries kept in the index file (the count is always exact).
_REFUSALS_KEPT: Final = 1000
#: Cuts kept converted to frames (a bounded cache: cuts are many).
_CUTS_KEPT: Final = 65536
#: Lhotse's default for LHOTSE_AUDIO_DURATION_MISMATCH_TOLERANCE (lhotse.audio.utils).
DURATION_TOLERANCE_SECONDS: Final = 0.5
#: The most a tolerance from the environment may be (a mistyped value must not pad minutes).
_MAX_TOLERANCE_SECONDS: Final = 60.0

_CATALOGUE_RECORDINGS: Final = pa.schema(
    [
        ("recording_id", pa.string()),
        ("path", pa.string()),
        ("command", pa.string()),
        ("offset_bytes", pa.int64()),
        ("length_bytes", pa.int64()),  # -1: to the end of the file
        ("declared_rate", pa.int32()),  # 0: not declared
        ("declared_channels", pa.int32()),
        ("declared_frames", pa.int64()),
        ("described_in", pa.string()),
        ("parquet_column", pa.string()),
        ("url", pa.string()),
        # The stamp of the recording's file when the source was catalogued ("": none, for
        # commands and objects): a process that makes or loads its plan later checks it.
        ("stamp", pa.string()),
    ]
)
_CATALOGUE_CUTS: Final = pa.schema(
    [
        ("cut_id", pa.large_string()),
        ("recording", pa.int32()),
        ("start_seconds", pa.float64()),
        ("duration_seconds", pa.float64()),  # NaN: to the end of the recording
        ("channels", pa.list_(pa.int16())),  # empty: all
        ("metadata", pa.large_string()),
    ]
)
_PLAN_SCHEMA: Final = RECORDINGS_SCHEMA


def duration_tolerance_seconds() -> float:
    """How much audio may differ from its manifest's length, as Lhotse decides it.

    ``LHOTSE_AUDIO_DURATION_MISMATCH_TOLERANCE`` when it is set to a number in
    ``[0, 60]`` seconds, else :data:`DURATION_TOLERANCE_SECONDS`.  Raises
    :class:`SourceError` for a value that is set but is not such a number.
    """
    text = os.environ.get("LHOTSE_AUDIO_DURATION_MISMATCH_TOLERANCE")
    if text is None:
        return DURATION_TOLERANCE_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= _MAX_TOLERANCE_SECONDS:
        raise SourceError(
            f"must be a number of seconds in [0, {_MAX_TOLERANCE_SECONDS:g}], not {text!r}",
            where="LHOTSE_AUDIO_DURATION_MISMATCH_TOLERANCE",
        )
    return value


def prepare_index(source: str, cache_root: str, policy: SourcePolicy | None = None) -> str:
    """The index directory for ``source``, written or rewritten if the source changed.

    Entries of the source that ``policy`` does not allow (files outside its
    roots, commands) are refused like invalid ones.  The cache root and the
    index directory are private to the user this process runs as (see
    :func:`private_directory`).  Raises :class:`cutfs.codec.errors.SourceError`
    for unreadable input or a cache that cannot be used.
    """
    source = os.path.abspath(source)
    policy = policy or SourcePolicy.for_source(source)
    key = hashlib.sha256(source.encode("utf-8", "surrogateescape")).hexdigest()[:20]
    private_directory(cache_root)
    directory = os.path.join(cache_root, key)
    stamp = _stamp(source)
    rules = _policy_stamp(policy)
    current = _read_index_file(directory)
    if (
        current is not None
        and current.get("version") == INDEX_VERSION
        and current.get("stamp") == stamp
        and current.get("policy") == rules
    ):
        private_directory(directory)
        private_directory(os.path.join(directory, _PLANS))
        return directory
    _refuse_links_out(source, policy)
    refusals = Refusals(strict=False, limits=policy.input_limits)
    catalogue = read_source([source], refusals)
    _confine(catalogue, policy, refusals)
    try:
        private_directory(directory)
        private_directory(os.path.join(directory, _PLANS))
        write_table(os.path.join(directory, _RECORDINGS), _recordings_table(catalogue), 0o600)
        cuts = _cuts_table(catalogue)
        write_table(os.path.join(directory, _CUTS), cuts, 0o600)
        cut_paths = served_paths(cuts.column("cut_id"))
        write_file_tree(os.path.join(directory, CUTS_TREE), cut_paths, 0o600)
        write_kaldi_order(
            os.path.join(directory, KALDI_ORDER_FILE), cuts.column("cut_id"), cut_paths, 0o600
        )
        recording_ids = [recording.recording_id for recording in catalogue.recordings]
        write_file_tree(
            os.path.join(directory, RECORDINGS_TREE), served_paths(recording_ids), 0o600
        )
        info = {
            "format": INDEX_FORMAT,
            "version": INDEX_VERSION,
            "source": source,
            "kind": catalogue.kind,
            "stamp": stamp,
            "policy": rules,
            "mentions": mentions_of(cuts.column("metadata")),
            "refused_count": len(catalogue.refused),
            "refused": catalogue.refused[:_REFUSALS_KEPT],
        }
        _write_atomically(os.path.join(directory, INDEX_FILE), json.dumps(info).encode())
    except OSError as exc:
        raise SourceError(
            f"cannot write the index cache: {exc.strerror} (choose another with --cache-dir)",
            where=directory,
        ) from exc
    return directory


def _refuse_links_out(source: str, policy: SourcePolicy) -> None:
    """Refuse a source holding links that lead outside the allowed roots, audio files aside.

    Manifests, Kaldi files and tables are read as they are found, so a ``text``
    linked to someone else's file would be served as transcripts; audio files
    are checked one by one later (their entries are refused, the rest served).
    """
    if policy.unrestricted or policy.any_path:
        return
    entries = [source]
    if os.path.isdir(source) and not os.path.islink(source):
        for directory, subdirectories, names in os.walk(source):
            entries += [os.path.join(directory, name) for name in subdirectories + names]
    for path in entries:
        if not os.path.islink(path) or path.lower().endswith(_AUDIO_SUFFIXES):
            continue
        if not policy.is_allowed(path):
            raise SourceError(
                f"{path} links to {os.path.realpath(path)}, outside the source and the allowed "
                "roots: remove the link, or allow its target with --allow-root",
                where=source,
            )


#: Files whose links are checked as recordings, one by one (see _refuse_links_out).
_AUDIO_SUFFIXES: Final = tuple(sorted(AUDIO_EXTENSIONS))


def _shown_path(path: str, root: str) -> str:
    """``path`` relative to ``root`` (the source's location) where it lies beneath it,
    else as it is."""
    relative = os.path.relpath(path, root) if os.path.isabs(path) and root else path
    return path if relative.startswith(os.pardir) else relative


def _policy_stamp(policy: SourcePolicy) -> dict[str, Any]:
    """What of the policy decides the catalogue: a cached one made under other rules is redone."""
    return {
        "roots": list(policy.allowed_roots),
        "any_path": policy.any_path,
        "commands": policy.allow_commands,
        "objects": list(policy.allowed_objects),
        "input_limits": dataclasses.astuple(policy.input_limits),
    }


def _confine(catalogue: SourceCatalogue, policy: SourcePolicy, refusals: Refusals) -> None:
    """Refuse the recordings ``policy`` does not allow, and their cuts."""
    allowed = []
    for recording in catalogue.recordings:
        where = f"{recording.described_in} (recording {recording.recording_id!r})"
        with refusals.entry():
            if recording.url is not None:
                policy.check_object(recording.url, where)
            elif recording.command is not None:
                policy.check_command_file(_defining_file(recording.described_in), where)
            elif recording.path is not None:
                policy.check_file(recording.path, where)
            allowed.append(recording)
    if len(allowed) == len(catalogue.recordings):
        return
    catalogue.recordings = allowed
    catalogue.check(refusals)


def _defining_file(described_in: str) -> str:
    """The file named in ``path:line`` (where a recording is described)."""
    path, _, line = described_in.rpartition(":")
    return path if path and line.isdigit() else described_in


@dataclass(frozen=True, slots=True)
class IndexedSource:
    """How a decoder worker opens a source index directory, with the daemon's limits for
    the objects its url sources name (picklable)."""

    directory: str
    disk_cache_bytes: int = DEFAULT_DISK_BYTES
    deadline_seconds: float = DEFAULT_STORE_DEADLINE_SECONDS

    @property
    def where(self) -> str:
        return self.directory

    def open(self, policy: SourcePolicy | None) -> SourceIndex:
        return SourceIndex(
            self.directory,
            load_cuts=False,
            policy=policy,
            disk_cache_bytes=self.disk_cache_bytes,
            deadline_seconds=self.deadline_seconds,
        )


class SourceIndex:
    """An index directory opened for serving (see the module docstring)."""

    def __init__(
        self,
        directory: str,
        store: LocalStore | None = None,
        *,
        load_cuts: bool = True,
        policy: SourcePolicy | None = None,
        disk_cache_bytes: int = DEFAULT_DISK_BYTES,
        deadline_seconds: float = DEFAULT_STORE_DEADLINE_SECONDS,
    ) -> None:
        """Open an index directory that :func:`prepare_index` wrote.

        ``policy`` must be the one the index was prepared with (default: the
        source's own location, no commands); files are opened through it.  Objects
        that url sources name are read through a piece cache of at most
        ``disk_cache_bytes``, each request within ``deadline_seconds``.
        """
        self.directory = directory
        self.spec: LibrarySpec = IndexedSource(directory, disk_cache_bytes, deadline_seconds)
        info = _read_index_file(directory)
        if info is None or info.get("version") != INDEX_VERSION:
            raise ShardFormatError("not a current cutfs source index", where=directory)
        self.info = info
        source = str(info.get("source"))
        #: What the paths of files beneath it are shown relative to (provenance).
        self._source_root = source if os.path.isdir(source) else os.path.dirname(source)
        self.policy = (policy or SourcePolicy.for_source(source)).with_root(directory)
        self._tolerance_seconds = duration_tolerance_seconds()
        local = store or LocalStore("/", opener=self.policy.open_file)
        #: Files by path, and the objects of url sources by URL (through a piece cache).
        self.store = RoutingStore(
            local,
            os.path.join(directory, _PIECES),
            disk_cache_bytes=disk_cache_bytes,
            deadline_seconds=deadline_seconds,
        )
        recordings = read_table(os.path.join(directory, _RECORDINGS))
        self._recording_ids: list[str] = recordings.column("recording_id").to_pylist()
        self._paths: list[str | None] = recordings.column("path").to_pylist()
        self._commands: list[str | None] = recordings.column("command").to_pylist()
        self._offsets = int_column(recordings, "offset_bytes")
        self._lengths = int_column(recordings, "length_bytes")
        self._declared_rates = int_column(recordings, "declared_rate")
        self._declared_channels = int_column(recordings, "declared_channels")
        self._declared_frames = int_column(recordings, "declared_frames")
        self._described_in: list[str] = recordings.column("described_in").to_pylist()
        self._parquet_columns: list[str | None] = recordings.column("parquet_column").to_pylist()
        self._urls: list[str | None] = recordings.column("url").to_pylist()
        self._catalogued_stamps: list[str] = recordings.column("stamp").to_pylist()
        cuts = read_mapped(os.path.join(directory, _CUTS), _CATALOGUE_CUTS) if load_cuts else None
        cuts = cuts if cuts is not None else _CATALOGUE_CUTS.empty_table()
        mentions = info.get("mentions")
        self._cuts_table = CutTable(cuts, mentions if isinstance(mentions, dict) else None)
        self._cut_recordings = self._cuts_table.recordings
        self._cut_starts = float_view(cuts, "start_seconds")
        self._cut_durations = float_view(cuts, "duration_seconds")
        self._plans: dict[int, Recording] = {}
        #: Recordings served at the rate their manifest declares rather than the decoder's
        #: (Opus, see :func:`_served_at_declared_rate`), and how.
        self._resamplers: dict[int, Resampler] = {}
        self._blobs: dict[int, tuple[str, int, int]] = {}
        #: (inode, size, modification time) of each blob's file when its plan was made.
        self._blob_stamps: dict[int, str] = {}
        #: What the catalogue was made from; decoder workers check they open the same.
        self.identity = hashlib.sha256(
            json.dumps([info.get("version"), info.get("stamp"), info.get("policy")]).encode()
        ).hexdigest()
        self._cuts: LRUCache[int, Cut] = LRUCache(maxsize=_CUTS_KEPT)
        self._trees: tuple[FileTree, FileTree] | None = None
        self._order: KaldiOrder | None = None
        #: Recordings whose audio disagrees with their manifest: id -> what differs.
        self.mismatches: dict[str, str] = {}
        if len(self._cut_recordings) and (
            self._cut_recordings.min() < 0 or self._cut_recordings.max() >= len(self._paths)
        ):
            raise ShardFormatError(
                "a cut refers to a recording that does not exist", where=directory
            )
        self._check_numbers()
        if load_cuts:
            self.trees()  # a catalogue that cannot be read is refused at open
            self.kaldi_order()

    def _check_numbers(self) -> None:
        """Refuse catalogue tables whose numbers the readers would never have written."""
        rates, channels, frames = (
            self._declared_rates,
            self._declared_channels,
            self._declared_frames,
        )
        starts, durations = self._cut_starts, self._cut_durations
        bad = [
            bool(((rates < 0) | (rates > MAX_SAMPLE_RATE_HZ)).any()),
            bool(((channels < 0) | (channels > MAX_CHANNELS)).any()),
            bool(((frames < -1) | (frames > MAX_FRAMES)).any()),
            bool(((self._offsets < 0) | (self._lengths < -1)).any()),
            not bool(np.isfinite(starts).all()),
            bool(((starts < 0) | (starts > MAX_RECORDING_SECONDS)).any()),
            bool(((durations < 0) | (durations > MAX_RECORDING_SECONDS)).any()),
        ]
        if any(bad):
            raise ShardFormatError(
                "the catalogue holds numbers out of range (not written by cutfs?)",
                where=self.directory,
            )

    def counters(self) -> dict[str, int]:
        return self.store.counters()

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> SourceIndex:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- catalogue --------------------------------------------------------------------------

    @property
    def recording_ids(self) -> Sequence[str]:
        return self._recording_ids

    @property
    def cut_ids(self) -> Sequence[str]:
        return self._cuts_table.ids

    def kaldi_order(self) -> KaldiOrder:
        """The cuts' Kaldi key order that :func:`prepare_index` wrote."""
        if self._order is None:
            self._order = KaldiOrder(os.path.join(self.directory, KALDI_ORDER_FILE), self.num_cuts)
        return self._order

    def trees(self) -> tuple[FileTree, FileTree]:
        """The file trees of the cuts and recordings that :func:`prepare_index` wrote."""
        if self._trees is None:
            self._trees = (
                FileTree(os.path.join(self.directory, CUTS_TREE), self.num_cuts),
                FileTree(os.path.join(self.directory, RECORDINGS_TREE), len(self.recording_ids)),
            )
        return self._trees

    @property
    def num_cuts(self) -> int:
        return len(self._cuts_table.ids)

    def describe(self) -> dict[str, Any]:
        return {
            "source": self.info.get("source"),
            "kind": self.info.get("kind"),
            "index_directory": self.directory,
            "recordings": len(self._recording_ids),
            "recordings_indexed": len(self._plans),
            "cuts": self.num_cuts,
            "manifest_mismatches": len(self.mismatches),
            "refused_entries": self.refused_count,
        }

    @property
    def refused_count(self) -> int:
        """Entries of the source left out because they were invalid (see ``refused``)."""
        count = self.info.get("refused_count", 0)
        return count if isinstance(count, int) else 0

    @property
    def refused(self) -> list[str]:
        """Messages about the first refused entries."""
        messages = self.info.get("refused", [])
        return [str(m) for m in messages] if isinstance(messages, list) else []

    def cut_recording(self, index: int) -> int:
        return int(self._cut_recordings[index])

    def metadata_mentions(self, field: str) -> bool:
        return self._cuts_table.metadata_mentions(field)

    def origin(self, recording_index: int) -> RecordingOrigin:
        """The recording's object URI, file (relative to the source where it lies beneath
        it) or ``command``; its codec once this process has its plan."""
        url, path = self._urls[recording_index], self._paths[recording_index]
        if url:
            source = url
        elif path:
            source = _shown_path(path, self._source_root)
        else:
            source = "command"
        plan = self._plans.get(recording_index)
        if plan is None:
            return RecordingOrigin(source)
        return RecordingOrigin(
            source,
            container=plan.container_format,
            codec=plan.codec_name,
            transcoded_from=plan.transcoded_from,
        )

    def cut_metadata(self, index: int) -> dict[str, Any]:
        return self._cuts_table.metadata(index)

    def declared(self, recording_index: int) -> AudioShape | None:
        rate = int(self._declared_rates[recording_index])
        if rate <= 0:
            return None
        channels = int(self._declared_channels[recording_index])
        return AudioShape(rate, channels, int(self._declared_frames[recording_index]))

    def shape(self, recording_index: int) -> AudioShape | None:
        declared = self.declared(recording_index)
        if declared is not None:
            return declared
        plan = self._plans.get(recording_index)
        if plan is None:
            return None
        return AudioShape(plan.sample_rate, plan.channels, plan.num_frames)

    def frame_limit(self, recording_index: int) -> int:
        shape = self.shape(recording_index)
        assert shape is not None, "frame_limit() before the shape is known"
        return shape.num_frames + self._tolerance_frames(recording_index)

    def cut_frames(self, index: int) -> tuple[int, int, int, tuple[int, ...]] | None:
        cut = self.cut(index)
        if cut is None:
            return None
        return cut.recording_index, cut.start_frame, cut.num_frames, cut.channels

    def cut(self, index: int) -> Cut | None:
        cut: Cut | None = self._cuts.get(index)
        if cut is not None:
            return cut
        recording_index = int(self._cut_recordings[index])
        shape = self.shape(recording_index)
        if shape is None:
            return None
        cut = self._frame_cut(index, recording_index, shape)
        self._cuts[index] = cut
        return cut

    def _frame_cut(self, index: int, recording_index: int, shape: AudioShape) -> Cut:
        cut_id = self._cuts_table.ids[index]
        start = seconds_to_frames(float(self._cut_starts[index]), shape.sample_rate)
        duration = float(self._cut_durations[index])
        if math.isnan(duration):
            length = max(0, shape.num_frames - start)
        else:
            length = seconds_to_frames(duration, shape.sample_rate)
        where = self._described_in[recording_index]
        if start + length > shape.num_frames + self._tolerance_frames(recording_index):
            raise ManifestMismatchError(
                f"cut {cut_id!r} ends at frame {start + length}, after the end of recording "
                f"{self._recording_ids[recording_index]!r} ({shape.num_frames} frames at "
                f"{shape.sample_rate} Hz)",
                where=where,
            )
        channels = self._cuts_table.channels(index)
        if any(channel >= shape.channels for channel in channels):
            raise ManifestMismatchError(
                f"cut {cut_id!r} asks for channels {list(channels)} of a recording with "
                f"{shape.channels}",
                where=where,
            )
        if channels == tuple(range(shape.channels)):
            channels = ()
        return Cut(cut_id, recording_index, start, length, channels)

    def _tolerance_frames(self, recording_index: int) -> int:
        declared = self.declared(recording_index)
        if declared is None:
            return 0
        return math.ceil(self._tolerance_seconds * declared.sample_rate)

    # -- plans ------------------------------------------------------------------------------

    def index(self, recording_index: int, trace: DecodeTrace | None = None) -> Recording:
        """The recording's plan: the one this process has, else the index cache's (counted
        in ``trace.plans_loaded``: another process of the mount, or an earlier mount,
        computed it), else computed now and put in the cache."""
        plan = self._plans.get(recording_index)
        if plan is None:
            self._check_catalogued(recording_index)
            plan = self._load_or_compute(recording_index, trace)
            self.adopt(recording_index, plan)
        return plan

    def _check_catalogued(self, recording_index: int) -> None:
        """Refuse a recording whose file is not the one the source's catalogue was made
        from: every process of a mount makes or loads its own plans, and one that came to a
        recording after its file was rewritten must not serve the new audio."""
        expected = self._catalogued_stamps[recording_index]
        path = self._paths[recording_index]
        if expected and path is not None and file_version(path) != expected:
            raise SourceError(
                "changed since the source was catalogued (rewritten or replaced?): mount it "
                "again to serve the new audio",
                where=self._where(recording_index),
            )

    def adopt(self, recording_index: int, recording: Recording) -> None:
        """Keep a plan; check it against what the manifest declares.

        Raises :class:`ManifestMismatchError` when the rate or the channels
        differ (no frame could be served right); a length difference is kept
        in :attr:`mismatches` and handled by :meth:`read_frames`.
        """
        declared = self.declared(recording_index)
        recording_id = self._recording_ids[recording_index]
        if declared is not None:
            if (declared.sample_rate, declared.channels) != (
                recording.sample_rate,
                recording.channels,
            ) and not self._adopt_declared_rate(recording_index, recording, declared):
                message = (
                    f"recording {recording_id!r}: the manifest declares "
                    f"{declared.sample_rate} Hz, {declared.channels} channel(s); the audio has "
                    f"{recording.sample_rate} Hz, {recording.channels} channel(s)"
                )
                self.mismatches[recording_id] = message
                raise ManifestMismatchError(message, where=self._described_in[recording_index])
            difference = self._served_frames(recording_index, recording) - declared.num_frames
            if difference:
                self.mismatches[recording_id] = (
                    f"recording {recording_id!r}: the manifest declares {declared.num_frames} "
                    f"frames, the audio has {declared.num_frames + difference} ({difference:+d}, "
                    f"{difference / declared.sample_rate:+.4f} s; Lhotse's tolerance is "
                    f"{self._tolerance_seconds:g} s)"
                )
        self._plans[recording_index] = recording

    def _adopt_declared_rate(
        self, recording_index: int, recording: Recording, declared: AudioShape
    ) -> bool:
        """Whether the recording is served at the rate its manifest declares, resampled
        (and then how is kept); False when that rate cannot be right."""
        if not _served_at_declared_rate(recording, declared):
            return False
        try:
            resampler = OutputFormat(sample_rate=declared.sample_rate).resampler(
                recording.sample_rate
            )
        except UnsupportedAudioError:
            return False
        if resampler is not None:
            self._resamplers[recording_index] = resampler
        return True

    def _served_frames(self, recording_index: int, recording: Recording) -> int:
        """The recording's length as served: at the decoder's rate, or the declared one."""
        resampler = self._resamplers.get(recording_index)
        return (
            recording.num_frames
            if resampler is None
            else resampler.output_frames(recording.num_frames)
        )

    def _load_or_compute(self, recording_index: int, trace: DecodeTrace | None) -> Recording:
        key = self._plan_key(recording_index)
        plan_path = os.path.join(self.directory, _PLANS, f"{key}.arrow")
        loaded = self._load_plan(plan_path, recording_index, key)
        if loaded is not None:
            if trace is not None:
                trace.plans_loaded += 1
            return loaded
        return self._compute_plan(recording_index, key, plan_path)

    def _plan_key(self, recording_index: int) -> str:
        command = self._commands[recording_index]
        url = self._urls[recording_index]
        if command is not None:
            identity = f"command\0{command}"
        elif url is not None:  # the version its reads are pinned to
            identity = f"object\0{url}\0{self._object_version(recording_index, url)}"
        else:
            path = self._source_path(recording_index)
            try:
                status = os.stat(path)
            except OSError as exc:
                raise SourceError(
                    f"cannot read the audio: {exc.strerror}", where=self._where(recording_index)
                ) from exc
            identity = (
                f"file\0{path}\0{self._offsets[recording_index]}\0"
                f"{self._lengths[recording_index]}\0{status.st_size}\0{status.st_mtime_ns}\0"
                f"{status.st_ino}\0{status.st_ctime_ns}"
            )
        identity = f"{INDEX_VERSION}\0{identity}"
        return hashlib.sha256(identity.encode("utf-8", "surrogateescape")).hexdigest()[:32]

    def _load_plan(self, plan_path: str, recording_index: int, key: str) -> Recording | None:
        """A cached plan, if there is one and it holds up; ``None`` means compute it.

        A cached plan is checked like a shard's recording row: its numbers in
        range, its audio the file this recording's catalogue entry names (or
        the cache's own copy of it), its byte range inside that file, and its
        seek index inside its bytes.  One that fails is logged by the caller
        as recomputed, never served.
        """
        try:
            row = read_table(plan_path).to_pylist()[0]
            recording = recording_from_row(row)
            blob = self._checked_blob(row, recording, recording_index, key)
        except (ShardFormatError, IndexError, KeyError, TypeError, ValueError, OSError):
            return None  # not computed yet, unreadable or not to be trusted: compute it again
        self._blobs[recording_index] = blob
        self._blob_stamps[recording_index] = self._stamp(blob[0])
        return recording

    def _checked_blob(
        self, row: dict[str, Any], recording: Recording, recording_index: int, key: str
    ) -> tuple[str, int, int]:
        if recording.recording_id != self._recording_ids[recording_index]:
            raise ValueError("the plan is of another recording")
        source, offset, stored = str(row["source"]), int(row["blob_offset"]), row["stored_bytes"]
        plans = os.path.join(self.directory, _PLANS)
        if source == os.path.join(plans, f"{key}.flac"):
            expected_offset = 0
        elif self._urls[recording_index] is not None:
            expected_offset = 0
            if source != self._urls[recording_index]:
                raise ValueError("the plan's audio is not the recording's object")
        elif self._commands[recording_index] is not None or self._parquet_columns[recording_index]:
            expected_offset = 0
            if source != os.path.join(plans, f"{key}.audio"):
                raise ValueError("the plan's audio is not the cache's copy")
        else:
            expected_offset = int(self._offsets[recording_index])
            if source != self._source_path(recording_index):
                raise ValueError("the plan's audio is not the recording's file")
        if offset != expected_offset or not isinstance(stored, int) or stored <= 0:
            raise ValueError("the plan's byte range is not the recording's")
        if offset + stored > self._source_size(source):
            raise ValueError("the plan's byte range ends after its file")
        offsets = recording.seek_index.byte_offsets
        if recording.header_bytes > stored or offsets[0] < 0 or offsets[-1] >= stored:
            raise ValueError("the plan's seek index points outside its bytes")
        return source, offset, offset + stored

    def _compute_plan(self, recording_index: int, key: str, plan_path: str) -> Recording:
        plans = os.path.join(self.directory, _PLANS)
        recording_id = self._recording_ids[recording_index]
        path, offset, length = self._source_bytes(recording_index, key)
        with (
            tempfile.TemporaryDirectory(dir=plans) as workdir,
            contextlib.closing(LocalStore(workdir)) as fetched,
        ):
            try:
                if is_remote(path):  # indexed from a copy, fetched once; read by ranges after
                    self._check_room(length, recording_index)
                    self.store.download(path, os.path.join(workdir, _FETCHED))
                    blob = fetched.read(_FETCHED, 0, length)
                else:
                    blob = self.store.read(path, offset, offset + length)
            except CutfsError as exc:
                raise SourceError(
                    f"cannot read the audio: {exc}", where=self._where(recording_index)
                ) from exc
            try:
                indexed = index_recording(blob, recording_id, workdir, self._cache_room() - length)
            except CutfsError as exc:
                raise type(exc)(exc.message, where=self._where(recording_index)) from exc
            finally:
                blob.release()
            if indexed.stored_path is not None:  # transcoded to FLAC: keep it in the cache
                path = os.path.join(plans, f"{key}.flac")
                os.replace(indexed.stored_path, path)
                offset, length = 0, os.path.getsize(path)
        row = recording_row(indexed.recording, -1, -1, length, path, offset)
        table = pa.Table.from_pylist([row], schema=_PLAN_SCHEMA)
        write_table(plan_path, table, 0o600)
        self._blobs[recording_index] = (path, offset, offset + length)
        self._blob_stamps[recording_index] = self._stamp(path)
        return indexed.recording

    def _source_bytes(self, recording_index: int, key: str) -> tuple[str, int, int]:
        """The file (or object) holding a recording's bytes and their range (a command runs
        once)."""
        url = self._urls[recording_index]
        if url is not None:
            self.policy.check_object(url, self._where(recording_index))
            return url, 0, self._source_size(url)
        command = self._commands[recording_index]
        if command is not None:
            path = os.path.join(self.directory, _PLANS, f"{key}.audio")
            if not os.path.exists(path):
                where = self._where(recording_index)
                defining_file = _defining_file(self._described_in[recording_index])
                self.policy.check_command_file(defining_file, where)
                check_may_run_commands_here(where)
                limits = self.policy.command_limits
                room = max(min(limits.max_output_bytes, self._cache_room()), 0)
                limits = replace(limits, max_output_bytes=room)
                # In the directory of the file that defines it, as paths in it are relative to.
                run_command(command, path, limits, where, os.path.dirname(defining_file))
            return path, 0, os.path.getsize(path)
        path = self._source_path(recording_index)
        offset = int(self._offsets[recording_index])
        length = int(self._lengths[recording_index])
        column = self._parquet_columns[recording_index]
        if column is not None:  # offset and length are the row group and the row
            extracted = os.path.join(self.directory, _PLANS, f"{key}.audio")
            if not os.path.exists(extracted):
                cell = read_parquet_cell(path, column, offset, length)
                if len(cell) > self._cache_room():
                    raise SourceError(
                        f"the row's {len(cell)} bytes do not fit in what the index cache "
                        "quota leaves (--index-cache-size)",
                        where=self._where(recording_index),
                    )
                _write_atomically(extracted, cell)
            return extracted, 0, os.path.getsize(extracted)
        if length < 0:
            length = os.path.getsize(path) - offset
        return path, offset, length

    def _cache_room(self) -> int:
        """Bytes of audio copies the index cache may still take (may be negative)."""
        used = 0
        with contextlib.suppress(OSError), os.scandir(os.path.join(self.directory, _PLANS)) as it:
            for entry in it:
                if entry.name.endswith((".audio", ".flac")) and entry.is_file():
                    used += entry.stat().st_size
        return self.policy.cache_quota_bytes - used

    def _stamp(self, source: str) -> str:
        """What tells that a recording's audio changed: a file's stamp now, or the version
        an object's reads are pinned to (a changed object fails its reads by itself)."""
        return self.store.version(source) if is_remote(source) else file_version(source)

    def _mapped_stamp(self, path: str) -> str:
        """The stamp of the file the store reads for ``path``, taken from the descriptor
        it mapped (mapped now if need be), whatever the path holds since."""
        self.store.size(path)
        return self.store.version(path)

    def _source_size(self, source: str) -> int:
        try:
            return self.store.size(source) if is_remote(source) else os.stat(source).st_size
        except CutfsError as exc:
            raise SourceError(f"cannot reach the audio: {exc.message}", where=source) from exc

    def _object_version(self, recording_index: int, url: str) -> str:
        self.policy.check_object(url, self._where(recording_index))
        try:
            return self.store.version(url)
        except CutfsError as exc:
            raise SourceError(
                f"cannot reach the audio: {exc.message}", where=self._where(recording_index)
            ) from exc

    def _check_room(self, length: int, recording_index: int) -> None:
        """Refuse to fetch an object for indexing that the index cache quota has no room
        for (its copy is removed once the recording is indexed)."""
        if length > self._cache_room():
            raise SourceError(
                f"indexing fetches the object's {length} bytes, more than what the index "
                "cache quota leaves (--index-cache-size)",
                where=self._where(recording_index),
            )

    def _source_path(self, recording_index: int) -> str:
        path = self._paths[recording_index]
        assert path is not None
        return path

    def _where(self, recording_index: int) -> str:
        source = (
            self._urls[recording_index]
            or self._paths[recording_index]
            or f"{self._commands[recording_index]} |"
        )
        return f"{source} (recording {self._recording_ids[recording_index]!r})"

    # -- frames -----------------------------------------------------------------------------

    def expect_read(self, recording_index: int, first: int) -> None:
        plan = self._plans.get(recording_index)
        if plan is None:
            return
        resampler = self._resamplers.get(recording_index)
        if resampler is not None:  # ``first`` is at the declared rate
            first = resampler.input_span(first, first + 1, plan.num_frames)[0]
        plan.seek_index.expect(first - plan.preroll_frames)  # raises nothing

    def read_frames(
        self,
        recording_index: int,
        first: int,
        end: int,
        trace: DecodeTrace | None = None,
        *,
        ahead_frames: int = 0,
    ) -> Int16Array:
        """Frames ``[first, end)`` of the recording as its manifest declares it
        (``ahead_frames`` is ignored here).

        Past the end of shorter audio, frames within the tolerance are the
        reflection of the last frames (Lhotse's padding); the result stops
        short where even that cannot serve.
        """
        first_use = recording_index not in self._plans
        plan = self.index(recording_index)
        mismatch = self.mismatches.get(self._recording_ids[recording_index])
        if first_use and mismatch is not None and trace is not None:
            trace.notes.append(mismatch)
        actual = self._served_frames(recording_index, plan)
        end = min(end, actual + self._tolerance_frames(recording_index))
        if end <= actual:
            return self._served(recording_index, plan, first, max(first, end), trace)
        reflect_from = 2 * actual - 1 - end  # the earliest frame a reflection needs
        if reflect_from < 0:
            return self._served(recording_index, plan, first, actual, trace)
        start = min(first, reflect_from)
        decoded = self._served(recording_index, plan, start, actual, trace)
        positions = np.arange(max(first, actual), end)
        padding = decoded[2 * actual - 2 - positions - start]
        return np.concatenate(
            [decoded[first - start :] if first < actual else decoded[:0], padding]
        )

    def _served(
        self, recording_index: int, plan: Recording, first: int, end: int, trace: DecodeTrace | None
    ) -> Int16Array:
        """Frames ``[first, end)`` as served: decoded, and resampled to the declared rate
        where the recording is served at it (the frames of the whole recording resampled,
        as ``--sample-rate`` makes them: any range is the same wherever a read starts)."""
        resampler = self._resamplers.get(recording_index)
        if resampler is None or first >= end:
            return self._decode(recording_index, plan, first, end, trace)
        low, high = resampler.input_span(first, end, plan.num_frames)
        decoded = self._decode(recording_index, plan, low, high, trace)
        resampled = resampler.resample(decoded.astype(np.float64), low, first, end)
        served: Int16Array = np.clip(np.rint(resampled), -32768, 32767).astype(np.int16)
        return served

    def _decode(
        self, recording_index: int, plan: Recording, first: int, end: int, trace: DecodeTrace | None
    ) -> Int16Array:
        path, start, stop = self._blobs[recording_index]
        indexed = self._blob_stamps.get(recording_index)
        # The file at the path now, and the file the store maps (opened after a check of
        # the path, it could be another renamed into place between the two): both must
        # be the one indexed.  An object's reads are pinned to its version already.
        if self._stamp(path) != indexed or (
            not is_remote(path) and self._mapped_stamp(path) != indexed
        ):
            raise SourceError(
                "the audio file changed since its recording was indexed: remount (or wait "
                "for the index to be rebuilt) to serve the new audio",
                where=self._where(recording_index),
            )
        blob = Blob(self.store, path, start, stop)
        # The bytes of the decode in one request (one GET for an object not in the cache).
        at_hand = blob.prefetch(decode_spans(plan, len(blob), first, end))
        return decode_frames(blob, plan, first, end, trace, arriving=not at_hand)


def _stamp(source: str) -> str:
    """A digest of the names, sizes and times of every file under ``source``."""
    digest = hashlib.sha256()
    if os.path.isdir(source):
        for directory, subdirectories, names in os.walk(source):
            subdirectories.sort()
            for name in sorted(names):
                _stamp_file(digest, os.path.join(directory, name))
    else:
        _stamp_file(digest, source)
    return digest.hexdigest()


def _stamp_file(digest: Any, path: str) -> None:
    try:
        status = os.stat(path)
    except OSError:
        return
    times = f"{status.st_mtime_ns}\0{status.st_ctime_ns}"  # the change time: no user sets it
    digest.update(f"{path}\0{status.st_size}\0{times}\n".encode(errors="replace"))


def _catalogued_stamp(path: str | None, url: str | None, command: str | None) -> str:
    """The stamp of a recording's file now, as the catalogue keeps it ("" when the audio
    is no file of its own: an object, whose reads are pinned, or a command's output)."""
    if path is None or url is not None or command is not None:
        return ""
    return file_version(path)


def _recordings_table(catalogue: SourceCatalogue) -> pa.Table:
    rows = []
    for recording in catalogue.recordings:
        declared = recording.declared
        rows.append(
            {
                "recording_id": recording.recording_id,
                "path": recording.path,
                "command": recording.command,
                "offset_bytes": recording.offset_bytes,
                "length_bytes": -1 if recording.length_bytes is None else recording.length_bytes,
                "declared_rate": declared.sample_rate if declared else 0,
                "declared_channels": declared.channels if declared else 0,
                "declared_frames": declared.num_frames if declared else -1,
                "described_in": recording.described_in,
                "parquet_column": recording.parquet_column,
                "url": recording.url,
                "stamp": _catalogued_stamp(recording.path, recording.url, recording.command),
            }
        )
    return pa.Table.from_pylist(rows, schema=_CATALOGUE_RECORDINGS)


def _cuts_table(catalogue: SourceCatalogue) -> pa.Table:
    """The catalogue's cuts with recordings as numbers, column by column (no object per cut)."""
    cuts = catalogue.cuts.table()
    ids = pa.array([recording.recording_id for recording in catalogue.recordings], pa.string())
    channels = cuts.column("channels")
    return pa.table(
        [
            cuts.column("cut_id").cast(pa.large_string()),
            pc.index_in(cuts.column("recording_id"), value_set=ids).cast(pa.int32()),
            cuts.column("start_seconds"),
            cuts.column("duration_seconds"),
            pc.if_else(pc.is_null(channels), pa.scalar([], channels.type), channels),
            cuts.column("metadata").cast(pa.large_string()),
        ],
        schema=_CATALOGUE_CUTS,
    )


def _read_index_file(directory: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(directory, INDEX_FILE), encoding="utf-8") as index_file:
            info = json.load(index_file)
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or info.get("format") != INDEX_FORMAT:
        return None
    return info


def _write_atomically(path: str, data: bytes) -> None:
    descriptor, partial = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".partial-")
    try:
        with os.fdopen(descriptor, "wb") as output:
            output.write(data)
        os.chmod(partial, 0o600)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise


__all__ = [
    "DURATION_TOLERANCE_SECONDS",
    "INDEX_FILE",
    "SourceIndex",
    "default_cache_root",
    "duration_tolerance_seconds",
    "prepare_index",
]


#: FFmpeg decodes every Opus stream at 48 kHz; its header keeps the rate of the audio that
#: was encoded, which Lhotse's ``Recording.from_file`` declares (GigaSpeech's manifests do).
_OPUS_DECODED_RATE: Final = 48000


def _served_at_declared_rate(recording: Recording, declared: AudioShape) -> bool:
    """Whether a recording whose manifest declares another rate than the decoder gives is
    served at the declared one: Opus (decoded at 48 kHz whatever was encoded) with the
    channels the manifest declares, as Lhotse loads it."""
    return (
        recording.codec_name == "opus"
        and recording.sample_rate == _OPUS_DECODED_RATE
        and declared.channels == recording.channels
    )
