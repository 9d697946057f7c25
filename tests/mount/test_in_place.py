"""Sources mounted in place, without packing: Lhotse manifests and Kaldi directories.

Every cut is compared with ffmpeg's full decode of the original file; what is
indexed when, and what the second mount reuses, is read from the mount's own
statistics and the index cache on disk.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from scipy.signal import resample_poly
from support.corpus import wav_header
from support.mounts import CUTFS, mounted, needs_fuse
from support.references import (
    Reference,
    close_enough,
    cut_path,
    cut_plan,
    expected_cut,
    expected_file,
    pyav_decode,
    recording_id,
)

pytestmark = [pytest.mark.mount, needs_fuse]


def stats(mountpoint: str) -> dict[str, dict[str, object]]:
    with open(os.path.join(mountpoint, ".cutfs", "stats")) as stats_file:
        loaded: dict[str, dict[str, object]] = json.load(stats_file)
    return loaded


def allow_corpus(corpus: dict[str, str]) -> tuple[str, str]:
    """The mount option that lets manifests here name the corpus's files (which lie elsewhere)."""
    return ("--allow-root", os.path.dirname(next(iter(corpus.values()))))


def plan_files(cache: str) -> dict[str, int]:
    """Every plan in an index cache, with its modification time."""
    found = {}
    for directory, _, names in os.walk(cache):
        for name in names:
            if os.path.basename(directory) == "plans" and name.endswith(".arrow"):
                found[name] = os.stat(os.path.join(directory, name)).st_mtime_ns
    return found


@pytest.fixture(scope="module")
def lhotse_in_place(
    tmp_path_factory: pytest.TempPathFactory, lhotse_manifests: list[str], corpus: dict[str, str]
) -> Iterator[tuple[str, str]]:
    cache = str(tmp_path_factory.mktemp("index-cache"))
    mountpoint = str(tmp_path_factory.mktemp("in-place"))
    source = os.path.dirname(lhotse_manifests[0])
    options = ("--cache-dir", cache, "--serving-processes", "2", *allow_corpus(corpus))
    with mounted(source, mountpoint, *options) as path:
        yield path, cache


def test_lhotse_sizes_come_from_the_manifest_without_decoding(
    lhotse_in_place: tuple[str, str], references: dict[str, Reference]
) -> None:
    mountpoint, _ = lhotse_in_place
    for cut in cut_plan(references):
        samples, _ = expected_cut(cut, references)
        assert os.stat(cut_path(mountpoint, str(cut["id"]))).st_size == 44 + 2 * len(samples)
    counters = stats(mountpoint)["counters"]
    assert counters.get("decodes", 0) == 0
    assert counters.get("recordings_indexed", 0) == 0


def test_lhotse_in_place_every_cut_equals_the_full_decode(
    lhotse_in_place: tuple[str, str], references: dict[str, Reference]
) -> None:
    mountpoint, _ = lhotse_in_place
    for cut in cut_plan(references):
        with open(cut_path(mountpoint, str(cut["id"])), "rb") as cut_file:
            actual = cut_file.read()
        reference = next(r for n, r in references.items() if recording_id(n) == cut["recording"])
        assert close_enough(actual, expected_file(cut, references), reference.lossless), cut["id"]
    shards = stats(mountpoint)["shards"]
    assert shards["kind"] == "Lhotse manifests"
    assert shards["manifest_mismatches"] == 0


def test_second_mount_reuses_the_index(
    tmp_path: Path,
    lhotse_manifests: list[str],
    references: dict[str, Reference],
    corpus: dict[str, str],
) -> None:
    cache = str(tmp_path / "cache")
    source = os.path.dirname(lhotse_manifests[0])
    cuts = cut_plan(references)
    allow = allow_corpus(corpus)
    with mounted(source, str(tmp_path / "first"), "--cache-dir", cache, *allow) as mountpoint:
        for cut in cuts:
            with open(cut_path(mountpoint, str(cut["id"])), "rb") as cut_file:
                cut_file.read()
    plans = plan_files(cache)
    assert len(plans) == len(references)  # one plan per recording, made on first use
    with mounted(source, str(tmp_path / "second"), "--cache-dir", cache, *allow) as mountpoint:
        for cut in cuts[:12]:
            with open(cut_path(mountpoint, str(cut["id"])), "rb") as cut_file:
                expected = expected_file(cut, references)
                assert close_enough(cut_file.read(), expected, False)
    assert plan_files(cache) == plans  # nothing was indexed again


