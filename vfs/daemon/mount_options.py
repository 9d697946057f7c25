"""The options of a mount, each declared once: its field, default, flag, ``-o`` key and help.

:class:`MountOptions` is what the daemon runs with; :class:`DaemonOptions` is how the daemon
process itself runs (foreground, log, debug).  Every field that a user sets is declared
with :func:`option`, which records on the field how the command line spells it; the
parser, the ``-o`` keys and their help, the man page, the README's table and the keywords
of ``cutfs.mounted`` are all made from these declarations (see
:mod:`cutfs.vfs.cli.mount_arguments`).  Adding an option is one field here plus the code
that uses it.

A default is written once, on the field.  Where the best default depends on the machine or
on another option (``workers``, ``serving_processes``), the field holds ``None`` and a
property resolves it; its help says what ``None`` becomes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import Field, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Final

from cutfs.codec.storage.cache_usage import DEFAULT_DISK_BYTES
from cutfs.codec.trust.clean_start import absolute
from cutfs.codec.trust.command_runner import CommandLimits
from cutfs.codec.trust.limits import MAX_SAMPLE_RATE_HZ, InputLimits
from cutfs.codec.trust.source_policy import DEFAULT_CACHE_QUOTA_BYTES
from cutfs.vfs.daemon.request_slot import DEFAULT_READ_TIMEOUT_SECONDS

if TYPE_CHECKING:  # what the options make is imported where it is made (numpy, av, pyfuse3)
    from cutfs.codec.audio.output_format import OutputFormat
    from cutfs.vfs.fuse.operations import Ownership
    from cutfs.vfs.tree.windows_view import Windows

#: How many processes decode in turn by default at most (one per core below that): each
#: holds its own decoders and share of the block cache (about 65 MB besides the cache,
#: measured), so a big shared node is not filled with them unasked.
DEFAULT_PROCESSES_IN_TURN: Final = 8
#: Decoder workers (with ``--no-decode-in-turn``), unless told: one per core, at most 4.
DEFAULT_WORKERS: Final = min(os.cpu_count() or 1, 4)
_SIZE_UNITS: Final = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _cells(text: str) -> int:
    cells = int(text)
    if not 0 <= cells <= 64:
        raise ValueError(f"{cells} cells: 0 to 64")
    return cells


def parse_size(text: str) -> int:
    """``512M``, ``4G``, ``1.5T``, ``100`` (bytes): a number of bytes; ValueError else."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text, re.IGNORECASE)
    if match is None:
        raise ValueError(f"not a size: {text!r} (e.g. 512M, 4G)")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).upper()])


def format_size(size_bytes: int) -> str:
    """A size as :func:`parse_size` reads it back, in the largest unit that divides it."""
    for unit in ("T", "G", "M", "K"):
        if size_bytes and size_bytes % _SIZE_UNITS[unit] == 0:
            return f"{size_bytes // _SIZE_UNITS[unit]}{unit}"
    return str(size_bytes)


def parse_octal(text: str) -> int:
    """A permission mode in octal (``0444``); ValueError else."""
    try:
        value = int(text, 8)
    except ValueError:
        raise ValueError(f"not an octal mode: {text!r}") from None
    if not 0 <= value <= 0o7777:
        raise ValueError(f"mode out of range: {text!r}")
    return value


def parse_path(text: str) -> str:
    """A path, made absolute against the directory the command was run from."""
    return absolute(text)


@dataclass(frozen=True)
class Option:
    """How the command line spells one field: recorded on the field by :func:`option`."""

    #: The long flag, ``--cache-size``; its ``-o`` key is the same without dashes, with
    #: underscores (``cache_size``).
    flag: str
    help: str
    #: Reads a value from text (raises ValueError); ``None`` for a switch, which takes none.
    parse: Callable[[str], Any] | None = None
    metavar: str | None = None
    #: What the default is, in words, when the value alone does not say it (``None``).
    default_text: str | None = None
    #: A switch that also has ``--no-...`` (and ``-o no_...``).
    negatable: bool = False
    #: May be given several times; the field is a tuple of the values.
    repeated: bool = False
    short: str | None = None
    #: How the default is shown (sizes as ``512M``, modes in octal).
    show: Callable[[Any], str] = str

    @property
    def key(self) -> str:
        """The ``-o`` key, and the keyword of ``cutfs.mounted``."""
        return self.flag.removeprefix("--").replace("-", "_")

    def describe_default(self, default: Any) -> str | None:
        """The default as the help shows it, or None when there is nothing to show."""
        if self.default_text is not None:
            return self.default_text
        if default is None or default is False or default == ():
            return None
        return self.show(default)


