"""The ``cutfs`` command: its parser and what each of its subcommands does."""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import logging.handlers
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import IO, TYPE_CHECKING, Any, ClassVar, Final, NoReturn

from cutfs import __version__
from cutfs.codec.errors import CutfsError, ShardFormatError
from cutfs.codec.storage.object_location import is_remote
from cutfs.codec.trust.clean_start import absolute, clean_environment, python_command
from cutfs.vfs.cli.mount_arguments import (
    add_mount_arguments,
    daemon_options,
    fold_o_options,
    markdown_table,
    mount_options,
    o_options_help,
)
from cutfs.vfs.cli.printable import printable
from cutfs.vfs.daemon.exit_status import ExitCode, how_it_ended
from cutfs.vfs.daemon.mount_options import DaemonOptions, parse_size

if TYPE_CHECKING:
    from tqdm import tqdm

    from cutfs.codec.packing.commit import PackReport
    from cutfs.codec.packing.engines import PackEngine
    from cutfs.codec.packing.progress import PackProgress

log = logging.getLogger("cutfs")


_COMMANDS = ("pack", "mount", "upgrade", "umount", "stats", "which", "completion", "manpage")
#: ``cutfs pack STEP ...``: the steps of a pack, for engines of one's own.
_PACK_STEPS = ("plan", "run", "commit", "status")
#: What pack and mount read, for their help.
_SOURCE_FORMATS = (
    "Lhotse manifests (recordings plus supervisions or cuts, .jsonl or .jsonl.gz, or a "
    "directory of them), a Lhotse Shar directory, a Kaldi data directory (wav.scp, segments, "
    "text, utt2spk), a HuggingFace dataset (save_to_disk Arrow files or Parquet shards), "
    "WebDataset tars, Arrow episode shards with a segment list, or a directory of audio files"
)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments and arguments[0] not in _COMMANDS and not arguments[0].startswith("-"):
        arguments.insert(0, "mount")  # "cutfs SRC MNT -o OPTS", as mount(8) runs helpers
    parser = _parser()
    if arguments[:1] == ["pack"] and arguments[1:2] and arguments[1] in _PACK_STEPS:
        parser = _pack_step_parser()
        arguments = arguments[1:]
    args = parser.parse_args(arguments)
    if args.command is None:
        parser.print_help()
        return ExitCode.USAGE
    args.argv = arguments
    if args.command == "mount":
        try:
            fold_o_options(args, args.options)
            options = mount_options(args)
            options.check()  # usage errors, before a daemon starts
        except ValueError as exc:
            parser.error(str(exc))
    _make_paths_absolute(args)
    return int(args.run(args))


