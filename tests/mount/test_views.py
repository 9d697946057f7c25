"""The mount's manifests, time ranges made on lookup, and windows, read through real mounts."""

from __future__ import annotations

import errno
import gzip
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from support.corpus import wav_header
from support.mounts import CUTFS, mounted, needs_fuse
from support.references import Reference, cut_path, cut_plan, expected_cut

from cutfs.codec.catalogue.path_escape import escape_id

pytestmark = [pytest.mark.mount, needs_fuse]


def read(path: str) -> bytes:
    with open(path, "rb") as opened:
        return opened.read()


def samples_of(wav: bytes) -> np.ndarray:
    return np.frombuffer(wav[44:], dtype="<i2")


def test_kaldi_files_describe_the_cut_files(mount: str, references: dict[str, Reference]) -> None:
    cuts = {str(cut["id"]): cut for cut in cut_plan(references)}
    scp = dict(line.split(" ", 1) for line in read(f"{mount}/wav.scp").decode().splitlines())
    segments = [line.split(" ") for line in read(f"{mount}/segments").decode().splitlines()]
    keys = [fields[0] for fields in segments]
    assert keys == sorted(keys, key=lambda key: key.encode()) == sorted(scp, key=str.encode)
    for key, recording, start, end in segments:
        assert recording == key and start == "0.000"
        if key in cuts:  # ids with whitespace are percent-encoded keys
            samples, rate = expected_cut(cuts[key], references)
            assert round(float(end) * rate) == len(samples)
            assert os.stat(scp[key]).st_size == 44 + 2 * len(samples)
    text = dict(line.split(" ", 1) for line in read(f"{mount}/text").decode().splitlines())
    assert set(text.values()) == {"hello world"} and set(text) == set(scp)
    utt2spk = read(f"{mount}/utt2spk").decode().splitlines()
    assert {line.split(" ", 1)[1] for line in utt2spk} == {"spk1"}
    spk2utt = read(f"{mount}/spk2utt").decode().split()
    assert spk2utt[0] == "spk1" and sorted(spk2utt[1:]) == sorted(scp)


def test_lhotse_manifest_points_at_the_cut_files(
    mount: str, references: dict[str, Reference]
) -> None:
    cuts = {str(cut["id"]): cut for cut in cut_plan(references)}
    lines = gzip.decompress(read(f"{mount}/cuts.jsonl.gz")).decode().splitlines()
    assert len(lines) == len(cuts)
    for line in lines:
        item = json.loads(line)
        recording = item["recording"]
        samples, rate = expected_cut(cuts[item["id"]], references)
        assert (recording["num_samples"], recording["sampling_rate"]) == (len(samples), rate)
        assert round(item["duration"] * rate) == len(samples)
        path = recording["sources"][0]["source"]
        assert path == cut_path(mount, item["id"])
        assert os.stat(path).st_size == 44 + 2 * len(samples)
        supervision = item["supervisions"][0]
        assert (supervision["text"], supervision["speaker"]) == ("hello world", "spk1")
        assert supervision["start"] == 0.0


def test_audiofolder_metadata_lists_every_cut(mount: str, references: dict[str, Reference]) -> None:
    rows = [json.loads(line) for line in read(f"{mount}/cuts/metadata.jsonl").splitlines()]
    assert len(rows) == len(cut_plan(references))
    for row in rows:
        assert os.path.isfile(os.path.join(mount, "cuts", row["file_name"]))
        assert row["text"] == "hello world" and row["speaker"] == "spk1"


def test_nemo_manifest_lists_the_cut_files(mount: str, references: dict[str, Reference]) -> None:
    """NeMo's manifest format: one JSON object per line with ``audio_filepath``, ``duration``
    (seconds), ``offset`` and ``text`` (NeMo's ``ASRAudioText`` reads exactly these keys)."""
    cuts = {cut_path(mount, str(cut["id"])): cut for cut in cut_plan(references)}
    rows = [json.loads(line) for line in read(f"{mount}/nemo.jsonl").splitlines()]
    assert len(rows) == len(cuts)
    for row in rows:
        assert set(row) == {"audio_filepath", "duration", "offset", "text"}
        samples, rate = expected_cut(cuts[row["audio_filepath"]], references)
        assert round(row["duration"] * rate) == len(samples) and row["offset"] == 0.0
        assert row["text"] == "hello world"
        assert os.stat(row["audio_filepath"]).st_size == 44 + 2 * len(samples)


