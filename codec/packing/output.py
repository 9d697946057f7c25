"""Where a partitioned pack writes: a local directory or an object-storage prefix.

The plan, the partitions' shards and partial tables, the merged catalogue and
the manifest are all *named files* of one :class:`PackOutput`.  Every write is
whole or absent: a local file is written under a temporary name and renamed;
an object appears only when its PUT (or multipart upload) completes.  That is
what makes each step of a pack safe to rerun and the manifest, written last,
the one sign that a directory is complete.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from typing import Final, Protocol, TypeVar

import pyarrow as pa

from cutfs.codec.errors import SourceError
from cutfs.codec.storage.object_location import ObjectLocation, is_remote
from cutfs.codec.storage.object_service import ObjectStoreError
from cutfs.codec.storage.object_store import ObjectStore

#: A marker or plan description larger than this was not written by cutfs.
MAX_SMALL_FILE_BYTES: Final = 64 << 20
#: What a pack writes locally is readable by all and writable by its owner only, whatever
#: the umask: a plan others could change would make a run read or run what they chose.
_FILE_MODE: Final = 0o644
_T = TypeVar("_T")


class PackOutput(Protocol):
    """The files of one pack output, by name relative to its root (``_plan/plan.json``)."""

    #: The output as the user named it (a path or ``s3://bucket/prefix``).
    uri: str

    def where(self, name: str) -> str:
        """A file's full name, for messages."""
        ...

    def exists(self, name: str) -> bool: ...

    def read_small(self, name: str) -> bytes:
        """A small file's bytes (at most :data:`MAX_SMALL_FILE_BYTES`)."""
        ...

    def write_small(self, name: str, data: bytes) -> None:
        """Write ``data`` as file ``name``, whole or not at all."""
        ...

    def put_file(self, name: str, path: str) -> str:
        """Move (local) or upload (object storage) the local file ``path`` to ``name``;
        returns the new file's version: its ETag in object storage, ``""`` locally."""
        ...

    def sizes(self, prefix: str) -> dict[str, int]:
        """The files whose names start with ``prefix``, with their sizes in bytes."""
        ...

    def remove(self, name: str) -> None:
        """Remove a file; nothing happens when it is not there."""
        ...

    def remove_many(self, names: list[str]) -> None:
        """:meth:`remove` of each of ``names`` (in object storage, 1 000 per request)."""
        ...

    def open_table(self, name: str) -> pa.ipc.RecordBatchFileReader:
        """An Arrow IPC file, opened for reading single record batches: a batch read
        fetches only that batch's bytes (a map locally, ranged GETs in object storage)."""
        ...

    def check_trusted(self, name: str, why: str) -> None:
        """Refuse file ``name`` when someone other than this user could have written it
        (a local file owned by another user, or writable by its group or others), saying
        ``why`` that matters; object storage is governed by the bucket's own access
        rules."""
        ...

    def scratch(self) -> contextlib.AbstractContextManager[str]:
        """A private local directory for files to :meth:`put_file`, removed on exit."""
        ...

    def close(self) -> None: ...


def open_pack_output(uri: str) -> PackOutput:
    """The output named ``uri``: ``s3://`` or ``gs://bucket/prefix``, or a local directory
    (created)."""
    if is_remote(uri):
        return ObjectPackOutput(uri)
    return LocalPackOutput(uri)


