"""JSON lines as other people write them: one bad line is one refused entry."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from typing import Any

from cutfs.codec.errors import SourceError
from cutfs.codec.sources.catalogue import Refusals


def json_lines(path: str, refusals: Refusals) -> Iterator[tuple[Any, str]]:
    """Each line's JSON value and where it is (``path:line``); blank lines are skipped.

    A line that is not UTF-8, or not JSON (nested past Python's recursion limit
    included), is refused as one entry (see :class:`Refusals`). A file that cannot
    be read to its end (missing, unreadable, a gzip cut short) raises
    :class:`SourceError`: that concerns the whole source.
    """
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as lines:
            for number, raw in enumerate(lines, start=1):
                if not raw.strip():
                    continue
                where = f"{path}:{number}"
                try:
                    value = json.loads(raw.decode("utf-8"))
                except (ValueError, RecursionError) as exc:  # UnicodeDecodeError included
                    refusals.refuse(SourceError(f"not a line of JSON: {exc}", where=where))
                    continue
                yield value, where
    except (OSError, EOFError, zlib.error) as exc:
        raise SourceError(f"cannot read the manifest: {exc}", where=path) from exc
