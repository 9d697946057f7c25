"""Users' own tools on a real mount: each reads cuts through its normal API, unmodified.

Expected samples are ffmpeg's full decode of the original recordings (the
``references`` fixture).  ``scripts/compat.py`` runs this module and writes the
compatibility table in docs/compat.md with the versions used.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import wave
from pathlib import Path

import numpy as np
import pytest
import soundfile
from support.mounts import needs_fuse
from support.references import Reference, cut_path, cut_plan, expected_cut

pytestmark = [pytest.mark.mount, needs_fuse]

#: Cuts every client reads: a FLAC, an MP3 and a stereo-Opus-channel cut.
SAMPLE_IDS = ("flac_mono_16k/overlap-b", "mp3_vbr_stereo_44k/channel1", "opus_mono_16k/end")


def _cuts(references: dict[str, Reference]) -> list[dict[str, object]]:
    chosen = {str(cut["id"]): cut for cut in cut_plan(references)}
    return [chosen[cut_id] for cut_id in SAMPLE_IDS]


def _int16(samples: np.ndarray) -> np.ndarray:
    """Float samples in [-1, 1) as the int16 values they were made from."""
    return np.round(np.asarray(samples, dtype=np.float64) * 32768).astype(np.int32)


def _assert_equal(actual: np.ndarray, expected: np.ndarray) -> None:
    """Equal within 1 LSB (the references of lossy codecs are within 1 LSB)."""
    assert actual.shape == expected.shape
    assert int(np.abs(actual.astype(np.int32) - expected.astype(np.int32)).max(initial=0)) <= 1


def test_python_wave(mount: str, references: dict[str, Reference]) -> None:
    for cut in _cuts(references):
        expected, rate = expected_cut(cut, references)
        with wave.open(cut_path(mount, str(cut["id"]))) as wav:
            assert (wav.getframerate(), wav.getnchannels()) == (rate, 1)
            frames = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
        _assert_equal(frames, expected[:, 0])


def test_soundfile(mount: str, references: dict[str, Reference]) -> None:
    for cut in _cuts(references):
        expected, rate = expected_cut(cut, references)
        samples, served_rate = soundfile.read(cut_path(mount, str(cut["id"])), dtype="int16")
        assert served_rate == rate
        _assert_equal(samples, expected[:, 0])


def test_torchcodec(mount: str, references: dict[str, Reference]) -> None:
    from torchcodec.decoders import AudioDecoder  # noqa: PLC0415 - compat extra

    for cut in _cuts(references):
        expected, rate = expected_cut(cut, references)
        decoded = AudioDecoder(cut_path(mount, str(cut["id"]))).get_all_samples()
        assert decoded.sample_rate == rate
        _assert_equal(_int16(decoded.data.numpy()[0]), expected[:, 0])


def test_lhotse_reads_the_mount_manifest(mount: str, references: dict[str, Reference]) -> None:
    from lhotse import CutSet  # noqa: PLC0415 - compat extra
    from lhotse.dataset import DynamicBucketingSampler  # noqa: PLC0415

    cuts = CutSet.from_file(os.path.join(mount, "cuts.jsonl.gz"))
    by_id = {cut.id: cut for cut in cuts}
    assert len(by_id) == len(cut_plan(references))
    for plan in _cuts(references):
        expected, rate = expected_cut(plan, references)
        cut = by_id[str(plan["id"])]
        assert cut.sampling_rate == rate and cut.num_samples == len(expected)
        assert cut.supervisions[0].text == "hello world"
        _assert_equal(_int16(cut.load_audio()[0]), expected[:, 0])
    sampler = DynamicBucketingSampler(cuts, max_duration=60.0, num_buckets=2, shuffle=True, seed=0)
    seen = [cut.id for batch in sampler for cut in batch]
    assert sorted(seen) == sorted(by_id)
    batch = next(iter(sampler))
    assert all(cut.load_audio().shape[1] == cut.num_samples for cut in batch)


def test_datasets_audiofolder(mount: str, references: dict[str, Reference]) -> None:
    from datasets import Audio, load_dataset  # noqa: PLC0415 - compat extra

    dataset = load_dataset("audiofolder", data_dir=os.path.join(mount, "cuts"), split="train")
    dataset = dataset.cast_column("audio", Audio(decode=False))
    assert len(dataset) == len(cut_plan(references))
    assert set(dataset["text"]) == {"hello world"} and set(dataset["speaker"]) == {"spk1"}
    paths = [audio["path"] for audio in dataset["audio"]]
    decoded = load_dataset("audiofolder", data_dir=os.path.join(mount, "cuts"), split="train")
    wanted = {cut_path(mount, str(cut["id"])): cut for cut in _cuts(references)}
    assert set(wanted) <= set(paths)
    for path, cut in wanted.items():
        expected, rate = expected_cut(cut, references)
        audio = decoded[paths.index(path)]["audio"]  # a torchcodec AudioDecoder in datasets 4+
        samples = audio.get_all_samples()
        assert samples.sample_rate == rate
        _assert_equal(_int16(samples.data.numpy()[0]), expected[:, 0])


def test_sox_ffprobe_ffmpeg(mount: str, references: dict[str, Reference], tmp_path: Path) -> None:
    for cut in _cuts(references):
        expected, rate = expected_cut(cut, references)
        path = cut_path(mount, str(cut["id"]))
        info = subprocess.run(["soxi", "-s", path], capture_output=True, text=True, check=True)
        assert int(info.stdout) == len(expected)
        raw = subprocess.run(
            ["sox", path, "-t", "raw", "-e", "signed", "-b", "16", "-"],
            capture_output=True,
            check=True,
        ).stdout
        _assert_equal(np.frombuffer(raw, dtype="<i2"), expected[:, 0])
        probe = subprocess.run(
            ["ffprobe", "-v", "error", "-show_streams", "-of", "json", path],
            capture_output=True,
            text=True,
            check=True,
        )
        stream = json.loads(probe.stdout)["streams"][0]
        assert (int(stream["sample_rate"]), stream["codec_name"]) == (rate, "pcm_s16le")
        decoded = subprocess.run(
            ["ffmpeg", "-v", "error", "-i", path, "-f", "s16le", "-"],
            capture_output=True,
            check=True,
        ).stdout
        _assert_equal(np.frombuffer(decoded, dtype="<i2"), expected[:, 0])


def test_lhotse_manifest_is_valid_gzip_jsonl(mount: str) -> None:
    with gzip.open(os.path.join(mount, "cuts.jsonl.gz"), "rt") as manifest:
        assert all(json.loads(line)["type"] in ("MonoCut", "MultiCut") for line in manifest)
