"""A cut at the end of a 2-hour recording, read without decoding from the start; a
lookup that asks for the seek index pages its read will search; the whole recording
read in order, decoded ahead by both serving processes."""

from __future__ import annotations

import errno
import io
import json
import mmap
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import soundfile
from support.corpus import synthesize
from support.mounts import mounted, needs_fuse
from support.shards import resident_pages

from cutfs.codec.audio.decoder import DecodeTrace
from cutfs.codec.catalogue.shard_format import RECORDINGS_FILE
from cutfs.codec.catalogue.shard_set import ShardSet
from cutfs.codec.packing.packer import pack

HOURS = 2
RATE = 8000


@pytest.fixture(scope="module")
def long_shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[ShardSet, dict[str, str]]:
    directory = tmp_path_factory.mktemp("long")
    audio = directory / "audio"
    audio.mkdir()
    seconds = HOURS * 3600
    synthesize(str(directory / "long.wav"), seconds, RATE)
    paths = {
        "flac": str(audio / "two_hours_flac.flac"),
        "mp3": str(audio / "two_hours_mp3.mp3"),
    }
    subprocess.run(
        ["ffmpeg", "-v", "error", "-i", str(directory / "long.wav"), paths["flac"]], check=True
    )
    subprocess.run(
        [
            "ffmpeg",
            "-v",
            "error",
            "-i",
            str(directory / "long.wav"),
            "-c:a",
            "libmp3lame",
            "-b:a",
            "24k",
            paths["mp3"],
        ],
        check=True,
    )
    (directory / "long.wav").unlink()
    output = directory / "shards"
    pack([str(audio)], str(output), jobs=2)
    return ShardSet(str(output)), paths


def _ffmpeg_whole(path: str) -> np.ndarray:
    """ffmpeg's decode of a whole file, as 16-bit samples."""
    raw = subprocess.run(
        ["ffmpeg", "-v", "error", "-i", path, "-f", "s16le", "-"], check=True, capture_output=True
    ).stdout
    return np.frombuffer(raw, dtype="<i2")


def _ffmpeg_tail(path: str, start_seconds: float, seconds: float) -> np.ndarray:
    """ffmpeg's full decode (no input seeking: -ss after -i decodes from the start)."""
    raw = subprocess.run(
        [
            "ffmpeg",
            "-v",
            "error",
            "-i",
            path,
            "-ss",
            f"{start_seconds:.6f}",
            "-t",
            str(seconds),
            "-f",
            "s16le",
            "-",
        ],
        check=True,
        capture_output=True,
    ).stdout
    return np.frombuffer(raw, dtype="<i2")


@pytest.mark.parametrize("kind", ["flac", "mp3"])
def test_last_ten_seconds(kind: str, long_shards: tuple[ShardSet, dict[str, str]]) -> None:
    shards, paths = long_shards
    index = [rec.recording_id for rec in shards.recordings].index(f"two_hours_{kind}")
    recording = shards.recordings[index]
    assert recording.duration_seconds == pytest.approx(HOURS * 3600, abs=0.2)
    first = recording.num_frames - 10 * RATE
    trace = DecodeTrace()
    frames = shards.read_frames(index, first, recording.num_frames, trace)
    expected = _ffmpeg_tail(paths[kind], first / RATE, 10)
    assert len(expected) == 10 * RATE
    tolerance = 0 if kind == "flac" else 1
    assert np.abs(frames[:, 0].astype(np.int32) - expected.astype(np.int32)).max() <= tolerance
    # The proof that nothing was decoded from the start: the decoder produced
    # about 10 s of audio, not 2 hours, and read a sliver of the blob.
    assert trace.frames_decoded < 12 * RATE + recording.preroll_frames
    assert trace.bytes_read < len(shards.blob(index)) / 100


