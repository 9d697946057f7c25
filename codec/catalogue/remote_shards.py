"""A shard directory in object storage (``s3://bucket/prefix``), opened for serving.

At open, one listing of the location pins the manifest, the catalogue tables and the
shards: their sizes and ETags (or generations), on which every later GET is conditional.
Objects the listing does not show (a location that holds thousands of other objects,
credentials that may not list) are pinned with a HEAD each, 16 at a time.  The manifest
and the catalogue tables (the cuts and recordings tables, file trees and Kaldi order: a
few hundred bytes per cut) are downloaded once, in parallel, into
``<cache>/catalogues/<digest>`` and memory-mapped from there, exactly as a local
directory's; the digest covers the location, the manifest and the tables' versions, so a
second mount of the same shards downloads nothing, and changed tables get a fresh copy.
Each shard's size must be the one the manifest records.  A cold open costs three round
trips: the listing, the manifest, the tables.  Audio is
read through a :class:`cutfs.codec.storage.caching_store.CachingStore` in
``<cache>/pieces``: per cold cut, the pieces of its span (and the first time, its
recording's header), in one GET.

:class:`RemoteShards` is the picklable description a decoder worker opens the
same shards from: the location, the local catalogue and the pins, so workers
send no HEAD and agree with the daemon on every object's version.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

from cutfs.codec.catalogue.catalogue_copy import CATALOGUE_FILES, cached_catalogue
from cutfs.codec.catalogue.shard_format import MANIFEST_FILE, is_plain_file_name
from cutfs.codec.catalogue.shard_set import ShardSet
from cutfs.codec.errors import ShardFormatError, SourceError
from cutfs.codec.library import Library
from cutfs.codec.storage.cache_usage import DEFAULT_DISK_BYTES
from cutfs.codec.storage.caching_store import DEFAULT_MEMORY_BYTES, CachingStore
from cutfs.codec.storage.object_location import ObjectLocation
from cutfs.codec.storage.object_service import ObjectStoreError, PinnedObject, same_version
from cutfs.codec.storage.object_store import ObjectStore
from cutfs.codec.trust.source_policy import SourcePolicy

log = logging.getLogger("cutfs.remote_shards")

#: A manifest larger than this is not a cutfs manifest (it lists shards, not cuts).
MAX_MANIFEST_BYTES: Final = 64 << 20
_PARALLEL_HEADS: Final = 16
#: Pages of the location's listing read at open, of up to 1 000 objects each.
_MOST_LISTING_PAGES: Final = 10


@dataclass(frozen=True, slots=True)
class RemoteShards:
    """How to open a remote shard directory that the daemon has prepared (picklable)."""

    location: ObjectLocation
    #: The local copy of the manifest and catalogue tables.
    catalogue: str
    #: The piece cache directory.
    pieces: str
    #: Every shard's name, size and ETag, pinned by the daemon.
    pins: tuple[tuple[str, int, str], ...]
    disk_cache_bytes: int = DEFAULT_DISK_BYTES
    memory_cache_bytes: int = DEFAULT_MEMORY_BYTES
    deadline_seconds: float = 30.0

    @property
    def where(self) -> str:
        return f"{self.location.scheme}://{self.location.bucket}/{self.location.prefix}"

    def open(self, policy: SourcePolicy | None = None) -> Library:
        """The shards, for decoding (no cuts table)."""
        return self.open_shards(load_cuts=False)

    def open_shards(self, *, load_cuts: bool, remote: ObjectStore | None = None) -> ShardSet:
        """The shards, read through ``remote`` (which holds their pins already, and is
        closed with the shards) or a new store."""
        if remote is None:
            pins = {name: PinnedObject(size, etag) for name, size, etag in self.pins}
            remote = ObjectStore(self.location, deadline_seconds=self.deadline_seconds, pins=pins)
        store = CachingStore(
            remote,
            self.pieces,
            self.where,
            disk_bytes=self.disk_cache_bytes,
            memory_bytes=self.memory_cache_bytes,
        )
        try:
            return ShardSet(
                self.where, store, load_cuts=load_cuts, catalogue=self.catalogue, spec=self
            )
        except BaseException:
            store.close()
            raise


def open_remote_shards(
    uri: str,
    cache_root: str,
    *,
    disk_cache_bytes: int = DEFAULT_DISK_BYTES,
    memory_cache_bytes: int = DEFAULT_MEMORY_BYTES,
    deadline_seconds: float = 30.0,
) -> ShardSet:
    """Open ``s3://bucket/prefix`` for serving (see the module docstring).

    Raises :class:`SourceError` when the store cannot be reached or refuses,
    :class:`ShardFormatError` when what it holds is not a format-2 shard directory.
    """
    location = ObjectLocation.from_uri(uri)
    store = ObjectStore(location, deadline_seconds=deadline_seconds)
    try:
        listed = _listing(store)
        store.pin_from(listed, [MANIFEST_FILE, *CATALOGUE_FILES])
        try:
            manifest_bytes = store.get_whole(MANIFEST_FILE, MAX_MANIFEST_BYTES)
        except ObjectStoreError as exc:
            raise SourceError(f"cannot read the manifest: {exc.message}", where=uri) from exc
        shard_names = _shard_names(manifest_bytes, uri)
        catalogue = _fetched_catalogue(store, manifest_bytes, cache_root)
        store.pin_from(listed, shard_names)
        del listed
        pins = _pinned_shards(store, shard_names, manifest_bytes)
        description = RemoteShards(
            location,
            catalogue,
            os.path.join(cache_root, "pieces"),
            pins,
            disk_cache_bytes,
            memory_cache_bytes,
            deadline_seconds,
        )
        return description.open_shards(load_cuts=True, remote=store)
    except BaseException:
        store.close()
        raise


def _listing(store: ObjectStore) -> dict[str, PinnedObject]:
    """The location's objects as a bounded listing shows them; none when the store will
    not list (credentials may allow reading objects and not listing them): every object
    is then pinned with a HEAD."""
    try:
        return store.listed(_MOST_LISTING_PAGES)
    except ObjectStoreError as exc:
        log.info("cannot list %s (%s): each object is looked up alone", store.location.uri(), exc)
        return {}


def _shard_names(manifest_bytes: bytes, uri: str) -> list[str]:
    """The shard file names a manifest lists; a format-1 manifest is refused (its blobs
    can only be found by reading whole Arrow record batches)."""
    try:
        manifest = json.loads(manifest_bytes)
    except ValueError as exc:
        raise ShardFormatError(f"unreadable manifest: {exc}", where=uri) from exc
    if not isinstance(manifest, dict) or manifest.get("version") != 2:
        raise ShardFormatError(
            "only shard format 2 can be served from object storage: mount it from a local "
            "directory, or pack it again with this cutfs",
            where=uri,
        )
    shards = manifest.get("shards")
    if not isinstance(shards, list):
        raise ShardFormatError("the manifest lists no shards", where=uri)
    names = [shard.get("file") if isinstance(shard, dict) else None for shard in shards]
    for name in names:  # checked before any request names an object after them
        if not isinstance(name, str) or not is_plain_file_name(name):
            raise ShardFormatError(
                f"shard file name {name!r} is not a plain name under the prefix", where=uri
            )
    return [str(name) for name in names]


def _pin_each(store: ObjectStore, names: list[str]) -> list[PinnedObject]:
    """Every object's pin: a HEAD for each one not pinned yet, a few at a time."""
    if all(store.is_pinned(name) for name in names):
        return [store.pin(name) for name in names]
    with ThreadPoolExecutor(_PARALLEL_HEADS, thread_name_prefix="cutfs-head") as pool:
        return list(pool.map(store.pin, names))


