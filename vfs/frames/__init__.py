"""Frames on demand: from a read's frame range to decoded samples, cached.

- :mod:`.frame_source`: frame ranges of recordings from the block cache, decoding exactly
  what it lacks, once, whoever else waits for it.
- :mod:`.block_cache`: a size-bounded LRU of decoded blocks of any length.
- :mod:`.decode_pool`: decoding off the event loop, in worker processes (or threads), each
  request with a deadline; :mod:`.worker_message`: what a worker may send back, as checked
  plain data (never a pickle: workers parse other people's media); :mod:`.zygote`: the
  process that forks a serving process's workers, already the serving user.
"""
