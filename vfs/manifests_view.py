"""The manifests at a mount's root (``wav.scp``, ``cuts.jsonl.gz``, ...) and
``cuts/metadata.jsonl``, as text files (contents: :mod:`cutfs.vfs.manifest_files`)."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence

from cutfs.vfs.manifest_files import AUDIOFOLDER_METADATA, NEEDS_LENGTHS, ManifestFiles
from cutfs.vfs.view import MANIFEST_INODE_BASE, Entry, NodeKind, TextFile, View


class RenderedText:
    """A manifest rendered whole on first use; one that needs every cut's length has
    every recording indexed first (``index_all``)."""

    volatile = False

    def __init__(
        self,
        render: Callable[[], bytes],
        index_all: Callable[[], Awaitable[None]] | None,
    ) -> None:
        self._render = render
        self._index_all = index_all
        self._content: bytes | None = None

    def ready(self) -> bool:
        return self._content is not None

    async def prepare(self) -> None:
        if self._content is not None:
            return
        if self._index_all is not None:
            await self._index_all()
        if self._content is None:  # another request may have rendered it meanwhile
            self._content = self._render()

    def size_bytes(self) -> int:
        assert self._content is not None, "prepare() first"
        return len(self._content)

    def read(self, offset: int, size: int) -> bytes:
        assert self._content is not None, "prepare() first"
        return self._content[offset : offset + size]


class ManifestsView(View):
    """Root manifests and ``cuts/metadata.jsonl`` (listed by the cuts view: see
    :meth:`cut_directory_entries`)."""

    def __init__(
        self,
        manifests: ManifestFiles,
        index_all: Callable[[], Awaitable[None]],
        with_audiofolder: bool,
    ) -> None:
        names = manifests.root_names() + ([AUDIOFOLDER_METADATA] if with_audiofolder else [])
        self._texts: dict[int, RenderedText] = {}
        self._root: list[Entry] = []
        for number, name in enumerate(names):
            inode = MANIFEST_INODE_BASE + number
            waits = index_all if name in NEEDS_LENGTHS else None
            self._texts[inode] = RenderedText(functools.partial(manifests.render, name), waits)
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