def _make_paths_absolute(args: argparse.Namespace) -> None:
    """Resolve every local path argument against the directory the command was run from
    (:func:`caller_directory`): a clean start runs from ``/``, and what it starts must not
    depend on a working directory."""

    def local(path: str) -> str:
        return path if is_remote(path) else absolute(path)

    for name in ("shard_dir", "output", "directory", "mountpoint", "slurm_folder"):
        value = getattr(args, name, None)
        if isinstance(value, str):
            setattr(args, name, local(value))
    if isinstance(getattr(args, "sources", None), list):
        args.sources = [local(source) for source in args.sources]
    # The mount's own path options are made absolute as they are parsed (parse_path).


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cutfs",
        description="Serve cuts of long compressed recordings as exact WAV files over FUSE.",
    )
    parser.add_argument(
        "--version",
        action=_VersionAction,
        help="print the versions of cutfs and of the libraries it reads and serves with",
    )
    parser.set_defaults(command=None)
    commands = parser.add_subparsers(title="commands")

    pack_parser = commands.add_parser(
        "pack",
        help="pack recordings and cuts into shards",
        description=f"Read {_SOURCE_FORMATS}, and write a shard directory.",
    )
    pack_parser.add_argument(
        "sources",
        nargs="+",
        metavar="SOURCE",
        help="what to pack: a directory (any of the formats above), a WebDataset .tar, or "
        "Lhotse manifest files",
    )
    pack_parser.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="SHARD_DIR",
        help="the shard directory to create (must not exist or be empty), or object storage: "
        "s3://bucket/prefix, gs://bucket/prefix or az://container/prefix (each partition's "
        "shard is uploaded as it is packed, the manifest last; the prefix must hold no "
        "manifest yet)",
    )
    pack_parser.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=os.cpu_count() or 1,
        help="recordings indexed in parallel (default: one per core)",
    )
    pack_parser.add_argument(
        "--shard-size",
        type=_size,
        default=_DEFAULT_SHARD_SIZE,
        metavar="BYTES",
        help="bytes per shard, e.g. 512M (default 1G)",
    )
    _add_memory_argument(pack_parser)
    pack_parser.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    _add_engine_arguments(pack_parser)
    pack_parser.set_defaults(command="pack", run=_pack)

    mount_parser = commands.add_parser(
        "mount",
        help="mount a shard directory, or serve a source in place",
        description="Mount read-only; returns once the mount is ready. SOURCE is a shard "
        "directory (from 'cutfs pack'; local, or in object storage as s3://bucket/prefix, "
        "with ?endpoint_override=HOST:PORT&scheme=http for S3-compatible servers and "
        "credentials from the standard AWS environment and files, as gs://bucket/prefix "
        "with Google's application default credentials, or as az://container/prefix?account="
        "NAME with Azure's) or, served in place "
        "without packing: Lhotse manifests, a Lhotse Shar directory, a Kaldi data "
        "directory, a HuggingFace dataset (save_to_disk or Parquet), WebDataset tars, "
        "Arrow shards with a segment list, or a directory of audio files. Also runs as "
        "'cutfs SOURCE MOUNTPOINT -o OPTIONS', the form mount(8) uses for fstab entries of "
        "type fuse.cutfs.",
    )
    mount_parser.add_argument(
        "shard_dir",
        metavar="SOURCE",
        help="a shard directory from 'cutfs pack' (a path, s3://bucket/prefix, "
        "gs://bucket/prefix or az://container/prefix), or a source to serve in place",
    )
    mount_parser.add_argument(
        "mountpoint", metavar="MOUNTPOINT", help="an existing, empty directory to mount on"
    )
    add_mount_arguments(mount_parser)
    mount_parser.add_argument(
        "-o",
        dest="options",
        action="append",
        default=[],
        metavar="OPTIONS",
        help=o_options_help(),
    )
    mount_parser.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    mount_parser.set_defaults(command="mount", run=_mount)

    _add_tool_parsers(commands)
    return parser


#: ``--shard-size`` unless given: shard_writer's DEFAULT_SHARD_BYTES (not imported here:
#: it brings pyarrow into every command's start).
_DEFAULT_SHARD_SIZE: Final = "1G"


#: ``--memory`` unless given: memory_budget's DEFAULT_MEMORY_BYTES (not imported here, as
#: for the shard size).
_DEFAULT_MEMORY: Final = "2G"


def _add_memory_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--memory",
        type=_size,
        default=_DEFAULT_MEMORY,
        metavar="BYTES",
        help="memory the pack may use, e.g. 4G (default 2G): cuts beyond it are sorted on "
        "disk, in the output's scratch space (and TMPDIR while the sources are read), "
        "whatever their number",
    )


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    engines = parser.add_argument_group(
        "engines",
        "Where partitions are packed.  With slurm or ray the output (a directory every node "
        "sees, or object storage) is written in place: rerunning an interrupted pack keeps the "
        "partitions already done.",
    )
    engines.add_argument(
        "--engine",
        choices=("local", "slurm", "ray"),
        default="local",
        help="local: this machine, -j processes (default); slurm: a job array through "
        "submitit; ray: one task per partition on a Ray cluster",
    )
    engines.add_argument(
        "--cpus-per-task",
        type=int,
        default=1,
        metavar="N",
        help="slurm and ray: cores per partition task, each indexing a recording (default 1)",
    )
    engines.add_argument(
        "--retries",
        type=int,
        default=2,
        metavar="N",
        help="slurm and ray: runs again of a partition that crashed (not of bad input; default 2)",
    )
    engines.add_argument("--slurm-partition", metavar="NAME", help="slurm: the partition")
    engines.add_argument(
        "--array-parallelism",
        type=int,
        default=256,
        metavar="N",
        help="slurm: array tasks running at once (default 256)",
    )
    engines.add_argument(
        "--time-min",
        type=int,
        default=240,
        metavar="MIN",
        help="slurm: time limit of one partition task in minutes (default 240)",
    )
    engines.add_argument(
        "--mem-gb", type=float, metavar="GB", help="slurm: memory of one partition task"
    )
    engines.add_argument(
        "--slurm-folder",
        metavar="DIR",
        help="slurm: where submitit keeps job scripts, pickles and logs, seen by every node; "
        "only you may write it (default: a folder of yours below ~/.cache/cutfs/slurm, "
        "removed once the pack is committed)",
    )
    engines.add_argument(
        "--slurm-executor",
        choices=("slurm", "local"),
        default="slurm",
        help="slurm: 'local' runs the same submission with submitit's local executor, "
        "without a Slurm controller",
    )
    engines.add_argument(
        "--ray-address",
        metavar="ADDRESS",
        help="ray: the cluster to join, as ray.init(address=...) takes it (default: "
        "$RAY_ADDRESS, or a new instance on this machine)",
    )