def test_pyannote_reads_the_uem_and_rttm(mount: str, references: dict[str, Reference]) -> None:
    """pyannote.database's own loaders: whole recordings, and one speaker turn per cut placed
    where the cut lies in its recording."""
    from pyannote.database.util import load_rttm, load_uem  # noqa: PLC0415 - compat extra

    uem = load_uem(f"{mount}/recordings.uem")
    for name, reference in references.items():
        uri = name.rsplit(".", 1)[0]
        (segment,) = list(uem[uri])
        assert segment.start == 0 and round(segment.end * reference.rate) == len(reference.samples)
    annotations = load_rttm(f"{mount}/supervisions.rttm")
    cuts = [cut for cut in cut_plan(references) if cut["recording"] == "mp3_cbr_mono_16k"]
    turns = sorted(
        (round(segment.start, 3), round(segment.duration, 3))
        for segment, _, speaker in annotations["mp3_cbr_mono_16k"].itertracks(yield_label=True)
        if speaker == "spk1"
    )
    assert turns == sorted((round(c["start"], 3), round(c["duration"], 3)) for c in cuts)


def test_any_time_range_resolves_on_lookup(mount: str, references: dict[str, Reference]) -> None:
    flac = references["flac_mono_16k.flac"]
    path = os.path.join(mount, "recordings", "flac_mono_16k", "1.25-3.5.wav")
    data = read(path)
    assert data[:44] == wav_header(16000, 1, 36000)
    assert np.array_equal(samples_of(data), flac.samples[20000:56000, 0])
    opus = references["opus_stereo_48k.opus"]
    data = read(os.path.join(mount, "recordings", "opus_stereo_48k", "29-30.wav"))
    expected = opus.samples[29 * 48000 : 30 * 48000].reshape(-1)
    assert np.abs(samples_of(data).astype(int) - expected).max() <= 1
    listed = os.listdir(os.path.join(mount, "recordings"))
    assert "flac_mono_16k" not in listed and "flac_mono_16k.wav" in listed
    for bad in ("3.5-1.25.wav", "0-31.wav", "1-2.flac", "a-b.wav", "2-2.wav"):
        with pytest.raises(OSError) as raised:
            os.stat(os.path.join(mount, "recordings", "flac_mono_16k", bad))
        assert raised.value.errno == errno.ENOENT
    with pytest.raises(FileNotFoundError):
        os.stat(os.path.join(mount, "recordings", "no_such_recording", "0-1.wav"))


def test_windows_cover_each_recording_with_overlap(
    tmp_path: Path, shard_dir: str, references: dict[str, Reference]
) -> None:
    with mounted(shard_dir, str(tmp_path / "mnt"), "--window", "10", "--overlap", "2") as mnt:
        names = os.listdir(os.path.join(mnt, "windows", "flac_mono_16k"))
        assert sorted(names, key=lambda n: float(n.split("-")[0])) == [
            "0-10.wav",
            "8-18.wav",
            "16-26.wav",
            "24-30.wav",
        ]
        flac = references["flac_mono_16k.flac"].samples[:, 0]
        for name in names:
            start, end = (round(float(t) * 16000) for t in name.removesuffix(".wav").split("-"))
            data = read(os.path.join(mnt, "windows", "flac_mono_16k", name))
            assert np.array_equal(samples_of(data), flac[start:end])
        stereo = references["flac_s24_stereo_48k.flac"].samples
        data = read(os.path.join(mnt, "windows", "flac_s24_stereo_48k", "8-18.wav"))
        assert data[:44] == wav_header(48000, 2, 480000)
        assert np.array_equal(samples_of(data), stereo[8 * 48000 : 18 * 48000].reshape(-1))
        recordings = os.listdir(os.path.join(mnt, "recordings"))
        windows = os.listdir(os.path.join(mnt, "windows"))
        assert sorted(windows) == sorted(name.removesuffix(".wav") for name in recordings)


