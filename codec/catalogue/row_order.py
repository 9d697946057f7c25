"""Whether rows are already in the order a table must be written in.

The catalogue writers sort their rows once (:func:`pyarrow.compute.sort_indices`
and a ``take``: two more copies of the table at the peak).  Ids are very often
generated in order (``spk/utt0000001``), and then the rows come out of the
writers already sorted: checking that costs a comparison of each row with the
next, in bit-packed booleans, and spares both copies (at 100 million cuts,
gigabytes).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

_CHUNK = 1 << 22


def rows_in_order(names: pa.Array, groups: npt.NDArray[np.integer] | None = None) -> bool:
    """Whether rows sorted by (``groups``, ``names``) are in their current order: each
    row's group at most the next's, and within a group each name (compared as bytes) at
    most the next."""
    count = len(names)
    if count < 2:
        return True
    if groups is not None and bool(np.any(groups[1:] < groups[:-1])):
        return False
    names = names.cast(pa.large_binary())
    for start in range(0, count - 1, _CHUNK):
        stop = min(start + _CHUNK, count - 1)
        here = names.slice(start, stop - start)
        following = names.slice(start + 1, stop - start)
        ordered = pc.less_equal(here, following)
        if groups is not None:
            ordered = pc.or_(ordered, pa.array(groups[start + 1 : stop + 1] != groups[start:stop]))
        if not pc.all(ordered).as_py():
            return False
    return True
