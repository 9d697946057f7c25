"""Helpers for the trust tests: a second, unprivileged user and directories it can reach.

The attacks of the trust tests are made by ``nobody`` (uid 65534), as another
user of a shared compute node would make them: it writes sources, and reads
a mount that root made with ``allow_other``.  Its reads go through plain
system tools (``ls``, ``cat``) run as that user, so nothing of the test
process's rights leaks into them.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

OTHER_USER = "nobody"


def other_uid() -> int:
    return pwd.getpwnam(OTHER_USER).pw_uid


def other_gid() -> int:
    return pwd.getpwnam(OTHER_USER).pw_gid


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a second user)")


@contextmanager
def public_directory() -> Iterator[Path]:
    """A fresh directory under /tmp that every user can traverse (0755, owned by root)."""
    path = Path(tempfile.mkdtemp(prefix="cutfs-trust-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def give_to_other_user(path: Path) -> None:
    """Make ``path`` (and everything below it) belong to the other user."""
    os.chown(path, other_uid(), other_gid())
    if path.is_dir():
        for root, directories, files in os.walk(path):
            for name in directories + files:
                os.chown(os.path.join(root, name), other_uid(), other_gid(), follow_symlinks=False)


def as_other_user(*command: str, timeout: float = 300) -> subprocess.CompletedProcess[bytes]:
    """Run a command as the other user; its output is returned, never checked here.

    ``timeout`` only guards against a hang: no test asserts a time with it (under load, an
    ``ls`` of a mount still starting its serving processes took longer than a minute)."""
    return subprocess.run(
        list(command),
        user=OTHER_USER,
        group=other_gid(),
        extra_groups=[],
        capture_output=True,
        timeout=timeout,
        check=False,
        cwd="/",
    )