def _fetched_catalogue(store: ObjectStore, manifest_bytes: bytes, cache_root: str) -> str:
    """The local copy of the manifest and the catalogue tables, downloaded if missing."""
    digest = hashlib.sha256(store.location.uri().encode() + b"\0" + manifest_bytes)
    with contextlib.suppress(ObjectStoreError):  # the loop below says which one failed
        _pin_each(store, list(CATALOGUE_FILES))
    for name in CATALOGUE_FILES:
        try:
            digest.update(f"{name}\0{store.version(name)}\0".encode())
        except ObjectStoreError as exc:
            raise SourceError(
                f"cannot read the catalogue table {name}: {exc.message}",
                where=store.location.uri(),
            ) from exc

    def download(name: str, staging: str) -> None:
        try:
            store.download(name, os.path.join(staging, name))
        except ObjectStoreError as exc:
            raise SourceError(f"cannot download the catalogue: {exc}", where=name) from exc

    def fill(staging: str) -> None:
        with open(os.path.join(staging, MANIFEST_FILE), "wb") as manifest:
            manifest.write(manifest_bytes)
        with ThreadPoolExecutor(len(CATALOGUE_FILES), thread_name_prefix="cutfs-table") as pool:
            for done in [pool.submit(download, name, staging) for name in CATALOGUE_FILES]:
                done.result()

    return cached_catalogue(cache_root, digest.hexdigest(), fill)


def _pinned_shards(
    store: ObjectStore, names: list[str], manifest_bytes: bytes
) -> tuple[tuple[str, int, str], ...]:
    """Every shard's (name, size, ETag), each checked against the size the manifest
    records.  Raises :class:`SourceError` when a shard cannot be reached."""
    manifest = json.loads(manifest_bytes)
    recorded = {
        str(shard.get("file")): (shard.get("bytes"), shard.get("etag"))
        for shard in manifest["shards"]
        if isinstance(shard, dict)
    }
    try:
        pinned = _pin_each(store, names)
    except ObjectStoreError as exc:
        raise SourceError(f"cannot reach a shard: {exc}", where=store.location.uri()) from exc
    for name, pin in zip(names, pinned, strict=True):
        size, etag = recorded.get(name, (None, None))
        if (isinstance(size, int) and size != pin.size) or (
            isinstance(etag, str) and not same_version(etag, pin.etag)
        ):
            raise ShardFormatError(
                f"the shard is not the one packed (it has {pin.size} bytes and ETag {pin.etag}, "
                f"the manifest says {size} and {etag}): replaced, or not fully uploaded",
                where=f"{store.location.uri()} {name}",
            )
    return tuple((name, pin.size, pin.etag) for name, pin in zip(names, pinned, strict=True))
