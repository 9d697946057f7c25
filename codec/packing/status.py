"""``cutfs pack status``: how far a partitioned pack is, read from its markers alone.

Works while engines are running (it only reads), from any machine that can
read the output: partitions done, running (where, since when), failed (with
the error line), hours of audio packed, and an estimate of the time left from
the rate the done partitions were packed at.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field

from cutfs.codec.catalogue.shard_format import MANIFEST_FILE
from cutfs.codec.errors import SourceError
from cutfs.codec.packing.output import PackOutput
from cutfs.codec.packing.partition_packer import finished_partitions, part_name
from cutfs.codec.packing.plan import PLAN_FILE, PackPlan, read_plan


@dataclass(frozen=True, slots=True)
class PartitionState:
    """A partition that is running or failed."""

    partition: int
    host: str
    pid: int
    started: float
    error: str = ""
    #: Whether the failure was bad input (rerunning gives the same error) rather than a crash.
    data_error: bool = False
    #: A running marker left by a process that is gone (only known on its own host).
    stale: bool = False


@dataclass
class PackStatus:
    """The state of one pack output."""

    uri: str
    committed: bool = False
    partitions: int = 0
    recordings: int = 0
    done: list[int] = field(default_factory=list)
    running: list[PartitionState] = field(default_factory=list)
    failed: list[PartitionState] = field(default_factory=list)
    audio_seconds_done: float = 0.0
    stored_bytes_done: int = 0
    planned_bytes: int = 0
    planned_bytes_done: int = 0
    #: Seconds from the first partition's start to the last one's end, over those done.
    busy_seconds: float = 0.0
    #: Seconds left at the rate so far; ``None`` until a partition is done.
    seconds_left: float | None = None

    @property
    def waiting(self) -> int:
        return self.partitions - len(self.done) - len(self.running) - len(self.failed)

    def lines(self) -> list[str]:
        """The status as a person reads it."""
        if self.committed:
            return [f"{self.uri}: committed ({self.recordings} recordings); mountable"]
        hours = self.audio_seconds_done / 3600
        left = "unknown" if self.seconds_left is None else _duration(self.seconds_left)
        lines = [
            f"{self.uri}: {len(self.done)} of {self.partitions} partitions done, "
            f"{len(self.running)} running, {len(self.failed)} failed, {self.waiting} waiting",
            f"packed {hours:.2f} h of audio ({self.stored_bytes_done / 1e9:.2f} GB), "
            f"{100 * self.planned_bytes_done / max(self.planned_bytes, 1):.0f}% of the source "
            f"bytes; estimated time left: {left}",
        ]
        for state in self.running:
            since = _duration(max(time.time() - state.started, 0))
            stale = " (its process is gone: rerun it)" if state.stale else ""
            lines.append(
                f"  running: partition {state.partition} on {state.host} (pid {state.pid}) "
                f"for {since}{stale}"
            )
        for state in self.failed:
            kind = "bad input" if state.data_error else "crashed"
            lines.append(f"  failed ({kind}): partition {state.partition}: {state.error}")
        if not self.done and not self.running and not self.failed:
            lines.append("  nothing run yet: 'cutfs pack run OUT --partition N', or --engine")
        elif len(self.done) == self.partitions:
            lines.append("  every partition is done: 'cutfs pack commit OUT' makes it mountable")
        return lines


def read_status(output: PackOutput) -> PackStatus:
    """The status of the pack in ``output``; :class:`SourceError` when it holds none."""
    status = PackStatus(output.uri)
    if output.exists(MANIFEST_FILE) and not output.exists(PLAN_FILE):
        manifest = json.loads(output.read_small(MANIFEST_FILE))
        status.committed = True
        status.recordings = int(manifest.get("recordings", 0))
        return status
    plan = read_plan(output)
    status.partitions = plan.partitions
    status.recordings = plan.recordings
    status.planned_bytes = sum(plan.partition_bytes)
    present = output.sizes("_parts/part-")
    first_start, last_end = float("inf"), 0.0
    for partition, result in enumerate(finished_partitions(output, plan)):
        if result is not None:
            status.done.append(partition)
            status.audio_seconds_done += result.audio_seconds
            status.stored_bytes_done += result.stored_bytes
            status.planned_bytes_done += plan.partition_bytes[partition]
            first_start = min(first_start, result.started)
            last_end = max(last_end, result.finished)
            continue
        for kind, into in (("running.json", status.running), ("failed.json", status.failed)):
            if part_name(partition, kind) in present:
                state = _state(output, partition, kind, plan.digest)
                if state is not None:
                    into.append(state)
                    break
    if status.done:
        status.busy_seconds = max(last_end - first_start, 1e-3)
        rate = status.planned_bytes_done / status.busy_seconds
        remaining = status.planned_bytes - status.planned_bytes_done
        status.seconds_left = remaining / rate if rate > 0 else None
    return status


def failure(output: PackOutput, plan: PackPlan, partition: int) -> PartitionState | None:
    """The partition's ``failed`` marker, when its last run of this plan failed."""
    if not output.exists(part_name(partition, "failed.json")):
        return None
    return _state(output, partition, "failed.json", plan.digest)


def _state(output: PackOutput, partition: int, kind: str, digest: str) -> PartitionState | None:
    name = part_name(partition, kind)
    try:
        fields = json.loads(output.read_small(name))
        if fields.get("digest") != digest:
            return None
        state = PartitionState(
            partition,
            str(fields["host"]),
            int(fields["pid"]),
            float(fields["started"]),
            error=str(fields.get("error", "")),
            data_error=bool(fields.get("data_error", False)),
        )
    except SourceError:
        return None  # removed between the listing and the read: the run just ended
    except (ValueError, KeyError, TypeError, AttributeError):
        return PartitionState(partition, "?", 0, 0.0, error=f"unreadable marker {name}")
    if kind == "running.json" and state.host == socket.gethostname() and not _alive(state.pid):
        return PartitionState(state.partition, state.host, state.pid, state.started, stale=True)
    return state


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
