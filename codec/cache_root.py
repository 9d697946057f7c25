"""Where cutfs keeps its caches (indexes of sources served in place, catalogues and
pieces of object storage) unless told: a module of its own, imported by commands that
must start fast."""

from __future__ import annotations

import os


def default_cache_root() -> str:
    """Where index directories go unless told: ``$CUTFS_CACHE_DIR``, systemd's
    ``$CACHE_DIRECTORY``, else ``/var/cache/cutfs`` for root and ``~/.cache/cutfs`` for others."""
    explicit = os.environ.get("CUTFS_CACHE_DIR") or os.environ.get("CACHE_DIRECTORY")
    if explicit:  # CACHE_DIRECTORY: what systemd's CacheDirectory= made (the first of them)
        return explicit.split(":")[0]
    if os.geteuid() == 0:
        return "/var/cache/cutfs"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "cutfs")
