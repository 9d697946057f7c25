"""The pyfuse3 Operations: a thin adapter over :class:`cutfs.vfs.tree.filesystem.Filesystem`.

This is the one place where exceptions become errno values.  pyfuse3 only
understands :class:`pyfuse3.FUSEError`; anything else raised by a handler can
end its main loop and leave a hung mount, so every handler goes through
:func:`_errno_boundary`: expected filesystem errors pass through as their
errno, cutfs errors (corrupt data, a dead decoder) become EIO with a log line
naming the recording, and any other exception is logged with its traceback
and also becomes EIO.

Files are immutable and need no per-open state, so by default an open is
answered ``ENOSYS``: the kernel then opens every file of the mount without
asking (zero-message opens, ``FUSE_NO_OPEN_SUPPORT``), sends no RELEASE, and
keeps file contents in the page cache across opens.  A cold cut then costs a
LOOKUP and its READs, a warm one nothing.  Reads name their file by inode (the
:class:`~cutfs.vfs.fuse.device_channel.DeviceChannel` passes the inode where the
kernel sent file handle 0).  With ``direct_io`` the kernel must be told per open,
so opens are answered, with the inode as the file handle.

Volatile files (``.cutfs/stats``) change while mounted, yet a reader must see
one consistent text however many reads it takes.  Without opens there is no
per-open state, so each *lookup* of a volatile file answers a new inode, a
snapshot: its text rendered then, served to every read of that inode and
dropped when the kernel forgets it.  Its entry is not cached (the next path
walk looks up again, and gets a new snapshot); its attributes are (they never
change).

Entries and attributes of everything else are cached by the kernel for a day.
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import os
import secrets
import stat
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import pyfuse3

from cutfs.codec.errors import CutfsError
from cutfs.vfs.fuse.read_ahead import SHORTEST_FILE_BYTES, CellFile
from cutfs.vfs.stats.statistics import Statistics
from cutfs.vfs.tree.filesystem import Attributes, Filesystem, FsError, ReadBuffers
from cutfs.vfs.tree.snapshot_store import SnapshotStore

log = logging.getLogger("cutfs.operations")

CACHE_TIMEOUT_SECONDS = 86400.0
#: The namespace of a WAV file's provenance attributes (``getfattr -d``).
XATTR_PREFIX = "user.cutfs."
#: Inodes of snapshots of volatile files (this bit, a serial number, and the file's own
#: inode in the low bits), above every inode of :mod:`cutfs.vfs.tree.view`.
_SNAPSHOT_INODES = 1 << 60
_SNAPSHOT_INODE_BITS = 20
_SNAPSHOT_SERIALS = 1 << 39
_VOLATILE_INODE_MASK = (1 << _SNAPSHOT_INODE_BITS) - 1
#: A volatile text is read whole into its snapshot (they are a few KiB).
_LARGEST_TEXT_BYTES = 1 << 30

_P = ParamSpec("_P")
_R = TypeVar("_R")

#: How failures are counted in ``.cutfs/stats``.
_ERROR_KINDS = {
    "CorruptDataError": "corrupt_data",
    "ShardFormatError": "shard_format",
    "DecodeDeadlineError": "deadline",
    "WorkerDiedError": "worker_died",
    "ManifestMismatchError": "manifest_mismatch",
    "SourceError": "source",
    "UnsupportedAudioError": "unsupported_audio",
}


@dataclass(frozen=True)
class Ownership:
    """Owner, permission bits and times shown for every node (``None``: the daemon's own
    ids; the time the Operations is made)."""

    uid: int | None = None
    gid: int | None = None
    file_mode: int = 0o444
    dir_mode: int = 0o555
    #: Access, modification and change time of every node, in ns since the epoch.  A mount
    #: sets it once for all its serving processes: the kernel drops a file's cached pages
    #: when an answer gives it another modification time than the one it holds.
    time_ns: int | None = None


def _errno_boundary(
    handler: Callable[_P, Coroutine[Any, Any, _R]],
) -> Callable[_P, Coroutine[Any, Any, _R]]:
    name = f"requests.{handler.__name__}"

    @functools.wraps(handler)
    async def guarded(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        statistics: Statistics = args[0]._statistics  # type: ignore[attr-defined]
        statistics.count(name)
        try:
            return await handler(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except FsError as exc:
            raise pyfuse3.FUSEError(exc.errno) from None
        except CutfsError as exc:
            statistics.error(_ERROR_KINDS.get(type(exc).__name__, "other"))
            log.error("%s failed: %s", handler.__name__, exc)
            raise pyfuse3.FUSEError(errno.EIO) from None
        except Exception:
            statistics.error("internal")
            log.exception("%s failed unexpectedly", handler.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return guarded


class Operations(pyfuse3.Operations):
    """Answers the kernel's requests for one mount."""

    supports_dot_lookup = True
    enable_writeback_cache = False
    enable_acl = False

    def __init__(
        self,
        filesystem: Filesystem,
        ownership: Ownership | None = None,
        statistics: Statistics | None = None,
        direct_io: bool = False,
        snapshots: SnapshotStore | None = None,
    ) -> None:
        """``snapshots`` keeps what each open of a volatile file read (default: in this
        process only)."""
        super().__init__()
        ownership = ownership or Ownership()
        self._fs = filesystem
        self._uid = os.getuid() if ownership.uid is None else ownership.uid
        self._gid = os.getgid() if ownership.gid is None else ownership.gid
        self._file_mode = ownership.file_mode & 0o7777
        self._dir_mode = ownership.dir_mode & 0o7777
        self._statistics = statistics or Statistics()
        self._direct_io = direct_io
        self._snapshots = snapshots or SnapshotStore()
        # Handles of other serving processes' snapshots are theirs: start somewhere else.
        self._next_snapshot = secrets.randbelow(_SNAPSHOT_SERIALS)
        self._time_ns = time.time_ns() if ownership.time_ns is None else ownership.time_ns

    @property
    def statistics(self) -> Statistics:
        """What this process counts, for ``.cutfs/stats``."""
        return self._statistics

    @_errno_boundary
    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.EntryAttributes:
        started = time.perf_counter()
        attributes = await self._fs.lookup(parent_inode, name, ctx.uid)
        if attributes.volatile:
            attributes = await self._new_snapshot(attributes)
        self._statistics.observe("lookup", time.perf_counter() - started)
        return self._entry(attributes)

    @_errno_boundary
    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if inode & _SNAPSHOT_INODES:
            return self._entry(self._snapshot_attributes(inode, await self._snapshot(inode)))
        return self._entry(await self._fs.getattr(inode))

    async def _new_snapshot(self, volatile: Attributes) -> Attributes:
        """A new inode whose content is the volatile file's text as rendered now."""
        self._next_snapshot = (self._next_snapshot + 1) % _SNAPSHOT_SERIALS
        inode = _SNAPSHOT_INODES | self._next_snapshot << _SNAPSHOT_INODE_BITS | volatile.inode
        snapshot = await self._fs.read(volatile.inode, 0, _LARGEST_TEXT_BYTES)
        self._snapshots.put(inode, snapshot)
        return self._snapshot_attributes(inode, snapshot)

    @staticmethod
    def _snapshot_attributes(inode: int, snapshot: bytes) -> Attributes:
        return Attributes(inode, stat.S_IFREG, len(snapshot))

    async def _snapshot(self, inode: int) -> bytes:
        """A snapshot's text; rendered again if it was evicted (only past
        :data:`cutfs.vfs.tree.snapshot_store.KEPT` snapshots known at once)."""
        snapshot = self._snapshots.get(inode)
        if snapshot is None:
            snapshot = await self._fs.read(inode & _VOLATILE_INODE_MASK, 0, _LARGEST_TEXT_BYTES)
            self._snapshots.put(inode, snapshot)
        return snapshot

    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        """The kernel dropped lookups; time ranges and snapshots it no longer knows are
        freed.

        FORGET has no reply, so nothing may be raised: a failure is logged.
        """
        self._statistics.count("requests.forget")
        try:
            for inode, references in inode_list:
                if inode & _SNAPSHOT_INODES:
                    self._snapshots.drop(inode)  # each snapshot is looked up once
                else:
                    self._fs.forget(inode, references)
        except Exception:
            self._statistics.error("internal")
            log.exception("forget failed unexpectedly")

    @_errno_boundary
    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        await self._fs.open_directory(inode)
        return inode

    @_errno_boundary
    async def directory_entries(
        self, fh: int, start_id: int, max_entries: int
    ) -> list[tuple[bytes, pyfuse3.EntryAttributes, int]]:
        """At most ``max_entries`` entries of an open directory from ``start_id`` on:
        (name, attributes, next id).  A reader asks again from where it stopped."""
        return list(itertools.islice(self._directory_entries(fh, start_id), max_entries))

    def _directory_entries(
        self, fh: int, start_id: int
    ) -> Iterator[tuple[bytes, pyfuse3.EntryAttributes, int]]:
        entries = self._fs.listing(fh)
        for position in range(start_id, len(entries)):
            name, inode = entries[position]
            yield name, self._entry(self._fs.listed_attributes(inode)), position + 1

    @_errno_boundary
    async def releasedir(self, fh: int) -> None:
        return None

    @_errno_boundary
    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        """``ENOSYS`` (the kernel stops asking: see the module docstring), except with
        ``direct_io``, which the kernel learns per open."""
        if not self._direct_io:
            raise pyfuse3.FUSEError(errno.ENOSYS)
        if not inode & _SNAPSHOT_INODES:
            self._fs.check_open(inode, flags)
        return pyfuse3.FileInfo(fh=inode, keep_cache=False, direct_io=True)

    @_errno_boundary
    async def read(  # type: ignore[override]
        self,
        inode: int,
        off: int,
        size: int,
        *,
        decode_until: int | None = None,
        deadline: float | None = None,
    ) -> ReadBuffers:
        """Bytes of the file ``inode`` (its file handle, when opens are answered), as
        buffers to be written out in order (see :meth:`Filesystem.read_buffers`, and
        ``decode_until`` and ``deadline`` there): the
        :class:`~cutfs.vfs.fuse.device_channel.DeviceChannel` answers reads, not pyfuse3."""
        if inode & _SNAPSHOT_INODES:
            return [(await self._snapshot(inode))[off : off + size]]
        started = time.perf_counter()
        buffers = await self._fs.read_buffers(
            inode, off, size, decode_until=decode_until, deadline=deadline
        )
        self._statistics.observe("read", time.perf_counter() - started)
        self._statistics.count("reads")
        self._statistics.count("read_bytes", sum(len(buffer) for buffer in buffers))
        return buffers

    def read_ahead_file(self, inode: int) -> CellFile | None:
        """A file whose cells may be read ahead (a WAV file of two cells or more whose
        recording is indexed, served through the page cache), as the read-ahead board
        names it; None for any other (a cut's read takes the usual path), or one the
        kernel forgot."""
        if self._direct_io or inode & _SNAPSHOT_INODES:
            return None
        try:
            found = self._fs.wav_file(inode)
        except FsError:  # forgotten (a time range)
            return None
        except Exception:
            self._statistics.error("internal")
            log.exception("cannot tell the size of inode %d", inode)
            return None
        if found is None or found[0] < SHORTEST_FILE_BYTES:
            return None
        return CellFile(inode, *found)

    async def read_ahead(
        self, inode: int, offset: int, size: int, deadline: float | None = None
    ) -> ReadBuffers | None:
        """The bytes ``[offset, offset + size)`` of a file for the page cache, decoded
        exactly (see :mod:`cutfs.vfs.fuse.read_ahead`), by ``deadline`` if given; None
        when they cannot be had (the failure is logged, and the reader's own read will
        report it)."""
        started = time.perf_counter()
        try:
            buffers = await self._fs.read_buffers(
                inode, offset, size, decode_until=offset + size, deadline=deadline
            )
        except Exception as exc:
            self._statistics.count("read_ahead.failed")
            log.warning("cannot read ahead inode %d at byte %d: %s", inode, offset, exc)
            return None
        self._statistics.observe("read_ahead", time.perf_counter() - started)
        self._statistics.count("read_ahead.bytes", sum(len(buffer) for buffer in buffers))
        return buffers

    def continuation(
        self, inode: int, offset: int, most_bytes: int
    ) -> Callable[[], ReadBuffers] | None:
        """What the kernel could keep of a file past a read that ended at ``offset``, from
        what is cached now (see :meth:`Filesystem.cached_continuation`): nothing with
        ``direct_io`` (reads bypass the kernel's cache), for the statistics' snapshots,
        or when anything goes wrong (logged; the kernel then reads as usual)."""
        if self._direct_io or inode & _SNAPSHOT_INODES:
            return None
        try:
            return self._fs.cached_continuation(inode, offset, most_bytes)
        except Exception:
            self._statistics.error("internal")
            log.exception("cannot gather the cached rest of inode %d", inode)
            return None

    @_errno_boundary
    async def release(self, fh: int) -> None:
        return None

    @_errno_boundary
    async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
        """A WAV file's provenance attribute ``name`` (``user.cutfs.*``); ENODATA for
        any other name and node."""
        value = self._provenance(inode).get(name)
        if value is None:
            raise pyfuse3.FUSEError(errno.ENODATA)
        return value

    @_errno_boundary
    async def listxattr(self, inode: int, ctx: pyfuse3.RequestContext) -> list[bytes]:
        return list(self._provenance(inode))

    def _provenance(self, inode: int) -> dict[bytes, bytes]:
        if inode & _SNAPSHOT_INODES:
            return {}
        return {
            f"{XATTR_PREFIX}{name}".encode(): value.encode("utf-8", "surrogateescape")
            for name, value in self._fs.provenance(inode).items()
        }

    @_errno_boundary
    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        stats = pyfuse3.StatvfsData()
        stats.f_bsize = stats.f_frsize = 4096
        stats.f_blocks = stats.f_bfree = stats.f_bavail = 0
        stats.f_files = stats.f_ffree = stats.f_favail = 0
        stats.f_namemax = 255
        return stats

    def _entry(self, attributes: Attributes) -> pyfuse3.EntryAttributes:
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = attributes.inode
        entry.generation = 0
        # A provisional size, a volatile text or a snapshot of one must be looked up again.
        snapshot = bool(attributes.inode & _SNAPSHOT_INODES)
        looked_up_again = attributes.provisional or attributes.volatile or snapshot
        entry.entry_timeout = 0 if looked_up_again else CACHE_TIMEOUT_SECONDS
        fresh = attributes.volatile or attributes.provisional
        entry.attr_timeout = 0 if fresh else CACHE_TIMEOUT_SECONDS
        kind = stat.S_IFMT(attributes.mode)
        entry.st_mode = kind | (self._dir_mode if kind == stat.S_IFDIR else self._file_mode)
        entry.st_nlink = attributes.links
        entry.st_uid = self._uid
        entry.st_gid = self._gid
        entry.st_rdev = 0
        entry.st_size = attributes.size_bytes
        entry.st_blksize = 1 << 17
        entry.st_blocks = -(-attributes.size_bytes // 512)
        entry.st_atime_ns = entry.st_mtime_ns = entry.st_ctime_ns = self._time_ns
        return entry
