"""``cutfs pack``: from recordings and cuts to a shard directory, in three steps.

1. **plan** (:mod:`cutfs.codec.packing.plan`): the sources are read and checked,
   and the recordings split into partitions of about one shard each;
2. **run** (:mod:`cutfs.codec.packing.partition_packer`): each partition's recordings
   are decoded once (exact length, seek index) and stored in its shard, by an
   engine (:mod:`cutfs.codec.packing.engines`): this machine, Slurm or Ray;
3. **commit** (:mod:`cutfs.codec.packing.commit`): the partial tables are
   merged into the catalogue and the manifest is written last.

:func:`pack` runs all three on this machine into a temporary directory beside
the output, renamed into place only when complete: a failed pack leaves no
partial output and never touches an existing directory.  :func:`pack_in_place`
runs them in the output itself (a shared directory or ``s3://``), so that an
interrupted pack resumes where it stopped.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass

from cutfs.codec.catalogue.shard_writer import DEFAULT_SHARD_BYTES
from cutfs.codec.errors import SourceError
from cutfs.codec.packing.commit import PackReport, commit_pack
from cutfs.codec.packing.engines import LocalEngine, PackEngine
from cutfs.codec.packing.output import LocalPackOutput, PackOutput, open_pack_output
from cutfs.codec.packing.partition_packer import finished_partitions
from cutfs.codec.packing.plan import make_plan
from cutfs.codec.packing.progress import PackProgress, ProgressCallback
from cutfs.codec.spill.memory_budget import DEFAULT_MEMORY_BYTES
from cutfs.codec.storage.object_location import is_remote

__all__ = ["PackProgress", "PackReport", "ProgressCallback", "pack", "pack_in_place"]


def pack(
    sources: list[str],
    output_dir: str,
    *,
    jobs: int = 1,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
    on_progress: ProgressCallback | None = None,
) -> PackReport:
    """Pack the recordings and cuts read from ``sources`` into the new directory
    ``output_dir``, on this machine with ``jobs`` processes, planning and committing in
    about ``memory_bytes`` (rows beyond it are spilled to disk in the output's scratch
    space, or ``TMPDIR`` while the sources are read).

    Raises :class:`cutfs.codec.errors.CutfsError` subclasses for bad input, naming
    the file and the id; ``output_dir`` is then left as it was.
    """
    _check_output_dir(output_dir)
    parent = os.path.dirname(os.path.abspath(output_dir))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(output_dir)}.partial-", dir=parent)
    try:
        steps = _PackSteps(max_shard_bytes, memory_bytes, on_progress)
        report = steps.run(sources, LocalPackOutput(staging), LocalEngine(jobs))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes it private
        if os.path.isdir(output_dir):
            os.rmdir(output_dir)  # checked empty above
        os.rename(staging, output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    report.output_dir = output_dir
    return report


def pack_in_place(
    sources: list[str],
    output_uri: str,
    engine: PackEngine,
    *,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
    on_progress: ProgressCallback | None = None,
) -> PackReport:
    """Plan, run and commit in ``output_uri`` itself (a directory the engine's workers
    see, or ``s3://bucket/prefix``).

    Rerunning after a failure keeps the partitions already done.  Raises
    :class:`SourceError` when the output holds something else: files that are not
    a pack's, a shard directory, or the plan of other sources or options.
    """
    if not is_remote(output_uri):
        _check_output_dir(output_uri, allow_plan=True)
    output = open_pack_output(output_uri)
    try:
        return _PackSteps(max_shard_bytes, memory_bytes, on_progress).run(sources, output, engine)
    finally:
        output.close()


@dataclass(frozen=True)
class _PackSteps:
    """The options every step of a pack shares."""

    max_shard_bytes: int
    memory_bytes: int
    on_progress: ProgressCallback | None

    def run(self, sources: list[str], output: PackOutput, engine: PackEngine) -> PackReport:
        plan = make_plan(sources, output, self.max_shard_bytes, self.memory_bytes, self.on_progress)
        todo = [
            partition
            for partition, done in enumerate(finished_partitions(output, plan))
            if done is None
        ]
        engine.run(output, plan, todo, self.on_progress)
        report = commit_pack(output, memory_bytes=self.memory_bytes, on_progress=self.on_progress)
        report.output_dir = output.uri
        return report


def _check_output_dir(output_dir: str, *, allow_plan: bool = False) -> None:
    if not os.path.exists(output_dir):
        return
    entries = os.listdir(output_dir) if os.path.isdir(output_dir) else None
    if entries is not None and (not entries or (allow_plan and "_plan" in entries)):
        return
    raise SourceError(
        "the output exists and is not an empty directory; choose a new one or remove it",
        where=output_dir,
    )
