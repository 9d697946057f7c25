"""cutfs: cuts of long compressed recordings served as exact WAV files.

The package has two layers:

- :mod:`cutfs.codec`, a library with no FUSE dependency: sources, shards, seek
  indexes, decoding and the WAV layout;
- :mod:`cutfs.vfs`, the read-only FUSE filesystem and the ``cutfs`` command over it.

In the repository they are the top-level ``codec/`` and ``vfs/`` folders.

The API for notebooks, scripts and tests::

    import cutfs

    report = cutfs.pack(["data/kaldi"], "shards")          # like `cutfs pack`
    with cutfs.open("shards") as corpus:                    # read in-process, no mount
        samples, rate = corpus.read_cut(corpus.cut_ids[0])  # int16 (frames, channels)
    dataset = cutfs.CutDataset("shards")                   # for torch's DataLoader, no mount
    with cutfs.mounted("shards", cache_size="1G") as root:  # a real mount, always unmounted
        print(sorted(p.name for p in (root / "cuts").iterdir())[:3])
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

if TYPE_CHECKING:
    from cutfs.codec.corpus import Corpus
    from cutfs.codec.cut_dataset import CutDataset
    from cutfs.codec.packing.packer import PackReport
    from cutfs.vfs.cli.mounted import mounted

__all__ = ["CutDataset", "__version__", "mounted", "open", "pack"]


def __getattr__(name: str) -> Any:
    if name == "CutDataset":  # imported on first use: keeps `import cutfs` light
        from cutfs.codec.cut_dataset import CutDataset  # noqa: PLC0415

        return CutDataset
    if name == "mounted":
        from cutfs.vfs.cli.mounted import mounted  # noqa: PLC0415

        return mounted
    raise AttributeError(f"module 'cutfs' has no attribute {name!r}")


def pack(
    sources: list[str | os.PathLike[str]] | str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    jobs: int | None = None,
    shard_size_bytes: int | None = None,
) -> PackReport:
    """Pack sources (a directory, a WebDataset tar, or Lhotse manifest files) into a new
    shard directory ``output``, as ``cutfs pack`` does; returns what was written.

    ``jobs`` defaults to one process per core.  Raises
    :class:`cutfs.codec.errors.CutfsError` for bad input; ``output`` is then untouched.
    """
    from cutfs.codec.catalogue.shard_writer import DEFAULT_SHARD_BYTES  # noqa: PLC0415
    from cutfs.codec.packing.packer import pack as pack_sources  # noqa: PLC0415 - keep import light

    paths = [sources] if isinstance(sources, str | os.PathLike) else list(sources)
    return pack_sources(
        [os.fspath(path) for path in paths],
        os.fspath(output),
        jobs=jobs or os.cpu_count() or 1,
        max_shard_bytes=shard_size_bytes or DEFAULT_SHARD_BYTES,
    )


def open(source: str | os.PathLike[str], cache_dir: str | None = None) -> Corpus:
    """Cuts and recordings of a shard directory or of any source, read in this process
    (see :class:`cutfs.codec.corpus.Corpus`)."""
    from cutfs.codec.corpus import Corpus  # noqa: PLC0415

    return Corpus(source, cache_dir)
