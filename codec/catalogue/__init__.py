"""The catalogue: what recordings and cuts a corpus holds, in tables read in place.

- :mod:`.shard_format`: the on-disk format of a shard directory (version 2);
  :mod:`.shard_writer` writes one, :mod:`.shard_upgrade` rewrites format 1 as 2,
  :mod:`.shard_upload` puts one into object storage.
- :mod:`.shard_set`: a shard directory opened for reading (tables mapped, zero-copy blob
  views, ``read_frames``); :mod:`.remote_shards` opens one in object storage, with a local
  :mod:`.catalogue_copy` of its tables.
- :mod:`.mapped_table`: Arrow tables read in place from memory-mapped files, over which
  :mod:`.recording_table` and :mod:`.cut_table` are typed views.
- :mod:`.file_tree`: the mapped directory tree of served files; :mod:`.path_escape` maps
  ids to paths reversibly; :mod:`.kaldi_order` places the lines of per-cut Kaldi files;
  :mod:`.row_order` tells whether rows already come in the order a table needs.

Millions of cuts live here as mapped columns searched in place, never as Python objects.
"""
