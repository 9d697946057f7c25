"""``.cutfs/``: the daemon's counters, as JSON (``stats``) and in Prometheus' text format
(``metrics``), rendered afresh on every lookup (each gets a snapshot: see
:mod:`cutfs.vfs.fuse.operations`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

from cutfs.vfs.tree.view import CONTROL_INODE_BASE, Entry, NodeKind, TextFile, View

CONTROL_DIR: Final = ".cutfs"
STATS_FILE: Final = "stats"
METRICS_FILE: Final = "metrics"
_DIRECTORY: Final = CONTROL_INODE_BASE


class VolatileText:
    """A text rendered anew for each snapshot of it (one per lookup)."""

    volatile = True

    def __init__(self, render: Callable[[], bytes]) -> None:
        self._render = render

    def ready(self) -> bool:
        return True

    async def prepare(self) -> None:
        return None

    def size_bytes(self) -> int:
        return len(self._render())

    def read(self, offset: int, size: int) -> bytes:
        return self._render()[offset : offset + size]


class ControlView(View):
    """The control directory (see the module docstring); ``metrics`` is optional."""

    def __init__(
        self, status: Callable[[], bytes], metrics: Callable[[], bytes] | None = None
    ) -> None:
        texts = [(STATS_FILE, status)] + ([(METRICS_FILE, metrics)] if metrics else [])
        self._entries: tuple[Entry, ...] = tuple(
            (name.encode(), _DIRECTORY + 1 + number) for number, (name, _) in enumerate(texts)
        )
        self._texts = {
            _DIRECTORY + 1 + number: VolatileText(render)
            for number, (_, render) in enumerate(texts)
        }
        self.inode_ranges = (range(_DIRECTORY, _DIRECTORY + 1 + len(texts)),)

    def root_entries(self) -> Sequence[Entry]:
        return ((CONTROL_DIR.encode(), _DIRECTORY),)

    def kind(self, inode: int) -> NodeKind | None:
        if inode == _DIRECTORY:
            return NodeKind.DIRECTORY
        return NodeKind.TEXT if inode in self._texts else None

    async def lookup(self, directory: int, name: bytes, user: int) -> int | None:
        return dict(self._entries).get(name)

    def listing(self, directory: int) -> Sequence[Entry]:
        return self._entries

    def text(self, inode: int) -> TextFile:
        found = self._texts.get(inode)
        return found if found is not None else super().text(inode)
