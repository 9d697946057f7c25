"""The columns every cuts table has, packed or in place: ids, recordings, channels, metadata."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from cutfs.codec.catalogue.mapped_table import (
    BinaryColumn,
    ListColumn,
    StringColumn,
    native_int_view,
    single_chunk,
)
from cutfs.codec.errors import ShardFormatError

#: Metadata fields whose presence the manifests ask about (``text``, speaker maps).
MENTIONED_FIELDS: Final = ("text", "speaker")


class CutTable:
    """Read access to the shared columns of a cuts table (``cut_id``, ``recording``,
    ``channels``, ``metadata``); the time columns differ and stay with their owner.

    Columns are read in place (see :mod:`cutfs.codec.catalogue.mapped_table`): no Python
    object is made per cut until that cut is asked for.
    """

    def __init__(self, table: pa.Table, mentions: Mapping[str, bool] | None = None) -> None:
        """``mentions`` says, per field of :data:`MENTIONED_FIELDS`, whether any cut's
        metadata has it, as recorded when the table was written; without it
        :meth:`metadata_mentions` scans the metadata column."""
        self.ids = StringColumn.of(table, "cut_id")
        #: Each cut's recording number, as stored (int32): a view, read per cut.
        self.recordings: npt.NDArray[Any] = native_int_view(table, "recording")
        self._channels = ListColumn.of(table, "channels")
        self._metadata_array = single_chunk(table, "metadata")
        self._metadata = BinaryColumn(self._metadata_array)
        self._mentions = dict(mentions or {})
        self._metadata_checked = False

    def __len__(self) -> int:
        return len(self.ids)

    def channels(self, index: int) -> tuple[int, ...]:
        """The recording channels a cut carries; empty for all of them."""
        return tuple(int(channel) for channel in self._channels[index])

    def metadata_json(self, index: int) -> str:
        return self._metadata[index].decode("utf-8", "surrogateescape")

    def metadata(self, index: int) -> dict[str, Any]:
        try:
            metadata = json.loads(self._metadata[index])
        except ValueError:
            return {}
        return metadata if isinstance(metadata, dict) else {}

    def metadata_mentions(self, field: str) -> bool:
        """Whether any cut's metadata JSON has the key ``field`` (recorded, or a vectorised
        scan of the column: no parsing)."""
        known = self._mentions.get(field)
        if known is not None:
            return known
        if not self._metadata_checked:
            # The column is mapped unvalidated: an Arrow kernel trusts its offsets, and
            # offsets pointing anywhere would fault the process. The scan reads every
            # value anyway; so does the check.
            try:
                self._metadata_array.validate(full=True)
            except pa.ArrowException as exc:
                raise ShardFormatError(f"the cuts' metadata column is invalid: {exc}") from exc
            self._metadata_checked = True
        pattern = json.dumps(field) + ":"
        return bool(pc.any(pc.match_substring(self._metadata_array, pattern)).as_py() or False)


def mentions_of(metadata: pa.Array | pa.ChunkedArray) -> dict[str, bool]:
    """Per field of :data:`MENTIONED_FIELDS`, whether the metadata JSON texts mention it."""
    found = {}
    for field in MENTIONED_FIELDS:
        pattern = json.dumps(field) + ":"
        found[field] = bool(pc.any(pc.match_substring(metadata, pattern)).as_py() or False)
    return found
