"""The pyfuse3 Operations and the Filesystem behind them, called directly without a mount."""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pyfuse3
import pytest
import trio
import trio.testing
from support.references import Reference
from support.shards import copy_and_damage

from cutfs.codec.catalogue.shard_format import CUTS_FILE
from cutfs.codec.catalogue.shard_set import ShardSet
from cutfs.codec.catalogue.shard_writer import write_cut_catalogue
from cutfs.codec.packing.packer import pack
from cutfs.vfs.frames import frame_source
from cutfs.vfs.frames.block_cache import BlockCache
from cutfs.vfs.frames.decode_pool import DecodePool
from cutfs.vfs.frames.frame_source import FrameSource
from cutfs.vfs.fuse.operations import Operations
from cutfs.vfs.stats.statistics import Statistics
from cutfs.vfs.tree.filesystem import Filesystem
from cutfs.vfs.tree.view import ROOT_INODE

#: What pyfuse3 passes with a request: who asked (root here).
CONTEXT = SimpleNamespace(uid=0, gid=0, pid=0, umask=0o022)


class Mount:
    """The objects a mount assembles, minus the kernel; decoding runs in threads."""

    def __init__(self, shard_dir: str, cache_bytes: int = 64 << 20) -> None:
        self.shards = ShardSet(shard_dir)
        self.decodes: list[tuple[int, int, int]] = []
        #: The frames each decode asked the store to fetch ahead, in order.
        self.aheads: list[int] = []
        self.gate: threading.Event | None = None
        original: Callable[..., Any] = self.shards.read_frames

        def counted_read_frames(
            index: int, first: int, end: int, trace: Any = None, **options: int
        ) -> Any:
            self.decodes.append((index, first, end))
            self.aheads.append(options.get("ahead_frames", 0))
            if self.gate is not None:
                self.gate.wait(10)
            return original(index, first, end, trace, **options)

        self.shards.read_frames = counted_read_frames  # type: ignore[method-assign]
        self.cache = BlockCache(cache_bytes)
        frames = FrameSource(self.shards, self.cache, DecodePool(self.shards, 0))
        self.fs = Filesystem(self.shards, frames, "/mnt/cutfs")
        self.ops = Operations(self.fs)

    async def inode(self, path: str) -> int:
        inode = ROOT_INODE
        for name in path.split("/"):
            inode = (await self.ops.lookup(inode, name.encode(), CONTEXT)).st_ino
        return inode

    async def read_all(self, path: str) -> bytes:
        inode = await self.inode(path)
        size = (await self.ops.getattr(inode, None)).st_size
        return await self.read(inode, 0, size + 100)  # the kernel opens without asking

    async def read(self, inode: int, offset: int, size: int) -> bytes:
        """What the device channel would write out for a READ."""
        return b"".join(await self.ops.read(inode, offset, size))


@pytest.fixture()
def mount(shard_dir: str) -> Mount:
    return Mount(shard_dir)


def test_sizes_are_known_without_decoding(mount: Mount, references: dict[str, Reference]) -> None:
    async def scenario() -> None:
        for name, reference in references.items():
            recording = name.rsplit(".", 1)[0]
            inode = await mount.inode(f"recordings/{recording}.wav")
            attributes = await mount.ops.getattr(inode, None)
            assert attributes.st_size == 44 + reference.samples.size * 2
            cut = await mount.inode(f"cuts/{recording}/overlap-a.wav")
            assert (await mount.ops.getattr(cut, None)).st_size == 44 + 10 * reference.rate * 2

    trio.run(scenario)
    assert mount.decodes == []


def test_reads_are_exact_at_any_offset(mount: Mount, references: dict[str, Reference]) -> None:
    reference = references["opus_stereo_48k.opus"]

    async def scenario() -> None:
        inode = await mount.inode("recordings/opus_stereo_48k.wav")
        whole = await mount.read_all("recordings/opus_stereo_48k.wav")
        for offset, size in [
            (0, 1),
            (43, 2),
            (44, 3),
            (45, 4),
            (1001, 77777),
            (len(whole) - 3, 10),
        ]:
            assert await mount.read(inode, offset, size) == whole[offset : offset + size]
        assert await mount.read(inode, len(whole), 4096) == b""
        assert await mount.read(inode, 1 << 62, 4096) == b""
        with pytest.raises(pyfuse3.FUSEError) as raised:
            await mount.ops.read(inode, -1, 10)
        assert raised.value.errno == errno.EINVAL
        samples = np.frombuffer(whole[44:], dtype="<i2").reshape(-1, 2)
        reference.assert_matches(samples, 0)

    trio.run(scenario)


