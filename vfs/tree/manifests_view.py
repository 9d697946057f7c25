"""The manifests at a mount's root (``wav.scp``, ``cuts.jsonl.gz``, ...) and
``cuts/metadata.jsonl``, as text files (contents: :mod:`cutfs.vfs.tree.manifest_files`).

No manifest is held whole in memory.  ``wav.scp`` is rendered per read from
the stored Kaldi order (:mod:`cutfs.codec.catalogue.kaldi_order`): its exact size is
known at once and any byte range is found by a binary search.  The others
are written out once, in chunks, to an unnamed temporary file on first use
(after every recording is indexed, for those that need lengths), by a
background task that later requests wait for; reads are then ``pread``.
"""

from __future__ import annotations

import functools
import os
import tempfile
import zlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Final

import trio

from cutfs.codec.catalogue.kaldi_order import KaldiOrder, kaldi_key
from cutfs.codec.errors import CutfsError
from cutfs.vfs.tree.manifest_files import (
    AUDIOFOLDER_METADATA,
    COMPRESSED,
    NEEDS_LENGTHS,
    WAV_SCP,
    ManifestFiles,
)
from cutfs.vfs.tree.view import MANIFEST_INODE_BASE, Entry, NodeKind, TextFile, View

#: Bytes read back from a spilled manifest at most per read request.
_MAX_READ_BYTES: Final = 1 << 24


class WavScp:
    """``wav.scp``, rendered line by line for each read (see the module docstring)."""

    volatile = False

    def __init__(
        self,
        order: KaldiOrder,
        cut_ids: Sequence[str],
        cut_path: Callable[[int], str],
        cuts_directory: str,
    ) -> None:
        self._order = order
        self._ids = cut_ids
        self._cut_path = cut_path
        self._prefix = (cuts_directory.rstrip("/") + "/").encode("utf-8", "surrogateescape")
        self._constant = len(self._prefix) + 2  # " " and "\n"

    def ready(self) -> bool:
        return True

    async def prepare(self) -> None:
        return None

    def size_bytes(self) -> int:
        return self._order.line_start(len(self._order), self._constant)

    def read(self, offset: int, size: int) -> bytes:
        end = min(offset + size, self.size_bytes())
        if offset >= end:
            return b""
        line = self._order.line_at(offset, self._constant)
        start = self._order.line_start(line, self._constant)
        pieces: list[bytes] = []
        position = start
        while position < end:
            text = self._line(line)
            pieces.append(text)
            position += len(text)
            line += 1
        return b"".join(pieces)[offset - start : end - start]

    def _line(self, line: int) -> bytes:
        cut = self._order.cut_at(line)
        key = kaldi_key(self._ids[cut]).encode("utf-8", "surrogateescape")
        path = self._cut_path(cut).encode("utf-8", "surrogateescape")
        return b"%s %s%s\n" % (key, self._prefix, path)


class SpilledText:
    """A manifest written once to an unnamed temporary file (see the module docstring).

    ``index_all`` (for manifests that need every cut's length) runs first.
    The rendering yields to the event loop between chunks, so requests for
    other files go on meanwhile; it runs in a task of its own, so a request
    that gives up waiting (its deadline) does not stop it.
    """

    volatile = False

    def __init__(
        self,
        chunks: Callable[[], Iterator[bytes]],
        compressed: bool,
        index_all: Callable[[], Awaitable[None]] | None,
    ) -> None:
        self._chunks = chunks
        self._compressed = compressed
        self._index_all = index_all
        self._file: int | None = None
        self._size = 0
        self._done: trio.Event | None = None
        self._failure: BaseException | None = None

    def ready(self) -> bool:
        return self._file is not None

    async def prepare(self) -> None:
        if self._done is None or (self._done.is_set() and self._file is None):
            self._failure = None  # the last attempt failed (or there was none): try again
            self._done = trio.Event()
            trio.lowlevel.spawn_system_task(self._render, name="render a manifest")
        done = self._done
        await done.wait()
        if self._file is None:  # failed, or stopped with the daemon
            raise self._failure or CutfsError("the manifest could not be rendered")

    async def _render(self) -> None:
        assert self._done is not None
        try:
            if self._index_all is not None:
                await self._index_all()
            self._file, self._size = await self._write()
        except Exception as exc:  # handed to the requests waiting (and logged by them)
            self._failure = exc
        finally:
            self._done.set()

    async def _write(self) -> tuple[int, int]:
        with tempfile.TemporaryFile(prefix="cutfs-manifest-") as spill:
            compressor = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
            for chunk in self._chunks():
                spill.write(compressor.compress(chunk) if self._compressed else chunk)
                await trio.sleep(0)
            if self._compressed:
                spill.write(compressor.flush())
            spill.flush()
            return os.dup(spill.fileno()), spill.tell()

    def size_bytes(self) -> int:
        return self._size

    def read(self, offset: int, size: int) -> bytes:
        assert self._file is not None, "prepare() first"
        return os.pread(self._file, min(size, _MAX_READ_BYTES), offset)


class ManifestsView(View):
    """Root manifests and ``cuts/metadata.jsonl`` (listed by the cuts view: see
    :meth:`cut_directory_entries`)."""

    def __init__(
        self,
        manifests: ManifestFiles,
        wav_scp: WavScp,
        index_all: Callable[[], Awaitable[None]],
        with_audiofolder: bool,
    ) -> None:
        names = manifests.root_names() + ([AUDIOFOLDER_METADATA] if with_audiofolder else [])
        self._texts: dict[int, TextFile] = {}
        self._root: list[Entry] = []
        for number, name in enumerate(names):
            inode = MANIFEST_INODE_BASE + number
            if name == WAV_SCP:
                self._texts[inode] = wav_scp
            else:
                self._texts[inode] = SpilledText(
                    functools.partial(manifests.chunks, name),
                    name in COMPRESSED,
                    index_all if name in NEEDS_LENGTHS else None,
                )
            self._root.append((name.encode(), inode))
        self._audiofolder = self._root.pop() if with_audiofolder else None
        self.inode_ranges = (range(MANIFEST_INODE_BASE, MANIFEST_INODE_BASE + len(names)),)

    def root_entries(self) -> Sequence[Entry]:
        return self._root

    def cut_directory_entries(self) -> Sequence[Entry]:
        """Files this view puts in ``cuts/``."""
        return () if self._audiofolder is None else (self._audiofolder,)

    def kind(self, inode: int) -> NodeKind | None:
        return NodeKind.TEXT if inode in self._texts else None

    def text(self, inode: int) -> TextFile:
        found = self._texts.get(inode)
        return found if found is not None else super().text(inode)
