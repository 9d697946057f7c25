#!/usr/bin/env python3
"""A training loop fed by a PyTorch DataLoader: cuts through a cutfs mount, cuts read
in-process by ``cutfs.CutDataset``, and the same cuts read from the original long files
with soundfile and with Lhotse, side by side.

    .venv/bin/python bench/dataloader.py                      # this 2-core machine
    .venv/bin/python bench/dataloader.py --workers 16 --rounds 3   # a GPU node

torch comes from the machine (nothing is downloaded); the model runs on CUDA when it is
there, else on the CPU.  The corpus is bench/run.py's (synthetic 2-hour FLAC, MP3 and
Opus recordings, 16 kHz mono; Opus decodes at 48 kHz), packed once into OUT/shards; the
cuts are 10 s long and at least 20 s apart, so no two share a decoded block.  Each system
gets a cold start: the kernel page cache is dropped, and the mount is a fresh daemon.
Every system reads the same cuts in the same order (shuffled once, with a fixed seed)
into the same model: a small 1-D convolution network trained with SGD, enough work per
step to make a GPU wait for data when the loader is slow.

Reported per system: cuts per second over the epoch, and the fraction of steps that
waited for input (the loop's wait for the next batch took more than 1 ms).  Results go to
docs/bench/dataloader.{md,json}; compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import soundfile
from run import CUT_SECONDS, Cut, _drop_caches, _machine, _prepare, _unmount

REPOSITORY = Path(__file__).resolve().parent.parent
CUTFS = [sys.executable, "-m", "cutfs.vfs.cli"]
WAITED_SECONDS = 0.001
MODEL_SAMPLES = 160_000


class MountedCuts:
    """Cut files of a cutfs mount, read with soundfile (what an unmodified script does)."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> np.ndarray:
        samples, _ = soundfile.read(self.paths[index], dtype="float32", always_2d=True)
        return samples.T


class OriginalCuts:
    """Cuts read from the original long files with soundfile: seek, then read."""

    def __init__(self, cuts: list[tuple[str, float]]) -> None:
        self.cuts = cuts

    def __len__(self) -> int:
        return len(self.cuts)

    def __getitem__(self, index: int) -> np.ndarray:
        path, start = self.cuts[index]
        with soundfile.SoundFile(path) as sound:
            sound.seek(round(start * sound.samplerate))
            frames = round(CUT_SECONDS * sound.samplerate)
            return sound.read(frames, dtype="float32", always_2d=True).T


class LhotseCuts:
    """Cuts of the original files through Lhotse's ``cut.load_audio()`` (the recordings are
    read once, as a manifest would hold them)."""

    def __init__(self, cuts: list[tuple[str, float]]) -> None:
        self.cuts = cuts
        self._recordings: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self.cuts)

    def __getitem__(self, index: int) -> np.ndarray:
        from lhotse import Recording  # noqa: PLC0415 - the compat extra

        path, start = self.cuts[index]
        recording = self._recordings.get(path)
        if recording is None:
            recording = self._recordings[path] = Recording.from_file(path)
        cut = recording.to_cut().truncate(offset=start, duration=CUT_SECONDS)
        return np.asarray(cut.load_audio(), dtype=np.float32)