def option(
    default: Any,
    flag: str,
    help: str,
    *,
    parse: Callable[[str], Any] | None = None,
    metavar: str | None = None,
    default_text: str | None = None,
    negatable: bool = False,
    repeated: bool = False,
    short: str | None = None,
    show: Callable[[Any], str] = str,
) -> Any:
    """A dataclass field that the command line sets (see :class:`Option`)."""
    spelling = Option(flag, help, parse, metavar, default_text, negatable, repeated, short, show)
    return field(default=default, metadata={"option": spelling})


def options_of(cls: type[Any]) -> Iterator[tuple[Field[Any], Option]]:
    """The fields of a dataclass that the command line sets, with their spelling."""
    for declared in fields(cls):
        spelling = declared.metadata.get("option")
        if isinstance(spelling, Option):
            yield declared, spelling


@dataclass(frozen=True)
class DaemonOptions:
    """How the daemon process runs (not what it serves)."""

    foreground: bool = option(
        False, "--foreground", "stay in the foreground, logging to stderr", short="-f"
    )
    log_file: str | None = option(
        None,
        "--log-file",
        "log here, or 'syslog'",
        parse=lambda text: text if text == "syslog" else parse_path(text),
        metavar="PATH",
        default_text="stderr in the foreground, else syslog",
    )
    debug: bool = option(False, "--debug", "log at debug level")


