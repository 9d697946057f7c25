"""Files in a directory another user can write, read and replaced without trusting it.

Whoever can write a directory can put a FIFO (an ``open`` for reading blocks until a writer
comes), a device, a link or a huge file where a process expects its own small file.  Such
files are read here without following a link and without blocking, only if they are
regular files, and up to a bound; a process's own file is written anew (never through
what is at its name) and renamed into place, so a reader never sees half of it.
"""

from __future__ import annotations

import contextlib
import os
import stat
from typing import Final

#: How a file is created: anew, never through a link or into a FIFO already there.
_NEW_FILE: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def read_regular_file(path: str, most_bytes: int) -> bytes:
    """The bytes of the regular file at ``path``.

    Raises FileNotFoundError when there is none, OSError when it cannot be opened (a link:
    ELOOP), ValueError when it is not a regular file or holds more than ``most_bytes``."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with open(descriptor, "rb") as file:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise ValueError("not a regular file")
        content = file.read(most_bytes + 1)
    if len(content) > most_bytes:
        raise ValueError(f"larger than {most_bytes} bytes")
    return content


def replace_file(path: str, content: bytes, temporary: str, mode: int = 0o600) -> None:
    """Put ``content`` at ``path``: written to ``temporary`` (made anew with ``mode``:
    whatever was at that name is removed first) and renamed over ``path``.  Raises
    OSError."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary)
    descriptor = os.open(temporary, _NEW_FILE, mode)
    with open(descriptor, "wb") as file:
        file.write(content)
    os.replace(temporary, path)