@needs_fuse
@pytest.mark.parametrize("kind", ["flac", "mp3"])
def test_a_whole_recording_read_in_order_is_decoded_ahead_exactly(
    kind: str, long_shards: tuple[ShardSet, dict[str, str]], tmp_path: Path
) -> None:
    """``open().read()`` of a 2-hour recording (28 cells of 4 MiB): the serving processes
    decode the cells ahead of the reader (jobs taken, cells pushed), what the reader gets
    is the full decode (FLAC exactly, MP3 within 1 LSB), and the frames decoded stay
    close to the recording's (cells are not decoded twice, as a read waiting for a cell
    another process fills would otherwise do)."""
    shards, paths = long_shards
    with mounted(shards.directory, str(tmp_path / "mnt"), "--serving-processes", "2") as mnt:
        with open(f"{mnt}/recordings/two_hours_{kind}.wav", "rb") as wav:
            data = wav.read()
        counters = json.loads(Path(mnt, ".cutfs", "stats").read_bytes())["counters"]
    samples, rate = soundfile.read(io.BytesIO(data), dtype="int16")
    expected = _ffmpeg_whole(paths[kind])
    assert rate == RATE and len(samples) == len(expected)
    tolerance = 0 if kind == "flac" else 1
    assert np.abs(samples.astype(np.int32) - expected.astype(np.int32)).max() <= tolerance
    cells = -(-len(data) // (4 << 20))
    assert counters["read_ahead.jobs_taken"] >= cells // 2
    assert counters["read_ahead.bytes"] >= (cells // 2) * (4 << 20) - 4096 * cells
    assert counters["frames_decoded"] < 1.5 * len(expected)


@needs_fuse
@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "stopped"])
def test_a_whole_recording_read_goes_on_when_a_serving_process_fails_midway(
    fault: signal.Signals, long_shards: tuple[ShardSet, dict[str, str]], tmp_path: Path
) -> None:
    """A serving process killed, or stopped (then killed by the daemon past the 4 s
    deadline), while cells are being decoded ahead: the reads it held fail with EIO (and
    are read again), a read waiting for a cell it was filling gives up on it (at once for
    a dead filler, after half the deadline for a stopped one) and decodes the bytes itself,
    and every byte read is the full decode's."""
    shards, paths = long_shards
    chunk = 1 << 20
    retries = 0
    options = ("--serving-processes", "2", "--read-timeout", "4")
    with mounted(shards.directory, str(tmp_path / "mnt"), *options) as mnt:
        pids = json.loads(Path(mnt, ".cutfs", "stats").read_bytes())["serving"]["pids"]
        descriptor = os.open(f"{mnt}/recordings/two_hours_flac.wav", os.O_RDONLY)
        pieces: list[bytes] = []
        signal.signal(signal.SIGALRM, _hung)
        signal.alarm(120)  # a read that never ends fails the test instead of hanging it
        try:
            while True:
                try:
                    piece = os.pread(descriptor, chunk, len(pieces) * chunk)
                except OSError as exc:
                    assert exc.errno == errno.EIO and retries < 8, exc
                    retries += 1
                    continue
                if not piece:
                    break
                pieces.append(piece)
                if len(pieces) == 24:  # about six cells in: cells ahead are being decoded
                    os.kill(pids[1], fault)
        finally:
            signal.alarm(0)
            os.close(descriptor)
        counters = json.loads(Path(mnt, ".cutfs", "stats").read_bytes())["counters"]
    samples, _ = soundfile.read(io.BytesIO(b"".join(pieces)), dtype="int16")
    expected = _ffmpeg_whole(paths["flac"])
    assert len(samples) == len(expected) and np.array_equal(samples, expected)
    assert counters["read_ahead.jobs_taken"] > 0


def _hung(*_: object) -> None:
    raise AssertionError("a read did not end within 120 s")


@needs_fuse
def test_a_lookup_asks_for_the_seek_index_pages_its_read_will_search(
    long_shards: tuple[ShardSet, dict[str, str]], tmp_path: Path
) -> None:
    """A cold cut should wait for storage once (its audio), not first for its seek index:
    looking a file up asks for the index pages the read will search, before the read.
    Checked with mincore on a copy of the shards whose pages were evicted (no process had
    mapped them); a window far from the one looked up is the control (its page stays out).
    """
    if not _evictable(tmp_path):
        pytest.skip("this file system keeps its pages in memory (tmpfs?): nothing to evict")
    shards, _ = long_shards
    number = [rec.recording_id for rec in shards.recordings].index("two_hours_flac")
    seek_index = shards.recording(number).seek_index
    looked_up_seconds, control_seconds = 2400, 4800
    copy = tmp_path / "shards"
    shutil.copytree(shards.directory, copy)
    table = copy / RECORDINGS_FILE
    content = table.read_bytes()
    samples_at, offsets_at = (
        _only_place(content, column) for column in (seek_index.samples, seek_index.byte_offsets)
    )
    point, control = (
        seek_index.points_through(seconds * RATE) - 1
        for seconds in (looked_up_seconds, control_seconds)
    )
    page, control_page = ((samples_at + 8 * at) // mmap.PAGESIZE for at in (point, control))
    offsets_page = (offsets_at + 8 * point) // mmap.PAGESIZE
    if page == control_page:
        pytest.skip(f"pages of {mmap.PAGESIZE} bytes hold both points: nothing to tell apart")
    for path in copy.iterdir():
        _evict(path)
    with mounted(str(copy), str(tmp_path / "mnt"), "--window", "10") as mountpoint:
        before = _resident(table, page)
        os.stat(
            f"{mountpoint}/windows/two_hours_flac/{looked_up_seconds}-{looked_up_seconds + 10}.wav"
        )
        deadline = time.monotonic() + 5
        while not _resident(table, page) and time.monotonic() < deadline:  # not waited for
            time.sleep(0.01)
        after, control_after = _resident(table, page), _resident(table, control_page)
        offsets_after = _resident(table, offsets_page)
    assert not before, "the page was not evicted: the check would prove nothing"
    assert after and offsets_after
    assert not control_after


def _only_place(content: bytes, column: npt.NDArray[np.int64]) -> int:
    """Where a column's values are in a file (its first points, found once only)."""
    start = column[:4].tobytes()
    found = content.find(start)
    assert found > 0 and content.find(start, found + 1) < 0
    return found


def _evict(path: Path) -> None:
    """Drop a file's pages from the page cache (written back first: dirty pages stay)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
        os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(descriptor)


def _evictable(directory: Path) -> bool:
    """Whether a file's pages there leave the page cache when asked to."""
    probe = directory / "probe"
    probe.write_bytes(bytes(mmap.PAGESIZE))
    _evict(probe)
    evicted = not _resident(probe, 0)
    probe.unlink()
    return evicted


def _resident(path: Path, page: int) -> bool:
    return resident_pages(path, page, page + 1)[0]
