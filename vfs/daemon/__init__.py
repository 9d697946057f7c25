"""The daemon: one mount assembled, run, supervised and taken down.

- :mod:`.mount`: the daemon assembled for one mount (source, serving processes, the
  kernel's mount), run until unmounted or signalled, with its exit statuses;
  :mod:`.mount_options`: every option of a mount, declared once.
- :mod:`.serving_process`: the extra processes that serve one mount, started, watched and
  replaced; :mod:`.serving_stack`: what one serving process holds (library, decoders,
  cache, filesystem); :mod:`.request_slot`: the request a process decoding in turn is
  answering, for the daemon to fail if it dies; :mod:`.doorbell`: one process asking
  another to publish now; :mod:`.log_channel`: their log records, as checked plain data.
- :mod:`.serving_user`: the unprivileged user a root daemon reads its source as.
- :mod:`.kernel_tuning`: optional sysfs settings of the mount (read-ahead, background).
"""
