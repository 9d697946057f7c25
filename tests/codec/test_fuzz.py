"""Hypothesis fuzzing of the read path: corrupt blobs, lying seek indexes and plans, and
byte ranges of virtual files against the fully materialised file."""

from __future__ import annotations

import dataclasses
import subprocess

import numpy as np
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.corpus import synthesize

from cutfs.codec.audio.decoder import decode_frames
from cutfs.codec.audio.recording import Recording
from cutfs.codec.audio.recording_indexer import index_recording
from cutfs.codec.audio.seek_index import SeekIndex
from cutfs.codec.catalogue.shard_set import ShardSet
from cutfs.codec.errors import CutfsError
from cutfs.codec.storage.blob import Blob
from cutfs.vfs.frames.block_cache import BlockCache
from cutfs.vfs.frames.decode_pool import DecodePool
from cutfs.vfs.frames.frame_source import FrameSource
from cutfs.vfs.tree.filesystem import Filesystem
from cutfs.vfs.tree.view import CUT_INODE_BASE, RECORDING_INODE_BASE

FORMATS = {
    "flac": ["-c:a", "flac"],
    "mp3": ["-c:a", "libmp3lame", "-b:a", "32k"],
    "ogg": ["-c:a", "libvorbis"],
    "opus": ["-c:a", "libopus", "-b:a", "24k"],
    "m4a": ["-c:a", "aac", "-aac_pns", "0"],
    "wav": ["-c:a", "pcm_s24le"],
}
FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[bytes, Recording]]:
    """Four-second recordings of each codec, indexed."""
    directory = tmp_path_factory.mktemp("fuzz")
    source = directory / "source.wav"
    synthesize(str(source), 4, 16000)
    indexed = {}
    for extension, arguments in FORMATS.items():
        path = directory / f"small.{extension}"
        subprocess.run(
            ["ffmpeg", "-v", "error", "-i", str(source), *arguments, str(path)], check=True
        )
        blob = path.read_bytes()
        result = index_recording(memoryview(blob), extension, str(directory))
        assert result.stored_path is None
        indexed[extension] = (blob, result.recording)
    return indexed


def _decode_or_fail_cleanly(blob: bytes, recording: Recording, first: int, end: int) -> None:
    try:
        frames = decode_frames(Blob.of(blob), recording, first, end)
    except CutfsError:
        return
    assert frames.shape == (end - first, recording.channels)
    assert frames.dtype == np.int16


@FUZZ
@given(st.sampled_from(sorted(FORMATS)), st.data())
def test_corrupt_blobs_fail_cleanly(
    small: dict[str, tuple[bytes, Recording]], extension: str, data: st.DataObject
) -> None:
    blob, recording = small[extension]
    corrupted = bytearray(blob)
    for _ in range(data.draw(st.integers(1, 20))):
        position = data.draw(st.integers(0, len(blob) - 1))
        corrupted[position] = data.draw(st.integers(0, 255))
    cut_at = data.draw(st.integers(0, len(blob)))
    if data.draw(st.booleans()):
        corrupted = corrupted[:cut_at]  # truncated
    first = data.draw(st.integers(0, recording.num_frames - 1))
    end = data.draw(st.integers(first, min(recording.num_frames, first + 40000)))
    _decode_or_fail_cleanly(bytes(corrupted), recording, first, end)


@FUZZ
@given(st.sampled_from(sorted(FORMATS)), st.data())
def test_lying_seek_indexes_and_plans_fail_cleanly(
    small: dict[str, tuple[bytes, Recording]], extension: str, data: st.DataObject
) -> None:
    blob, recording = small[extension]
    points = data.draw(
        st.lists(
            st.tuples(st.integers(-5000, 10**6), st.integers(0, 2 * len(blob))),
            min_size=1,
            max_size=8,
        )
    )
    samples = sorted(point[0] for point in points)
    offsets = sorted(point[1] for point in points)
    lying = dataclasses.replace(
        recording,
        seek_index=SeekIndex.from_points(samples, offsets),
        header_bytes=data.draw(st.integers(0, 2 * len(blob))),
        preroll_frames=data.draw(st.integers(0, 100000)),
        timeline_origin=data.draw(st.integers(-(10**6), 10**6)),
    )
    first = data.draw(st.integers(0, recording.num_frames - 1))
    end = data.draw(st.integers(first, min(recording.num_frames, first + 40000)))
    _decode_or_fail_cleanly(blob, lying, first, end)


class _Files:
    """A Filesystem over the packed test shards, with decoding in threads."""

    def __init__(self, shard_dir: str) -> None:
        self.shards = ShardSet(shard_dir)
        frames = FrameSource(self.shards, BlockCache(256 << 20), DecodePool(self.shards, 0))
        self.fs = Filesystem(self.shards, frames, "/mnt")
        self.whole: dict[int, bytes] = {}

    def materialised(self, inode: int) -> bytes:
        if inode not in self.whole:
            size = self.fs.listed_attributes(inode).size_bytes
            self.whole[inode] = trio.run(self.fs.read, inode, 0, size)
        return self.whole[inode]


@pytest.fixture(scope="module")
def files(shard_dir: str) -> _Files:
    return _Files(shard_dir)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.data())
def test_any_byte_range_equals_the_materialised_file(files: _Files, data: st.DataObject) -> None:
    if data.draw(st.booleans()):
        inode = CUT_INODE_BASE + data.draw(st.integers(0, files.shards.num_cuts - 1))
    else:
        inode = RECORDING_INODE_BASE + data.draw(st.integers(0, len(files.shards.recordings) - 1))
    whole = files.materialised(inode)
    offset = data.draw(
        st.one_of(st.integers(0, len(whole) + 100), st.integers(0, 100), st.just(2**62))
    )
    size = data.draw(st.one_of(st.integers(0, 300_000), st.sampled_from([1, 2, 3, 4095, 4096])))
    assert trio.run(files.fs.read, inode, offset, size) == whole[offset : offset + size]
