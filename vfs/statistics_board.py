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
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Final

from cutfs.vfs.statistics import Statistics

log = logging.getLogger("cutfs.statistics_board")

#: Sections whose numbers are per process and add up to the mount's (the others, such as
#: the shard set's description and the shared time-range table, are the same in every
#: process).
SUMMED_SECTIONS: Final = frozenset({"cache", "workers", "store", "indexing"})
#: A published file larger than this is not read (they are a few KiB).
_LARGEST_FILE_BYTES: Final = 1 << 20


class StatisticsBoard:
    """One process's view of the board: it publishes its own file and reads the others'."""

    def __init__(self, directory: str, index: int, processes: int) -> None:
        self._directory = directory
        self._index = index
        self._processes = processes

    def _path(self, index: int) -> str:
        return os.path.join(self._directory, f"{index}.json")

    def publish(self, statistics: Statistics, sections: dict[str, Any]) -> None:
        """Replace this process's file with its current figures."""
        state = {
            "pid": os.getpid(),
            "published": time.time(),
            "statistics": statistics.export(),
            "sections": {
                name: sections[name] for name in (*SUMMED_SECTIONS, "serving") if name in sections
            },
        }
        temporary = self._path(self._index) + ".new"
        try:
            with open(temporary, "w", encoding="utf-8") as file:
                json.dump(state, file)
            os.replace(temporary, self._path(self._index))
        except OSError as exc:
            log.warning("cannot publish this process's statistics: %s", exc)

    def combine(
        self, statistics: Statistics, sections: dict[str, Any]
    ) -> tuple[Statistics, dict[str, Any]]:
        """This process's live figures plus every other process's latest ones, and a
        ``serving`` section (requests answered by each process counted)."""
        total = statistics.copy()
        combined = dict(sections)
        answered = {self._index: _requests(statistics.counters)}
        for index, state in self._others():
            try:
                checked = Statistics()
                checked.absorb(state["statistics"])  # all or nothing: a bad file adds nothing
                total.absorb(checked.export())
                for name, section in state["sections"].items():
                    if name in SUMMED_SECTIONS and isinstance(section, dict):
                        combined[name] = _added(combined.get(name, {}), section)
                    elif name == "serving" and isinstance(section, dict):  # the daemon's
                        combined[name] = section
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

    def _others(self) -> list[tuple[int, dict[str, Any]]]:
        states = []
        for index in range(self._processes):
            if index == self._index:
                continue
            try:
                with open(self._path(index), "rb") as file:
                    content = file.read(_LARGEST_FILE_BYTES + 1)
                if len(content) > _LARGEST_FILE_BYTES:
                    raise ValueError("file too large")
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
