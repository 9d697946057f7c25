"""Cuts as a map-style dataset for PyTorch's DataLoader, read in the loader's workers.

:class:`CutDataset` reads cuts through :class:`cutfs.codec.corpus.Corpus` in the
process that asks for them: no FUSE mount, so a DataLoader's workers decode in
parallel with no daemon in between.  It holds only the source's name until
first used; each process (a DataLoader worker after its fork or spawn) opens
the source itself on its first item, so the dataset pickles cheaply.  torch is
not imported: a DataLoader needs nothing but ``__len__`` and ``__getitem__``.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import numpy.typing as npt

from cutfs.codec.corpus import Corpus


class CutDataset:
    """Item ``i`` is cut ``i`` of the source: ``(samples, sample_rate, cut_id)``.

    ``samples`` is float32 in [-1, 1) of shape (channels, frames) by default (what
    torchaudio and most models take), or the exact int16 frames, shape (frames,
    channels), with ``dtype="int16"``.  Cut ``i`` is ``Corpus.cut_ids[i]``.
    """

    def __init__(
        self, source: str | os.PathLike[str], cache_dir: str | None = None, dtype: str = "float32"
    ) -> None:
        if dtype not in ("float32", "int16"):
            raise ValueError("dtype must be 'float32' or 'int16'")
        self._source = os.fspath(source)
        self._cache_dir = cache_dir
        self._dtype = dtype
        self._corpus: Corpus | None = None
        self._opened_by = -1
        with Corpus(self._source, cache_dir) as corpus:  # bad sources fail here, at once
            self._length = corpus.num_cuts

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> tuple[npt.NDArray[Any], int, str]:
        if not -self._length <= index < self._length:
            raise IndexError(f"cut {index} of {self._length}")
        corpus = self._opened()
        number = index % self._length
        samples, rate = corpus.read_cut_at(number)
        cut_id = corpus.cut_ids[number]
        if self._dtype == "int16":
            return samples, rate, cut_id
        return _float_channels(samples), rate, cut_id

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_corpus"] = None  # each process opens its own
        return state

    def close(self) -> None:
        if self._corpus is not None:
            self._corpus.close()
            self._corpus = None

    def _opened(self) -> Corpus:
        """This process's corpus (opened again after a fork: maps and connections do not
        cross one)."""
        if self._corpus is None or self._opened_by != os.getpid():
            self._corpus = Corpus(self._source, self._cache_dir)
            self._opened_by = os.getpid()
        return self._corpus


def _float_channels(samples: npt.NDArray[np.int16]) -> npt.NDArray[np.float32]:
    """Frames (frames, channels) of int16 as float32 in [-1, 1) of shape (channels, frames):
    one pass into a new array (scaling by a power of two is exact)."""
    result = np.empty(samples.shape[::-1], dtype=np.float32)
    np.multiply(samples.T, np.float32(1 / 32768), out=result)
    return result
