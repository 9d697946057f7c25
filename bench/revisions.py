#!/usr/bin/env python3
"""Revisions of cutfs side by side: cold 10 s cuts against soundfile, and uncached
throughput with 2 readers, each revision mounting in turn, round after round.

    sudo .venv/bin/python bench/revisions.py 78cb600 HEAD --rounds 2
    sudo .venv/bin/python bench/revisions.py HEAD "HEAD:--no-decode-in-turn"

Each revision is checked out into a temporary git worktree and mounts from there: a
virtual environment made beside it puts the worktree, then the packages of this checkout's
environment, on its path (a ``.pth`` file: cutfs starts isolated interpreters, which
ignore ``PYTHONPATH`` and the working directory). The corpus and shards are bench/run.py's
quick ones. Per round and revision, for each 2-hour recording named by ``--recordings``: a
fresh daemon, then every cut once with the page cache dropped before it, each followed by
the same cut with soundfile on the original (page cache dropped too); then bench/run.py's
uncached throughput (2 readers, a mount with a 1 MB block cache and ``--direct-io``,
against 2 soundfile processes). Taking turns spreads the host's drift over all the
revisions: compare the ratios, each against soundfile in the same step.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from run import (
    REPOSITORY,
    Setup,
    _drop_caches,
    _prepare,
    _read_file,
    _soundfile_cut,
    _timed,
    _unmount,
)
from run import _uncached_throughput as uncached_throughput


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "revisions",
        nargs="+",
        help="git revisions (HEAD, a commit, a branch), each optionally followed by "
        "':' and mount options ('HEAD:--no-decode-in-turn')",
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--recordings", nargs="+", default=["flac_2h", "opus_2h"])
    parser.add_argument("--work", type=Path, default=REPOSITORY / "bench" / "out")
    args = parser.parse_args()
    setup = _prepare(args.work, {"30min": 1800.0, "2h": 7200.0}, 12)
    mountpoint = args.work / "mnt" / "revisions"
    mountpoint.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[str, int, str, float, float]] = []
    with tempfile.TemporaryDirectory(prefix="cutfs-revisions-") as scratch:
        trees: dict[str, tuple[str, tuple[str, ...]]] = {}
        for label in args.revisions:
            revision, _, options = label.partition(":")
            tree = Path(scratch) / f"{len(trees)}"
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(tree), revision],
                check=True,
                cwd=REPOSITORY,
                capture_output=True,
            )
            trees[label] = (_interpreter_for(tree), tuple(shlex.split(options)))
        try:
            for round_number in range(args.rounds):
                for revision, (python, options) in trees.items():
                    rows += _cold(
                        setup, python, options, mountpoint, args.recordings, revision, round_number
                    )
                    command = (python, "-m", "cutfs.vfs.cli")
                    for row in uncached_throughput(setup, cutfs=command, options=options):
                        ratio = row["cutfs_cuts_per_second"] / row["soundfile_cuts_per_second"]
                        name = f"uncached {row['recording']}"
                        rows.append((revision, round_number, name, ratio, 0.0))
                        print(f"bench: {revision} round {round_number} {name} {ratio:.2f}x")
        finally:
            _unmount(mountpoint)
            for python, _ in trees.values():
                subprocess.run(
                    ["git", "worktree", "remove", "--force", str(Path(python).parents[2])],
                    check=False,
                    cwd=REPOSITORY,
                    capture_output=True,
                )
    print(_table(rows))
    return 0


def _interpreter_for(tree: Path) -> str:
    """A Python that imports cutfs from the worktree ``tree`` and everything else from this
    checkout's environment: a virtual environment inside the worktree (``tree/.venv``),
    whose ``.pth`` lists both."""
    environment = tree / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(environment)], check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    packages = [path for path in sys.path if path.endswith("site-packages")]
    site = environment / "lib" / version / "site-packages"
    (site / "revision.pth").write_text("\n".join([str(tree), *packages]) + "\n")
    return str(environment / "bin" / "python")


def _cold(
    setup: Setup,
    python: str,
    options: tuple[str, ...],
    mountpoint: Path,
    recordings: list[str],
    revision: str,
    round_number: int,
) -> list[tuple[str, int, str, float, float]]:
    """Per recording: (revision, round, recording, cutfs p50 / soundfile p50, cutfs p50)."""
    rows = []
    for rid in recordings:
        _unmount(mountpoint)
        subprocess.run(
            [
                *(python, "-m", "cutfs.vfs.cli", "mount", *options),
                *(str(setup.shards), str(mountpoint)),
            ],
            check=True,
            cwd=Path(python).parents[2],  # revisions before the clean start import from here
        )
        cold, direct = [], []
        for cut in (cut for cut in setup.cuts[rid] if "/c" in cut.cut_id):
            path = mountpoint / "cuts" / f"{cut.cut_id}.wav"
            _drop_caches()
            cold.append(_timed(lambda path=path: _read_file(path)))
            original = setup.corpus[rid]
            _drop_caches()
            direct.append(_timed(lambda o=original, c=cut: _soundfile_cut(o, c.start_seconds)))
        ours, theirs = statistics.median(cold), statistics.median(direct)
        rows.append((revision, round_number, f"cold {rid}", ours / theirs, ours))
        print(
            f"bench: {revision} round {round_number} cold {rid} {ours:.2f} ms, "
            f"soundfile {theirs:.2f} ms: {ours / theirs:.2f}x",
            flush=True,
        )
    _unmount(mountpoint)
    return rows


def _table(rows: list[tuple[str, int, str, float, float]]) -> str:
    measures = sorted({row[2] for row in rows})
    revisions = list(dict.fromkeys(row[0] for row in rows))
    lines = [
        "| measure | " + " | ".join(revisions) + " |",
        "|---|" + "---|" * len(revisions),
    ]
    for measure in measures:
        cells = []
        for revision in revisions:
            found = [row for row in rows if row[0] == revision and row[2] == measure]
            ratios = ", ".join(f"{row[3]:.2f}x" for row in found)
            times = [row[4] for row in found if row[4]]
            cells.append(ratios + (f" ({statistics.median(times):.2f} ms)" if times else ""))
        lines.append(f"| {measure} vs soundfile | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
