"""A cut at the end of a 2-hour recording, read without decoding from the start."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
from corpus import synthesize

from cutfs.codec.decoder import DecodeTrace
from cutfs.codec.packer import pack
from cutfs.codec.shard_set import ShardSet

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