def test_bad_window_options_are_refused(tmp_path: Path, shard_dir: str) -> None:
    result = subprocess.run(
        [*CUTFS, "mount", "--window", "5", "--overlap", "5", shard_dir, str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert "overlap" in result.stderr


def test_ids_with_slashes_have_range_directories(mount: str) -> None:
    # A recording id with "/" is not in the test corpus; cut ids are, and they make
    # directories under cuts/ that must not be mistaken for range directories.
    with pytest.raises(FileNotFoundError):
        os.stat(os.path.join(mount, "cuts", "spk1", "sess2", "utt3", "0-1.wav"))
    assert os.path.isfile(os.path.join(mount, "cuts", escape_id("spk1/sess2/utt3")))


# -- output formats -------------------------------------------------------------------------


def resampled(reference: Reference, rate: int) -> np.ndarray:
    """scipy's resample_poly of ffmpeg's full decode, rounded to 16 bits (the reference)."""
    from math import gcd  # noqa: PLC0415

    from scipy.signal import resample_poly  # noqa: PLC0415

    divisor = gcd(reference.rate, rate)
    full = resample_poly(
        reference.samples.astype(np.float64), rate // divisor, reference.rate // divisor, axis=0
    )
    return np.clip(np.rint(full), -32768, 32767).astype(np.int16)


def assert_within(actual: np.ndarray, expected: np.ndarray, lsb: int) -> None:
    assert actual.shape == expected.shape
    assert int(np.abs(actual.astype(np.int32) - expected.astype(np.int32)).max()) <= lsb


def test_resampled_files_equal_the_resampled_recording(
    tmp_path: Path, shard_dir: str, references: dict[str, Reference]
) -> None:
    stereo = references["flac_s24_stereo_48k.flac"]
    mp3 = references["mp3_noxing_mono_22k.mp3"]
    with mounted(shard_dir, str(tmp_path / "mnt"), "--sample-rate", "16000") as mnt:
        whole = resampled(stereo, 16000)
        assert len(whole) == -(-len(stereo.samples) // 3)
        data = read(os.path.join(mnt, "recordings", "flac_s24_stereo_48k.wav"))
        assert data[:44] == wav_header(16000, 2, len(whole))
        # Lossless source: only the rounding of two float computations may differ.
        assert_within(samples_of(data).reshape(-1, 2), whole, 1)
        # A cut of channel 0 starting at 10.0123 s: frame 480590 at 48 kHz, output 160197.
        data = read(cut_path(mnt, "flac_s24_stereo_48k/overlap-b"))
        assert data[:44] == wav_header(16000, 1, 160000)
        assert_within(samples_of(data), whole[160197 : 160197 + 160000, 0], 1)
        # 22 050 Hz -> 16 kHz (up 320, down 441), a lossy source within 1 LSB of ffmpeg.
        whole = resampled(mp3, 16000)
        data = read(os.path.join(mnt, "recordings", "mp3_noxing_mono_22k", "3-7.5.wav"))
        assert_within(samples_of(data), whole[48000:120000, 0], 2)
        lines = gzip.decompress(read(f"{mnt}/cuts.jsonl.gz")).decode().splitlines()
        for item in map(json.loads, lines):
            recording = item["recording"]
            assert recording["sampling_rate"] == 16000
            size = os.stat(recording["sources"][0]["source"]).st_size
            assert size == 44 + 2 * recording["num_samples"] * len(recording["channel_ids"])


def test_float32_files_are_the_decode_scaled(
    tmp_path: Path, shard_dir: str, references: dict[str, Reference]
) -> None:
    """16-bit samples served as float32 are each sample divided by 32768, exactly (the
    reference is ffmpeg's decode, the division done in float64)."""
    import soundfile  # noqa: PLC0415

    stereo = references["flac_s24_stereo_48k.flac"].samples.astype(np.float64)
    with mounted(shard_dir, str(tmp_path / "mnt"), "-o", "float32") as mnt:
        path = os.path.join(mnt, "recordings", "flac_s24_stereo_48k", "1-2.wav")
        data = read(path)
        assert len(data) == 44 + 4 * 2 * 48000 and data[20:22] == b"\x03\x00"  # IEEE float
        expected = (stereo[48000:96000] / 32768).astype(np.float32)
        assert np.array_equal(np.frombuffer(data[44:], dtype="<f4").reshape(-1, 2), expected)
        samples, rate = soundfile.read(path, dtype="float32")
        assert rate == 48000 and np.array_equal(samples, expected)


def test_mono_float32_files(
    tmp_path: Path, shard_dir: str, references: dict[str, Reference]
) -> None:
    import soundfile  # noqa: PLC0415

    stereo = references["flac_s24_stereo_48k.flac"].samples.astype(np.float64)
    with mounted(shard_dir, str(tmp_path / "mnt"), "-o", "mono,float32") as mnt:
        path = os.path.join(mnt, "recordings", "flac_s24_stereo_48k", "1-2.wav")
        data = read(path)
        assert len(data) == 44 + 4 * 48000 and data[20:22] == b"\x03\x00"  # IEEE float
        expected = (stereo[48000:96000].mean(axis=1) / 32768).astype(np.float32)
        assert np.array_equal(np.frombuffer(data[44:], dtype="<f4"), expected)
        samples, rate = soundfile.read(path, dtype="float32")
        assert rate == 48000 and np.array_equal(samples, expected)
