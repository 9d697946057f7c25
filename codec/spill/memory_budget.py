"""How much memory a pack may use, and how much of it goes to buffered rows.

``cutfs pack --memory`` sets one budget for the whole pack (default 2 GiB).  Part of
it is spent whatever the input: the interpreter and its libraries, a batch in flight,
the audio a recording's indexing decodes.  What is left buffers rows: the sorts'
runs and merges (:mod:`cutfs.codec.spill.external_sort`).
"""

from __future__ import annotations

from typing import Final

DEFAULT_MEMORY_BYTES: Final = 2 << 30
#: What a pack's process holds besides its buffered rows (measured: the interpreter with
#: pyarrow, numpy and PyAV is about 150 MB; a batch of rows in flight and the tree's
#: working arrays a few hundred more).
FIXED_BYTES: Final = 640 << 20
#: The least a budget may leave to buffered rows (a smaller one still works, in more runs).
LEAST_BUFFER_BYTES: Final = 256 << 10


def buffer_bytes(memory_bytes: int) -> int:
    """The part of a budget of ``memory_bytes`` left to buffered rows."""
    return max(memory_bytes - FIXED_BYTES, LEAST_BUFFER_BYTES)
