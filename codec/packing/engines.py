"""Who runs a pack's partitions: this machine, a Slurm job array, or a Ray cluster.

Every engine runs the same task, :func:`cutfs.codec.packing.partition_packer.run_partition_task`,
once per partition that is not done yet, and reads nothing back but its small
result: the audio goes from the sources to the output directly, never through
the engine.  Because a partition's output depends only on the plan, engines
may run partitions in any order, on any machine, and again after a failure.

A partition that fails with bad input (its ``failed`` marker says so) is not
retried: it would fail the same way.  One that crashed (a node lost, a
timeout, a killed process) is retried up to ``retries`` times.  When
partitions are still failed at the end, :class:`SourceError` names them
with their error lines; those already done stay done, and a rerun (or
``cutfs pack run``) packs only the rest.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any, Final, Protocol

from cutfs.codec.errors import SourceError
from cutfs.codec.packing.commit import missing_partitions_message
from cutfs.codec.packing.output import PackOutput
from cutfs.codec.packing.partition_packer import (
    PartitionResult,
    finished_partitions,
    pack_partition,
    run_partition_task,
)
from cutfs.codec.packing.plan import PackPlan
from cutfs.codec.packing.progress import PackProgress, ProgressCallback
from cutfs.codec.packing.status import failure, read_status
from cutfs.codec.trust.private_directory import private_directory

#: Seconds between two looks at a cluster's jobs.
POLL_SECONDS: Final = 1.0


class PackEngine(Protocol):
    """Runs partitions of a plan until each is done or has failed for good."""

    def run(
        self,
        output: PackOutput,
        plan: PackPlan,
        partitions: list[int],
        on_progress: ProgressCallback | None,
    ) -> None:
        """Run ``partitions``; raises :class:`SourceError` naming those that failed."""
        ...


class _Tally:
    """Progress over partitions: recordings and bytes of those done so far."""

    def __init__(self, output: PackOutput, plan: PackPlan, on_progress: ProgressCallback | None):
        self._output = output
        self._plan = plan
        self._on_progress = on_progress
        self.recordings = 0
        self.stored_bytes = 0
        self.audio_seconds = 0.0
        if on_progress is not None:
            for done in finished_partitions(output, plan):
                if done is not None:
                    self.add(done)

    def add(self, result: PartitionResult) -> None:
        self.recordings += result.recordings
        self.stored_bytes += result.stored_bytes
        self.audio_seconds += result.audio_seconds
        self.show()

    def show(self, recordings: int = 0, stored_bytes: int = 0, audio_seconds: float = 0.0) -> None:
        """Report the partitions done plus what a partition under way has done so far."""
        if self._on_progress is not None:
            self._on_progress(
                PackProgress(
                    self.recordings + recordings,
                    self._plan.recordings,
                    self.stored_bytes + stored_bytes,
                    self.audio_seconds + audio_seconds,
                )
            )


@dataclass(frozen=True)
class LocalEngine:
    """This machine: partitions one after another, each indexed by ``jobs`` processes, or,
    when there are at least as many partitions as jobs, ``jobs`` partitions at once."""

    jobs: int = 1

    def run(
        self,
        output: PackOutput,
        plan: PackPlan,
        partitions: list[int],
        on_progress: ProgressCallback | None,
    ) -> None:
        tally = _Tally(output, plan, on_progress)
        if self.jobs <= 1 or len(partitions) < self.jobs:
            for partition in partitions:

                def under_way(progress: PackProgress) -> None:
                    tally.show(
                        progress.recordings_done, progress.stored_bytes, progress.audio_seconds
                    )

                tally.add(pack_partition(output, partition, jobs=self.jobs, on_progress=under_way))
            return
        context = get_context("spawn")
        with ProcessPoolExecutor(max_workers=self.jobs, mp_context=context) as pool:
            running = {
                pool.submit(run_partition_task, output.uri, partition): partition
                for partition in partitions
            }
            failed: list[int] = []
            while running:
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    partition = running.pop(future)
                    if future.exception() is not None:
                        failed.append(partition)
                        continue
                    tally.add(_result_of(future.result()))
        _raise_for(output, plan, sorted(failed))


@dataclass(frozen=True)
class SlurmEngine:
    """A Slurm job array through submitit, one array task per partition.

    ``cluster`` is ``"slurm"``, or ``"local"`` to run the same submission code
    with submitit's local executor (no controller needed: tests, a workstation).
    Job scripts, pickles and logs go to ``folder``, which the nodes must see.
    """

    folder: str
    cluster: str = "slurm"
    slurm_partition: str | None = None
    array_parallelism: int = 256
    cpus_per_task: int = 1
    timeout_min: int = 240
    mem_gb: float | None = None
    retries: int = 2
    jobs_per_task: int = 1
    extra: tuple[tuple[str, Any], ...] = ()

    def check_folder(self) -> None:
        """Refuse a folder another user could write (:class:`SourceError`): submitit
        unpickles the results it finds there, as the user who packs."""
        private_directory(self.folder, "submitit's folder", "choose one with --slurm-folder")

    def run(
        self,
        output: PackOutput,
        plan: PackPlan,
        partitions: list[int],
        on_progress: ProgressCallback | None,
    ) -> None:
        try:
            import submitit  # noqa: PLC0415 - only needed for this engine
        except ImportError as exc:
            raise SourceError("--engine slurm needs submitit: pip install submitit") from exc
        self.check_folder()
        # Its tasks run an isolated interpreter (see clean_start): a job starts in the
        # directory it was submitted from, which must not be on the import path.
        python = f"{shlex.quote(sys.executable)} -I"
        executor = submitit.AutoExecutor(
            folder=self.folder, cluster=self.cluster, slurm_python=python, local_python=python
        )
        parameters: dict[str, Any] = {
            "name": "cutfs-pack",
            "timeout_min": self.timeout_min,
            "cpus_per_task": self.cpus_per_task,
            "slurm_array_parallelism": self.array_parallelism,
            **dict(self.extra),
        }
        if self.mem_gb is not None:
            parameters["mem_gb"] = self.mem_gb
        if self.slurm_partition is not None:
            parameters["slurm_partition"] = self.slurm_partition
        if self.cluster == "local":  # submitit's local executor only knows the generic ones
            parameters = {k: v for k, v in parameters.items() if not k.startswith("slurm_")}
        executor.update_parameters(**parameters)
        tally = _Tally(output, plan, on_progress)
        attempts = dict.fromkeys(partitions, 0)
        todo = list(partitions)
        failed: list[int] = []
        while todo:
            jobs = executor.map_array(
                run_partition_task,
                [output.uri] * len(todo),
                todo,
                [self.jobs_per_task] * len(todo),
            )
            running = dict(zip(jobs, todo, strict=True))
            todo = []
            while running:
                time.sleep(POLL_SECONDS)
                for job in [job for job in running if job.done()]:
                    partition = running.pop(job)
                    attempts[partition] += 1
                    if job.exception() is None:
                        tally.add(_result_of(job.result()))
                    elif attempts[partition] <= self.retries and _crashed(output, plan, partition):
                        todo.append(partition)
                    else:
                        failed.append(partition)
        _raise_for(output, plan, sorted(failed))


@dataclass(frozen=True)
class RayEngine:
    """One Ray task per partition on the cluster ``ray.init(address=address)`` finds (a new
    local instance when ``address`` is ``None``); crashed tasks are retried by Ray."""

    address: str | None = None
    cpus_per_task: int = 1
    retries: int = 2
    #: CPUs of a local instance started here (``None``: all of them).
    local_cpus: int | None = None

    def run(
        self,
        output: PackOutput,
        plan: PackPlan,
        partitions: list[int],
        on_progress: ProgressCallback | None,
    ) -> None:
        try:
            import ray  # noqa: PLC0415 - only needed for this engine
        except ImportError as exc:
            raise SourceError("--engine ray needs Ray: pip install 'ray[default]'") from exc
        started_here = not ray.is_initialized()
        if started_here:
            # A local instance keeps its session (sockets, logs, spilled objects) in a
            # private directory, not in Ray's default /tmp/ray, which every user shares.
            # Ray makes its own directory writable by all: it goes inside the private one.
            local: dict[str, Any] = (
                {"_temp_dir": os.path.join(private_ray_directory(), "ray")}
                if self.address is None
                else {}
            )
            ray.init(
                address=self.address,
                num_cpus=self.local_cpus if self.address is None else None,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
                **local,
            )
        try:
            task = ray.remote(
                num_cpus=self.cpus_per_task, max_retries=self.retries, retry_exceptions=False
            )(run_partition_task)
            tally = _Tally(output, plan, on_progress)
            running = {
                task.remote(output.uri, partition, self.cpus_per_task): partition
                for partition in partitions
            }
            failed: list[int] = []
            while running:
                ready, _ = ray.wait(list(running), num_returns=1, timeout=POLL_SECONDS)
                for reference in ready:
                    partition = running.pop(reference)
                    try:
                        tally.add(_result_of(ray.get(reference)))
                    except Exception:
                        failed.append(partition)
        finally:
            if started_here:
                ray.shutdown()
        _raise_for(output, plan, sorted(failed))


def _result_of(fields: dict[str, Any]) -> PartitionResult:
    return PartitionResult(**fields)


def _crashed(output: PackOutput, plan: PackPlan, partition: int) -> bool:
    """Whether a failed partition is worth another try: not when its input is bad."""
    state = failure(output, plan, partition)
    return state is None or not state.data_error


def _raise_for(output: PackOutput, plan: PackPlan, failed: list[int]) -> None:
    if not failed:
        return
    errors = {state.partition: state.error for state in read_status(output).failed}
    first = failed[0]
    raise SourceError(
        f"{missing_partitions_message(failed, plan.partitions)} (partition {first}: "
        f"{errors.get(first, 'no error recorded; see the engine logs')}); "
        "'cutfs pack status OUT' lists them, and rerunning packs only those",
        where=output.uri,
    )


def private_ray_directory() -> str:
    """The private directory that holds the session directory (``ray/``) of a local Ray
    instance started by ``cutfs pack``: the user's runtime directory
    (``$XDG_RUNTIME_DIR/cutfs-ray``) or ``/tmp/cutfs-ray-<uid>``, mode 0700 and this
    user's (else :class:`SourceError`).  Short, since Ray puts Unix sockets in it (their
    paths are limited to 107 bytes)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    path = (
        os.path.join(runtime, "cutfs-ray")
        if runtime and os.path.isabs(runtime)
        else f"/tmp/cutfs-ray-{os.geteuid()}"
    )
    private_directory(
        path,
        "the session directory of the local Ray instance",
        "remove it, or give --ray-address of a cluster",
    )
    return path


def default_slurm_folder(output_uri: str) -> str:
    """Where submitit keeps its files when none is given: a private folder of the user who
    packs, ``~/.cache/cutfs/slurm/<digest of the output>``, never the output itself (a
    shared project directory: submitit unpickles what it finds in its folder, so another
    member of the group could have code run as whoever packs).  The nodes must see it, as
    home directories are on clusters; otherwise give ``--slurm-folder``."""
    digest = hashlib.sha256(output_uri.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return os.path.join(os.path.expanduser("~"), ".cache", "cutfs", "slurm", digest)