def test_kaldi_directory_in_place_is_indexed_on_first_lookup(
    tmp_path: Path, corpus: dict[str, str], references: dict[str, Reference]
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    chosen = ["flac_mono_16k", "mp3_cbr_mono_16k", "opus_mono_16k"]
    paths = {recording_id(name): path for name, path in corpus.items()}
    (data / "wav.scp").write_text(
        f"flac_mono_16k {paths['flac_mono_16k']}\n"
        f"mp3_cbr_mono_16k {paths['mp3_cbr_mono_16k']}\n"
        f"opus_mono_16k\t{paths['opus_mono_16k']}\n"  # Kaldi files may use tabs
    )
    segments = [(f"{rec}-{n}", rec, 2.0 + 7 * n, 6.5 + 7 * n) for rec in chosen for n in range(3)]
    (data / "segments").write_text(
        "".join(f"{utt} {rec} {start} {end}\n" for utt, rec, start, end in segments)
    )
    (data / "text").write_text("".join(f"{utt} words of {utt}\n" for utt, *_ in segments))
    options = ("--cache-dir", str(tmp_path / "cache"), *allow_corpus(corpus))
    with mounted(str(data), str(tmp_path / "mnt"), *options) as mnt:
        listed = sorted(os.listdir(os.path.join(mnt, "cuts")))
        assert listed == sorted(["metadata.jsonl", *(f"{utt}.wav" for utt, *_ in segments)])
        assert stats(mnt)["counters"].get("recordings_indexed", 0) == 0  # listing indexes nothing
        with open(os.path.join(mnt, "segments")) as segments_file:  # needs every length
            lines = sorted(line.split() for line in segments_file)
        assert lines == sorted([utt, utt, "0.000", "4.500000"] for utt, *_ in segments)
        assert stats(mnt)["counters"]["recordings_indexed"] == len(chosen)
        for utt, rec, start, end in segments:
            cut = {"id": utt, "recording": rec, "start": start, "duration": end - start}
            expected = expected_file(cut, references)
            path = cut_path(mnt, utt)
            assert os.stat(path).st_size == len(expected)
            with open(path, "rb") as cut_file:
                assert close_enough(cut_file.read(), expected, rec.startswith("flac")), utt
        counters = stats(mnt)["counters"]
        assert counters["recordings_indexed"] == len(chosen)  # each was indexed once
        # The serving process that did not index a recording read its plan from the cache.
        assert counters.get("plans_loaded", 0) <= len(chosen)


def _manifests_with_declared(
    directory: Path,
    corpus: dict[str, str],
    declared: dict[str, tuple[int, int]],
    cuts: list[dict[str, object]],
) -> str:
    """Lhotse manifests whose recordings declare the given (sampling rate, num_samples)."""
    directory.mkdir()
    with open(directory / "recordings.jsonl", "w") as out:
        for name, (rate, frames) in declared.items():
            source = {"type": "file", "channels": [0], "source": corpus[name]}
            item = {
                "id": recording_id(name),
                "sources": [source],
                "sampling_rate": rate,
                "num_samples": frames,
                "duration": frames / rate,
                "channel_ids": [0],
            }
            out.write(json.dumps(item) + "\n")
    with open(directory / "cuts.jsonl", "w") as out:
        for cut in cuts:
            out.write(json.dumps({"type": "MonoCut", "channel": 0, **cut}) + "\n")
    return str(directory)


def _cut(cut_id: str, recording: str, start: float, duration: float) -> dict[str, object]:
    return {"id": cut_id, "recording_id": recording, "start": start, "duration": duration}


def test_manifest_that_disagrees_with_the_audio_follows_lhotse(
    tmp_path: Path, corpus: dict[str, str], references: dict[str, Reference]
) -> None:
    flac, mp3, opus = "flac_mono_16k.flac", "mp3_cbr_mono_16k.mp3", "opus_stereo_48k.opus"
    flac_frames = len(references[flac].samples)
    mp3_frames = len(references[mp3].samples)
    padded = 150  # within Lhotse's default tolerance (0.5 s, 8000 frames at 16 kHz)
    declared = {
        flac: (16000, flac_frames + padded),
        mp3: (16000, mp3_frames + 16000),  # a second more than the audio: beyond tolerance
        opus: (16000, 16000 * 30),  # 2 channels, where the manifest names 1 (see below)
    }
    tail_start = (flac_frames - 32000) / 16000
    cuts = [
        _cut("flac-tail", "flac_mono_16k", tail_start, 2.0 + padded / 16000),
        _cut("mp3-middle", "mp3_cbr_mono_16k", 3.0, 4.0),
        _cut("mp3-tail", "mp3_cbr_mono_16k", mp3_frames / 16000 - 1, 2.0),
        _cut("opus", "opus_stereo_48k", 1.0, 1.0),
    ]
    source = _manifests_with_declared(tmp_path / "manifests", corpus, declared, cuts)
    options = ("--cache-dir", str(tmp_path / "cache"), *allow_corpus(corpus))
    with mounted(source, str(tmp_path / "mnt"), *options) as mnt:
        # Shorter audio within tolerance: Lhotse pads what it loads by reflection.
        loaded = references[flac].samples[flac_frames - 32000 :, 0]
        expected = np.pad(loaded, (0, padded), mode="reflect")
        with open(cut_path(mnt, "flac-tail"), "rb") as cut_file:
            data = cut_file.read()
        assert data[:44] == wav_header(16000, 1, len(expected))
        assert np.array_equal(np.frombuffer(data[44:], dtype="<i2"), expected)
        whole = os.path.join(mnt, "recordings", "flac_mono_16k.wav")
        assert os.stat(whole).st_size == 44 + 2 * (flac_frames + padded)
        # Beyond tolerance: that read fails, the rest of the recording is served.
        with open(cut_path(mnt, "mp3-middle"), "rb") as cut_file:
            assert len(cut_file.read()) == 44 + 2 * 64000
        for failing in ("mp3-tail", "opus"):
            with pytest.raises(OSError) as raised, open(cut_path(mnt, failing), "rb") as cut_file:
                cut_file.read()
            assert raised.value.errno == errno.EIO
        snapshot = stats(mnt)
        assert snapshot["errors"].get("manifest_mismatch", 0) >= 2
        assert snapshot["counters"]["manifest_mismatches"] >= 1  # the padded FLAC, logged


def test_opus_declared_at_the_rate_it_was_encoded_at_is_served_at_that_rate(
    tmp_path: Path, corpus: dict[str, str]
) -> None:
    """Lhotse's ``Recording.from_file`` declares an Opus file at the rate in its header,
    the rate of the audio that was encoded (GigaSpeech's manifests too), and Lhotse loads
    it at that rate; FFmpeg decodes every Opus stream at 48 kHz.  Such a recording is
    served at the declared rate: the whole decode resampled (the filter of
    ``scipy.signal.resample_poly``), cut where each file starts.  (Before, every read of
    it failed with EIO: "the manifest declares 16000 Hz; the audio has 48000 Hz".)"""
    name = "opus_mono_16k.opus"
    decoded = pyav_decode(corpus[name])[:, 0]
    resampled = resample_poly(decoded.astype(np.float64), 1, 3)
    expected = np.clip(np.rint(resampled), -32768, 32767).astype(np.int16)
    assert len(expected) == -(-len(decoded) // 3)
    cuts = [
        _cut("opus-start", "opus_mono_16k", 0.0, 1.5),
        _cut("opus-middle", "opus_mono_16k", 7.25, 10.0),
        _cut("opus-end", "opus_mono_16k", len(expected) / 16000 - 2.0, 2.0),
    ]
    declared = {name: (16000, len(expected))}
    source = _manifests_with_declared(tmp_path / "manifests", corpus, declared, cuts)
    options = ("--cache-dir", str(tmp_path / "cache"), *allow_corpus(corpus))
    with mounted(source, str(tmp_path / "mnt"), *options) as mnt:
        for cut in cuts:
            first = round(float(cut["start"]) * 16000)  # type: ignore[arg-type]
            frames = round(float(cut["duration"]) * 16000)  # type: ignore[arg-type]
            with open(cut_path(mnt, str(cut["id"])), "rb") as cut_file:
                data = cut_file.read()
            assert data[:44] == wav_header(16000, 1, frames), cut["id"]
            served = np.frombuffer(data[44:], dtype="<i2").astype(np.int32)
            wanted = expected[first : first + frames].astype(np.int32)
            # resample_poly sums in another order: floating-point rounding, 1 LSB at most.
            assert int(np.abs(served - wanted).max()) <= 1, cut["id"]
        whole = os.path.join(mnt, "recordings", "opus_mono_16k.wav")
        assert os.stat(whole).st_size == 44 + 2 * len(expected)
        snapshot = stats(mnt)
        assert snapshot["errors"].get("manifest_mismatch", 0) == 0
        assert snapshot["counters"].get("manifest_mismatches", 0) == 0


def test_unreadable_source_is_refused_with_a_message(tmp_path: Path) -> None:
    empty = tmp_path / "nothing-here"
    empty.mkdir()
    (tmp_path / "mnt").mkdir()
    result = subprocess.run(
        [*CUTFS, "mount", "--cache-dir", str(tmp_path / "c"), str(empty), str(tmp_path / "mnt")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 3
    assert "no manifests, datasets or audio files were found" in result.stderr
