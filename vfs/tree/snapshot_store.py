"""Snapshots of volatile files (``.cutfs/stats``), one per lookup, kept until forgotten.

A reader of ``.cutfs/stats`` must see one consistent text however many reads
it takes, so each lookup of it answers a new inode whose text is rendered then
(:mod:`cutfs.vfs.fuse.operations`), and reads of that inode are served from here.
When several processes serve a mount, the lookup and the reads of one snapshot
may reach different processes: the snapshot is then also written to a
directory the processes share, where any of them finds it.  At most
:data:`KEPT` snapshots are kept (the oldest go first): a forget may reach a
process that never saw the lookup, and a kernel that never forgets must not
grow the store.
"""

from __future__ import annotations

import contextlib
import os
from typing import Final

from cutfs.codec.trust.shared_file import read_regular_file, replace_file

#: Snapshots kept at once, in memory and in the shared directory.
KEPT: Final = 256
#: A shared snapshot larger than this is not read back (they are a few KiB).
_LARGEST_BYTES: Final = 64 << 20


class SnapshotStore:
    """Snapshots by inode; shared through ``directory`` when it is given."""

    def __init__(self, directory: str | None = None) -> None:
        self._directory = directory
        self._local: dict[int, bytes] = {}
        if directory is not None:
            os.makedirs(directory, mode=0o700, exist_ok=True)

    def _path(self, inode: int) -> str:
        assert self._directory is not None
        return os.path.join(self._directory, f"{inode:x}")

    def put(self, inode: int, snapshot: bytes) -> None:
        self._local[inode] = snapshot
        while len(self._local) > KEPT:
            del self._local[next(iter(self._local))]
        if self._directory is None:
            return
        self._trim_shared()
        replace_file(self._path(inode), snapshot, f"{self._path(inode)}.{os.getpid()}")

    def get(self, inode: int) -> bytes | None:
        """The snapshot of ``inode``, or ``None`` if no process has it (any more)."""
        snapshot = self._local.get(inode)
        if snapshot is not None or self._directory is None:
            return snapshot
        try:
            return read_regular_file(self._path(inode), _LARGEST_BYTES)
        except (OSError, ValueError):  # none, or not what a serving process puts there
            return None

    def drop(self, inode: int) -> None:
        self._local.pop(inode, None)
        if self._directory is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(inode))

    def _trim_shared(self) -> None:
        assert self._directory is not None
        with os.scandir(self._directory) as entries:
            files = sorted(
                (entry.stat().st_mtime_ns, entry.path) for entry in entries if entry.is_file()
            )
        for _, path in files[: max(0, len(files) - KEPT + 1)]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
