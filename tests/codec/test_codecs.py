"""Every codec, decoded through the seek index, against ffmpeg's full decode."""

from __future__ import annotations

import random

import numpy as np
import pytest
from support.corpus import ENCODINGS
from support.references import Reference, pyav_decode, recording_id

from cutfs.codec.audio.decoder import DecodeTrace
from cutfs.codec.audio.recording import DecodeMethod
from cutfs.codec.catalogue.shard_set import ShardSet

NAMES = [encoding.name for encoding in ENCODINGS]


@pytest.fixture(scope="module")
def shards(shard_dir: str) -> ShardSet:
    return ShardSet(shard_dir)


def _index(shards: ShardSet, name: str) -> int:
    ids = [recording.recording_id for recording in shards.recordings]
    return ids.index(recording_id(name))


@pytest.mark.parametrize("name", NAMES)
def test_length_rate_and_channels_match_ffmpeg(
    name: str, shards: ShardSet, references: dict[str, Reference]
) -> None:
    recording = shards.recordings[_index(shards, name)]
    reference = references[name]
    assert recording.num_frames == len(reference.samples)
    assert recording.sample_rate == reference.rate
    assert recording.channels == reference.channels


@pytest.mark.parametrize("name", NAMES)
def test_random_ranges_match_the_full_decode(
    name: str, shards: ShardSet, references: dict[str, Reference]
) -> None:
    index = _index(shards, name)
    recording = shards.recordings[index]
    reference = references[name]
    rng = random.Random(name)
    ranges = [
        (0, 1),
        (0, 4000),
        (recording.num_frames - 1, recording.num_frames),
        (recording.num_frames - 9000, recording.num_frames),
    ]
    for _ in range(12):
        first = rng.randrange(recording.num_frames)
        ranges.append((first, min(recording.num_frames, first + rng.randrange(1, 80000))))
    for first, end in ranges:
        reference.assert_matches(shards.read_frames(index, first, end), first)


@pytest.mark.parametrize("name", [n for n in NAMES if n.endswith(".opus")])
def test_opus_ranges_are_the_full_decode_bit_for_bit_by_the_same_ffmpeg(
    name: str, shards: ShardSet, corpus: dict[str, str]
) -> None:
    """Opus's decoder state converges to the sequential decode's exactly within about 0.75 s
    (CELT's energy prediction halves an error every 20 ms frame), so a range decoded after
    a second of pre-roll is the full decode's, bit for bit, by the same FFmpeg.  (The
    ffmpeg command line may link another FFmpeg, which rounds CELT differently: within
    1 LSB of it, as above.)  With half a second of pre-roll, 1 window in 22 of a 20-minute
    recording differed."""
    index = _index(shards, name)
    recording = shards.recordings[index]
    full = pyav_decode(corpus[name])
    assert full.shape == (recording.num_frames, recording.channels)
    rng = random.Random(f"exact {name}")
    ranges = [(0, 48000), (recording.num_frames - 30000, recording.num_frames)]
    for _ in range(24):
        first = rng.randrange(recording.num_frames - 1)
        ranges.append((first, min(recording.num_frames, first + rng.randrange(1, 200_000))))
    for first, end in ranges:
        served = shards.read_frames(index, first, end)
        differing = int(np.count_nonzero(served != full[first:end]))
        assert differing == 0, f"frames {first}-{end}: {differing} samples differ"


def test_whole_recordings_match_the_full_decode(
    shards: ShardSet, references: dict[str, Reference]
) -> None:
    for name in NAMES:
        index = _index(shards, name)
        frames = shards.read_frames(index, 0, shards.recordings[index].num_frames)
        references[name].assert_matches(frames, 0)


def test_blobs_are_stored_unchanged_unless_transcoded(
    shards: ShardSet, corpus: dict[str, str]
) -> None:
    for name in NAMES:
        index = _index(shards, name)
        recording = shards.recordings[index]
        with open(corpus[name], "rb") as original:
            original_bytes = original.read()
        if recording.transcoded_from:
            assert recording.codec_name == "flac"
            assert bytes(shards.blob(index).read(0, 4)) == b"fLaC"
        else:
            blob = shards.blob(index)
            assert bytes(blob.read(0, len(blob))) == original_bytes


def test_noise_substitution_aac_is_transcoded_and_others_are_kept(shards: ShardSet) -> None:
    transcoded = {rec.recording_id for rec in shards.recordings if rec.transcoded_from}
    assert transcoded == {"aac_pns_mono_16k"}
    methods = {rec.recording_id: rec.method for rec in shards.recordings}
    assert methods["wav_s24_stereo_44k"] is DecodeMethod.PCM
    assert methods["mp3_vbr_stereo_44k"] is DecodeMethod.SPLICE
    assert methods["aac_nopns_stereo_44k"] is DecodeMethod.SEEK


@pytest.mark.parametrize(
    "name",
    ["flac_mono_16k.flac", "mp3_cbr_mono_16k.mp3", "opus_mono_16k.opus", "vorbis_mono_16k.ogg"],
)
def test_a_cut_near_the_end_decodes_only_near_the_end(name: str, shards: ShardSet) -> None:
    index = _index(shards, name)
    recording = shards.recordings[index]
    trace = DecodeTrace()
    second = recording.sample_rate
    shards.read_frames(index, recording.num_frames - 3 * second, recording.num_frames, trace)
    # What a seek index allows: pre-roll, one seek interval and the packet
    # granularity on top of the 3 s wanted; never the 27 s before.
    assert trace.frames_decoded < 3 * second + recording.preroll_frames + 2 * second
    assert trace.bytes_read < len(shards.blob(index)) // 4
