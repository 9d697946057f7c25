"""Directories only this process's user can write: the index cache, catalogue copies, the
folder of submitit's job pickles."""

from __future__ import annotations

import contextlib
import os
import stat

from cutfs.codec.errors import SourceError


def private_directory(
    path: str,
    what: str = "the index cache",
    remedy: str = "choose a private directory with --cache-dir",
) -> None:
    """Make sure ``path`` is a directory only this process's user can reach and write.

    It is created (mode 0700) if missing.  An existing one must be a real directory (not
    a link), owned by this user, and writable by nobody else: a cache that others can write
    could plant plans that serve other audio, a job folder pickles that run as this user.
    Raises :class:`SourceError` saying what is wrong (``what`` names the directory in the
    message, ``remedy`` says what to do).
    """
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        status = os.lstat(path)
    except OSError as exc:
        raise SourceError(f"cannot create {what}: {exc.strerror} ({remedy})", where=path) from exc
    user = os.geteuid()
    if not stat.S_ISDIR(status.st_mode):
        raise SourceError(f"{what} is not a directory (a link?)", where=path)
    if status.st_uid != user:
        raise SourceError(
            f"{what} belongs to uid {status.st_uid}, not to this process's user {user}: {remedy}",
            where=path,
        )
    if status.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise SourceError(
            f"{what} is writable by its group or others: {remedy} (or chmod go-w it)",
            where=path,
        )
    if status.st_mode & 0o077:
        with contextlib.suppress(OSError):
            os.chmod(path, 0o700)