def test_errors_become_errno_values(mount: Mount) -> None:
    async def scenario() -> None:
        with pytest.raises(pyfuse3.FUSEError) as raised:
            await mount.ops.lookup(ROOT_INODE, b"missing", CONTEXT)
        assert raised.value.errno == errno.ENOENT
        cut = await mount.inode("cuts/flac_mono_16k/start.wav")
        with pytest.raises(pyfuse3.FUSEError) as raised:
            await mount.ops.lookup(cut, b"x", CONTEXT)
        assert raised.value.errno == errno.ENOTDIR
        with pytest.raises(pyfuse3.FUSEError) as raised:
            await mount.ops.open(cut, 0, None)  # the kernel then opens files without asking
        assert raised.value.errno == errno.ENOSYS
        # Opens are answered only with direct_io, which the kernel learns per open.
        direct = Operations(mount.fs, direct_io=True)
        info = await direct.open(cut, 0, None)
        assert (info.fh, info.direct_io) == (cut, True)
        with pytest.raises(pyfuse3.FUSEError) as raised:
            await direct.open(cut, 0o1, None)  # O_WRONLY
        assert raised.value.errno == errno.EROFS
        with pytest.raises(pyfuse3.FUSEError) as raised:
            await direct.open(await mount.inode("cuts"), 0, None)
        assert raised.value.errno == errno.EISDIR
        with pytest.raises(pyfuse3.FUSEError) as raised:
            await mount.ops.getattr((1 << 40) + 10**9, None)
        assert raised.value.errno == errno.ENOENT

    trio.run(scenario)


def test_overlapping_cuts_share_decoded_blocks(mount: Mount) -> None:
    async def scenario() -> None:
        await mount.read_all("cuts/mp3_cbr_mono_16k/overlap-a.wav")  # 5 s to 15 s
        decodes_before = len(mount.decodes)
        await mount.read_all("cuts/mp3_cbr_mono_16k/overlap-b.wav")  # 10.0123 s to 20.0123 s
        decoded = mount.decodes[decodes_before:]
        # Only the frames after 15 s were decoded, from 15 s exactly.
        assert [(first, end) for _, first, end in decoded] == [(15 * 16000, 320197)]
        await mount.read_all("cuts/mp3_cbr_mono_16k/overlap-a.wav")
        assert len(mount.decodes) == decodes_before + 1  # all of it cached
        assert mount.cache.statistics().hits == 1

    trio.run(scenario)


