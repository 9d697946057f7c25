"""What the test corpus should hold: ffmpeg's full decodes, the cut plan, expected files."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cutfs.codec.audio.cut import seconds_to_frames
from cutfs.codec.catalogue.path_escape import escape_id
from support.corpus import wav_header

CORPUS_SECONDS = 30.0


@dataclass(frozen=True)
class Reference:
    samples: np.ndarray  # int16 (frames, channels): ffmpeg's full decode
    rate: int
    channels: int
    lossless: bool

    def assert_matches(self, actual: np.ndarray, first: int) -> None:
        """``actual`` equals frames from ``first`` on: exactly, or within 1 LSB for lossy codecs."""
        expected = self.samples[first : first + len(actual)]
        assert actual.shape == expected.shape
        difference = np.abs(actual.astype(np.int32) - expected.astype(np.int32))
        tolerance = 0 if self.lossless else 1
        assert int(difference.max(initial=0)) <= tolerance


def recording_id(name: str) -> str:
    return name.rsplit(".", 1)[0]


ODD_IDS = (
    "spk1/sess2/utt3",
    "..",
    ".",
    "",
    "%percent",
    "x" * 300,
    "with space",
    "ünïcödé/ок",
    "nul\u0000id",
    "a//b",
    "trailing/",
)


def cut_plan(references: dict[str, Reference]) -> list[dict[str, object]]:
    """Cuts of every recording: at the start, at the very end, overlapping, odd ids, channels."""
    cuts: list[dict[str, object]] = []
    for name, reference in sorted(references.items()):
        rec = recording_id(name)
        duration = len(reference.samples) / reference.rate
        cuts.append({"id": f"{rec}/start", "recording": rec, "start": 0.0, "duration": 2.5})
        cuts.append(
            {
                "id": f"{rec}/end",
                "recording": rec,
                "start": round(duration - 3.0, 6),
                "duration": round(3.0, 6),
            }
        )
        cuts.append({"id": f"{rec}/overlap-a", "recording": rec, "start": 5.0, "duration": 10.0})
        cuts.append(
            {"id": f"{rec}/overlap-b", "recording": rec, "start": 10.0123, "duration": 10.0}
        )
        if reference.channels > 1:
            cuts.append(
                {
                    "id": f"{rec}/channel1",
                    "recording": rec,
                    "start": 1.0,
                    "duration": 4.0,
                    "channel": 1,
                }
            )
    flac = "flac_mono_16k"
    for number, odd in enumerate(ODD_IDS):
        cuts.append({"id": odd, "recording": flac, "start": 1.0 + number, "duration": 1.5})
    return cuts


def write_lhotse_manifests(
    directory: Path, corpus: dict[str, str], references: dict[str, Reference]
) -> list[str]:
    """Lhotse recordings and cuts manifests (as Lhotse writes them) for the corpus."""
    recordings_path = directory / "recordings.jsonl"
    cuts_path = directory / "cuts.jsonl"
    with open(recordings_path, "w") as out:
        for name, path in sorted(corpus.items()):
            reference = references[name]
            out.write(
                json.dumps(
                    {
                        "id": recording_id(name),
                        "sources": [
                            {
                                "type": "file",
                                "channels": list(range(reference.channels)),
                                "source": path,
                            }
                        ],
                        "sampling_rate": reference.rate,
                        "num_samples": len(reference.samples),
                        "duration": len(reference.samples) / reference.rate,
                        "channel_ids": list(range(reference.channels)),
                    }
                )
                + "\n"
            )
    with open(cuts_path, "w") as out:
        for cut in cut_plan(references):
            channel = cut.get("channel", 0)
            out.write(
                json.dumps(
                    {
                        "id": cut["id"],
                        "start": cut["start"],
                        "duration": cut["duration"],
                        "channel": channel,
                        "recording_id": cut["recording"],
                        "supervisions": [
                            {
                                "id": f"sup-{cut['id']}",
                                "recording_id": cut["recording"],
                                "start": 0.0,
                                "duration": cut["duration"],
                                "channel": channel,
                                "text": "hello world",
                                "speaker": "spk1",
                                "language": "en",
                            }
                        ],
                        "type": "MonoCut",
                    }
                )
                + "\n"
            )
    return [str(recordings_path), str(cuts_path)]


def expected_cut(
    cut: dict[str, object], references: dict[str, Reference]
) -> tuple[np.ndarray, int]:
    """The cut's samples cut out of ffmpeg's full decode, and its rate."""
    name = next(name for name in references if recording_id(name) == cut["recording"])
    reference = references[name]
    first = seconds_to_frames(float(cut["start"]), reference.rate)  # type: ignore[arg-type]
    count = seconds_to_frames(float(cut["duration"]), reference.rate)  # type: ignore[arg-type]
    channel = int(cut.get("channel", 0))  # type: ignore[call-overload]
    return reference.samples[first : first + count, channel : channel + 1], reference.rate


def expected_file(cut: dict[str, object], references: dict[str, Reference]) -> bytes:
    samples, rate = expected_cut(cut, references)
    return wav_header(rate, 1, len(samples)) + samples.astype("<i2").tobytes()


def cut_path(mount: str, cut_id: str) -> str:
    return os.path.join(mount, "cuts", escape_id(cut_id))


def close_enough(actual: bytes, expected: bytes, lossless: bool) -> bool:
    if lossless or len(actual) != len(expected):
        return actual == expected
    if actual[:44] != expected[:44]:
        return False
    a = np.frombuffer(actual[44:], dtype="<i2").astype(np.int32)
    b = np.frombuffer(expected[44:], dtype="<i2").astype(np.int32)
    return bool(np.abs(a - b).max(initial=0) <= 1)


def pyav_decode(path: str) -> np.ndarray:
    """The whole file decoded at once by PyAV, the FFmpeg cutfs decodes with (which may be
    another version than the command line's), as 16-bit PCM (frames, channels), rounded
    as cutfs rounds."""
    import av  # noqa: PLC0415 - only the tests that compare with PyAV's own decode

    with av.open(path) as container:
        planes = [frame.to_ndarray() for frame in container.decode(audio=0)]
    samples = np.concatenate(planes, axis=1).T  # planar float: (channels, frames) per frame
    return np.clip(np.rint(samples.astype(np.float64) * 32768.0), -32768, 32767).astype(np.int16)
