"""Lines of text files as other people write them: bounded, and one bad line is one
refused entry.

:func:`bounded_lines` reads any text file of a source (JSON lines, possibly gzipped; Kaldi
tables) a line at a time within :class:`cutfs.codec.trust.limits.InputLimits`: a line
longer than ``line_bytes`` is refused and skipped without being held (a 1 MB gzip can hold
a line of a gigabyte), a file that decompresses to more than ``file_bytes`` or a source of
more than ``entries`` lines is refused whole.  :func:`json_lines` parses each line.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from typing import Any, Final

from cutfs.codec.errors import SourceError
from cutfs.codec.sources.catalogue import Refusals

#: What a line too long is skipped by, a piece at a time.
_SKIP_BYTES: Final = 1 << 20


def json_lines(path: str, refusals: Refusals) -> Iterator[tuple[Any, str]]:
    """Each line's JSON value and where it is (``path:line``); blank lines are skipped.

    A line that is not UTF-8, or not JSON (nested past Python's recursion limit
    included), or too long, is refused as one entry (see :class:`Refusals`). A file that
    cannot be read to its end (missing, unreadable, a gzip cut short) or that is past the
    limits raises :class:`SourceError`: that concerns the whole source.
    """
    for raw, where in bounded_lines(path, refusals, "the manifest"):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # UnicodeDecodeError included
            refusals.refuse(SourceError(f"not a line of JSON: {exc}", where=where))
            continue
        yield value, where


def bounded_lines(path: str, refusals: Refusals, what: str = "") -> Iterator[tuple[bytes, str]]:
    """Each line of ``path`` (gunzipped if it ends in ``.gz``) and where it is; a line past
    the limit is refused and skipped.  Raises :class:`SourceError` for a file that cannot be
    read to its end (``what`` names it in the message) or is past the limits."""
    limits = refusals.limits
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as lines:
            number = 0
            while raw := lines.readline(limits.line_bytes + 1):
                number += 1
                where = f"{path}:{number}"
                refusals.count_line(where)
                if lines.tell() > limits.file_bytes:
                    raise SourceError(
                        f"larger than {limits.file_bytes} bytes (decompressed): refused",
                        where=path,
                    )
                if len(raw) > limits.line_bytes:
                    _skip_line(lines, raw)
                    refusals.refuse(
                        SourceError(f"a line longer than {limits.line_bytes} bytes", where=where)
                    )
                    continue
                yield raw, where
    except (OSError, EOFError, zlib.error) as exc:
        raise SourceError(f"cannot read{' ' + what if what else ''}: {exc}", where=path) from exc


def _skip_line(lines: Any, start: bytes) -> None:
    """Read on to the end of a line whose start was too long, a piece at a time."""
    piece = start
    while piece and not piece.endswith(b"\n"):
        piece = lines.readline(_SKIP_BYTES)
