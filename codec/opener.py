"""The one place that decides what a source is and opens the :class:`Library` serving it.

A source is a shard directory in object storage (``s3://``, ``gs://``, ``az://``), a local
shard directory (it holds ``manifest.json``), or anything else ``cutfs pack`` reads, served
in place through an index prepared in the cache.  The mount, the serving processes and
``cutfs.open`` all open sources here, each passing the policy it reads under: a mount
confines a source to its own location (the default), ``cutfs.open`` and ``cutfs pack``
read with the caller's own rights (:meth:`SourcePolicy.everything`).
"""

from __future__ import annotations

import os

from cutfs.codec.cache_root import default_cache_root
from cutfs.codec.catalogue.remote_shards import open_remote_shards
from cutfs.codec.catalogue.shard_format import MANIFEST_FILE
from cutfs.codec.catalogue.shard_set import ShardSet
from cutfs.codec.errors import SourceError
from cutfs.codec.library import Library
from cutfs.codec.packing.plan import refuse_uncommitted
from cutfs.codec.sources.source_index import SourceIndex, prepare_index
from cutfs.codec.storage.cache_usage import DEFAULT_DISK_BYTES
from cutfs.codec.storage.object_location import is_remote
from cutfs.codec.storage.object_store import DEFAULT_STORE_DEADLINE_SECONDS
from cutfs.codec.trust.source_policy import SourcePolicy


def open_source(
    source: str,
    cache_dir: str | None = None,
    policy: SourcePolicy | None = None,
    *,
    disk_cache_bytes: int = DEFAULT_DISK_BYTES,
    deadline_seconds: float = DEFAULT_STORE_DEADLINE_SECONDS,
) -> Library:
    """The library serving ``source``: a shard directory (local, or in object storage), or
    any other source prepared for serving in place.

    ``cache_dir`` holds indexes of sources served in place and local copies of catalogues
    on network or object storage (default: :func:`default_cache_root`).
    ``disk_cache_bytes`` bounds the piece cache of shards in object storage, or of the
    objects a source's recordings name; ``deadline_seconds`` is how long one request to
    object storage may take.  ``policy`` confines a source served in place (default: its
    own location, no commands).  Raises :class:`cutfs.codec.errors.SourceError` or
    :class:`cutfs.codec.errors.ShardFormatError` when the source cannot be read.
    """
    cache_root = cache_dir or default_cache_root()
    if is_remote(source):
        return open_remote_shards(
            source,
            cache_root,
            disk_cache_bytes=disk_cache_bytes,
            deadline_seconds=deadline_seconds,
        )
    if os.path.isdir(source) and os.path.exists(os.path.join(source, MANIFEST_FILE)):
        return ShardSet(source, cache_root=cache_root)
    if not os.path.exists(source):
        raise SourceError("no such file or directory", where=source)
    refuse_uncommitted(source)
    policy = policy or SourcePolicy.for_source(source)
    directory = prepare_index(source, cache_root, policy)
    return SourceIndex(
        directory,
        policy=policy,
        disk_cache_bytes=disk_cache_bytes,
        deadline_seconds=deadline_seconds,
    )