class LocalPackOutput:
    """A pack output in a local (or shared network) directory."""

    def __init__(self, directory: str) -> None:
        self.uri = directory
        self._root = os.path.abspath(directory)
        os.makedirs(self._root, exist_ok=True)

    def where(self, name: str) -> str:
        return os.path.join(self.uri, name)

    def path(self, name: str) -> str:
        """The local path of file ``name``."""
        return os.path.join(self._root, name)

    def exists(self, name: str) -> bool:
        return os.path.exists(self.path(name))

    def read_small(self, name: str) -> bytes:
        try:
            with open(self.path(name), "rb") as file:
                data = file.read(MAX_SMALL_FILE_BYTES + 1)
        except OSError as exc:
            raise SourceError(f"cannot read: {exc.strerror}", where=self.where(name)) from exc
        if len(data) > MAX_SMALL_FILE_BYTES:
            raise SourceError("larger than cutfs ever writes it", where=self.where(name))
        return data

    def write_small(self, name: str, data: bytes) -> None:
        path = self.path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = f"{path}.{os.getpid()}.partial"
        try:
            with open(partial, "wb") as file:
                file.write(data)
                os.fchmod(file.fileno(), _FILE_MODE)
            os.replace(partial, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)

    def put_file(self, name: str, path: str) -> str:
        target = self.path(name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.chmod(path, _FILE_MODE)
        os.replace(path, target)  # the scratch directory is on the same file system
        return ""

    def check_trusted(self, name: str, why: str) -> None:
        try:
            status = os.lstat(self.path(name))
        except OSError as exc:
            raise SourceError(f"cannot read: {exc.strerror}", where=self.where(name)) from exc
        if (
            status.st_uid not in (os.geteuid(), 0)
            or status.st_mode & 0o022
            or not stat.S_ISREG(status.st_mode)
        ):
            raise SourceError(
                "could have been written by another user (owned by uid "
                f"{status.st_uid}, mode {status.st_mode & 0o777:o}, "
                f"{'a file' if stat.S_ISREG(status.st_mode) else 'not a regular file'}): {why}",
                where=self.where(name),
            )

    def sizes(self, prefix: str) -> dict[str, int]:
        folder, _, start = prefix.rpartition("/")
        directory = self.path(folder)
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            return {}
        return {
            (f"{folder}/" if folder else "") + entry.name: entry.stat().st_size
            for entry in entries
            if entry.name.startswith(start) and entry.is_file()
        }

    def remove_many(self, names: list[str]) -> None:
        for name in names:
            self.remove(name)

    def remove(self, name: str) -> None:
        path = self.path(name)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def open_table(self, name: str) -> pa.ipc.RecordBatchFileReader:
        try:
            # Read, not mapped: a pass over a partition's tables then holds one batch at
            # a time, where a map would keep every page it touched until it is closed.
            return pa.ipc.open_file(pa.OSFile(self.path(name)))
        except (OSError, pa.ArrowException) as exc:
            raise SourceError(f"cannot read: {exc}", where=self.where(name)) from exc

    @contextlib.contextmanager
    def scratch(self) -> Iterator[str]:
        # Inside the output, so that put_file is a rename on the same file system.
        parent = self.path("_parts")
        os.makedirs(parent, exist_ok=True)
        directory = tempfile.mkdtemp(prefix=".scratch-", dir=parent)
        try:
            yield directory
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def close(self) -> None:
        pass


class ObjectPackOutput:
    """A pack output under an object-storage prefix (``s3://bucket/prefix``)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.store = ObjectStore(ObjectLocation.from_uri(uri))

    def where(self, name: str) -> str:
        return self.store.location.where(name)

    def exists(self, name: str) -> bool:
        return self._checked(name, lambda: self.store.exists(name))

    def read_small(self, name: str) -> bytes:
        self.store.forget(name)  # a marker may have been rewritten since it was last read
        return self._checked(name, lambda: self.store.get_whole(name, MAX_SMALL_FILE_BYTES))

    def write_small(self, name: str, data: bytes) -> None:
        self._checked(name, lambda: self.store.put_bytes(name, data))

    def put_file(self, name: str, path: str) -> str:
        etag = self._checked(name, lambda: self.store.put(name, path))
        os.unlink(path)
        return etag

    def sizes(self, prefix: str) -> dict[str, int]:
        return self._checked(prefix, lambda: self.store.listing(prefix))

    def remove(self, name: str) -> None:
        self._checked(name, lambda: self.store.delete(name))

    def remove_many(self, names: list[str]) -> None:
        if names:
            self._checked(names[0], lambda: self.store.delete_many(names))

    def check_trusted(self, name: str, why: str) -> None:
        pass

    def open_table(self, name: str) -> pa.ipc.RecordBatchFileReader:
        self.store.forget(name)
        size = self._checked(name, lambda: self.store.size(name))
        source = pa.PythonFile(_RangedFile(self, name, size), mode="r")
        try:
            return pa.ipc.open_file(source)
        except pa.ArrowException as exc:
            raise SourceError(f"cannot read: {exc}", where=self.where(name)) from exc

    @contextlib.contextmanager
    def scratch(self) -> Iterator[str]:
        directory = tempfile.mkdtemp(prefix="cutfs-pack-")
        try:
            yield directory
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def close(self) -> None:
        self.store.close()

    def _checked(self, name: str, call: Callable[[], _T]) -> _T:
        try:
            return call()
        except ObjectStoreError as exc:
            raise SourceError(str(exc.message), where=self.where(name)) from exc


class _RangedFile:
    """A read-only file over one object, each read a bounded ranged GET (for Arrow)."""

    def __init__(self, output: ObjectPackOutput, name: str, size: int) -> None:
        self._output = output
        self._name = name
        self._size = size
        self._position = 0
        self.closed = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def writable(self) -> bool:
        return False

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self._size}[whence]
        self._position = max(base + offset, 0)
        return self._position

    def read(self, count: int = -1) -> bytes:
        stop = self._size if count < 0 else min(self._position + count, self._size)
        if stop <= self._position:
            return b""
        start, self._position = self._position, stop
        return bytes(self._output.store.read(self._name, start, stop))

    def close(self) -> None:
        self.closed = True
