"""cutfs's library: from stored recordings to exact frames, with no FUSE in sight.

Nothing here imports the filesystem layer (:mod:`cutfs.vfs`, pyfuse3, trio): the library
packs sources into shards and reads exact frame ranges back on its own (a test checks).

- :mod:`.storage`: where stored bytes live (local files, object storage, the piece cache).
- :mod:`.audio`: the codec proper (seek index, decoders, PCM, resampling, the WAV layout).
- :mod:`.catalogue`: shard directories and the mapped tables and trees of a corpus.
- :mod:`.sources`: the inputs pack reads, and audio served where it lies.
- :mod:`.packing`: a pack as plan, partitions and commit, on any engine.
- :mod:`.trust`: limits, policy and commands for data from other people; the clean start.
- :mod:`.library`: what the filesystem serves from (a :class:`Library`, packed or in
  place); :mod:`.corpus` and :mod:`.cut_dataset`: reading without a mount (the API);
  :mod:`.errors`: the exception hierarchy.
"""

if __name__ != "cutfs.codec":  # the top-level folder imported by its own name
    raise ImportError(
        "import cutfs.codec, not codec: the folder codec/ is the package cutfs.codec (through the "
        "link cutfs/codec); imported as codec its modules would be second copies, with classes "
        "that are not cutfs's own"
    )
