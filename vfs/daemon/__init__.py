"""The daemon: one mount assembled, run, supervised and taken down.

- :mod:`.mount`: the daemon assembled for one mount (source, serving processes, the
  kernel's mount), run until unmounted or signalled, with its exit statuses;
  :mod:`.mount_options`: every option of a mount, declared once.
- :mod:`.supervisor`: the one process that keeps root and parses nothing: it starts,
  watches, fails and replaces the serving processes.
- :mod:`.serving_process`: the processes that open the source and serve the mount, as
  the serving user; :mod:`.serving_stack`: what one serving process holds (library,
  decoders, cache, filesystem); :mod:`.request_slot`: the request a process is answering
  and its heartbeat, for the supervisor to see; :mod:`.doorbell`: one process asking
  another to publish now; :mod:`.log_channel`: their log records, as checked plain data.
- :mod:`.process_name`: what the processes are called in ``ps``.  What they run as, may
  call and may open is :mod:`cutfs.vfs.sandbox`'s.
- :mod:`.kernel_tuning`: optional sysfs settings of the mount (read-ahead, background).
"""
