"""cutfs's codec library: shards, seek indexes, decoding and the WAV layout.

Nothing here imports the filesystem layer (pyfuse3, trio): the library can be
used on its own to pack recordings and to read exact frame ranges back.
"""
