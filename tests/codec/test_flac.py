"""FLAC through libsndfile from a seek point: frame headers, a wrong index, long spans."""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import random
import subprocess
import threading
import tracemalloc
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.references import Reference, recording_id

from cutfs.codec.audio import decoder
from cutfs.codec.audio import flac_decoder as flac_decoder_module
from cutfs.codec.audio.decoder import DecodeTrace, decode_frames
from cutfs.codec.audio.flac_frame import frame_first_sample
from cutfs.codec.audio.recording import DecodeMethod
from cutfs.codec.audio.seek_index import SeekIndex
from cutfs.codec.catalogue.shard_set import ShardSet
from cutfs.codec.errors import CorruptDataError
from cutfs.codec.storage.blob import Blob

FLAC_NAMES = ["flac_mono_16k.flac", "flac_s24_stereo_48k.flac", "flac_6ch_16k.flac"]


@pytest.fixture(scope="module")
def shards(shard_dir: str) -> ShardSet:
    return ShardSet(shard_dir)


@pytest.fixture(params=["libflac", "libsndfile"])
def flac_decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each FLAC decoder in turn: libFLAC itself, and libsndfile, which decodes where the
    system has no libFLAC."""
    if request.param == "libsndfile":
        monkeypatch.setattr(decoder, "thread_decoder", lambda: None)
    else:
        assert flac_decoder_module.thread_decoder() is not None, "libFLAC is not installed"
    return str(request.param)


def _index(shards: ShardSet, name: str) -> int:
    return list(shards.recording_ids).index(recording_id(name))


def _ffprobe_packets(path: str) -> list[tuple[int, int]]:
    """(byte offset, first sample) of every FLAC frame, as ffprobe's parser finds them."""
    shown = subprocess.run(
        [
            *("ffprobe", "-v", "error", "-select_streams", "a:0"),
            *("-show_entries", "packet=pos,pts", "-of", "json", path),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [(int(p["pos"]), int(p["pts"])) for p in json.loads(shown)["packets"]]


@pytest.mark.parametrize("name", FLAC_NAMES)
def test_every_frame_header_gives_the_sample_ffprobe_gives(
    name: str, corpus: dict[str, str]
) -> None:
    with open(corpus[name], "rb") as flac_file:
        data = flac_file.read()
    packets = _ffprobe_packets(corpus[name])
    assert len(packets) > 50
    # The last frame of a fixed-blocksize stream is shorter: its number times its own block
    # size is not its sample (documented; the index never points there).
    for position, sample in packets[:-1]:
        assert frame_first_sample(data[position : position + 16]) == sample
        # One byte off is not a frame header (sync code, reserved bits and CRC-8).
        assert frame_first_sample(data[position + 1 : position + 17]) is None


def _bitwise_crc8(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def test_a_variable_blocksize_header_gives_its_sample_number() -> None:
    """No encoder here writes variable block sizes: the header is built by the format's
    rules, a 7-byte coded sample number and an 8-bit block size."""
    sample = 2**35 + 12345
    coded = bytes([0xFE] + [0x80 | (sample >> shift) & 0x3F for shift in range(30, -1, -6)])
    header = bytes([0xFF, 0xF9, 0x69, 0x08]) + coded + bytes([99])  # block size 100 frames
    assert frame_first_sample(header + bytes([_bitwise_crc8(header)])) == sample
    assert frame_first_sample(header + bytes([_bitwise_crc8(header) ^ 1])) is None
    assert frame_first_sample(header[:6]) is None


@given(st.binary(max_size=20), st.sampled_from([b"", b"\xff\xf8", b"\xff\xf9"]))
def test_any_bytes_give_a_sample_or_none_and_never_raise(data: bytes, sync: bytes) -> None:
    """The bytes at a seek point come from a shard someone else wrote."""
    found = frame_first_sample(sync + data)
    assert found is None or found >= 0


@pytest.mark.parametrize("name", FLAC_NAMES)
def test_long_splices_stream_and_match_the_full_decode(
    name: str,
    shards: ShardSet,
    references: dict[str, Reference],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through libsndfile, splices too long for a memory file are read through the
    bounded reader instead, with the same samples.  (That they read no byte past the
    splice is checked over object storage, where a byte past it would cost a GET:
    test_remote_shards.)"""
    monkeypatch.setattr(decoder, "thread_decoder", lambda: None)
    monkeypatch.setattr(decoder, "MEMORY_SPLICE_BYTES", 1)
    index = _index(shards, name)
    recording = shards.recording(index)
    assert recording.method is DecodeMethod.SNDFILE
    rng = random.Random(name)
    for _ in range(6):
        first = rng.randrange(recording.num_frames - 1)
        end = min(recording.num_frames, first + rng.randrange(1, 5 * recording.sample_rate))
        trace = DecodeTrace()
        references[name].assert_matches(shards.read_frames(index, first, end, trace), first)
        point, stop = decoder.sndfile_span(recording, len(shards.blob(index)), first, end)
        assert trace.bytes_read == recording.header_bytes + stop - point.byte_offset


@pytest.mark.parametrize("name", FLAC_NAMES)
@pytest.mark.usefixtures("flac_decoder")
def test_a_seek_point_at_the_wrong_byte_fails_instead_of_serving_other_samples(
    name: str, shards: ShardSet, references: dict[str, Reference]
) -> None:
    index = _index(shards, name)
    recording = shards.recording(index)
    samples = recording.seek_index.samples.copy()
    offsets = recording.seek_index.byte_offsets.copy()
    assert len(samples) > 10
    middle = len(samples) // 2
    first = int(samples[middle]) + 10
    end = first + 1000
    blob = shards.blob(index)
    references[name].assert_matches(decode_frames(blob, recording, first, end), first)
    for wrong in (int(offsets[middle - 1]), int(offsets[middle]) + 1):
        moved = offsets.copy()
        moved[middle] = wrong
        plan = dataclasses.replace(recording, seek_index=SeekIndex(samples, moved))
        with pytest.raises(CorruptDataError, match="seek index says sample"):
            decode_frames(blob, plan, first, end)


@pytest.mark.usefixtures("flac_decoder")
def test_an_index_starting_after_the_frames_asked_for_fails(
    shards: ShardSet, references: dict[str, Reference]
) -> None:
    name = "flac_mono_16k.flac"
    index = _index(shards, name)
    recording = shards.recording(index)
    references[name].assert_matches(decode_frames(shards.blob(index), recording, 100, 200), 100)
    late = SeekIndex(recording.seek_index.samples + 4000, recording.seek_index.byte_offsets)
    plan = dataclasses.replace(recording, seek_index=late)
    with pytest.raises(CorruptDataError, match="seek index starts at frame 4000"):
        decode_frames(shards.blob(index), plan, 100, 200)


@pytest.mark.usefixtures("flac_decoder")
def test_an_index_with_one_point_costs_time_not_memory(
    shards: ShardSet, references: dict[str, Reference]
) -> None:
    """A seek index from a shard may leave any gap between points: with only the first,
    a read near the end decodes the whole recording before it, in bounded pieces."""
    name = "flac_s24_stereo_48k.flac"
    index = _index(shards, name)
    recording = shards.recording(index)
    sparse = SeekIndex(recording.seek_index.samples[:1], recording.seek_index.byte_offsets[:1])
    plan = dataclasses.replace(recording, seek_index=sparse)
    first = recording.num_frames - 2 * recording.sample_rate
    skipped_bytes = first * recording.channels * 2  # what one read of the skip would take
    assert skipped_bytes > 4 << 20
    tracemalloc.start()
    try:
        frames = decode_frames(shards.blob(index), plan, first, first + 1000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    references[name].assert_matches(frames, first)
    assert peak < 2 << 20, peak


def test_threads_that_decoded_leave_no_memory_file_behind(
    shards: ShardSet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through libsndfile, each decoding thread keeps a memory file for its splices; it
    goes with the thread (with ``--workers 0`` trio's threads come and go)."""
    monkeypatch.setattr(decoder, "thread_decoder", lambda: None)
    index = _index(shards, "flac_mono_16k.flac")
    shards.read_frames(index, 16000, 32000)  # whatever this thread opens once
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        thread = threading.Thread(target=shards.read_frames, args=(index, 16000, 32000))
        thread.start()
        thread.join()
    assert len(os.listdir("/proc/self/fd")) <= before


def test_a_range_ending_at_a_seek_point_reads_no_byte_past_it(
    shards: ShardSet, references: dict[str, Reference], flac_decoder: str
) -> None:
    """libsndfile is given the whole span; libFLAC reads what it needs of it."""
    name = "flac_mono_16k.flac"
    index = _index(shards, name)
    recording = shards.recording(index)
    samples = recording.seek_index.samples
    offsets = recording.seek_index.byte_offsets
    for start, stop in ((3, 7), (10, 11), (0, 5)):
        first, end = int(samples[start]) + 5, int(samples[stop])
        trace = DecodeTrace()
        references[name].assert_matches(shards.read_frames(index, first, end, trace), first)
        header = min(recording.header_bytes, int(offsets[start]))
        spliced = header + int(offsets[stop]) - int(offsets[start])
        if flac_decoder == "libsndfile":
            assert trace.bytes_read == spliced
        else:
            assert spliced - (64 << 10) < trace.bytes_read <= spliced


@pytest.mark.usefixtures("flac_decoder")
def test_an_index_pointing_past_the_stored_bytes_fails_clearly(shards: ShardSet) -> None:
    index = _index(shards, "flac_mono_16k.flac")
    recording = shards.recording(index)
    blob = shards.blob(index)
    moved = recording.seek_index.byte_offsets.copy()
    moved[len(moved) // 2 :] += len(blob)
    plan = dataclasses.replace(recording, seek_index=SeekIndex(recording.seek_index.samples, moved))
    first = int(recording.seek_index.samples[len(moved) // 2]) + 10
    with pytest.raises(CorruptDataError, match=r"outside the \d+ bytes stored"):
        decode_frames(blob, plan, first, first + 1000)


@pytest.mark.parametrize("name", FLAC_NAMES)
def test_both_decoders_give_the_samples_of_the_full_decode(
    name: str, shards: ShardSet, references: dict[str, Reference], flac_decoder: str
) -> None:
    index = _index(shards, name)
    recording = shards.recording(index)
    rate = recording.sample_rate
    rng = random.Random(f"{name} {flac_decoder}")
    ranges = [(0, rate), (recording.num_frames - 3 * rate, recording.num_frames)]
    for _ in range(8):
        first = rng.randrange(recording.num_frames - 1)
        ranges.append((first, min(recording.num_frames, first + rng.randrange(1, 12 * rate))))
    for first, end in ranges:
        trace = DecodeTrace()
        frames = shards.read_frames(index, first, end, trace)
        assert frames.shape == (end - first, recording.channels)
        references[name].assert_matches(frames, first)
        assert trace.frames_decoded >= end - first


def _corrupted(shards: ShardSet, index: int, change: Callable[[bytearray], None]) -> Blob:
    data = bytearray(shards.blob(index).read(0, len(shards.blob(index))))
    change(data)
    return Blob.of(bytes(data))


def _seek_interval(shards: ShardSet, index: int, sample: int) -> tuple[int, int, int]:
    """(first sample, first byte, end byte) of the frames between the seek point at or
    before ``sample`` and the next one: whole frames, a few of them."""
    index_points = shards.recording(index).seek_index
    at = int(np.searchsorted(index_points.samples, sample, side="right")) - 1
    return (
        int(index_points.samples[at]),
        int(index_points.byte_offsets[at]),
        int(index_points.byte_offsets[at + 1]),
    )


def test_libflac_fails_a_frame_whose_crc_does_not_match(shards: ShardSet) -> None:
    index = _index(shards, "flac_mono_16k.flac")
    recording = shards.recording(index)
    _, _, end = _seek_interval(shards, index, 5 * 16000)

    def flip(data: bytearray) -> None:
        data[end - 1] ^= 0x5A  # the last byte of a frame: its CRC-16

    blob = _corrupted(shards, index, flip)
    with pytest.raises(CorruptDataError, match="CRC does not match"):
        decode_frames(blob, recording, 4 * 16000, 6 * 16000)
    # Ranges that do not reach the frame still decode.
    decode_frames(blob, recording, 7 * 16000, 8 * 16000)


def test_libflac_fails_a_stream_with_frames_cut_out(shards: ShardSet) -> None:
    """A torn copy: the frames of one seek interval are gone, every frame left is sound
    and the index is the original's.  libFLAC numbers frames by their headers but, from
    1.4 on, decodes silence in place of missing ones and goes on; the frames after the
    gap then end elsewhere than the index says, and the read fails rather than serve
    silence and samples that come early.  (Through libsndfile, which hides where its
    decoder is in the stream, such a read succeeds.)"""
    index = _index(shards, "flac_mono_16k.flac")
    recording = shards.recording(index)
    _, start, end = _seek_interval(shards, index, 5 * 16000)

    def cut_out(data: bytearray) -> None:
        del data[start:end]

    blob = _corrupted(shards, index, cut_out)
    with pytest.raises(CorruptDataError):
        decode_frames(blob, recording, 4 * 16000, 6 * 16000)


def test_libflac_fails_frames_of_another_channel_count(shards: ShardSet) -> None:
    index = _index(shards, "flac_mono_16k.flac")
    recording = shards.recording(index)
    plan = dataclasses.replace(recording, channels=2)
    with pytest.raises(CorruptDataError, match="a frame of 1 channels in a stream of 2"):
        decode_frames(shards.blob(index), plan, 16000, 32000)


def test_a_decoder_gives_back_what_its_source_raised_and_decodes_again(
    shards: ShardSet, references: dict[str, Reference]
) -> None:
    """An error reading the stream (object storage that timed out) reaches the caller
    as it was, not as whatever libFLAC made of a stream that stopped; the thread's
    decoder then decodes the next range as if nothing happened."""
    name = "flac_mono_16k.flac"
    index = _index(shards, name)
    recording = shards.recording(index)
    point = recording.seek_index.point_at_or_before(16000)
    reader = decoder.SpliceReader(shards.blob(index), recording.header_bytes, point.byte_offset)

    class Failing:
        def __init__(self) -> None:
            self.calls = 0

        def readinto(self, buffer: Any) -> int:
            self.calls += 1
            if self.calls > 3:
                raise TimeoutError("the store did not answer")
            return reader.readinto(buffer)

        def tell(self) -> int:
            return reader.tell()

    flac = flac_decoder_module.thread_decoder()
    assert flac is not None
    output = np.zeros((10 * 16000, 1), dtype=np.int16)
    with pytest.raises(TimeoutError, match="did not answer"):
        bounds = flac_decoder_module.FrameBounds([], [])
        flac.decode_into(Failing(), point.sample, 16000 - point.sample, output, bounds)
    references[name].assert_matches(
        decode_frames(shards.blob(index), recording, 16000, 48000), 16000
    )


def test_each_thread_has_its_decoder_and_it_goes_with_the_thread(shards: ShardSet) -> None:
    index = _index(shards, "flac_mono_16k.flac")
    made: list[weakref.ref[flac_decoder_module.FlacDecoder]] = []

    def decode() -> None:
        shards.read_frames(index, 16000, 32000)
        flac = flac_decoder_module.thread_decoder()
        assert flac is not None
        made.append(weakref.ref(flac))

    for _ in range(5):
        thread = threading.Thread(target=decode)
        thread.start()
        thread.join()
    gc.collect()
    assert len({id(ref) for ref in made}) == 5
    assert all(ref() is None for ref in made)
