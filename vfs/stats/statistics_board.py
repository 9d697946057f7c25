"""The statistics of a mount served by several processes, added up.

Each serving process counts what it answers in its own :class:`Statistics`.
Every second it publishes them, with its numeric sections (cache, workers,
store), as one JSON file in a private directory of the daemon, replaced by
rename so that a reader never sees half a file.  Whichever process answers
a read of ``.cutfs/stats`` adds the other processes' latest files to its own
live figures: counters and histograms add up exactly, and the others' part
is at most a second old.  A file that is missing (a process still starting)
or unreadable is left out, and the ``serving`` section says how many
processes were counted.

So that a read shows what every process has counted up to that moment, the
process answering it first publishes its own figures, then rings the others'
doorbells (:mod:`cutfs.vfs.daemon.doorbell`) and waits for their files to be replaced,
at most :data:`FRESH_WAIT_SECONDS` (a process answers between two requests).
Publishing its own first also keeps the counters from going back when two
reads in a row are answered by different processes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable
from typing import Any, Final

from cutfs.codec.trust.shared_file import read_regular_file, replace_file
from cutfs.vfs.daemon.doorbell import Doorbell
from cutfs.vfs.stats.statistics import Statistics, checked_name

log = logging.getLogger("cutfs.statistics_board")

#: Sections whose numbers are per process and add up to the mount's (the others, such as
#: the shard set's description and the shared time-range table, are the same in every
#: process).
SUMMED_SECTIONS: Final = frozenset({"cache", "workers", "store", "indexing"})
#: Sections only the daemon has (how its processes are doing, the kernel settings it
#: applied): whichever process answers shows the daemon's.
_DAEMONS: Final = ("serving", "kernel")
#: How long a read of the statistics waits for the other processes' fresh figures: one
#: busy with a long decode is shown as it last published.
FRESH_WAIT_SECONDS: Final = 0.1
#: How often the files of the processes rung are looked at while waiting.
_FRESH_POLL_SECONDS: Final = 0.001
#: A published file larger than this is not read (they are a few KiB).
_LARGEST_FILE_BYTES: Final = 1 << 20
#: Sections nest this deep at most, lists hold this many numbers at most.
_MOST_DEPTH: Final = 3
_MOST_LIST: Final = 1024
#: Text another process may publish: printable ASCII, 200 characters at most.
_TEXT: Final = re.compile(r"[ -~]{0,200}")


class StatisticsBoard:
    """One process's view of the board: it publishes its own file and reads the others'."""

    def __init__(
        self, directory: str, index: int, processes: int, supervisor_file: str | None = None
    ) -> None:
        """The board in ``directory`` of ``processes`` publishers, seen by the one numbered
        ``index``.  Publisher 0 is the supervisor, whose file is ``supervisor_file`` when
        given: a file of root's in root's own directory, which the serving processes read
        and only root writes (its ``serving`` and ``kernel`` sections, and the requests it
        failed)."""
        self._directory = directory
        self._index = index
        self._processes = processes
        self._supervisor_file = supervisor_file
        self._sequence = 0
        self._doorbell: Doorbell | None = None

    def _path(self, index: int) -> str:
        if index == 0 and self._supervisor_file is not None:
            return self._supervisor_file
        return os.path.join(self._directory, f"{index}.json")

    def _doorbell_path(self, index: int) -> str:
        return os.path.join(self._directory, f"{index}.bell")

    def open_doorbell(self, on_ring: Callable[[], None]) -> Doorbell:
        """This process's doorbell, answered by calling ``on_ring`` (which publishes)."""
        self._doorbell = Doorbell.open(self._doorbell_path(self._index), on_ring)
        return self._doorbell

    def publish(self, statistics: Statistics, sections: dict[str, Any]) -> None:
        """Replace this process's file with its current figures."""
        self._sequence += 1
        state = {
            "pid": os.getpid(),
            "sequence": self._sequence,
            "published": time.time(),
            "statistics": statistics.export(),
            "sections": {
                name: sections[name] for name in (*SUMMED_SECTIONS, *_DAEMONS) if name in sections
            },
        }
        path = self._path(self._index)
        try:
            # The supervisor's file is read by the serving processes, which run as a user.
            mode = 0o644 if path == self._supervisor_file else 0o600
            replace_file(path, json.dumps(state).encode(), path + ".new", mode)
        except OSError as exc:
            log.warning("cannot publish this process's statistics: %s", exc)

    def combine(
        self, statistics: Statistics, sections: dict[str, Any]
    ) -> tuple[Statistics, dict[str, Any]]:
        """This process's live figures plus every other process's latest ones, and a
        ``serving`` section (requests answered by each process counted)."""
        self.publish(statistics, sections)
        total = statistics.copy()
        combined = dict(sections)
        answered = {self._index: _requests(statistics.counters)}
        for index, state in self._fresh_others():
            try:
                checked = Statistics()
                checked.absorb(state["statistics"])  # all or nothing: a bad file adds nothing
                total.absorb(checked.export())
                for name, section in state["sections"].items():
                    if name in SUMMED_SECTIONS and isinstance(section, dict):
                        combined[name] = _added(combined.get(name, {}), _checked(section))
                    elif name in _DAEMONS and isinstance(section, dict):
                        combined[name] = _checked(section)
                answered[index] = _requests(state["statistics"]["counters"])
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                log.warning("left out the statistics of serving process %d: %s", index, exc)
        combined["serving"] = {
            **combined.get("serving", {}),
            "processes": self._processes,
            "counted": len(answered),
            "requests_by_process": [answered.get(i) for i in range(self._processes)],
        }
        return total, combined

    def _fresh_others(self) -> list[tuple[int, dict[str, Any]]]:
        """The other processes' states, published after they were asked here (those that
        answer within :data:`FRESH_WAIT_SECONDS`)."""
        states = dict(self._others())
        rung = {
            index: _sequence(state)
            for index, state in states.items()
            if Doorbell.ring(self._doorbell_path(index))
        }
        deadline = time.monotonic() + FRESH_WAIT_SECONDS
        while rung and time.monotonic() < deadline:
            time.sleep(_FRESH_POLL_SECONDS)
            if self._doorbell is not None:
                self._doorbell.answer()  # one ringing this one meanwhile waits for it too
            for index, state in self._others(list(rung)):
                states[index] = state
                if _sequence(state) != rung[index]:
                    del rung[index]
        return sorted(states.items())

    def _others(self, indexes: list[int] | None = None) -> list[tuple[int, dict[str, Any]]]:
        states = []
        for index in range(self._processes) if indexes is None else indexes:
            if index == self._index:
                continue
            try:
                content = read_regular_file(self._path(index), _LARGEST_FILE_BYTES)
                state = json.loads(content)
                if not isinstance(state, dict):
                    raise ValueError("not an object")
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as exc:
                log.warning("cannot read the statistics of serving process %d: %s", index, exc)
                continue
            states.append((index, state))
        return states


