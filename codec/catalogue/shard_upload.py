"""Putting a packed shard directory into object storage, the manifest last.

``cutfs pack SOURCE -o s3://bucket/prefix`` packs into a local scratch
directory and then calls :func:`upload_shards`: the shards first, then the
catalogue tables, then ``manifest.json`` with each shard's ETag added.  A
mount reads the manifest first, so until the upload is complete the prefix
is not mountable, and a mount refuses a shard whose ETag is not the one the
manifest records (replaced since it was packed).
"""

from __future__ import annotations

import json
import os

from cutfs.codec.catalogue.catalogue_copy import CATALOGUE_FILES
from cutfs.codec.catalogue.shard_format import MANIFEST_FILE
from cutfs.codec.errors import SourceError
from cutfs.codec.storage.object_location import ObjectLocation
from cutfs.codec.storage.object_service import ObjectStoreError
from cutfs.codec.storage.object_store import ObjectStore


def upload_shards(directory: str, uri: str) -> None:
    """Upload the shard directory ``directory`` to ``uri`` (``s3://bucket/prefix``).

    Raises :class:`SourceError` when the destination already holds a manifest
    (nothing is overwritten) or the store refuses.
    """
    store = ObjectStore(ObjectLocation.from_uri(uri))
    try:
        if store.exists(MANIFEST_FILE):
            raise SourceError(
                "the destination already holds a shard directory; choose a new prefix or remove it",
                where=uri,
            )
        with open(os.path.join(directory, MANIFEST_FILE), encoding="utf-8") as file:
            manifest = json.load(file)
        for shard in manifest["shards"]:
            shard["etag"] = store.put(shard["file"], os.path.join(directory, shard["file"]))
        for name in CATALOGUE_FILES:
            store.put(name, os.path.join(directory, name))
        staged = os.path.join(directory, MANIFEST_FILE + ".uploaded")
        with open(staged, "w", encoding="utf-8") as file:
            json.dump(manifest, file, indent=2)
        store.put(MANIFEST_FILE, staged)
    except ObjectStoreError as exc:
        raise SourceError(f"upload failed: {exc}", where=uri) from exc
    finally:
        store.close()
