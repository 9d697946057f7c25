"""A read-only FUSE passthrough of a directory: slow storage that a test can pause.

Run as ``python tests/support/pausable_fs.py SOURCE MOUNTPOINT``.  Sending the process
SIGSTOP makes every access to MOUNTPOINT block, as with an NFS server that
stopped answering; SIGCONT lets it go on.  Used by the fault tests only.
"""

from __future__ import annotations

import errno
import os
import sys

import pyfuse3
import trio


class Passthrough(pyfuse3.Operations):
    def __init__(self, source: str) -> None:
        super().__init__()
        self._paths = {pyfuse3.ROOT_INODE: source}

    def _path(self, inode: int) -> str:
        try:
            return self._paths[inode]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ENOENT) from None

    def _attributes(self, path: str) -> pyfuse3.EntryAttributes:
        try:
            info = os.lstat(path)
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = info.st_ino
        self._paths[info.st_ino] = path
        entry.st_mode = info.st_mode
        entry.st_nlink = info.st_nlink
        entry.st_uid = info.st_uid
        entry.st_gid = info.st_gid
        entry.st_size = info.st_size
        entry.st_blksize = 4096
        entry.st_blocks = info.st_blocks
        entry.st_atime_ns = info.st_atime_ns
        entry.st_mtime_ns = info.st_mtime_ns
        entry.st_ctime_ns = info.st_ctime_ns
        entry.attr_timeout = entry.entry_timeout = 0
        return entry

    async def lookup(self, parent_inode: int, name: bytes, ctx: object = None) -> object:
        return self._attributes(os.path.join(self._path(parent_inode), os.fsdecode(name)))

    async def getattr(self, inode: int, ctx: object = None) -> object:
        if inode == pyfuse3.ROOT_INODE:
            attributes = self._attributes(self._paths[inode])
            attributes.st_ino = pyfuse3.ROOT_INODE
            return attributes
        return self._attributes(self._path(inode))

    async def opendir(self, inode: int, ctx: object) -> int:
        return inode

    async def readdir(self, fh: int, start_id: int, token: object) -> None:
        names = sorted(os.listdir(self._path(fh)))
        for position, name in enumerate(names[start_id:], start=start_id):
            attributes = self._attributes(os.path.join(self._path(fh), name))
            if not pyfuse3.readdir_reply(token, os.fsencode(name), attributes, position + 1):
                return

    async def open(self, inode: int, flags: int, ctx: object) -> object:
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise pyfuse3.FUSEError(errno.EROFS)
        return pyfuse3.FileInfo(fh=os.open(self._path(inode), os.O_RDONLY))

    async def read(self, fh: int, off: int, size: int) -> bytes:
        return os.pread(fh, size, off)

    async def release(self, fh: int) -> None:
        os.close(fh)

    async def statfs(self, ctx: object) -> object:
        stats = pyfuse3.StatvfsData()
        info = os.statvfs(self._paths[pyfuse3.ROOT_INODE])
        for attribute in (
            "f_bsize",
            "f_frsize",
            "f_blocks",
            "f_bfree",
            "f_bavail",
            "f_files",
            "f_ffree",
            "f_favail",
            "f_namemax",
        ):
            setattr(stats, attribute, getattr(info, attribute))
        return stats


def main() -> None:
    source, mountpoint = sys.argv[1], sys.argv[2]
    pyfuse3.init(
        Passthrough(os.path.abspath(source)),
        mountpoint,
        {"fsname=pausable", "ro", "default_permissions"},
    )
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=True)


if __name__ == "__main__":
    main()
