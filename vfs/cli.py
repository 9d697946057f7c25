"""The ``cutfs`` command: ``pack``, ``mount`` and ``umount``."""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence

from codec.errors import CutfsError
from codec.packer import pack
from codec.shard_writer import DEFAULT_SHARD_BYTES
from vfs.mount import ExitCode, MountError, MountOptions, serve

log = logging.getLogger("cutfs")

_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return ExitCode.USAGE
    return int(args.run(args))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cutfs",
        description="Serve cuts of long compressed recordings as exact WAV files over FUSE.",
    )
    parser.set_defaults(command=None)
    commands = parser.add_subparsers(title="commands")

    pack_parser = commands.add_parser(
        "pack",
        help="pack recordings and cuts into shards",
        description="Read Lhotse manifests, a Kaldi data directory or a directory of audio "
        "files, and write a shard directory.",
    )
    pack_parser.add_argument(
        "sources", nargs="+", metavar="SOURCE", help="a directory, or Lhotse manifest files"
    )
    pack_parser.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="SHARD_DIR",
        help="the shard directory to create (must not exist or be empty)",
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
        default=DEFAULT_SHARD_BYTES,
        metavar="BYTES",
        help="bytes per shard, e.g. 512M (default 1G)",
    )
    pack_parser.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    pack_parser.set_defaults(command="pack", run=_pack)

    mount_parser = commands.add_parser(
        "mount",
        help="mount a shard directory",
        description="Mount a shard directory read-only; returns once the mount is ready.",
    )
    mount_parser.add_argument("shard_dir", metavar="SHARD_DIR")
    mount_parser.add_argument("mountpoint", metavar="MOUNTPOINT")
    mount_parser.add_argument(
        "-f", "--foreground", action="store_true", help="stay in the foreground, logging to stderr"
    )
    mount_parser.add_argument(
        "--cache-size",
        type=_size,
        default=512 << 20,
        metavar="BYTES",
        help="decoded-audio cache, e.g. 2G (default 512M)",
    )
    mount_parser.add_argument(
        "--workers",
        type=int,
        default=min(os.cpu_count() or 1, 4),
        help="decoder processes; 0 decodes in threads (default: cores, at most 4)",
    )
    mount_parser.add_argument(
        "--allow-other",
        action="store_true",
        help="let other users read the mount (needs user_allow_other "
        "in /etc/fuse.conf when not root)",
    )
    mount_parser.add_argument(
        "--log-file",
        metavar="PATH",
        help="log here (default: stderr in the foreground, else syslog)",
    )
    mount_parser.add_argument("--debug", action="store_true", help="log every request")
    mount_parser.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)
    mount_parser.set_defaults(command="mount", run=_mount)

    umount_parser = commands.add_parser("umount", help="unmount (fusermount3 -u)")
    umount_parser.add_argument("mountpoint", metavar="MOUNTPOINT")
    umount_parser.set_defaults(command="umount", run=_umount)
    return parser


def _size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text, re.IGNORECASE)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 512M, 4G)")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).upper()])


# -- pack --------------------------------------------------------------------------------------


def _pack(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="cutfs: %(message)s")
    progress = None if args.quiet else _Progress()
    started = time.monotonic()
    try:
        report = pack(
            args.sources,
            args.output,
            jobs=max(args.jobs, 1),
            max_shard_bytes=args.shard_size,
            on_progress=progress.update if progress else None,
        )
    except CutfsError as exc:
        if progress:
            progress.finish()
        print(f"cutfs pack: error: {exc}", file=sys.stderr)
        return ExitCode.ERROR
    except KeyboardInterrupt:
        print("cutfs pack: interrupted; nothing was written", file=sys.stderr)
        return 130
    if progress:
        progress.finish()
    for recording_id, reason in report.transcoded.items():
        print(f"cutfs pack: {recording_id}: {reason}", file=sys.stderr)
    elapsed = time.monotonic() - started
    print(
        f"packed {report.recordings} recordings ({report.audio_seconds / 3600:.2f} h of audio, "
        f"{report.stored_bytes / 1e6:.1f} MB) and {report.cuts} cuts into {report.output_dir} "
        f"in {elapsed:.1f} s; {len(report.transcoded)} transcoded to FLAC"
    )
    return ExitCode.OK