class CutfsInProcess:
    """``cutfs.CutDataset`` in the cut order of the others."""

    def __init__(self, shards: str, cut_ids: list[str]) -> None:
        import cutfs  # noqa: PLC0415

        self.dataset = cutfs.CutDataset(shards)
        with cutfs.open(shards) as corpus:
            position = {cut_id: n for n, cut_id in enumerate(corpus.cut_ids)}
        self.numbers = [position[cut_id] for cut_id in cut_ids]

    def __len__(self) -> int:
        return len(self.numbers)

    def __getitem__(self, index: int) -> np.ndarray:
        samples, _, _ = self.dataset[self.numbers[index]]
        return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=REPOSITORY / "bench" / "out-dataloader")
    parser.add_argument("--out", type=Path, default=REPOSITORY / "docs" / "bench")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--cuts-per-recording", type=int, default=300)
    parser.add_argument("--mount-workers", type=int, default=None, help="cutfs --workers")
    parser.add_argument("--rounds", type=int, default=1, help="epochs per system, interleaved")
    parser.add_argument(
        "--serving-processes",
        type=int,
        nargs="+",
        default=[1],
        help="mount once per count given with event loops handing decodes to workers "
        "(cutfs --no-decode-in-turn --serving-processes N), e.g. 1 2",
    )
    parser.add_argument(
        "--in-turn",
        type=int,
        nargs="*",
        default=[],
        metavar="N",
        help="also mount once per count given with N processes decoding in turn "
        "(cutfs --serving-processes N, the default kind), e.g. 2",
    )
    parser.add_argument(
        "--float32",
        action="store_true",
        help="also mount each of those serving float32 WAV (cutfs --float32), the samples "
        "the loop wants, so that soundfile reads them without converting",
    )
    parser.add_argument(
        "--model-threads",
        type=int,
        default=None,
        help="torch threads of the training loop (default: torch's own, one per core); on a "
        "small CPU-only machine its threads wait for each other by spinning while the loaders "
        "want the same cores",
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("run as root: cold starts drop the kernel page cache")
    import torch  # noqa: PLC0415 - the machine's own torch

    if args.model_threads is not None:
        torch.set_num_threads(args.model_threads)

    setup = _prepare(args.work, {"2h": 7200.0}, args.cuts_per_recording)
    cuts = [cut for rid in sorted(setup.cuts) for cut in setup.cuts[rid]]
    random.Random(7).shuffle(cuts)
    originals = [(str(setup.corpus[cut.recording]), cut.start_seconds) for cut in cuts]
    mountpoint = args.work / "mnt"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    mounted_paths = [_cut_path(mountpoint, cut) for cut in cuts]
    kinds = [(n, False) for n in args.serving_processes] + [(n, True) for n in args.in_turn]
    formats = [False, True] if args.float32 else [False]
    mounts = {
        _mount_name(n, in_turn, float32): (n, in_turn, float32)
        for float32 in formats
        for n, in_turn in kinds
    }
    systems: dict[str, Callable[[], Any]] = {
        **{name: (lambda: MountedCuts(mounted_paths)) for name in mounts},
        "cutfs in-process": lambda: CutfsInProcess(str(setup.shards), [cut.cut_id for cut in cuts]),
        "soundfile, originals": lambda: OriginalCuts(originals),
    }
    if _installed("lhotse"):
        systems["Lhotse, originals"] = lambda: LhotseCuts(originals)
    epochs: dict[str, list[dict[str, Any]]] = {system: [] for system in systems}
    for _ in range(args.rounds):  # rounds alternate between systems: noise falls on all
        for system, make in systems.items():
            if system in mounts:
                _mount(setup.shards, mountpoint, args.mount_workers, *mounts[system])
            _drop_caches()
            row = _epoch(torch, make(), args.workers, args.batch_size, device)
            _unmount(mountpoint)
            epochs[system].append(row)
            print(
                f"bench: {system:22s} {row['cuts_per_second']:7.1f} cuts/s, "
                f"{100 * row['waited_fraction']:.0f}% of steps waited, "
                f"CPU {100 * row['cpu_busy_fraction']:.0f}% busy, "
                f"{row['cpu_ms_per_cut']:.2f} ms per cut",
                flush=True,
            )
    rows = [
        {
            "system": system,
            "cuts_per_second": statistics.median(r["cuts_per_second"] for r in runs),
            "waited_fraction": statistics.median(r["waited_fraction"] for r in runs),
            "epochs": runs,
        }
        for system, runs in epochs.items()
    ]
    results = {
        "machine": {**_machine(), "device": device, "torch": torch.__version__},
        "model_threads": torch.get_num_threads(),
        "workers": args.workers,
        "batch_size": args.batch_size,
        "cuts": len(cuts),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dataloader.json").write_text(json.dumps(results, indent=2) + "\n")
    text = _markdown(results)
    (args.out / "dataloader.md").write_text(text)
    print(text)
    return 0


def _cut_path(mountpoint: Path, cut: Cut) -> str:
    return str(mountpoint / "cuts" / f"{cut.cut_id}.wav")


def _mount_name(serving_processes: int, in_turn: bool, float32: bool) -> str:
    if in_turn:
        name = f"cutfs mount, {serving_processes} decoding in turn"
    elif serving_processes == 1:
        name = "cutfs mount, workers"
    else:
        name = f"cutfs mount, {serving_processes} loops, workers"
    return f"{name}, float32" if float32 else name


def _mount(
    shards: Path,
    mountpoint: Path,
    workers: int | None,
    serving_processes: int,
    in_turn: bool,
    float32: bool,
) -> None:
    _unmount(mountpoint)
    mountpoint.mkdir(parents=True, exist_ok=True)
    options = ["--workers", str(workers)] if workers is not None and not in_turn else []
    options += ["--serving-processes", str(serving_processes)]
    options += ["--decode-in-turn"] if in_turn else ["--no-decode-in-turn"]
    options += ["--float32"] if float32 else []
    subprocess.run([*CUTFS, "mount", *options, str(shards), str(mountpoint)], check=True)
    processes = serving_processes + (1 if in_turn else 0)  # in turn, besides the daemon
    deadline = time.monotonic() + 120
    while processes > 1:  # every serving process answers before the epoch starts
        stats = json.loads((mountpoint / ".cutfs" / "stats").read_bytes())
        if stats["serving"]["ready"] == processes or time.monotonic() > deadline:
            break
        time.sleep(0.2)


def _installed(module: str) -> bool:
    import importlib.util  # noqa: PLC0415

    return importlib.util.find_spec(module) is not None


def _model(torch: Any) -> Any:
    nn = torch.nn
    return nn.Sequential(
        nn.Conv1d(1, 32, kernel_size=400, stride=160),
        nn.ReLU(),
        nn.Conv1d(32, 64, kernel_size=3, stride=2),
        nn.ReLU(),
        nn.AdaptiveAvgPool1d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


def _epoch(torch: Any, dataset: Any, workers: int, batch_size: int, device: str) -> dict[str, Any]:
    """One pass over ``dataset`` training the model; cuts/s and how often input was late."""
    model = _model(torch).to(device)
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=workers,
        # Opus decodes at 48 kHz, the others at 16 kHz: the model sees the first 10 s of
        # samples at 16 kHz's count (the loader's work, reading whole cuts, is unchanged).
        collate_fn=lambda batch: torch.from_numpy(
            np.stack([item[:1, :MODEL_SAMPLES] for item in batch])
        ),
        persistent_workers=False,
    )
    steps = waited = cuts = 0
    busy_before = _busy_cpu_seconds()
    started = time.perf_counter()
    iterator = iter(loader)
    while True:
        asked = time.perf_counter()
        try:
            batch = next(iterator)
        except StopIteration:
            break
        waited += time.perf_counter() - asked > WAITED_SECONDS
        batch = batch.to(device)
        loss = model(batch).logsumexp(dim=1).mean()  # any differentiable objective will do
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        steps += 1
        cuts += len(batch)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    busy = _busy_cpu_seconds() - busy_before
    return {
        "cuts": cuts,
        "seconds": round(seconds, 2),
        "cuts_per_second": round(cuts / seconds, 1),
        "waited_fraction": round(waited / max(steps, 1), 3),
        "cpu_busy_fraction": round(busy / (seconds * (os.cpu_count() or 1)), 3),
        "cpu_ms_per_cut": round(1000 * busy / max(cuts, 1), 2),
    }


def _busy_cpu_seconds() -> float:
    """CPU time the whole machine spent busy so far (every process, the kernel too):
    /proc/stat's first line less idle and I/O wait, in seconds."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n")[0].split()[1:8]]
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def _markdown(results: dict[str, Any]) -> str:
    machine = results["machine"]
    rows = results["rows"]
    base = next(row for row in rows if row["system"] == "cutfs in-process")["cuts_per_second"]
    lines = [
        "# A DataLoader feeding a training loop: cutfs beside the originals",
        "",
        f"Generated by `bench/dataloader.py` on {machine['date']}: {machine['cores']} cores, "
        f"{machine['device']}, torch {machine['torch']}; {results['workers']} DataLoader "
        f"workers, batches of {results['batch_size']}, {results['model_threads']} "
        f"torch threads in the loop, {results['cuts']} cold 10 s cuts of "
        "2-hour FLAC, MP3 and Opus recordings; medians of "
        f"{len(rows[0]['epochs'])} epochs per system, the systems taking turns, the page "
        "cache dropped and the mount restarted before each.",
        "",
        "| system | cuts/s | / cutfs in-process | steps that waited for input | CPUs busy "
        "| CPU ms per cut |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        epochs = row["epochs"]
        busy = statistics.median(epoch["cpu_busy_fraction"] for epoch in epochs)
        cpu = statistics.median(epoch["cpu_ms_per_cut"] for epoch in epochs)
        lines.append(
            f"| {row['system']} | {row['cuts_per_second']} | "
            f"{row['cuts_per_second'] / base:.2f} | {100 * row['waited_fraction']:.0f}% | "
            f"{100 * busy:.0f}% | {cpu:.2f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    shutil.which("fusermount3") or sys.exit("needs fusermount3")
    sys.exit(main())
