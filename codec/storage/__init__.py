"""Where stored bytes live, and how a bounded range of them is read.

- :mod:`.byte_store`: the seam, :class:`ByteStore` (named objects read by bounded range);
  :mod:`.blob`: one recording's bytes inside a store, read by blob-relative ranges.
- :mod:`.local_store`: files of a local or network file system, memory-mapped.
- :mod:`.object_store`: objects in object storage, each GET conditional on the version
  pinned at open; :mod:`.object_location`: where they are (``s3://``, ``gs://``,
  ``az://``); :mod:`.object_service`: the contract of a kind of storage, which
  :mod:`.s3_service`, :mod:`.gcs_service` and :mod:`.azure_service` implement.
- :mod:`.caching_store`: a piece cache on local disk and in memory in front of a remote
  store, its size shared between processes by :mod:`.cache_usage`.
- :mod:`.routing_store`: one store over local files and objects named by URL.
- :mod:`.memory_advice`: hints to the kernel about mapped pages that will be read soon.

Nothing here knows about audio: stores move bytes.
"""