class _Progress:
    """A progress line on stderr: redrawn on a terminal, every 10 s otherwise."""

    def __init__(self) -> None:
        self._tty = sys.stderr.isatty()
        self._started = time.monotonic()
        self._last = 0.0
        self._line = ""

    def update(self, done: int, total: int, stored_bytes: int) -> None:
        now = time.monotonic()
        interval = 0.2 if self._tty else 10.0
        if now - self._last < interval and done != total:
            return
        self._last = now
        elapsed = now - self._started
        self._line = (
            f"packing: {done}/{total} recordings, {stored_bytes / 1e6:.1f} MB, {elapsed:.0f} s"
        )
        if self._tty:
            print("\r" + self._line, end="", file=sys.stderr, flush=True)
        else:
            print(self._line, file=sys.stderr, flush=True)

    def finish(self) -> None:
        if self._tty and self._line:
            print(file=sys.stderr)


# -- mount -------------------------------------------------------------------------------------


def _mount(args: argparse.Namespace) -> int:
    if not args.foreground:
        return _mount_in_background(args)
    _configure_logging(args)
    options = MountOptions(
        cache_bytes=args.cache_size,
        workers=max(args.workers, 0),
        allow_other=args.allow_other,
        debug_fuse=False,
    )
    ready_fd: int | None = args.ready_fd

    def on_ready() -> None:
        if ready_fd is not None:
            os.write(ready_fd, b"ready\n")
            os.close(ready_fd)

    try:
        serve(args.shard_dir, args.mountpoint, options, on_ready)
    except MountError as exc:
        log.error("%s", exc)
        if ready_fd is not None:
            os.write(ready_fd, f"error {exc.exit_code} {exc}\n".encode())
        return exc.exit_code
    except Exception as exc:
        log.exception("the daemon failed")
        if ready_fd is not None:
            os.write(ready_fd, f"error {ExitCode.ERROR} {exc}\n".encode())
        return ExitCode.ERROR
    return ExitCode.OK


def _mount_in_background(args: argparse.Namespace) -> int:
    """Start the daemon detached and wait until it reports ready (or fails)."""
    read_end, write_end = os.pipe()
    command = [
        sys.executable,
        "-m",
        "vfs.cli",
        "mount",
        "--foreground",
        "--ready-fd",
        str(write_end),
        "--cache-size",
        str(args.cache_size),
        "--workers",
        str(args.workers),
        "--log-file",
        args.log_file or "syslog",
    ]
    if args.allow_other:
        command.append("--allow-other")
    if args.debug:
        command.append("--debug")
    command += [os.path.abspath(args.shard_dir), os.path.abspath(args.mountpoint)]
    daemon = subprocess.Popen(
        command,
        pass_fds=(write_end,),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd="/",
    )
    os.close(write_end)
    with os.fdopen(read_end, "rb") as ready:
        message = ready.read().decode(errors="replace").strip()
    if message == "ready":
        return ExitCode.OK
    status = daemon.wait()
    if message.startswith("error "):
        _, code, text = message.split(" ", 2)
        print(f"cutfs mount: {text}", file=sys.stderr)
        return int(code)
    print(
        f"cutfs mount: the daemon exited with status {status} before the mount was ready",
        file=sys.stderr,
    )
    return status or ExitCode.ERROR


def _configure_logging(args: argparse.Namespace) -> None:
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
    else:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("cutfs: %(levelname)s %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)


def _umount(args: argparse.Namespace) -> int:
    result = subprocess.run(["fusermount3", "-u", args.mountpoint], check=False)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
