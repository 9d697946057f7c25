"""Trust: what data from other people may make cutfs read, run and hold, and how cutfs
starts its processes.

- :mod:`.clean_start`: every Python process cutfs starts is an isolated interpreter
  running from ``/`` with a minimal environment (imports nothing but the standard library:
  it runs first).
- :mod:`.limits`: range checks for every number read from data cutfs did not write.
- :mod:`.source_policy`: where a source served in place may make cutfs read (its roots),
  and whether its commands may run; :mod:`.command_runner` runs one within limits.
- :mod:`.private_directory`: directories only their user can write (caches, submitit's
  folder); :mod:`.shared_file`: files in directories others can write, read without
  trusting them.

This package's ``__init__`` imports nothing: the ``cutfs`` entry point imports
:mod:`.clean_start` before anything else.
"""