@dataclass(frozen=True)
class MountOptions:
    """What a mount serves and how (see the module docstring for how each is set)."""

    cache_bytes: int = option(
        512 << 20,
        "--cache-size",
        "decoded-audio cache (LRU), e.g. 2G",
        parse=parse_size,
        metavar="BYTES",
        show=format_size,
    )
    cache_dir: str | None = option(
        None,
        "--cache-dir",
        "where indexes of sources served in place are kept, so that the next mount starts at once",
        parse=parse_path,
        metavar="DIR",
        default_text="$CUTFS_CACHE_DIR, else /var/cache/cutfs for root, ~/.cache/cutfs for others",
    )
    disk_cache_bytes: int = option(
        DEFAULT_DISK_BYTES,
        "--disk-cache-size",
        "for shards in object storage, and objects that a source's recordings name: the "
        "most fetched pieces kept on disk below --cache-dir, shared by the mount's "
        "processes and later mounts",
        parse=parse_size,
        metavar="BYTES",
        show=format_size,
    )
    sample_rate: int | None = option(
        None,
        "--sample-rate",
        "serve every file at this rate: the whole recording resampled (the filter of scipy's "
        "resample_poly), cut where the file starts; sizes stay exact",
        parse=int,
        metavar="HZ",
    )
    mono: bool = option(False, "--mono", "serve every file as the mean of its channels")
    float32: bool = option(False, "--float32", "serve 32-bit float WAV instead of 16-bit PCM")
    window_seconds: float | None = option(
        None,
        "--window",
        "add windows/<recording>/<start>-<end>.wav: every recording in windows of this length "
        "(the last one ends with the recording); no audio is written",
        parse=float,
        metavar="SECONDS",
    )
    overlap_seconds: float = option(
        0.0,
        "--overlap",
        "how much consecutive windows overlap",
        parse=float,
        metavar="SECONDS",
        default_text="0",
    )
    serving_processes: int | None = option(
        None,
        "--serving-processes",
        "processes answering the mount's requests, which decode what they serve, one "
        "request at a time; the daemon besides them (the supervisor, which alone keeps "
        "root) keeps the read timeout and replaces a process that crashes or stops; with "
        "--no-decode-in-turn, event loops that hand decoding to the workers (workers and "
        "cache size are split among them)",
        parse=int,
        metavar="N",
        default_text=f"the cores the daemon may use, at most {DEFAULT_PROCESSES_IN_TURN}; "
        "1 with --no-decode-in-turn",
    )
    decode_in_turn: bool = option(
        True,
        "--decode-in-turn",
        "serving processes decode what they serve themselves (the fewest hand-offs per cold "
        "cut); --no-decode-in-turn hands every decode to --workers decoder processes "
        "instead, so one event loop keeps answering lookups and cached reads while they "
        "decode",
        negatable=True,
        default_text="on",
    )
    workers: int = option(
        DEFAULT_WORKERS,
        "--workers",
        "with --no-decode-in-turn, the decoder processes; 0 decodes in threads (no crash "
        "isolation)",
        parse=int,
        metavar="N",
        default_text="cores, at most 4",
    )
    read_ahead_cells: int = option(
        4,
        "--read-ahead-cells",
        "with --decode-in-turn, how many 4 MiB cells of a long file read in order (a whole "
        "recording) the idle serving processes decode ahead of its reader, in parallel; 0 "
        "turns this off",
        parse=_cells,
        metavar="N",
    )
    read_timeout_seconds: float = option(
        DEFAULT_READ_TIMEOUT_SECONDS,
        "--read-timeout",
        "fail a read with EIO when its data takes longer than this, instead of hanging on "
        "stalled storage",
        parse=float,
        metavar="SECONDS",
        show=lambda seconds: f"{seconds:g}",
    )
    allow_other: bool = option(
        False,
        "--allow-other",
        "let other users read the mount (permissions are still checked; needs "
        "user_allow_other in /etc/fuse.conf when not root)",
    )
    user: str | None = option(
        None,
        "--user",
        "started as root, read the source as this user",
        parse=str,
        metavar="USER",
        default_text="the owner of SOURCE; root only when SOURCE belongs to root",
    )
    allowed_roots: tuple[str, ...] = option(
        (),
        "--allow-root",
        "let a source served in place read audio files under DIR too (by default only files "
        "beneath the source itself); may be repeated",
        parse=parse_path,
        metavar="DIR",
        repeated=True,
    )
    allowed_objects: tuple[str, ...] = option(
        (),
        "--allow-objects",
        "let a source served in place fetch the objects its manifests name (Lhotse url "
        "sources) beneath PREFIX, e.g. s3://corpus/audio/, with the daemon's credentials; "
        "each is fetched whole into the index cache on first use (none by default); may be "
        "repeated",
        parse=str,
        metavar="PREFIX",
        repeated=True,
    )
    allow_commands: bool = option(
        False,
        "--allow-commands",
        "run the shell commands of a source served in place (Kaldi 'cmd |' lines, Lhotse "
        "command sources): off by default; even then only from files that belong to the "
        "user the daemon reads as (never root) and that no one else can write",
    )
    command_timeout_seconds: float = option(
        CommandLimits().timeout_seconds,
        "--command-timeout",
        "with --allow-commands, kill a command (its whole process group) that runs longer "
        f"than this; its output is also capped at {CommandLimits().max_output_bytes >> 30} GiB",
        parse=float,
        metavar="SECONDS",
        show=lambda seconds: f"{seconds:g}",
    )
    cache_quota_bytes: int = option(
        DEFAULT_CACHE_QUOTA_BYTES,
        "--index-cache-size",
        "the most audio a source served in place may make the index cache hold (command "
        "output, Parquet rows, recordings transcoded to FLAC), e.g. 20G; past it those "
        "recordings fail with EIO and a log line",
        parse=parse_size,
        metavar="BYTES",
        show=format_size,
    )
    max_line_bytes: int = option(
        InputLimits().line_bytes,
        "--max-line-size",
        "the longest line of a source's manifests and tables served in place (a longer "
        "line is one refused entry, never held in memory)",
        parse=parse_size,
        metavar="BYTES",
        show=format_size,
    )
    max_file_bytes: int = option(
        InputLimits().file_bytes,
        "--max-manifest-size",
        "the most one manifest or table of a source served in place may decompress to "
        "(past it the source is refused)",
        parse=parse_size,
        metavar="BYTES",
        show=format_size,
    )
    max_entries: int = option(
        InputLimits().entries,
        "--max-entries",
        "the most lines of all the manifests and tables of a source served in place (past "
        "it the source is refused)",
        parse=int,
        metavar="N",
    )
    uid: int | None = option(
        None,
        "--uid",
        "owner shown for every file",
        parse=int,
        metavar="UID",
        default_text="the daemon's",
    )
    gid: int | None = option(
        None,
        "--gid",
        "group shown for every file",
        parse=int,
        metavar="GID",
        default_text="the daemon's",
    )
    file_mode: int = option(
        0o444,
        "--file-mode",
        "permission bits of files",
        parse=parse_octal,
        metavar="MODE",
        show=lambda mode: f"{mode:04o}",
    )
    dir_mode: int = option(
        0o555,
        "--dir-mode",
        "permission bits of directories",
        parse=parse_octal,
        metavar="MODE",
        show=lambda mode: f"{mode:04o}",
    )
    direct_io: bool = option(
        False,
        "--direct-io",
        "bypass the kernel page cache for WAV files (every read reaches the daemon; for "
        "benchmarks, slower when warm)",
    )
    read_ahead_kb: int | None = option(
        None,
        "--read-ahead-kb",
        "set the mount's read-ahead through sysfs after mounting (root only; 0 turns "
        "read-ahead off)",
        parse=int,
        metavar="KIB",
        default_text="1024 as root, so that a 10 s cut is one read request",
    )
    max_background: int | None = option(
        None,
        "--max-background",
        "set the kernel's background FUSE requests through sysfs (root, fusectl mounted)",
        parse=int,
        metavar="N",
    )
    profile: bool = option(
        False,
        "--profile",
        "time every phase of the read path (shard slice, open and seek, decode, convert, "
        "cached or decoded) into .cutfs/stats",
    )
    #: Access, modification and change time of every node, in ns since the epoch: decided
    #: once by the daemon for all its serving processes (not an option).
    time_ns: int | None = None

    @property
    def processes(self) -> int:
        """:attr:`serving_processes`, or its default where it is ``None``."""
        if self.serving_processes is not None:
            return self.serving_processes
        if self.decode_in_turn:
            return min(len(os.sched_getaffinity(0)), DEFAULT_PROCESSES_IN_TURN)
        return 1

    @property
    def reads_ahead(self) -> bool:
        """Whether the serving processes decode cells ahead of readers going through long
        files (see :mod:`cutfs.vfs.fuse.read_ahead`): when they decode in turn (each takes
        jobs between requests) and pages are pushed (not with ``--direct-io``)."""
        return self.decode_in_turn and self.read_ahead_cells > 0 and not self.direct_io

    @property
    def ownership(self) -> Ownership:
        from cutfs.vfs.fuse.operations import Ownership  # noqa: PLC0415 - see the imports

        return Ownership(self.uid, self.gid, self.file_mode, self.dir_mode, self.time_ns)

    @property
    def output_format(self) -> OutputFormat:
        """Sample rate, mono and sample format of every WAV file; ValueError if invalid."""
        from cutfs.codec.audio.output_format import OutputFormat  # noqa: PLC0415

        return OutputFormat(self.sample_rate, self.mono, self.float32)

    @property
    def windows(self) -> Windows | None:
        """``windows/`` of every recording (None: no such directory); ValueError if invalid."""
        if self.window_seconds is None:
            return None
        from cutfs.vfs.tree.windows_view import Windows  # noqa: PLC0415 - see the imports

        return Windows(self.window_seconds, self.overlap_seconds)

    def check(self) -> None:
        """Raise ValueError for values no mount can serve with, as the daemon would when
        it makes what they describe (:attr:`output_format`, :attr:`windows`,
        :attr:`input_limits`), without importing what those need: the command checks
        them before it starts a daemon."""
        if self.sample_rate is not None and not 0 < self.sample_rate <= MAX_SAMPLE_RATE_HZ:
            raise ValueError(f"the sample rate must lie in [1, {MAX_SAMPLE_RATE_HZ}] Hz")
        if self.window_seconds is not None and not 0 <= self.overlap_seconds < self.window_seconds:
            raise ValueError("windows need 0 <= overlap < length")
        _ = self.input_limits

    @property
    def input_limits(self) -> InputLimits:
        """How much a source's text files may make the daemon read; ValueError if invalid."""
        return InputLimits(self.max_line_bytes, self.max_file_bytes, self.max_entries)

    @property
    def command_limits(self) -> CommandLimits:
        return CommandLimits(timeout_seconds=self.command_timeout_seconds)
