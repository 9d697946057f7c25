"""cutfs's filesystem: a read-only FUSE daemon over :mod:`cutfs.codec`, and its command.

Depends on :mod:`cutfs.codec`, never the reverse.

- :mod:`.cli`: the ``cutfs`` command (and ``cutfs.mounted``).
- :mod:`.daemon`: one mount assembled, run and supervised; its serving processes and the
  user it reads as.
- :mod:`.fuse`: the wire protocol with the kernel and the one errno boundary.
- :mod:`.tree`: the filesystem and the views its tree is composed of.
- :mod:`.frames`: frames on demand: the frame source, the block cache, the decode pool.
- :mod:`.stats`: counters, the board of several processes, Prometheus.
"""

if __name__ != "cutfs.vfs":  # the top-level folder imported by its own name
    raise ImportError(
        "import cutfs.vfs, not vfs: the folder vfs/ is the package cutfs.vfs (through the "
        "link cutfs/vfs); imported as vfs its modules would be second copies, with classes "
        "that are not cutfs's own"
    )
