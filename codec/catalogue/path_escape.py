"""Mapping ids to relative file paths, reversibly.

An id is used as its own path, plus ``.wav``, when it is safe: each of its
``/``-separated components is non-empty, not ``.`` or ``..``, free of NUL,
does not start with ``%``, and is short enough that the file name fits in 255
bytes.  Every other id is escaped as a whole:

1. percent-encode its UTF-8 bytes, keeping only ``A-Z a-z 0-9 - _ . ~``
   (so ``/`` becomes ``%2F`` and ``%`` becomes ``%25``);
2. split the result into pieces of at most 240 bytes;
3. prefix every piece with ``%`` and join them with ``/``.

An id whose path would clash with another's (the id ``a.wav/b`` needs a
directory where the id ``a`` has its file) is escaped as well.

Because safe ids never have a component starting with ``%``, a path whose
first component starts with ``%`` is always an escaped id:
``unescape_path`` reverses the rule by dropping the suffix, removing each
piece's leading ``%``, joining and percent-decoding.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import quote, unquote

SUFFIX: Final = ".wav"
_MAX_NAME_BYTES: Final = 255
_PIECE_BYTES: Final = 240
_ESCAPE: Final = "%"


def escape_id(identifier: str, *, force: bool = False) -> str:
    """The relative path (with ``.wav``) under which the id is served.

    ``force`` escapes even a safe id, to resolve a clash of paths.
    """
    if not force and _is_safe(identifier):
        return identifier + SUFFIX
    encoded = quote(identifier, safe="", errors="surrogateescape")
    pieces = [encoded[i : i + _PIECE_BYTES] for i in range(0, len(encoded), _PIECE_BYTES)] or [""]
    return "/".join(_ESCAPE + piece for piece in pieces) + SUFFIX


def unescape_path(path: str) -> str:
    """The id served at ``path``; the inverse of :func:`escape_id`."""
    if not path.endswith(SUFFIX):
        raise ValueError(f"not a served path: {path!r}")
    body = path[: -len(SUFFIX)]
    if not body.startswith(_ESCAPE):
        return body
    pieces = body.split("/")
    if not all(piece.startswith(_ESCAPE) for piece in pieces):
        raise ValueError(f"malformed escaped path: {path!r}")
    return unquote("".join(piece[1:] for piece in pieces), errors="surrogateescape")


#: Ids made of short components of ASCII letters, digits, "_", "-" and "." (not first):
#: safe by construction (non-empty, not "." or "..", no NUL or "%", under 255 bytes).  The
#: common case, checked in one regex call: a million ids build a tree in a second.
PLAIN_ID_PATTERN: Final = (
    r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,200}(?:/[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,200})*$"
)
_PLAIN_ID: Final = re.compile(PLAIN_ID_PATTERN)


def _is_safe(identifier: str) -> bool:
    if _PLAIN_ID.fullmatch(identifier):
        return True
    components = identifier.split("/")
    for position, component in enumerate(components):
        limit = _MAX_NAME_BYTES - (len(SUFFIX) if position == len(components) - 1 else 0)
        try:
            size = len(component.encode("utf-8"))
        except UnicodeEncodeError:
            return False
        if (
            component in ("", ".", "..")
            or "\0" in component
            or component.startswith(_ESCAPE)
            or size > limit
        ):
            return False
    return True
