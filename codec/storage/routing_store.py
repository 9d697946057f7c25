"""One :class:`cutfs.codec.storage.byte_store.ByteStore` over local files and objects named by URL.

Sources served in place name their audio by path, and Lhotse ``url`` sources by the URL
of an object (``s3://bucket/key``, ``gs://...``, ``az://...``).  A name that is such a
URL is read from its location through a piece cache (one
:class:`cutfs.codec.storage.caching_store.CachingStore` per bucket, created on first use, in a
directory of the index cache); any other name goes to the local store.  Objects are
pinned as every object store pins them: a read of an object that changed since its
first use fails instead of serving other bytes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Sequence

from cutfs.codec.storage.byte_store import ByteStore
from cutfs.codec.storage.cache_usage import DEFAULT_DISK_BYTES
from cutfs.codec.storage.caching_store import CachingStore
from cutfs.codec.storage.object_location import ObjectLocation, is_remote, split_object_url
from cutfs.codec.storage.object_store import DEFAULT_STORE_DEADLINE_SECONDS, ObjectStore


class RoutingStore:
    """Local files through ``local``, objects through piece caches in ``pieces``."""

    def __init__(
        self,
        local: ByteStore,
        pieces: str,
        *,
        disk_cache_bytes: int = DEFAULT_DISK_BYTES,
        deadline_seconds: float = DEFAULT_STORE_DEADLINE_SECONDS,
    ) -> None:
        """``disk_cache_bytes`` bounds the pieces kept in ``pieces`` (each bucket's piece
        cache sweeps the whole directory once what it wrote passes the bound, as the
        processes of a mount do); ``deadline_seconds`` is how long a request to a store
        may take."""
        self._local = local
        self._pieces = pieces
        self._disk_cache_bytes = disk_cache_bytes
        self._deadline_seconds = deadline_seconds
        #: Per bucket: its store, and the piece cache in front of it (which pins through it).
        self._remote: dict[ObjectLocation, tuple[ObjectStore, CachingStore]] = {}
        self._lock = threading.Lock()

    def _route(self, name: str) -> tuple[ByteStore, str]:
        if not is_remote(name):
            return self._local, name
        _, cached, key = self._remote_of(name)
        return cached, key

    def _remote_of(self, name: str) -> tuple[ObjectStore, CachingStore, str]:
        location, key = split_object_url(name)
        with self._lock:
            stores = self._remote.get(location)
            if stores is None:
                os.makedirs(self._pieces, mode=0o700, exist_ok=True)
                remote = ObjectStore(location, deadline_seconds=self._deadline_seconds)
                cached = CachingStore(
                    remote, self._pieces, location.uri(), disk_bytes=self._disk_cache_bytes
                )
                stores = (remote, cached)
                self._remote[location] = stores
        return stores[0], stores[1], key

    def size(self, name: str) -> int:
        store, key = self._route(name)
        return store.size(key)

    def version(self, name: str) -> str:
        store, key = self._route(name)
        return store.version(key)

    def check_unchanged(self, name: str) -> None:
        store, key = self._route(name)
        store.check_unchanged(key)

    def read(self, name: str, start: int, stop: int) -> memoryview:
        store, key = self._route(name)
        return store.read(key, start, stop)

    def read_many(self, name: str, ranges: Sequence[tuple[int, int]]) -> list[memoryview]:
        store, key = self._route(name)
        return store.read_many(key, ranges)

    def stream(self, name: str, start: int, stop: int, chunk_bytes: int) -> Iterator[memoryview]:
        store, key = self._route(name)
        return store.stream(key, start, stop, chunk_bytes)

    def prefetch(self, name: str, ranges: Sequence[tuple[int, int]]) -> bool:
        store, key = self._route(name)
        return store.prefetch(key, ranges)

    def download(self, name: str, path: str) -> None:
        """Write a remote object whole to the file ``path`` (parts in flight bound the
        memory), not through the piece cache (what indexing reads once), of the version
        later reads are pinned to."""
        remote, _, key = self._remote_of(name)
        remote.download(key, path)

    def counters(self) -> dict[str, int]:
        totals = dict(self._local.counters())
        with self._lock:
            remote = [cached for _, cached in self._remote.values()]
        for store in remote:
            for counter, value in store.counters().items():
                totals[counter] = totals.get(counter, 0) + value
        return totals

    def close(self) -> None:
        with self._lock:
            remote = [cached for _, cached in self._remote.values()]
            self._remote.clear()
        for store in remote:
            store.close()  # and the object store behind it
        self._local.close()
