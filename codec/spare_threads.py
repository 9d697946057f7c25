"""Threads that decode parts of one range on CPUs that are idle at the moment.

A cold cut read alone (a script opening one file, a DataLoader warming up, a
listening tool) waits for one decode on one CPU while the node's other CPUs sit
idle.  FLAC frames decode independently once the stream header is known, so a
range can be split at a seek point and its parts decoded at the same time, each
into its own slice of the result.  libsndfile runs without the GIL, so threads
of one process are enough.

Splitting only pays when a CPU is free to take a part: under load (every CPU
busy decoding other cuts) it would add the second part's open and a thread
hand-off to work that is throughput-bound.  :meth:`SpareThreads.idle_cpus`
reads the number of runnable threads on the node (``/proc/loadavg``, about
1.3 µs on a descriptor kept open) and compares it with the CPUs this process
may use; a decode asks for helpers only for CPUs that are idle when it starts.
The count is a snapshot, so two decoders may both see one idle CPU; the cost of
that race is one decode shared by three threads on two CPUs, not a wrong sample.

Each process has its own pool (:func:`shared_threads`), made on first use and
dropped in a child after ``fork`` (threads do not survive a fork).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final, TypeVar

_Result = TypeVar("_Result")

#: The most helper threads a process keeps: a 10 s cut decodes in about 2 ms, and a
#: part much shorter than 2 s is not worth a hand-off (see ``MIN_PART_SECONDS`` in
#: :mod:`cutfs.codec.decoder`).
MOST_HELPERS: Final = 3
#: The most helpers a process may be configured with.
HELPERS_LIMIT: Final = 64


class SpareThreads:
    """Up to ``most_helpers`` threads for parts of decodes, used when CPUs are idle.

    ``most_helpers`` 0 turns splitting off; ``when_idle_only`` False offers every helper
    to every decode, idle CPUs or not (for tests, which must split whatever else the
    machine runs).  The threads are started when first needed and live as long as the
    process (they wait on a queue when unused).
    """

    def __init__(self, most_helpers: int = MOST_HELPERS, *, when_idle_only: bool = True) -> None:
        if not 0 <= most_helpers <= HELPERS_LIMIT:
            raise ValueError(f"helpers must be 0 to {HELPERS_LIMIT}, not {most_helpers}")
        self._most_helpers = most_helpers
        self._when_idle_only = when_idle_only
        self._usable_cpus = usable_cpus()
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._loadavg = _open_loadavg()

    @property
    def most_helpers(self) -> int:
        return self._most_helpers

    def helpers_free(self) -> int:
        """How many helpers a decode starting now may use: the CPUs idle at this moment
        (never counting the caller's own), at most ``most_helpers``."""
        if self._most_helpers == 0 or not self._when_idle_only:
            return self._most_helpers
        return min(self._most_helpers, self.idle_cpus())

    def idle_cpus(self) -> int:
        """The CPUs this process may use that no runnable thread occupies now, besides
        the caller's (0 when the count cannot be read)."""
        running = self._running_threads()
        if running is None:
            return 0
        # The caller is running, so it is among ``running``.
        return max(self._usable_cpus - running, 0)

    def submit(
        self, work: Callable[..., _Result], *arguments: Any, **keywords: Any
    ) -> Future[_Result]:
        """Run ``work(*arguments, **keywords)`` on a helper thread."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=max(self._most_helpers, 1), thread_name_prefix="cutfs-part"
                )
            pool = self._pool
        return pool.submit(work, *arguments, **keywords)

    def close(self) -> None:
        """Let the helpers exit once their parts are done."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        if self._loadavg is not None:
            os.close(self._loadavg)
            self._loadavg = None

    def forget(self) -> None:
        """Let go of what a forked child inherited, without touching the parent's threads."""
        self._pool = None
        if self._loadavg is not None:
            os.close(self._loadavg)
            self._loadavg = None

    def _running_threads(self) -> int | None:
        """Runnable threads on the node now: the first number of ``/proc/loadavg``'s
        fourth field (``running/total``)."""
        if self._loadavg is None:
            return None
        try:
            fields = os.pread(self._loadavg, 128, 0).split()
            return int(fields[3].split(b"/")[0])
        except (OSError, IndexError, ValueError):
            return None


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity, lowered by a cgroup v2 CPU quota
    when one is set (a container limited to 2 CPUs on a 64-CPU node sees 64 idle ones in
    ``/proc/loadavg``, whose count is the node's)."""
    cpus = len(os.sched_getaffinity(0))
    quota = _cgroup_quota_cpus()
    return max(1, min(cpus, quota)) if quota is not None else cpus


def _cgroup_quota_cpus() -> int | None:
    try:
        with open("/proc/self/cgroup", encoding="ascii") as file:
            lines = file.read().splitlines()
        relative = next(line[3:] for line in lines if line.startswith("0::"))
        with open(f"/sys/fs/cgroup{relative}/cpu.max", encoding="ascii") as file:
            quota, period = file.read().split()[:2]
    except (OSError, StopIteration, ValueError, UnicodeDecodeError):
        return None
    if quota == "max":
        return None
    try:
        return max(1, math.ceil(int(quota) / int(period)))
    except (ValueError, ZeroDivisionError):
        return None


def _open_loadavg() -> int | None:
    try:
        return os.open("/proc/loadavg", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


class _ProcessThreads:
    """The process's :class:`SpareThreads`, made on first use, and the number of helpers
    it is to have."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.threads: SpareThreads | None = None
        self.most_helpers = MOST_HELPERS
        self.when_idle_only = True

    def get(self) -> SpareThreads:
        with self.lock:
            if self.threads is None:
                self.threads = SpareThreads(self.most_helpers, when_idle_only=self.when_idle_only)
            return self.threads

    def configure(self, most_helpers: int, when_idle_only: bool) -> None:
        SpareThreads(most_helpers).close()  # validates the number
        with self.lock:
            previous, self.threads = self.threads, None
            self.most_helpers = most_helpers
            self.when_idle_only = when_idle_only
        if previous is not None:
            previous.close()

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's threads are not there (and another of its
        threads may have held the lock), so the next decode makes a pool of its own."""
        if self.threads is not None:
            self.threads.forget()
        self.threads = None
        self.lock = threading.Lock()


_process = _ProcessThreads()
os.register_at_fork(after_in_child=_process.forget_after_fork)


def shared_threads() -> SpareThreads:
    """This process's spare threads (made on first use, with :data:`MOST_HELPERS` helpers
    unless :func:`configure` said otherwise)."""
    return _process.get()


def configure(most_helpers: int, *, when_idle_only: bool = True) -> None:
    """Use at most ``most_helpers`` helper threads in this process from now on (0: decode
    every range on the calling thread; ``when_idle_only``: see :class:`SpareThreads`)."""
    _process.configure(most_helpers, when_idle_only)
