"""The FUSE side: the wire protocol with the kernel, and the one errno boundary.

- :mod:`.operations`: the pyfuse3 Operations, a thin adapter over the filesystem; the one
  place where exceptions become errno values (:mod:`.fs_error` is the error it raises).
- :mod:`.device_channel`: requests served from the mount's ``/dev/fuse`` descriptor (or a
  clone of it), read and answered without pyfuse3's loop.
- :mod:`.page_pusher`: the rest of a file put into the kernel's page cache
  (``FUSE_NOTIFY_STORE``) before it is asked for.
"""
