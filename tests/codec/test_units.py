"""Unit and property tests of the small pieces: WAV layout, path escaping, seek index, rounding."""

from __future__ import annotations

import io
import itertools
import mmap
import pickle
import struct
import wave

import av
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cutfs.codec.audio.cut import seconds_to_frames
from cutfs.codec.audio.float_staging import FloatStaging
from cutfs.codec.audio.pcm import float_to_s16, packed_to_s16
from cutfs.codec.audio.resampler import Resampler
from cutfs.codec.audio.riff import parse_riff_wave
from cutfs.codec.audio.seek_index import SeekIndex
from cutfs.codec.audio.wav_layout import HEADER_BYTES, WavLayout
from cutfs.codec.catalogue.file_tree import served_paths
from cutfs.codec.catalogue.path_escape import escape_id, unescape_path
from cutfs.codec.errors import CorruptDataError, ShardFormatError
from cutfs.codec.storage.memory_advice import address_of
from cutfs.vfs.frames.block_cache import BLOCK_OVERHEAD_BYTES, BlockCache


def test_header_bytes_field_by_field() -> None:
    header = WavLayout(sample_rate=16000, channels=2, num_frames=1000).header()
    expected = (
        b"RIFF"
        + (36 + 4000).to_bytes(4, "little")  # RIFF size: file size minus 8
        + b"WAVE"
        + b"fmt "
        + (16).to_bytes(4, "little")  # fmt chunk size
        + (1).to_bytes(2, "little")  # WAVE_FORMAT_PCM
        + (2).to_bytes(2, "little")  # channels
        + (16000).to_bytes(4, "little")  # sample rate
        + (64000).to_bytes(4, "little")  # byte rate = rate * block align
        + (4).to_bytes(2, "little")  # block align = channels * 2
        + (16).to_bytes(2, "little")  # bits per sample
        + b"data"
        + (4000).to_bytes(4, "little")  # data size
    )
    assert header == expected and len(header) == HEADER_BYTES


@given(st.integers(1, 192000), st.integers(1, 8), st.integers(0, 10**6))
def test_header_agrees_with_the_standard_library(rate: int, channels: int, frames: int) -> None:
    layout = WavLayout(rate, channels, frames)
    data = layout.header() + bytes(layout.data_bytes)
    assert len(data) == layout.size_bytes
    with wave.open(io.BytesIO(data)) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getnframes()) == (
            rate,
            channels,
            frames,
        )
        assert wav.getsampwidth() == 2


def test_sizes_beyond_riff_limits_saturate() -> None:
    layout = WavLayout(16000, 1, 38 * 3600 * 16000)  # 38 h: 4.4 GB of data
    assert layout.size_bytes == 44 + 38 * 3600 * 16000 * 2
    (riff_size,) = struct.unpack_from("<I", layout.header(), 4)
    (data_size,) = struct.unpack_from("<I", layout.header(), 40)
    assert riff_size == data_size == 0xFFFFFFFF


@given(st.integers(1, 6), st.integers(0, 5000), st.integers(-100, 20000), st.integers(0, 20000))
def test_byte_ranges_map_to_covering_frames(
    channels: int, frames: int, offset: int, size: int
) -> None:
    layout = WavLayout(8000, channels, frames)
    offset = max(offset, 0)
    first, end = layout.frames_for_bytes(offset, size)
    stop = min(offset + size, layout.size_bytes)
    if stop <= max(offset, HEADER_BYTES):
        assert first == end
        return
    assert 0 <= first < end <= frames
    assert HEADER_BYTES + first * layout.frame_bytes <= max(offset, HEADER_BYTES)
    assert HEADER_BYTES + end * layout.frame_bytes >= stop
    assert HEADER_BYTES + (end - 1) * layout.frame_bytes < stop


@given(st.text(max_size=600))
def test_escaping_round_trips_and_is_safe(identifier: str) -> None:
    path = escape_id(identifier)
    assert unescape_path(path) == identifier
    for component in path.split("/"):
        assert component not in ("", ".", "..")
        assert "\0" not in component
        assert len(component.encode("utf-8", "surrogateescape")) <= 255