def _checked(section: dict[str, Any], depth: int = 0) -> dict[str, Any]:
    """A section another process published, if it holds only what cutfs's own do: names
    (:func:`checked_name`) mapped to numbers, short plain text, lists of numbers or such
    sections, three deep at most; ValueError else."""
    if depth > _MOST_DEPTH:
        raise ValueError("a section nested too deep")
    checked: dict[str, Any] = {}
    for name, value in section.items():
        if isinstance(value, dict):
            checked[checked_name(name)] = _checked(value, depth + 1)
        elif isinstance(value, list):
            if not all(_is_number(item) or item is None for item in value):
                raise ValueError(f"a list of other than numbers in {name!r:.80}")
            checked[checked_name(name)] = value[:_MOST_LIST]
        elif isinstance(value, str):
            if _TEXT.fullmatch(value) is None:
                raise ValueError(f"text with characters not shown in {name!r:.80}")
            checked[checked_name(name)] = value
        elif _is_number(value) or value is None or isinstance(value, bool):
            checked[checked_name(name)] = value
        else:
            raise ValueError(f"an unexpected value in {name!r:.80}")
    return checked


def _sequence(state: dict[str, Any]) -> object:
    """What changes with each publication of a state (anything, from a file of another
    process: it is only compared)."""
    return state.get("sequence")


def _requests(counters: Any) -> int:
    return sum(int(v) for k, v in dict(counters).items() if str(k).startswith("requests."))


def _added(own: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """``own`` with ``other``'s numbers added, key by key (nested sections too); values
    that are not numbers stay ``own``'s."""
    result = dict(own)
    for key, value in other.items():
        mine = result.get(key)
        if _is_number(value) and (mine is None or _is_number(mine)):
            result[key] = (mine or 0) + value
        elif isinstance(value, dict) and isinstance(mine, dict | None):
            result[key] = _added(mine or {}, value)
    return result


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
