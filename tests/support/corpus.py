"""Local test audio: speech from espeak-ng mixed with noise, encoded by ffmpeg.

Nothing is downloaded.  Run as a script to make a small demo corpus::

    python tests/support/corpus.py OUTPUT_DIR
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from dataclasses import dataclass

import numpy as np

SENTENCES = (
    "Speech teams train models on short cuts of long recordings.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Loading a cut means a random read into a long compressed file.",
    "Every cut is an ordinary wave file with an exact size.",
)


@dataclass(frozen=True)
class Encoding:
    """One test file: its name and the ffmpeg output arguments that make it."""

    name: str
    rate: int
    channels: int
    ffmpeg_args: tuple[str, ...]
    lossless: bool


ENCODINGS = (
    Encoding("wav_s16_mono_16k.wav", 16000, 1, ("-c:a", "pcm_s16le"), True),
    Encoding("wav_s24_stereo_44k.wav", 44100, 2, ("-c:a", "pcm_s24le"), True),
    Encoding("wav_s32_mono_22k.wav", 22050, 1, ("-c:a", "pcm_s32le"), True),
    Encoding("wav_f32_stereo_16k.wav", 16000, 2, ("-c:a", "pcm_f32le"), True),
    Encoding("wav_u8_mono_8k.wav", 8000, 1, ("-c:a", "pcm_u8"), True),
    Encoding("flac_mono_16k.flac", 16000, 1, ("-c:a", "flac"), True),
    Encoding("flac_s24_stereo_48k.flac", 48000, 2, ("-c:a", "flac", "-sample_fmt", "s32"), True),
    Encoding("flac_6ch_16k.flac", 16000, 6, ("-c:a", "flac"), True),
    Encoding("mp3_cbr_mono_16k.mp3", 16000, 1, ("-c:a", "libmp3lame", "-b:a", "32k"), False),
    Encoding("mp3_vbr_stereo_44k.mp3", 44100, 2, ("-c:a", "libmp3lame", "-q:a", "4"), False),
    Encoding(
        "mp3_noxing_mono_22k.mp3",
        22050,
        1,
        ("-c:a", "libmp3lame", "-b:a", "48k", "-write_xing", "0"),
        False,
    ),
    Encoding("vorbis_mono_16k.ogg", 16000, 1, ("-c:a", "libvorbis", "-q:a", "3"), False),
    Encoding("vorbis_stereo_44k.ogg", 44100, 2, ("-c:a", "libvorbis"), False),
    Encoding("opus_mono_16k.opus", 16000, 1, ("-c:a", "libopus", "-b:a", "24k"), False),
    Encoding("opus_stereo_48k.opus", 48000, 2, ("-c:a", "libopus", "-b:a", "64k"), False),
    Encoding("aac_pns_mono_16k.m4a", 16000, 1, ("-c:a", "aac", "-b:a", "24k"), False),
    Encoding(
        "aac_nopns_stereo_44k.m4a",
        44100,
        2,
        ("-c:a", "aac", "-aac_pns", "0", "-b:a", "96k"),
        False,
    ),
    Encoding("aac_adts_mono_16k.aac", 16000, 1, ("-c:a", "aac", "-aac_pns", "0"), False),
)


def make_speech(path: str, seconds: float, rate: int, channels: int, seed: int = 0) -> str:
    """A WAV of speech and pink noise; each channel differs from the others."""
    work = path + ".parts"
    os.makedirs(work, exist_ok=True)
    voice = os.path.join(work, "voice.wav")
    text = " ".join(SENTENCES[(seed + i) % len(SENTENCES)] for i in range(len(SENTENCES)))
    subprocess.run(["espeak-ng", "-s", "150", "-w", voice, text], check=True)
    total = int(seconds * rate)
    speech = _read_resampled(voice, rate)
    rng = np.random.default_rng(seed)
    columns = []
    for channel in range(channels):
        repeats = -(-total // len(speech)) + 1
        shifted = np.roll(np.tile(speech, repeats), channel * rate // 7)[:total]
        noise = rng.standard_normal(total) * 0.02 * (channel + 1)
        columns.append(0.6 * shifted + noise)
    samples = np.clip(np.stack(columns, axis=1), -1.0, 1.0)
    raw = os.path.join(work, "mix.f32")
    samples.astype("<f4").tofile(raw)
    subprocess.run(
        [
            "ffmpeg",
            "-v",
            "error",
            "-y",
            "-f",
            "f32le",
            "-ar",
            str(rate),
            "-ac",
            str(channels),
            "-i",
            raw,
            "-c:a",
            "pcm_f32le",
            path,
        ],
        check=True,
    )
    for name in os.listdir(work):
        os.unlink(os.path.join(work, name))
    os.rmdir(work)
    return path


def synthesize(path: str, seconds: float, rate: int) -> str:
    """A mono 16-bit WAV of a frequency sweep plus pink noise: no two seconds alike,
    so a read shifted by even one sample cannot match.  Fast for hours of audio."""
    subprocess.run(
        [
            "sox",
            "-n",
            "-r",
            str(rate),
            "-c",
            "1",
            "-b",
            "16",
            path,
            "synth",
            str(seconds),
            "sine",
            "200-3000",
            "synth",
            str(seconds),
            "pinknoise",
            "mix",
        ],
        check=True,
    )
    return path


def _read_resampled(path: str, rate: int) -> np.ndarray:
    raw = subprocess.run(
        ["ffmpeg", "-v", "error", "-i", path, "-ac", "1", "-ar", str(rate), "-f", "f32le", "-"],
        check=True,
        capture_output=True,
    ).stdout
    return np.frombuffer(raw, dtype="<f4").astype(np.float64)


def encode(source_wav: str, encoding: Encoding, directory: str) -> str:
    path = os.path.join(directory, encoding.name)
    subprocess.run(
        ["ffmpeg", "-v", "error", "-y", "-i", source_wav, *encoding.ffmpeg_args, path],
        check=True,
    )
    return path


def make_corpus(directory: str, seconds: float = 60.0) -> dict[str, str]:
    """Every encoding in ENCODINGS, ``seconds`` long; returns name -> path."""
    os.makedirs(directory, exist_ok=True)
    sources: dict[tuple[int, int], str] = {}
    paths = {}
    for encoding in ENCODINGS:
        key = (encoding.rate, encoding.channels)
        if key not in sources:
            sources[key] = make_speech(
                os.path.join(directory, f".speech_{key[0]}_{key[1]}.wav"),
                seconds,
                *key,
                seed=len(sources),
            )
        paths[encoding.name] = encode(sources[key], encoding, directory)
    for source in sources.values():
        os.unlink(source)
    return paths


def ffmpeg_decode(path: str) -> tuple[np.ndarray, int, int]:
    """The reference: ffmpeg's full decode as int16 (frames, channels), rate, channels."""
    probe = (
        subprocess.run(
            [
                "ffprobe",
                "-v",
                "error",
                "-select_streams",
                "a:0",
                "-show_entries",
                "stream=sample_rate,channels",
                "-of",
                "csv=p=0",
                path,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        .stdout.strip()
        .split(",")
    )
    rate, channels = int(probe[0]), int(probe[1])
    raw = subprocess.run(
        ["ffmpeg", "-v", "error", "-i", path, "-map", "0:a:0", "-f", "s16le", "-"],
        check=True,
        capture_output=True,
    ).stdout
    return np.frombuffer(raw, dtype="<i2").reshape(-1, channels), rate, channels


def wav_header(rate: int, channels: int, frames: int) -> bytes:
    """The canonical 44-byte header of 16-bit PCM, built by hand as the test oracle."""
    data = frames * channels * 2
    return (
        b"RIFF"
        + struct.pack("<I", 36 + data)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", 16)  # fmt chunk of 16 bytes
        + struct.pack("<H", 1)  # PCM
        + struct.pack("<H", channels)
        + struct.pack("<I", rate)
        + struct.pack("<I", rate * channels * 2)  # byte rate
        + struct.pack("<H", channels * 2)  # block align
        + struct.pack("<H", 16)  # bits per sample
        + b"data"
        + struct.pack("<I", data)
    )


if __name__ == "__main__":
    target = sys.argv[1] if len(sys.argv) > 1 else "demo-corpus"
    for name, path in make_corpus(
        target, seconds=float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
    ).items():
        print(f"{name}: {path}")