@given(st.binary(max_size=300))
def test_escaping_round_trips_ids_from_invalid_utf8(raw: bytes) -> None:
    identifier = raw.decode("utf-8", "surrogateescape")
    assert unescape_path(escape_id(identifier)) == identifier


def test_safe_ids_are_kept_as_they_are() -> None:
    assert escape_id("spk1/utt-0001") == "spk1/utt-0001.wav"
    assert escape_id("..") == "%...wav"
    assert escape_id("") == "%.wav"


def test_clashing_paths_are_escaped() -> None:
    paths = served_paths(["a", "a.wav/b", "c/d", "c"]).to_pylist()
    assert paths[0] == "a.wav"
    assert paths[1] == escape_id("a.wav/b", force=True)
    assert len(set(paths)) == 4
    assert all(
        unescape_path(path) == ident
        for path, ident in zip(paths, ["a", "a.wav/b", "c/d", "c"], strict=True)
    )


@given(st.lists(st.integers(-2000, 10**7), min_size=1, max_size=50, unique=True), st.integers())
def test_seek_index_finds_the_last_point_at_or_before(samples: list[int], target: int) -> None:
    samples.sort()
    index = SeekIndex.from_points(samples, list(range(len(samples))))
    point = index.point_at_or_before(target)
    earlier = [s for s in samples if s <= target]
    assert point.sample == (earlier[-1] if earlier else samples[0])


