"""The columns every cuts table has, packed or in place: ids, recordings, channels, metadata."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from cutfs.codec.shard_format import int_column


class CutTable:
    """Read access to the shared columns of a cuts table (``cut_id``, ``recording``,
    ``channels``, ``metadata``); the time columns differ and stay with their owner."""

    def __init__(self, table: pa.Table) -> None:
        self.ids: list[str] = table.column("cut_id").to_pylist()
        self.recordings: npt.NDArray[np.int64] = int_column(table, "recording")
        channels = table.column("channels").combine_chunks()
        self._channel_offsets = np.asarray(channels.offsets, dtype=np.int64)
        self._channel_values = np.asarray(channels.flatten(), dtype=np.int64)
        self._metadata = table.column("metadata")

    def channels(self, index: int) -> tuple[int, ...]:
        """The recording channels a cut carries; empty for all of them."""
        start, end = self._channel_offsets[index], self._channel_offsets[index + 1]
        return tuple(int(channel) for channel in self._channel_values[start:end])

    def metadata_json(self, index: int) -> str:
        return str(self._metadata[index].as_py())

    def metadata(self, index: int) -> dict[str, Any]:
        metadata = json.loads(self.metadata_json(index))
        return metadata if isinstance(metadata, dict) else {}

    def metadata_mentions(self, text: str) -> bool:
        """Whether any cut's metadata JSON contains ``text`` (vectorised: no parsing)."""
        return bool(pc.any(pc.match_substring(self._metadata, text)).as_py())
