"""A local copy of a shard directory's catalogue, for shards on network storage.

A mount searches its catalogue (the cuts and recordings tables and their
file trees) in place, through memory maps, on the daemon's event loop.
That is right for local disks, where a page fault costs a fraction of a
millisecond; on NFS or a FUSE store a fault waits for the network, and a
stalled server would stall every lookup.  So a catalogue on such storage is
copied once into the local cache (``<cache root>/catalogues/<key>``, private
to the user) and mapped from there; only decoding, which runs in workers
under a deadline, reads the shards themselves.  The key covers the
manifest and the tables' (inode, size, modification time), so a changed
directory gets a fresh copy.  The cache and the copies must be private to the
daemon's user (:func:`cutfs.codec.trust.private_directory.private_directory`): a copy
planted by someone else would be served.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Final

from cutfs.codec.catalogue.file_tree import TREE_FILES
from cutfs.codec.catalogue.kaldi_order import KALDI_ORDER_FILE
from cutfs.codec.catalogue.shard_format import (
    CUTS_FILE,
    CUTS_TREE,
    MANIFEST_FILE,
    RECORDINGS_FILE,
    RECORDINGS_TREE,
)
from cutfs.codec.errors import SourceError
from cutfs.codec.storage.local_store import file_stamp
from cutfs.codec.trust.private_directory import private_directory

#: File system types whose page faults may wait on a network (prefixes of
#: /proc/self/mountinfo's type field: "fuse.sshfs", "nfs4", ...).
NETWORK_FILESYSTEMS: Final = (
    "nfs",
    "cifs",
    "smb",
    "fuse",
    "ceph",
    "lustre",
    "gpfs",
    "beegfs",
    "9p",
    "glusterfs",
    "afs",
    "panfs",
    "wekafs",
    "virtiofs",
)
CATALOGUE_FILES: Final = (
    RECORDINGS_FILE,
    CUTS_FILE,
    KALDI_ORDER_FILE,
    *(tree + suffix for tree in (CUTS_TREE, RECORDINGS_TREE) for suffix in TREE_FILES),
)


def catalogue_directory(shard_dir: str, cache_root: str | None) -> str:
    """Where to map ``shard_dir``'s catalogue from: the directory itself when it is on local
    storage (or no cache is given), else its local copy, made if missing.

    Raises :class:`SourceError` when the copy cannot be made.
    """
    if cache_root is None or not is_on_network_storage(shard_dir):
        return shard_dir
    present = [name for name in CATALOGUE_FILES if os.path.exists(os.path.join(shard_dir, name))]
    digest = hashlib.sha256()
    with open(os.path.join(shard_dir, MANIFEST_FILE), "rb") as manifest:
        digest.update(manifest.read())
    for name in present:
        digest.update(f"{name}\0{file_stamp(os.path.join(shard_dir, name))}\0".encode())

    def fill(staging: str) -> None:
        for name in present:
            shutil.copyfile(os.path.join(shard_dir, name), os.path.join(staging, name))
            os.chmod(os.path.join(staging, name), 0o600)

    return cached_catalogue(cache_root, digest.hexdigest(), fill)


def cached_catalogue(cache_root: str, digest: str, fill: Callable[[str], None]) -> str:
    """``<cache_root>/catalogues/<digest>``, made if missing by ``fill`` writing the files
    into a private staging directory that is then renamed into place (so a copy is
    complete or absent).  The cache directories must be private to this user (a copy
    planted by someone else must not be mapped).  Raises :class:`SourceError` when the
    copy cannot be made (``fill`` may raise its own :class:`CutfsError`).
    """
    parent = os.path.join(cache_root, "catalogues")
    copy = os.path.join(parent, digest[:32])
    private_directory(cache_root)
    private_directory(parent)
    if os.path.isdir(copy):
        private_directory(copy)
        return copy
    try:
        staging = tempfile.mkdtemp(prefix=".partial-", dir=parent)
        try:
            fill(staging)
            os.rename(staging, copy)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    except FileExistsError:
        pass  # another mount made the same copy meanwhile
    except OSError as exc:
        raise SourceError(
            f"cannot copy the catalogue to the local cache: {exc.strerror or exc}",
            where=parent,
        ) from exc
    return copy


def is_on_network_storage(path: str) -> bool:
    """Whether ``path`` is on a file system of :data:`NETWORK_FILESYSTEMS` (by the mount
    with the longest mount point containing it; ``False`` when that cannot be read)."""
    target = os.path.realpath(path)
    best, best_type = "", ""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mountinfo:
            for line in mountinfo:
                fields = line.split()
                if "-" not in fields:
                    continue
                mount_point = _unescape(fields[4])
                filesystem = fields[fields.index("-") + 1]
                inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best):
                    best, best_type = mount_point, filesystem
    except OSError:
        return False
    return best_type.startswith(NETWORK_FILESYSTEMS)


def _unescape(field: str) -> str:
    """Undo mountinfo's octal escapes of spaces, tabs, newlines and backslashes."""
    for code, character in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, character)
    return field