def test_seek_index_refuses_unsorted_points() -> None:
    with pytest.raises(ValueError, match="sorted"):
        SeekIndex.from_points([0, 10, 5], [0, 1, 2])


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(0, 9000), min_size=513, max_size=3000),
    st.integers(0, 511),
    st.lists(st.integers(-10_000, 30_000_000), min_size=1, max_size=40),
)
def test_seek_index_searches_agree_with_a_binary_search_of_the_whole_index(
    gaps: list[int], shift_points: int, targets: list[int]
) -> None:
    """Large indexes are searched first in the page interpolation points to: the answer
    must be a binary search's, wherever the column starts in its page, for points spaced
    evenly or not (long silences compress to few bytes, so byte offsets bunch up), with
    points repeated (a zero gap), and for numpy integers as for Python's."""
    samples_list = np.cumsum([-3000, *gaps[1:]])
    offsets_list = np.cumsum(
        [0, *(gap // 7 if k % 97 else gap * 50 for k, gap in enumerate(gaps[1:]))]
    )
    # A page-aligned buffer (an anonymous map), the columns placed at any point in a page.
    room = mmap.mmap(-1, (2 * len(gaps) + 2 * 512) * 8)
    buffer = np.frombuffer(room, dtype=np.int64)
    samples = buffer[shift_points : shift_points + len(gaps)]
    offsets = buffer[len(gaps) + 512 : 2 * len(gaps) + 512]
    samples[:] = samples_list
    offsets[:] = offsets_list
    for index in (
        SeekIndex(samples, offsets, sorted_checked=False),
        SeekIndex(samples.copy()[::-1][::-1], offsets.copy()),  # contiguous, not mapped
        SeekIndex(np.repeat(samples, 2)[::2], np.repeat(offsets, 2)[::2]),  # strided
        SeekIndex(samples.astype(np.int32), offsets.astype(np.int32)),  # not int64
    ):
        edges = samples_list[255::256].tolist()  # points at and around page boundaries
        extremes = [int(samples_list[0]) - 1, int(samples_list[-1]), int(samples_list[-1]) + 1]
        for target in [*targets, *edges, *(edge - 1 for edge in edges), *extremes]:
            expected = int(np.searchsorted(samples_list, target, side="right"))
            assert index.points_through(target) == expected
            assert index.points_through(np.int64(target)) == expected
            point = index.point_at_or_before(target)
            assert point.sample == int(samples_list[max(expected - 1, 0)])
            assert index.point_at_or_before(np.int64(target)) == point
            assert index.points_through(np.int32(max(target, -(2**31)))) == int(
                np.searchsorted(samples_list, max(target, -(2**31)), side="right")
            )
            after = index.first_point_after(target)
            assert (after is None) == (expected == len(samples_list))
            byte = target // 3
            assert index.points_through_byte(byte) == int(
                np.searchsorted(offsets_list, byte, side="right")
            )
            index.expect(target)  # a hint: any sample, never an error
            index.expect(np.int64(target))
            index.expect(float(target))  # type: ignore[arg-type]
    del samples, offsets, buffer
    room.close()


def test_a_seek_index_pickles_as_its_points() -> None:
    """Another process gets the points and finds its own columns' addresses."""
    samples = np.arange(0, 4096 * 2000, 4096, dtype=np.int64)
    index = SeekIndex(samples, samples // 3)
    copy = pickle.loads(pickle.dumps(index))
    assert copy._addresses == (address_of(copy.samples), address_of(copy.byte_offsets))
    assert copy.point_at_or_before(4096 * 700 + 5) == index.point_at_or_before(4096 * 700 + 5)


@pytest.mark.parametrize(
    ("seconds", "rate", "frames"),
    [
        (0.5, 16000, 8000),
        (1 / 3, 3, 1),
        (0.00003125, 16000, 1),
        (0.000031249, 16000, 0),
        (2.5, 1, 3),
        (3.5, 1, 4),
        (10.0123, 16000, 160197),
        (1e-9, 16000, 0),
    ],
)
def test_frames_round_half_up_like_lhotse(seconds: float, rate: int, frames: int) -> None:
    assert seconds_to_frames(seconds, rate) == frames


def test_pcm_conversions_keep_the_top_bits() -> None:
    s24 = bytes([0x00, 0x34, 0x12, 0xFF, 0xFF, 0xFF, 0x00, 0x00, 0x80])
    assert packed_to_s16(s24, "s24").tolist() == [0x1234, -1, -32768]
    f32 = np.array([0.5, -1.0, 1.0, 1.5, 0.5 / 32768, 1.5 / 32768], dtype="<f4").tobytes()
    assert packed_to_s16(f32, "f32").tolist() == [16384, -32768, 32767, 32767, 0, 2]
    assert packed_to_s16(bytes([0, 128, 255]), "u8").tolist() == [-32768, 0, 32512]


def test_float_samples_convert_as_lrintf_of_the_scaled_value_in_double() -> None:
    """32-bit samples are converted in 32-bit arithmetic: the integers must be those of
    the exact computation, ``lrint(x * 32768.0)`` in double and clipped, for a spread
    of every finite float32 (one bit pattern in 4099), halfway cases and clipping."""
    patterns = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32)
    values = patterns.view(np.float32)
    halfway = (np.arange(-40, 40, dtype=np.float32) + np.float32(0.5)) / np.float32(32768)
    values = np.concatenate([values[np.isfinite(values)], halfway, [np.float32(np.inf)]])
    expected = np.clip(np.rint(values.astype(np.float64) * 32768.0), -32768, 32767)
    assert np.array_equal(float_to_s16(values), expected.astype(np.int16))
    out = np.empty((len(values) // 2, 2), dtype=np.int16)
    float_to_s16(values[: 2 * len(out)].reshape(-1, 2), out=out)
    assert np.array_equal(out.ravel(), expected[: 2 * len(out)].astype(np.int16))


def test_float_samples_in_place_convert_as_into_a_new_array() -> None:
    values = np.array([0.5, -1.0, 1.0, 1.5, 0.5 / 32768, 1.5 / 32768, np.inf], dtype=np.float32)
    expected = float_to_s16(values)
    assert np.array_equal(float_to_s16(values.copy(), in_place=True), expected)
    with pytest.raises(ValueError):
        float_to_s16(values.astype(np.float64), in_place=True)


@pytest.mark.parametrize("sample_format", ["fltp", "flt"])
@pytest.mark.parametrize("layout", ["mono", "stereo", "5.1"])
def test_float_staging_gathers_parts_of_frames_in_place(sample_format: str, layout: str) -> None:
    """Frames of a float decoder, each taken from some sample on, gathered and converted:
    the integers of the whole signal converted at once, in double, for planar and packed
    PyAV frames of 1, 2 and 6 channels."""
    channels = {"mono": 1, "stereo": 2, "5.1": 6}[layout]
    rng = np.random.default_rng(channels)
    signal = rng.uniform(-1.1, 1.1, size=(1000, channels)).astype(np.float32)
    sizes, skips = [120, 240, 7, 480, 153], [30, 0, 3, 0, 0]
    staging = FloatStaging(sum(sizes) - sum(skips), channels, sample_format)
    kept, at, start = [], 0, 0
    for size, skip in zip(sizes, skips, strict=True):
        part = signal[start : start + size]
        array = part.T.copy() if sample_format == "fltp" else part.reshape(1, -1).copy()
        frame = av.AudioFrame.from_ndarray(array, format=sample_format, layout=layout)
        staging.put(frame, skip, size - skip, at)
        kept.append(part[skip:])
        at, start = at + size - skip, start + size
    output = np.empty((at, channels), dtype=np.int16)
    staging.convert_into(output)
    wanted = np.concatenate(kept).astype(np.float64) * 32768.0
    assert np.array_equal(output, np.clip(np.rint(wanted), -32768, 32767).astype(np.int16))
    other = "flt" if sample_format == "fltp" else "fltp"
    with pytest.raises(CorruptDataError, match="changed"):
        staging.put(av.AudioFrame(format=other, layout=layout, samples=4), 0, 4, 0)


def test_riff_parser_finds_data_after_other_chunks() -> None:
    fmt = struct.pack("<HHIIHH", 1, 1, 8000, 16000, 2, 16)
    body = (
        b"WAVE"
        + b"LIST"
        + struct.pack("<I", 3)
        + b"abc\0"
        + b"fmt "
        + struct.pack("<I", 16)
        + fmt
        + b"data"
        + struct.pack("<I", 0xFFFFFFFF)
        + bytes(10)
    )
    wave_info = parse_riff_wave(memoryview(b"RIFF" + struct.pack("<I", len(body)) + body))
    assert wave_info is not None
    assert (wave_info.num_frames, wave_info.sample_format) == (5, "s16")
    assert parse_riff_wave(memoryview(b"RIFF\0\0\0\0WAVEjunk")) is None


_RATES = st.sampled_from([8000, 16000, 22050, 24000, 44100, 48000])


@settings(max_examples=40, deadline=None)
@given(_RATES, _RATES, st.data())
def test_any_slice_of_a_resampled_signal_equals_resample_poly(
    source_rate: int, target_rate: int, data: st.DataObject
) -> None:
    from scipy.signal import resample_poly  # noqa: PLC0415 - the independent reference

    resampler = Resampler(source_rate, target_rate)
    signal = np.random.default_rng(source_rate + target_rate).normal(size=(3001, 2)) * 1000
    expected = resample_poly(signal, resampler.up, resampler.down, axis=0)
    total = resampler.output_frames(len(signal))
    assert total == len(expected)
    first = data.draw(st.integers(0, total - 1))
    end = data.draw(st.integers(first + 1, total))
    low, high = resampler.input_span(first, end, len(signal))
    actual = resampler.resample(signal[low:high], low, first, end)
    assert np.abs(actual - expected[first:end]).max() < 1e-6


@given(
    st.lists(
        st.one_of(
            st.floats(0, 7 * 24 * 3600, allow_nan=False),
            st.integers(0, 10**7).map(lambda n: n / 32000),  # exact half frames at 16 kHz
            st.integers(0, 10**6).map(lambda n: n * 0.01 + 0.005),
        ),
        min_size=1,
        max_size=60,
    ),
    st.sampled_from([8000, 16000, 22050, 44100, 48000, 768000]),
)
def test_vectorised_frames_round_as_lhotse_does(seconds: list[float], rate: int) -> None:
    from cutfs.codec.packing.partition_packer import _frames  # noqa: PLC0415 - the one place it is tested

    values = np.array(seconds, dtype=np.float64)
    got = _frames(values, np.full(len(values), rate, dtype=np.int64))
    assert got.tolist() == [seconds_to_frames(value, rate) for value in seconds]


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        st.lists(st.integers(-2000, 10**7), min_size=2, max_size=50),
        # past a page of points: searched first in the page interpolation points to
        st.lists(st.integers(-2000, 10**7), min_size=600, max_size=1500),
    ),
    st.integers(-3000, 10**7 + 10),
)
def test_an_unchecked_seek_index_never_gives_a_point_out_of_order(
    samples: list[int], target: int
) -> None:
    """Views of a mapped table are not checked whole: a search either finds a point that is
    in order where it was found, or refuses; it never hands the decoder a wrong point."""
    offsets = np.arange(len(samples), dtype=np.int64) * 100
    index = SeekIndex(np.array(samples, dtype=np.int64), offsets, sorted_checked=False)
    index.expect(target)  # a hint: never an error, whatever the columns hold
    try:
        point = index.point_at_or_before(target)
    except ShardFormatError:
        assert samples != sorted(samples)
        return
    assert point.sample <= target or point.sample == samples[0]
    try:
        after = index.first_point_after(target)
    except ShardFormatError:
        assert samples != sorted(samples)
        return
    assert after is None or after.sample > target
    if samples == sorted(samples) and after is not None:
        assert after.byte_offset >= point.byte_offset


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 400), st.integers(1, 120)),
        min_size=1,
        max_size=40,
    ),
    st.integers(600, 3000),
)
def test_the_block_cache_serves_exactly_what_it_was_given(
    puts: list[tuple[int, int, int]], capacity_bytes: int
) -> None:
    """Blocks of any length put in any order: a lookup returns pieces and gaps that tile
    the range, every piece holds the frames of the signal at its place, and the cache
    never holds more bytes than its capacity (the index stays in step with evictions)."""
    cache = BlockCache(capacity_bytes)
    signal = np.arange(1000, dtype=np.int16).reshape(-1, 1)  # frame n holds n
    for recording, start, length in puts:
        cache.put(recording, start, (signal[start : start + length] + recording).copy())
        statistics = cache.statistics()
        assert statistics.bytes <= capacity_bytes
        for probe in range(4):
            pieces, gaps = cache.lookup(probe, 50, 450)
            spans = sorted([(s, s + len(p)) for s, p in pieces] + gaps)
            assert spans[0][0] == 50 and spans[-1][1] == 450
            assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
            for piece_start, piece in pieces:
                wanted = signal[piece_start : piece_start + len(piece)] + probe
                assert np.array_equal(piece, wanted)
    assert cache.statistics().blocks <= len(puts)


def test_the_block_cache_drops_blocks_a_new_one_overlaps() -> None:
    cache = BlockCache(1 << 20)
    cache.put(0, 10, np.zeros((10, 1), np.int16))  # [10, 20)
    cache.put(0, 30, np.zeros((10, 1), np.int16))  # [30, 40)
    cache.put(0, 15, np.ones((20, 1), np.int16))  # [15, 35) overlaps both
    pieces, gaps = cache.lookup(0, 0, 50)
    assert [(start, len(piece)) for start, piece in pieces] == [(15, 20)]
    assert gaps == [(0, 15), (35, 50)]
    view = np.ones((100, 1), np.int16)[10:20]
    cache.put(1, 0, view)  # a view is copied: the cache counts what it holds
    assert cache.statistics().bytes == 40 + 20 + 2 * BLOCK_OVERHEAD_BYTES
