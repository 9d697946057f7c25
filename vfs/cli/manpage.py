"""cutfs(1), generated from the command line's own parser, so that it never drifts from it."""

from __future__ import annotations

import argparse
import datetime
from typing import Final

from cutfs import __version__

_FOOTER: Final = """.SH FILES
.TP
.B MOUNTPOINT/.cutfs/stats
the daemon's counters as JSON (\\fBcutfs stats\\fR prints them)
.TP
.B MOUNTPOINT/.cutfs/metrics
the same in Prometheus' text exposition format
.TP
.B /var/cache/cutfs/UID
indexes of sources served in place, per user a root daemon reads as
.SH EXIT STATUS
\\fBcutfs mount\\fR: 0 mounted; 1 unexpected failure; 2 bad command line; 3 the source is
missing, unreadable or inconsistent; 4 bad mountpoint; 5 FUSE is missing.
.SH SEE ALSO
.BR fusermount3 (1),
.BR mount.fuse3 (8),
.BR fstab (5);
the README, docs/operations.md (including the security model) and docs/design.md of cutfs.
"""


def render_manpage(
    parser: argparse.ArgumentParser, steps: dict[str, argparse.ArgumentParser] | None = None
) -> str:
    """The manual page, in roff, of ``parser`` and its subcommands; ``steps`` maps a
    subcommand to a parser of its own subcommands (``cutfs pack plan``, ...)."""
    lines = [
        f'.TH CUTFS 1 "{_release_date()}" "cutfs {__version__}" "User Commands"',
        ".SH NAME",
        f"cutfs \\- {_roff(parser.description or '')}",
        ".SH SYNOPSIS",
    ]
    subcommands = _subcommands(parser)
    for command, step_parser in (steps or {}).items():
        subcommands += [(f"{command} {name}", step) for name, step in _subcommands(step_parser)]
    for name, subparser in subcommands:
        lines += [".PP", f".B cutfs {name}", _roff(_usage_tail(subparser))]
    lines += [".SH OPTIONS", *_options(parser)]
    for name, subparser in subcommands:
        lines += [f".SH {name.upper()}", _roff(subparser.description or ""), *_options(subparser)]
    return "\n".join(lines) + "\n" + _FOOTER


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def _options(parser: argparse.ArgumentParser) -> list[str]:
    lines = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            names = ", ".join(f"\\fB{_roff(option)}\\fR" for option in action.option_strings)
            if action.nargs != 0:
                names += f" \\fI{_roff(str(action.metavar or action.dest.upper()))}\\fR"
        else:
            names = f"\\fI{_roff(str(action.metavar or action.dest))}\\fR"
        lines += [".TP", names, _roff(action.help or "")]
    return lines


def _usage_tail(parser: argparse.ArgumentParser) -> str:
    usage = parser.format_usage().replace("\n", " ").split(None, 1)[1]
    return " ".join(usage.split()[2:])  # without "usage:" and "cutfs <command>"


def _roff(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("-", "\\-")
    return "\n".join(
        ("\\&" + line) if line.startswith((".", "'")) else line for line in escaped.splitlines()
    )


def _release_date() -> str:
    """A fixed date per version, so that the generated page is reproducible."""
    return _RELEASE_DATES.get(__version__, datetime.date(2026, 12, 1).isoformat())


_RELEASE_DATES: Final = {"0.2.0": "2026-12-01"}