def test_a_cache_smaller_than_the_readahead_still_keeps_what_was_decoded(
    shard_dir: str, references: dict[str, Reference]
) -> None:
    """A whole recording read in order in 64 KiB pieces through a 256 KiB cache: decodes
    are cut to a quarter of the cache, so each is kept, and the recording is decoded about
    once (a decode the cache could not hold would be decoded again by every read)."""
    mount = Mount(shard_dir, cache_bytes=256 << 10)

    async def scenario() -> bytes:
        inode = await mount.inode("recordings/flac_mono_16k.wav")
        size = (await mount.ops.getattr(inode, None)).st_size
        parts = [await mount.read(inode, offset, 1 << 16) for offset in range(0, size, 1 << 16)]
        return b"".join(parts)

    data = trio.run(scenario)
    samples = np.frombuffer(data[44:], dtype="<i2")
    assert np.array_equal(samples, references["flac_mono_16k.flac"].samples.reshape(-1))
    decoded = sum(end - first for _, first, end in mount.decodes)
    assert decoded <= 1.1 * len(samples), (decoded, len(samples))
    assert all(end - first <= (256 << 10) // 4 // 2 for _, first, end in mount.decodes)


def test_a_file_read_backwards_in_small_pieces_decodes_blocks_not_pieces(
    mount: Mount, references: dict[str, Reference]
) -> None:
    """4 KiB reads from the end of a 10 s cut to its start: each decode goes back to
    :data:`frame_source.MIN_DECODE_FRAMES`, so the next reads find their frames cached."""

    async def scenario() -> bytes:
        inode = await mount.inode("cuts/flac_mono_16k/overlap-a.wav")
        size = (await mount.ops.getattr(inode, None)).st_size
        offsets = range((size - 1) // 4096 * 4096, -1, -4096)
        parts = {offset: await mount.read(inode, offset, 4096) for offset in offsets}
        return b"".join(parts[offset] for offset in sorted(parts))

    data = trio.run(scenario)
    frames = 10 * 16000
    expected = references["flac_mono_16k.flac"].samples.reshape(-1)[5 * 16000 : 5 * 16000 + frames]
    assert np.array_equal(np.frombuffer(data[44:], dtype="<i2"), expected)
    assert len(mount.decodes) <= frames // frame_source.MIN_DECODE_FRAMES + 2
    assert all(end - first >= frame_source.MIN_DECODE_FRAMES for _, first, end in mount.decodes)


def test_a_recording_read_in_order_has_a_growing_window_fetched_ahead(
    mount: Mount, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decodes of 2 s (so that the 30 s recording takes many), read like a tool that
    reads a whole recording in 64 KiB pieces; cuts read after it fetch nothing ahead."""
    monkeypatch.setattr(frame_source, "MAX_READAHEAD_FRAMES", 32000)

    async def scenario() -> None:
        inode = await mount.inode("recordings/flac_mono_16k.wav")
        size = (await mount.ops.getattr(inode, None)).st_size
        handle = inode  # reads name the inode: the kernel opens without asking
        for offset in range(0, size, 1 << 16):
            await mount.ops.read(handle, offset, 1 << 16)
        assert len(mount.aheads) >= 10
        pairs = zip(mount.decodes, mount.aheads, strict=True)
        for number, ((_, first, end), ahead) in enumerate(pairs):
            assert first == (mount.decodes[number - 1][2] if number else 0)  # in order
            decoded = end - first
            streak = number - frame_source.SEQUENTIAL_DECODES
            windows = 0 if streak < 0 else min(2**streak, frame_source.MOST_DECODES_AHEAD)
            assert ahead == decoded * windows, number
        assert max(mount.aheads) > 2 * min(a for a in mount.aheads if a)  # it grew
        del mount.aheads[:]
        for cut in ("start", "overlap-a", "overlap-b", "end"):
            await mount.read_all(f"cuts/mp3_cbr_mono_16k/{cut}.wav")
        assert mount.aheads and set(mount.aheads) == {0}

    trio.run(scenario)


def test_one_decode_serves_concurrent_readers_of_the_same_blocks(mount: Mount) -> None:
    mount.gate = threading.Event()
    results: list[bytes] = []

    async def reader() -> None:
        results.append(await mount.read_all("cuts/vorbis_mono_16k/overlap-a.wav"))

    async def scenario() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()  # one decode parked, three waiting on it
            assert mount.gate is not None
            mount.gate.set()

    trio.run(scenario)
    assert len(results) == 4 and len(set(results)) == 1
    assert len(mount.decodes) == 1


def test_the_event_loop_keeps_answering_while_a_decode_runs(mount: Mount) -> None:
    """A decode parked in its worker thread must not stop other requests.

    If decoding ran on the event loop, the parked decode would hold the loop
    until the gate times out (10 s) and the other requests would be answered
    only after it finished.
    """
    events: list[str] = []

    async def slow_reader() -> None:
        await mount.read_all("recordings/opus_mono_16k.wav")
        events.append("slow read done")

    async def scenario() -> None:
        cached = await mount.read_all("cuts/flac_mono_16k/start.wav")  # warm the cache
        mount.gate = threading.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow_reader)
            await trio.testing.wait_all_tasks_blocked()  # the slow read is parked in its decode
            inode = await mount.inode("cuts/wav_s16_mono_16k/end.wav")
            await mount.ops.getattr(inode, None)
            assert await mount.read_all("cuts/flac_mono_16k/start.wav") == cached
            wav_scp = await mount.read_all("wav.scp")
            assert (
                b"\naac_adts_mono_16k/start /mnt/cutfs/cuts/aac_adts_mono_16k/start.wav\n"
                in wav_scp
            )
            events.append("other requests answered")
            assert mount.gate is not None
            mount.gate.set()

    trio.run(scenario)
    assert events == ["other requests answered", "slow read done"]


def test_corrupt_data_fails_with_eio_and_a_log_line(
    shard_dir: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    copy = tmp_path / "shards"
    # Everything after the first 20 kB zero-filled, as a truncated and padded file would be.
    copy_and_damage(
        shard_dir, copy, "vorbis_mono_16k", lambda size: [(20_000, b"\x00" * (size - 20_000))]
    )
    mount = Mount(str(copy))

    async def scenario() -> None:
        with pytest.raises(pyfuse3.FUSEError) as raised:
            await mount.read_all("cuts/vorbis_mono_16k/end.wav")
        assert raised.value.errno == errno.EIO
        assert len(await mount.read_all("cuts/flac_mono_16k/end.wav")) == 44 + 3 * 16000 * 2

    trio.run(scenario)
    assert any(
        "vorbis_mono_16k" in record.getMessage() and record.levelname == "ERROR"
        for record in caplog.records
    )


HOSTILE_IDS = [
    "../../etc/passwd",
    "/absolute",
    "x" * 10_000,
    "ctrl\x01\x1b[31m\n",
    "nul\x00",
    "replaced-\ufffd",
    ".",
    "..",
    "",
    "a/../../b",
    "é" * 5000,
]


def test_hostile_ids_stay_inside_the_mount(corpus: dict[str, str], tmp_path: Path) -> None:
    data = tmp_path / "kaldi"
    data.mkdir()
    (data / "wav.scp").write_text(f"rec {corpus['flac_mono_16k.flac']}\n")
    segments = "".join(f"seg{n} rec {n}.0 {n + 1}.0\n" for n in range(len(HOSTILE_IDS)))
    (data / "segments").write_text(segments)
    pack([str(data)], str(tmp_path / "shards"))
    # Give the cuts hostile ids (Kaldi ids cannot hold them): the catalogue is written again
    # from them by the packer's own writer, file tree and Kaldi order included.
    path = tmp_path / "shards" / CUTS_FILE
    with pa.OSFile(str(path), "rb") as source:
        table = pa.ipc.open_file(source).read_all()
    table = table.set_column(0, "cut_id", pa.array(HOSTILE_IDS, pa.large_string()))
    write_cut_catalogue(str(tmp_path / "shards"), table)
    mount = Mount(str(tmp_path / "shards"))

    async def walk(inode: int, depth: int) -> list[bytes]:
        found = []
        fs = mount.ops._fs
        for name, child in fs.listing(inode):
            assert name not in (b"", b".", b"..") and b"/" not in name and b"\0" not in name
            assert len(name) <= 255
            attributes = await mount.ops.lookup(inode, name, CONTEXT)
            assert attributes.st_ino == child
            if fs.listed_attributes(child).mode & 0o040000:
                found += await walk(child, depth + 1)
            elif name.endswith(b".wav"):  # cuts/metadata.jsonl is the other file
                found.append(await mount.read(child, 0, 44))
        return found

    async def scenario() -> None:
        cuts = await mount.inode("cuts")
        headers = await walk(cuts, 0)
        assert len(headers) == len(HOSTILE_IDS)
        assert all(header[:4] == b"RIFF" for header in headers)
        root = [name for name, _ in mount.ops._fs.listing(ROOT_INODE)]
        # The hostile table carries no text or speakers: no text, utt2spk, spk2utt.
        assert sorted(root) == [
            b"cuts",
            b"cuts.jsonl.gz",
            b"nemo.jsonl",
            b"recordings",
            b"recordings.uem",
            b"segments",
            b"wav.scp",
        ]

    trio.run(scenario)


def test_the_profiler_times_each_phase_only_when_asked(shard_dir: str) -> None:
    for profile in (False, True):
        shards = ShardSet(shard_dir)
        statistics = Statistics()
        pool = DecodePool(shards, 0, statistics=statistics, profile=profile)
        frames = FrameSource(shards, BlockCache(64 << 20), pool, statistics if profile else None)
        index = [r.recording_id for r in shards.recordings].index("mp3_cbr_mono_16k")
        trio.run(frames.frames, index, 16000, 48000)
        trio.run(frames.frames, index, 16000, 48000)
        phases = set(statistics.latencies)
        if profile:
            assert {
                "phase.fetch",
                "phase.open",
                "phase.decode",
                "phase.convert",
                "frames.decoded",
                "frames.cached",
            } <= phases
            assert statistics.latencies["phase.decode"].total_seconds > 0
        else:
            assert phases == {"decode"}