def _pack_step_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cutfs pack",
        description="The steps of a pack, for running partitions with a scheduler of your own: "
        "plan, then run every partition (in any order, on any machine that sees the output), "
        "then commit.",
    )
    steps = parser.add_subparsers(title="steps")
    plan = steps.add_parser(
        "plan", help="read and check the sources; write the plan of partitions under OUT/_plan"
    )
    plan.add_argument("sources", nargs="+", metavar="SOURCE", help="as for 'cutfs pack'")
    plan.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="OUT",
        help="a directory, or s3://, gs:// or az://bucket/prefix",
    )
    plan.add_argument(
        "--shard-size",
        type=_size,
        default=_DEFAULT_SHARD_SIZE,
        metavar="BYTES",
        help="source bytes per partition, each one shard (default 1G)",
    )
    _add_memory_argument(plan)
    plan.set_defaults(command="pack plan", run=_pack_plan)
    run = steps.add_parser("run", help="pack partitions into their shards and partial tables")
    run.add_argument("output", metavar="OUT")
    run.add_argument(
        "--partition",
        required=True,
        type=_partitions,
        metavar="I",
        help="the partition(s): I, I-J or I,J,...; a partition already done is skipped",
    )
    run.add_argument(
        "-j", "--jobs", type=int, default=1, help="recordings indexed in parallel (default 1)"
    )
    run.set_defaults(command="pack run", run=_pack_run)
    commit = steps.add_parser(
        "commit", help="check every partition, merge the tables, write the manifest last"
    )
    commit.add_argument("output", metavar="OUT")
    commit.add_argument(
        "--keep-parts", action="store_true", help="keep the plan and the partial tables"
    )
    _add_memory_argument(commit)
    commit.set_defaults(command="pack commit", run=_pack_commit)
    status = steps.add_parser(
        "status", help="partitions done, running and failed; hours packed; time left"
    )
    status.add_argument("output", metavar="OUT")
    status.set_defaults(command="pack status", run=_pack_status)
    for action in steps._choices_actions:  # each step's help is its description too
        steps.choices[action.dest].description = action.help
    parser.set_defaults(command=None)
    return parser


