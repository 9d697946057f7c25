"""Finding a source's files: a walk that stays inside the source and skips what is not a file.

Source directories are written by other people.  The walk never follows a
symbolic link to a directory (so a link loop cannot keep a mount from
starting, and a link to ``/`` does not pull the whole machine in), and it
keeps only regular files: a FIFO named ``x.wav`` would block the reader that
opens it, a device would read forever.  Links to files are kept here;
whether their targets lie where the mount may read is checked when they are
opened (:mod:`cutfs.codec.trust.source_policy`).
"""

from __future__ import annotations

import os
import stat

from cutfs.codec.sources.catalogue import Refusals


def files_under(
    directory: str, suffixes: tuple[str, ...], refusals: Refusals | None = None
) -> list[str]:
    """Regular files below ``directory`` whose names end with one of ``suffixes``, sorted.

    Suffixes are compared case-insensitively.  Files left out for what they
    are (not regular, a dangling or looping link) are noted in ``refusals``.
    """
    found = []
    lowered = tuple(suffix.lower() for suffix in suffixes)
    for root, subdirectories, names in os.walk(directory, onerror=None, followlinks=False):
        subdirectories.sort()
        for name in names:
            if not name.lower().endswith(lowered):
                continue
            path = os.path.join(root, name)
            problem = _not_a_regular_file(path)
            if problem is None:
                found.append(path)
            elif refusals is not None:
                refusals.note(f"{path}: skipped: {problem}")
    return sorted(found)


def _not_a_regular_file(path: str) -> str | None:
    try:
        status = os.stat(path)
    except OSError as exc:
        return f"cannot follow it ({exc.strerror})"
    if not stat.S_ISREG(status.st_mode):
        return "not a regular file (a FIFO, socket, device or directory)"
    return None
