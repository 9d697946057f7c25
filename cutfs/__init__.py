"""cutfs: cuts of long compressed recordings served as exact WAV files.

The package has two layers:

- :mod:`cutfs.codec`, a library with no FUSE dependency: sources, shards, seek
  indexes, decoding and the WAV layout;
- :mod:`cutfs.vfs`, the read-only FUSE filesystem and the ``cutfs`` command over it.

In the repository they are the top-level ``codec/`` and ``vfs/`` folders.
"""

__version__ = "0.2.0"