def _partitions(text: str) -> list[int]:
    numbers: list[int] = []
    try:
        for part in text.split(","):
            first, _, last = part.partition("-")
            numbers.extend(range(int(first), int(last or first) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not partition numbers: {text!r} (e.g. 3, 0-99)"
        ) from None
    if not numbers or min(numbers) < 0:
        raise argparse.ArgumentTypeError(f"not partition numbers: {text!r} (e.g. 3, 0-99)")
    return numbers


# -- pack --------------------------------------------------------------------------------------


def _pack(args: argparse.Namespace) -> int:
    from cutfs.codec.packing.engines import default_slurm_folder
    from cutfs.codec.packing.packer import pack, pack_in_place

    logging.basicConfig(level=logging.INFO, format="cutfs: %(message)s")
    progress = None if args.quiet else _Progress()
    started = time.monotonic()
    in_place = args.engine != "local" or is_remote(args.output)
    try:
        if in_place:
            report = pack_in_place(
                args.sources,
                args.output,
                _engine(args),
                max_shard_bytes=args.shard_size,
                memory_bytes=args.memory,
                on_progress=progress.update if progress else None,
            )
        else:
            report = pack(
                args.sources,
                args.output,
                jobs=max(args.jobs, 1),
                max_shard_bytes=args.shard_size,
                memory_bytes=args.memory,
                on_progress=progress.update if progress else None,
            )
    except CutfsError as exc:
        if progress:
            progress.finish()
        print(f"cutfs pack: error: {exc}", file=sys.stderr)
        if in_place:
            print(
                f"cutfs pack: the partitions done are kept: rerun to pack the rest, or see "
                f"'cutfs pack status {args.output}'",
                file=sys.stderr,
            )
        return ExitCode.ERROR
    except KeyboardInterrupt:
        kept = "the partitions done are kept" if in_place else "nothing was written"
        print(f"cutfs pack: interrupted; {kept}", file=sys.stderr)
        return 130
    if progress:
        progress.finish()
    if args.engine == "slurm" and args.slurm_folder is None:  # its default, ours to remove
        shutil.rmtree(default_slurm_folder(args.output), ignore_errors=True)
    _print_report(report, time.monotonic() - started)
    return ExitCode.OK


def _engine(args: argparse.Namespace) -> PackEngine:
    """The engine ``args`` ask for; raises :class:`CutfsError` for one that cannot run
    (before anything is written)."""
    from cutfs.codec.packing.engines import (
        LocalEngine,
        RayEngine,
        SlurmEngine,
        default_slurm_folder,
    )

    if args.engine == "slurm":
        engine = SlurmEngine(
            folder=args.slurm_folder or default_slurm_folder(args.output),
            cluster=args.slurm_executor,
            slurm_partition=args.slurm_partition,
            array_parallelism=max(args.array_parallelism, 1),
            cpus_per_task=max(args.cpus_per_task, 1),
            timeout_min=max(args.time_min, 1),
            mem_gb=args.mem_gb,
            retries=max(args.retries, 0),
            jobs_per_task=max(args.cpus_per_task, 1),
        )
        engine.check_folder()
        return engine
    if args.engine == "ray":
        return RayEngine(
            address=args.ray_address,
            cpus_per_task=max(args.cpus_per_task, 1),
            retries=max(args.retries, 0),
        )
    return LocalEngine(max(args.jobs, 1))


def _print_report(report: PackReport, elapsed: float) -> None:
    for recording_id, reason in report.transcoded.items():
        print(f"cutfs pack: {recording_id}: {reason}", file=sys.stderr)
    print(
        f"packed {report.recordings} recordings ({report.audio_seconds / 3600:.2f} h of audio, "
        f"{report.stored_bytes / 1e6:.1f} MB) and {report.cuts} cuts into {report.output_dir} "
        f"in {elapsed:.1f} s; {len(report.transcoded)} transcoded to FLAC"
    )


def _pack_step(step: Callable[[], int]) -> int:
    """Run one step of a pack; bad input and refusals become a message and status 1."""
    try:
        return step()
    except CutfsError as exc:
        print(f"cutfs pack: error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    except KeyboardInterrupt:
        print("cutfs pack: interrupted", file=sys.stderr)
        return 130


def _pack_plan(args: argparse.Namespace) -> int:
    from cutfs.codec.packing.output import open_pack_output
    from cutfs.codec.packing.plan import make_plan

    def step() -> int:
        output = open_pack_output(args.output)
        try:
            plan = make_plan(args.sources, output, args.shard_size, args.memory)
        finally:
            output.close()
        print(
            f"planned {plan.partitions} partitions of {plan.recordings} recordings and "
            f"{plan.cuts} cuts ({sum(plan.partition_bytes) / 1e9:.2f} GB of sources) in "
            f"{args.output}"
        )
        print(plan.partitions)
        return ExitCode.OK

    return _pack_step(step)


def _pack_run(args: argparse.Namespace) -> int:
    from cutfs.codec.packing.output import open_pack_output
    from cutfs.codec.packing.partition_packer import pack_partition

    def step() -> int:
        output = open_pack_output(args.output)
        try:
            for partition in args.partition:
                started = time.monotonic()
                result = pack_partition(output, partition, jobs=max(args.jobs, 1))
                what = (
                    "already done"
                    if result.skipped
                    else f"packed in {time.monotonic() - started:.1f} s"
                )
                print(
                    f"partition {partition}: {result.recordings} recordings, {result.cuts} "
                    f"cuts, {result.audio_seconds / 3600:.2f} h into {result.shard['file']}; "
                    f"{what}"
                )
        finally:
            output.close()
        return ExitCode.OK

    return _pack_step(step)


def _pack_commit(args: argparse.Namespace) -> int:
    from cutfs.codec.packing.commit import commit_pack
    from cutfs.codec.packing.output import open_pack_output

    def step() -> int:
        started = time.monotonic()
        output = open_pack_output(args.output)
        try:
            report = commit_pack(output, keep_parts=args.keep_parts, memory_bytes=args.memory)
        finally:
            output.close()
        if report.already_committed:
            print(f"{args.output} is already committed ({report.cuts} cuts); nothing to do")
        else:
            _print_report(report, time.monotonic() - started)
        return ExitCode.OK

    return _pack_step(step)


def _pack_status(args: argparse.Namespace) -> int:
    from cutfs.codec.packing.output import open_pack_output
    from cutfs.codec.packing.status import read_status

    def step() -> int:
        output = open_pack_output(args.output)
        try:
            status = read_status(output)
        finally:
            output.close()
        print("\n".join(status.lines()))
        return ExitCode.OK

    return _pack_step(step)


class _Progress:
    """Pack progress on stderr: a tqdm bar on a terminal (percentage, rate, ETA, hours of
    audio, bytes), otherwise a plain line every 10 s for logs; the phases that count cuts
    (reading, planning, sorting, merging, writing trees) as lines of their own."""

    def __init__(self) -> None:
        self._bar: tqdm[NoReturn] | None = None
        self._started = time.monotonic()
        self._last = 0.0
        self._phase_name = ""
        self._phase_done = ""

    def update(self, progress: PackProgress) -> None:
        if progress.phase != "packing":
            self._phase(progress)
            return
        if sys.stderr.isatty():
            self._draw(progress)
            return
        now = time.monotonic()
        if now - self._last < 10.0 and progress.recordings_done != progress.recordings:
            return
        self._last = now
        elapsed = now - self._started
        done, total = progress.recordings_done, progress.recordings
        rate = done / elapsed if elapsed > 0 else 0.0
        remaining = (total - done) / rate if rate > 0 else float("nan")
        print(
            f"packing: {done}/{total} recordings ({100 * done / max(total, 1):.0f}%), "
            f"{progress.audio_seconds / 3600:.2f} h of audio, {progress.stored_bytes / 1e6:.1f} "
            f"MB, {rate:.1f} recordings/s, {elapsed:.0f} s elapsed, ETA {remaining:.0f} s",
            file=sys.stderr,
            flush=True,
        )

    def _phase(self, progress: PackProgress) -> None:
        """A line when a phase that counts cuts begins, then every 10 s and at its end."""
        now = time.monotonic()
        new = progress.phase != self._phase_name
        done = progress.rows > 0 and progress.rows_done == progress.rows
        if not new and not done and now - self._last < 10.0:
            return
        if done and progress.phase == self._phase_done:
            return
        self._phase_name, self._last = progress.phase, now
        if done:
            self._phase_done = progress.phase
        counted = f": {progress.rows_done:,} of {progress.rows:,}" if progress.rows else ""
        line = f"{progress.phase}{counted}, {now - self._started:.0f} s elapsed"
        if self._bar is not None:
            self._bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def _draw(self, progress: PackProgress) -> None:
        if self._bar is None:
            size = shutil.get_terminal_size()  # 80x24 where the terminal reports none
            from tqdm import tqdm

            self._bar = tqdm(
                total=progress.recordings,
                unit="rec",
                desc="packing",
                ncols=size.columns,
                nrows=size.lines,
            )
        self._bar.set_postfix_str(
            f"{progress.audio_seconds / 3600:.2f} h, {progress.stored_bytes / 1e6:.0f} MB",
            refresh=False,
        )
        self._bar.update(progress.recordings_done - self._bar.n)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.close()


# -- mount -------------------------------------------------------------------------------------


def _mount(args: argparse.Namespace) -> int:
    if not args.foreground:
        return _mount_in_background(args)
    from cutfs.vfs.daemon.mount import MountError, serve

    if args.ready_fd is not None and args.log_file is None:
        args.log_file = "syslog"  # started in the background: stderr goes nowhere
    _configure_logging(daemon_options(args))
    options = mount_options(args)
    if args.workers is not None and options.decode_in_turn:
        log.warning(
            "--workers is used only with --no-decode-in-turn: the %s serving processes "
            "decode what they serve (--serving-processes)",
            "requested" if args.serving_processes is not None else "default",
        )
    ready_fd: int | None = args.ready_fd

    def on_ready() -> None:
        os.chdir("/")  # do not keep the caller's directory busy (a clean start is there)
        if ready_fd is not None:
            _detach_output()
            os.write(ready_fd, b"ready\n")
            os.close(ready_fd)

    try:
        serve(args.shard_dir, args.mountpoint, options, on_ready)
    except MountError as exc:
        log.error("%s", exc)
        _report_failure(ready_fd, exc.exit_code, str(exc))
        return exc.exit_code
    except Exception as exc:
        log.exception("the daemon failed")
        _report_failure(ready_fd, ExitCode.ERROR, str(exc))
        return ExitCode.ERROR
    return ExitCode.OK


def _report_failure(ready_fd: int | None, exit_code: int, message: str) -> None:
    if ready_fd is not None:
        os.write(ready_fd, f"error {exit_code} {message}\n".encode())


def _mount_in_background(args: argparse.Namespace) -> int:
    """Start the daemon detached, as a clean start with the same arguments, and wait until
    it is ready.

    The daemon reports through a pipe: "ready", or "error CODE MESSAGE".  It gets no
    terminal: its stdin and stdout are /dev/null, so a caller capturing our output (mount(8)
    does) is not kept waiting.  Its stderr is an unnamed file until it is ready (then
    /dev/null, see :func:`_detach_output`), so that a daemon that dies before it could
    log, for example at an import, is reported with what it printed.
    """
    read_end, write_end = os.pipe()
    command = python_command(
        "cutfs.vfs.cli", [*args.argv, "--foreground", "--ready-fd", str(write_end)]
    )
    with tempfile.TemporaryFile() as early_output:
        daemon = subprocess.Popen(
            command,
            cwd="/",
            env=clean_environment(),
            pass_fds=(write_end,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=early_output,
            start_new_session=True,
        )
        os.close(write_end)
        with os.fdopen(read_end, "rb") as ready:
            message = ready.read(_MOST_READY_BYTES).decode(errors="replace").strip()
        if message == "ready":
            return ExitCode.OK
        status = daemon.wait()
        if message.startswith("error "):
            _, code, text = [*message.split(" ", 2), ""][:3]
            print(f"cutfs mount: {text or 'the daemon failed (see its log)'}", file=sys.stderr)
            return int(code)
        print(
            f"cutfs mount: the daemon {how_it_ended(status)} before the mount was ready"
            + _last_lines(early_output),
            file=sys.stderr,
        )
    return status or ExitCode.ERROR


#: The most a daemon's report of its start is read of.
_MOST_READY_BYTES = 64 << 10


def _last_lines(output: IO[bytes], most_bytes: int = 4096) -> str:
    """What a daemon printed before it died, its last ``most_bytes``, as lines to append to
    a message (printable characters only: it may quote data)."""
    size = output.seek(0, os.SEEK_END)
    output.seek(max(size - most_bytes, 0))
    text = output.read().decode(errors="replace").strip()
    if not text:
        return " (it printed nothing)"
    printable = "".join(c if c.isprintable() or c == "\n" else "?" for c in text)
    return ":\n" + printable


def _detach_output() -> None:
    """In a daemon started in the background, once it is ready: stdout and stderr go to
    /dev/null (the log goes where ``--log-file`` says), not to the file its starter read."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
    finally:
        os.close(null)


def _configure_logging(args: DaemonOptions) -> None:
    level = logging.DEBUG if args.debug else logging.INFO
    handler: logging.Handler
    if args.log_file == "syslog":
        if os.path.exists("/dev/log"):
            handler = logging.handlers.SysLogHandler(address="/dev/log")
            handler.setFormatter(logging.Formatter("cutfs[%(process)d]: %(levelname)s %(message)s"))
        else:
            handler = logging.NullHandler()
    elif args.log_file:
        handler = logging.FileHandler(args.log_file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    elif os.environ.get("JOURNAL_STREAM"):
        # Under systemd, stderr goes to the journal, which reads the level from a
        # "<priority>" prefix.
        handler = logging.StreamHandler()
        handler.setFormatter(_JournalFormatter("%(levelname)s %(name)s: %(message)s"))
    else:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("cutfs: %(levelname)s %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)


class _JournalFormatter(logging.Formatter):
    _PRIORITIES: ClassVar[dict[int, int]] = {
        logging.DEBUG: 7,
        logging.INFO: 6,
        logging.WARNING: 4,
        logging.ERROR: 3,
        logging.CRITICAL: 2,
    }

    def format(self, record: logging.LogRecord) -> str:
        priority = self._PRIORITIES.get(record.levelno, 6)
        return "\n".join(f"<{priority}>{line}" for line in super().format(record).splitlines())


def _add_tool_parsers(commands: Any) -> None:
    """upgrade, stats, umount, completion and manpage."""
    upgrade_parser = commands.add_parser(
        "upgrade",
        help="rewrite a shard directory of an older format as the current one, in place",
        description="Rewrite the catalogue of a shard directory packed by an older cutfs "
        "(format 1) as format 2: blob offsets, file trees and Kaldi order are written, the "
        "shards are not touched (no audio is copied). Mounts then start at once, and the "
        "directory can be uploaded to object storage. Safe to interrupt and run again; "
        "a directory already of format 2 is left alone.",
    )
    upgrade_parser.add_argument(
        "directory", metavar="SHARD_DIR", help="a local shard directory from 'cutfs pack'"
    )
    upgrade_parser.set_defaults(command="upgrade", run=_upgrade)

    stats_parser = commands.add_parser(
        "stats", help="show a mount's counters", description="Print .cutfs/stats of a mount."
    )
    stats_parser.add_argument("mountpoint", metavar="MOUNTPOINT", help="a cutfs mount")
    stats_parser.add_argument("--json", action="store_true", help="print the raw JSON")
    stats_parser.add_argument(
        "--prometheus",
        action="store_true",
        help="print Prometheus' text exposition format (.cutfs/metrics), for example into "
        "node_exporter's textfile collector",
    )
    stats_parser.set_defaults(command="stats", run=_stats)

    which_parser = commands.add_parser(
        "which",
        help="say where a mounted file's audio comes from",
        description="Print the provenance of files of a mount (their user.cutfs.* extended "
        "attributes, as getfattr -d shows them): the recording and cut, the source file or "
        "object and shard, the range in the recording's samples, its rate and channels, the "
        "codec and any transcoding. Nothing is decoded.",
    )
    which_parser.add_argument("paths", nargs="+", metavar="PATH", help="files of a cutfs mount")
    which_parser.set_defaults(command="which", run=_which)

    umount_parser = commands.add_parser("umount", help="unmount (fusermount3 -u)")
    umount_parser.add_argument("mountpoint", metavar="MOUNTPOINT", help="a cutfs mount")
    umount_parser.set_defaults(command="umount", run=_umount)

    completion_parser = commands.add_parser(
        "completion",
        help="print a shell completion script",
        description="Print a completion script for the shell, for example: "
        "cutfs completion bash > /etc/bash_completion.d/cutfs",
    )
    completion_parser.add_argument(
        "shell", choices=("bash", "zsh", "tcsh"), help="the shell to complete in"
    )
    completion_parser.set_defaults(command="completion", run=_completion)

    manpage_parser = commands.add_parser(
        "manpage",
        help="print the manual page (roff)",
        description="Print cutfs(1), generated from this command line, for example: "
        "cutfs manpage > /usr/local/share/man/man1/cutfs.1",
    )
    manpage_parser.add_argument(
        "--markdown",
        action="store_true",
        help="print the table of mount options of README.md instead",
    )
    manpage_parser.set_defaults(command="manpage", run=_manpage)


class _VersionAction(argparse.Action):
    """``--version``: what ``version_text`` prints, then exit."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(version_text())
        parser.exit()


def version_text() -> str:
    """cutfs's version and those of the libraries that decide what it reads and serves."""
    import av
    import pyarrow
    import pyfuse3
    import soundfile

    ffmpeg = getattr(av, "ffmpeg_version_info", "unknown")
    return "\n".join(
        [
            f"cutfs {__version__}",
            f"Python {sys.version.split()[0]}",
            f"pyarrow {pyarrow.__version__}",
            f"PyAV {av.__version__} (FFmpeg {ffmpeg})",
            f"soundfile {soundfile.__version__} (libsndfile {soundfile.__libsndfile_version__})",
            f"pyfuse3 {pyfuse3.__version__} (libfuse {_libfuse_version()})",
        ]
    )


def _libfuse_version() -> str:
    try:
        library = ctypes.CDLL("libfuse3.so.3")
        library.fuse_pkgversion.restype = ctypes.c_char_p
        return str(library.fuse_pkgversion().decode())
    except (OSError, AttributeError):
        return "unknown"


def _completion(args: argparse.Namespace) -> int:
    import shtab

    print(shtab.complete(_parser(), shell=args.shell))
    return ExitCode.OK


def _manpage(args: argparse.Namespace) -> int:
    from cutfs.vfs.cli.manpage import render_manpage

    if args.markdown:
        print(markdown_table(), end="")
        return ExitCode.OK
    print(render_manpage(_parser(), {"pack": _pack_step_parser()}), end="")
    return ExitCode.OK


def _stats(args: argparse.Namespace) -> int:
    from cutfs.vfs.stats.prometheus import exposition_lines
    from cutfs.vfs.tree.control_view import CONTROL_DIR, METRICS_FILE, STATS_FILE

    if args.prometheus:
        metrics = os.path.join(args.mountpoint, CONTROL_DIR, METRICS_FILE)
        try:
            with open(metrics, encoding="utf-8", errors="replace") as metrics_file:
                text = metrics_file.read(_MOST_STATS_BYTES)
        except OSError as exc:
            print(f"cutfs stats: cannot read {metrics}: {exc.strerror}", file=sys.stderr)
            return ExitCode.ERROR
        print(exposition_lines(text), end="")
        return ExitCode.OK
    path = os.path.join(args.mountpoint, CONTROL_DIR, STATS_FILE)
    try:
        with open(path, encoding="utf-8") as stats_file:
            stats = json.loads(stats_file.read(_MOST_STATS_BYTES))
        if not isinstance(stats, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        print(f"cutfs stats: cannot read {path}: {printable(str(exc))}", file=sys.stderr)
        return ExitCode.ERROR
    if args.json:  # made anew here: whatever the file held, its text is escaped JSON
        print(json.dumps(stats, indent=1))
        return ExitCode.OK
    try:
        print(format_stats(stats))
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        print(f"cutfs stats: {path} is not what a mount writes: {exc!r:.200}", file=sys.stderr)
        return ExitCode.ERROR
    return ExitCode.OK


def _which(args: argparse.Namespace) -> int:
    from cutfs.vfs.fuse.operations import XATTR_PREFIX

    status = ExitCode.OK
    for number, path in enumerate(args.paths):
        try:
            names = [n for n in os.listxattr(path) if n.startswith(XATTR_PREFIX)]
            found = {n.removeprefix(XATTR_PREFIX): os.getxattr(path, n) for n in names}
        except OSError as exc:
            print(f"cutfs which: {printable(path)}: {exc.strerror}", file=sys.stderr)
            status = ExitCode.ERROR
            continue
        if not found:
            print(
                f"cutfs which: {printable(path)}: no provenance (only WAV files of a cutfs "
                "mount have one)",
                file=sys.stderr,
            )
            status = ExitCode.ERROR
            continue
        if number:
            print()
        print(printable(path))
        width = max(len(name) for name in found)
        for name, value in found.items():
            shown = printable(value.decode("utf-8", "replace"))
            print(f"  {printable(name):<{width}}  {shown}")
    return status


#: The most of a statistics file ``cutfs stats`` reads (they are a few KiB).
_MOST_STATS_BYTES = 4 << 20


def format_stats(stats: dict[str, Any]) -> str:
    """The statistics of a mount as aligned tables of plain text."""
    lines = [f"uptime  {stats.get('uptime_seconds', 0):.0f} s"]
    sections = ("counters", "errors", "cache", "workers", "shards", "store", "indexing", "views")
    for section in sections:
        values = stats.get(section) or {}
        lines.append(f"\n{section}" + ("  (none)" if not values else ""))
        width = max((len(printable(str(key))) for key in values), default=0)
        lines += [
            f"  {printable(str(key)):<{width}}  {printable(str(value))}"
            for key, value in values.items()
        ]
    latency = stats.get("latency") or {}
    if latency:
        lines.append("\nlatency (ms)")
        lines.append(f"  {'phase':<12} {'count':>9} {'mean':>9} {'p50':>9} {'p99':>9} {'max':>9}")
        for phase, row in latency.items():
            lines.append(
                f"  {printable(str(phase)):<12} {row['count']:>9} {row['mean_ms']:>9.2f} "
                f"{row['p50_ms']:>9.2f} {row['p99_ms']:>9.2f} {row['max_ms']:>9.2f}"
            )
    return "\n".join(lines)


def _upgrade(args: argparse.Namespace) -> int:
    from cutfs.codec.catalogue.shard_upgrade import upgrade_shards

    if is_remote(args.directory):
        print(
            "cutfs upgrade: error: upgrade a local copy of the directory, then upload its "
            "catalogue (the .arrow files other than shard-*.arrow, manifest.json last); "
            "the shards themselves do not change",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    try:
        report = upgrade_shards(args.directory)
    except ShardFormatError as exc:
        print(f"cutfs upgrade: error: {exc}; nothing was changed", file=sys.stderr)
        return ExitCode.BAD_SHARDS
    except CutfsError as exc:
        print(f"cutfs upgrade: error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    if not report.upgraded:
        print(f"{args.directory} is already shard format {report.from_version}: nothing to do")
        return ExitCode.OK
    print(
        f"upgraded {args.directory} from shard format {report.from_version}: "
        f"{report.recordings} recordings located, {report.cuts} cuts, "
        f"{report.catalogue_bytes / 1e6:.1f} MB of catalogue written in "
        f"{report.seconds:.1f} s; the shards were not changed"
    )
    return ExitCode.OK


def _umount(args: argparse.Namespace) -> int:
    result = subprocess.run(["fusermount3", "-u", args.mountpoint], check=False)
    return result.returncode
