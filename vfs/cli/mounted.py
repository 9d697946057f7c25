"""``cutfs.mounted``: a mount for the duration of a ``with`` block, as notebooks and tests want.

The mount is made by the ``cutfs`` command, exactly as a user would run it (a daemon in
the background, ready when the command returns, started clean: see
:mod:`cutfs.codec.trust.clean_start`), and is always unmounted on the way out,
errors included.  Options are the mount options' ``-o`` keys (the long options with ``_``
for ``-``, see :mod:`cutfs.vfs.daemon.mount_options`):
``mounted(src, cache_size="2G", serving_processes=4, allow_other=True)`` runs
``cutfs mount --cache-size 2G --serving-processes 4 --allow-other src MOUNTPOINT``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cutfs.codec.errors import CutfsError
from cutfs.codec.trust.clean_start import clean_environment, python_command
from cutfs.vfs.cli.mount_arguments import flags_for


class MountFailedError(CutfsError):
    """``cutfs mount`` refused or failed; the message is its own."""


@contextmanager
def mounted(
    source: str | os.PathLike[str],
    mountpoint: str | os.PathLike[str] | None = None,
    **options: str | int | float | bool | None,
) -> Iterator[Path]:
    """Mount ``source`` at ``mountpoint`` (a new temporary directory if ``None``) and yield it.

    ``True`` options become flags, ``False`` their ``--no-`` form where there is one (else
    nothing), ``None`` nothing; lists repeat the option.  Raises TypeError for a keyword
    that is no mount option, and :class:`MountFailedError` with the command's message when
    the mount fails.
    """
    temporary = mountpoint is None
    target = Path(tempfile.mkdtemp(prefix="cutfs-")) if mountpoint is None else Path(mountpoint)
    command = python_command(
        "cutfs.vfs.cli", ["mount", *flags_for(options), os.fspath(source), str(target)]
    )
    result = subprocess.run(
        command, cwd="/", env=clean_environment(), capture_output=True, text=True, check=False
    )
    try:
        if result.returncode != 0:
            raise MountFailedError(result.stderr.strip() or f"status {result.returncode}")
        yield target
    finally:
        _unmount(target)
        if temporary:
            shutil.rmtree(target, ignore_errors=True)


def _unmount(target: Path) -> None:
    if not os.path.ismount(target):
        return
    result = subprocess.run(["fusermount3", "-u", str(target)], capture_output=True, check=False)
    if result.returncode != 0:  # busy (a file still open): detach now, finish when closed
        subprocess.run(["fusermount3", "-u", "-z", str(target)], capture_output=True, check=False)
