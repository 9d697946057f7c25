"""Packing: from sources to shard directories, in partitions any engine can run.

- :mod:`.packer`: ``cutfs pack`` in three steps (plan, partitions, commit), in one call.
- :mod:`.plan`: which recordings and cuts each partition packs (``pack plan``);
  :mod:`.partition_packer`: one partition indexed and stored in its shard (``pack run``);
  :mod:`.commit`: the partitions' tables merged, the manifest written last (``pack
  commit``); :mod:`.status`: how far a pack is, from its markers alone.
- :mod:`.output`: where a pack writes (a directory or an object-storage prefix);
  :mod:`.engines`: who runs the partitions (local processes, Slurm through submitit, Ray);
  :mod:`.progress`: what the steps report to a progress display.
"""
