"""The sandbox of the processes that parse data: what they run as, may call and may open.

- :mod:`.serving_user`: the unprivileged user a root daemon reads its source as, and
  dropping every privilege to it (ids, capabilities, ``no_new_privs``);
- :mod:`.syscall_filter`: the seccomp filter of those processes (no programs but the
  source's commands, no network but object storage);
- :mod:`.path_confinement`: the Landlock rules of where they may read and write.

Used by the serving processes (:mod:`cutfs.vfs.daemon`) and by the decoder workers and
their zygote (:mod:`cutfs.vfs.frames`); it depends on neither.
"""
