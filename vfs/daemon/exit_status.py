"""What a process's exit status says: the statuses ``cutfs mount`` ends with, and a
status as words for a message.

Kept apart from the daemon's modules: the command that starts a daemon reads these
without importing what the daemon serves with.
"""

from __future__ import annotations

import signal


class ExitCode:
    """Exit statuses of ``cutfs mount``, one per kind of start-up failure."""

    OK = 0
    ERROR = 1  # unexpected failure
    USAGE = 2  # bad command line
    BAD_SHARDS = 3  # the source (shards, manifests, dataset) is missing, unreadable or inconsistent
    BAD_MOUNTPOINT = 4  # the mountpoint is missing, not a directory, or mounting failed
    NO_FUSE = 5  # /dev/fuse or fusermount3 is missing


def how_it_ended(status: int) -> str:
    """A process's end for a message: "exited with status N" or "was killed by SIGNAME"
    (``status`` as ``subprocess`` and ``multiprocessing`` give it: minus the signal)."""
    if status >= 0:
        return f"exited with status {status}"
    try:
        return f"was killed by {signal.Signals(-status).name}"
    except ValueError:
        return f"was killed by signal {-status}"
