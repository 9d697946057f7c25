"""What one serving process of a mount holds: library, decoders, cache, filesystem.

Each serving process of ``--serving-processes`` builds its own from the same
source and options (see :mod:`cutfs.vfs.daemon.serving_process`), with its share
of the decoder workers and of the block cache, so that the memory of a mount
stays what was configured however many processes serve it.  The supervisor
builds none: it never opens the source.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from cutfs.codec.library import Library
from cutfs.codec.trust.source_policy import SourcePolicy
from cutfs.vfs.daemon.doorbell import Doorbell
from cutfs.vfs.daemon.request_slot import RequestSlot
from cutfs.vfs.frames.block_cache import BlockCache
from cutfs.vfs.frames.decode_pool import DecodePool
from cutfs.vfs.frames.frame_source import FrameSource
from cutfs.vfs.frames.zygote import Zygote
from cutfs.vfs.fuse.operations import Operations
from cutfs.vfs.sandbox.serving_user import ServingUser
from cutfs.vfs.stats.prometheus import render_metrics
from cutfs.vfs.stats.statistics import Statistics
from cutfs.vfs.stats.statistics_board import StatisticsBoard
from cutfs.vfs.tree.filesystem import Filesystem
from cutfs.vfs.tree.snapshot_store import SnapshotStore
from cutfs.vfs.tree.span_table import SharedSpanTable

if TYPE_CHECKING:
    from cutfs.vfs.daemon.mount_options import MountOptions


@dataclass(frozen=True)
class ProcessShare:
    """One serving process's part of a mount's resources."""

    workers: int
    cache_bytes: int

    @classmethod
    def of(cls, options: MountOptions, processes: int) -> ProcessShare:
        """An even split of ``options`` among ``processes`` (at least one worker each,
        unless the mount decodes in threads, ``--workers 0``).  Processes that decode in
        turn have no workers."""
        workers = 0 if options.workers == 0 else max(1, -(-options.workers // processes))
        return cls(0 if options.decode_in_turn else workers, options.cache_bytes // processes)


@dataclass
class ServingStack:
    """The objects that answer one process's share of a mount's requests."""

    library: Library
    pool: DecodePool
    frames: FrameSource
    filesystem: Filesystem
    operations: Operations
    statistics: Statistics
    #: This process's sections of ``.cutfs/stats`` (cache, workers, store...), live.
    sections: Callable[[], dict[str, Any]]
    board: StatisticsBoard | None
    #: Where the mount is (for its channel, see :class:`DeviceChannel`).
    mountpoint: str

    def publish(self) -> None:
        """Publish this process's figures for the other serving processes, if any."""
        if self.board is not None:
            self.board.publish(self.statistics, self.sections())

    def open_doorbell(self) -> Doorbell | None:
        """The doorbell on which the other serving processes ask this one to publish now
        (None when it serves alone); open it as the user the statistics are written as."""
        return None if self.board is None else self.board.open_doorbell(self.publish)

    @classmethod
    def open(
        cls,
        stack: ExitStack,
        library: Library,
        mountpoint: str,
        options: MountOptions,
        share: ProcessShare,
        *,
        policy: SourcePolicy | None,
        user: ServingUser | None,
        kernel: dict[str, str],
        extra_status: Callable[[], dict[str, Any]] = dict,
        board: StatisticsBoard | None = None,
        shared_spans: SharedSpanTable | None = None,
        snapshot_dir: str | None = None,
        in_turn: RequestSlot | None = None,
        zygote: Zygote | None = None,
    ) -> ServingStack:
        """Start the decoder workers and build the filesystem over ``library``.

        Everything opened is closed by ``stack``.  ``kernel`` holds the kernel
        settings applied to the mount, and ``extra_status`` sections added to
        ``.cutfs/stats``; both are read each time the statistics are.  With a
        ``board``, the statistics shown add up every serving process's, and
        ``shared_spans`` is the time-range table they share and ``snapshot_dir``
        where they keep the snapshots of ``.cutfs/stats`` each open reads.
        ``in_turn``: this process decodes in turn, watched through this slot (see
        :class:`DecodePool`).  ``zygote``: what forks the decoder workers, if this
        process may not spawn them.
        """
        statistics = Statistics()
        pool = DecodePool(
            library,
            share.workers,
            options.read_timeout_seconds,
            statistics,
            options.profile,
            policy=policy,
            user=user,
            in_turn=in_turn,
            zygote=zygote,
        )
        stack.callback(pool.close)
        pool.start()  # the workers start while the tree is built
        cache = BlockCache(share.cache_bytes)
        frames = FrameSource(library, cache, pool, statistics if options.profile else None)

        def sections() -> dict[str, Any]:
            return {
                "cache": asdict(cache.statistics()),
                "workers": asdict(pool.statistics()),
                "shards": library.describe(),
                "store": pool.store_counters(),
                "views": {"time_ranges": filesystem.time_ranges},
                "indexing": {"in_progress": frames.recordings_being_indexed},
                # Only the supervisor tunes the kernel: the processes show its outcomes.
                **({"kernel": dict(kernel)} if kernel else {}),
                **extra_status(),
            }

        def combined() -> tuple[Statistics, dict[str, Any]]:
            if board is None:
                return statistics, sections()
            return board.combine(statistics, sections())

        def status() -> bytes:
            total, total_sections = combined()
            outcomes = total_sections.pop("kernel", kernel)
            snapshot = total.snapshot(kernel=outcomes, **total_sections)
            return (json.dumps(snapshot, indent=2) + "\n").encode()

        def metrics() -> bytes:
            total, total_sections = combined()
            total_sections.pop("kernel", None)
            return render_metrics(total, total_sections).encode()

        filesystem = Filesystem(
            library,
            frames,
            mountpoint,
            status,
            options.windows,
            options.output_format,
            metrics,
            shared_spans,
        )
        operations = Operations(
            filesystem,
            options.ownership,
            statistics,
            options.direct_io,
            SnapshotStore(snapshot_dir),
        )
        return cls(
            library, pool, frames, filesystem, operations, statistics, sections, board, mountpoint
        )
