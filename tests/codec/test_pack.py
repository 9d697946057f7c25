"""``cutfs pack`` from each kind of input, and its refusals of bad input."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from support.references import Reference

from cutfs.codec.catalogue.shard_set import ShardSet
from cutfs.codec.errors import SourceError
from cutfs.codec.packing.packer import pack

CUTFS = [sys.executable, "-m", "cutfs.vfs.cli"]


def _kaldi_dir(root: Path, corpus: dict[str, str]) -> Path:
    data = root / "kaldi"
    data.mkdir()
    flac = corpus["flac_mono_16k.flac"]
    mp3 = corpus["mp3_cbr_mono_16k.mp3"]
    (data / "wav.scp").write_text(
        f"rec_flac {flac}\nrec_piped ffmpeg -v error -i {mp3} -f wav - |\n"
    )
    (data / "segments").write_text(
        "utt1 rec_flac 0.5 2.75\nutt2 rec_piped 3.0 4.5\nutt3 rec_flac 20.0 -1\n"
    )
    (data / "utt2spk").write_text("utt1 alice\nutt2 bob\nutt3 alice\n")
    (data / "text").write_text("utt1 hello there\nutt2 good morning\n")
    return data


def test_kaldi_data_directory(
    tmp_path: Path, corpus: dict[str, str], references: dict[str, Reference]
) -> None:
    data = _kaldi_dir(tmp_path, corpus)
    report = pack([str(data)], str(tmp_path / "shards"), jobs=1)
    assert (report.recordings, report.cuts) == (2, 3)
    with ShardSet(str(tmp_path / "shards")) as shards:
        cuts = {shards.cut(i).cut_id: shards.cut(i) for i in range(shards.num_cuts)}
        assert json.loads(cuts["utt1"].metadata_json) == {"speaker": "alice", "text": "hello there"}
        assert json.loads(cuts["utt3"].metadata_json) == {"speaker": "alice"}
        assert (cuts["utt1"].start_frame, cuts["utt1"].num_frames) == (8000, 36000)
        assert cuts["utt3"].start_frame == 320000
        assert cuts["utt3"].end_frame == shards.recordings[cuts["utt3"].recording_index].num_frames
        utt1 = shards.read_frames(cuts["utt1"].recording_index, 8000, 44000)
        references["flac_mono_16k.flac"].assert_matches(utt1, 8000)
        # The piped command's output (a WAV of the decoded MP3) was stored once.
        piped = shards.recordings[cuts["utt2"].recording_index]
        assert piped.codec_name == "pcm_s16"
        frames = shards.read_frames(cuts["utt2"].recording_index, 48000, 72000)
        references["mp3_cbr_mono_16k.mp3"].assert_matches(frames, 48000)


def test_lhotse_recordings_and_supervisions_gzipped(tmp_path: Path, corpus: dict[str, str]) -> None:
    recordings = tmp_path / "recs_recordings.jsonl.gz"
    supervisions = tmp_path / "recs_supervisions.jsonl.gz"
    with gzip.open(recordings, "wt") as out:
        out.write(
            json.dumps(
                {
                    "id": "r1",
                    "sources": [
                        {
                            "type": "file",
                            "channels": [0, 1],
                            "source": corpus["vorbis_stereo_44k.ogg"],
                        }
                    ],
                    "sampling_rate": 44100,
                    "num_samples": 1323000,
                    "duration": 30.0,
                    "channel_ids": [0, 1],
                }
            )
            + "\n"
        )
    with gzip.open(supervisions, "wt") as out:
        for number, channel in enumerate([0, 1, [0, 1]]):
            out.write(
                json.dumps(
                    {
                        "id": f"s{number}",
                        "recording_id": "r1",
                        "start": 1.5,
                        "duration": 2.0,
                        "channel": channel,
                        "text": f"t{number}",
                        "speaker": "spk",
                        "language": "en",
                    }
                )
                + "\n"
            )
    pack([str(tmp_path)], str(tmp_path / "shards"), jobs=1)
    with ShardSet(str(tmp_path / "shards")) as shards:
        cuts = [shards.cut(i) for i in range(shards.num_cuts)]
        assert [cut.channels for cut in cuts] == [(0,), (1,), ()]
        metadata = json.loads(cuts[1].metadata_json)
        assert (metadata["text"], metadata["speaker"], metadata["language"]) == ("t1", "spk", "en")
        assert cuts[0].start_frame == 66150 and cuts[0].num_frames == 88200


def test_plain_directory_of_audio(tmp_path: Path, corpus: dict[str, str]) -> None:
    audio = tmp_path / "audio" / "sub"
    audio.mkdir(parents=True)
    os.symlink(corpus["opus_mono_16k.opus"], audio / "talk.opus")
    os.symlink(corpus["wav_u8_mono_8k.wav"], tmp_path / "audio" / "old.wav")
    (tmp_path / "audio" / "notes.txt").write_text("not audio")
    pack([str(tmp_path / "audio")], str(tmp_path / "shards"), jobs=2)
    with ShardSet(str(tmp_path / "shards")) as shards:
        assert sorted(shards.cut_ids) == ["old", "sub/talk"]
        talk = shards.cut(shards.cut_ids.index("sub/talk"))
        assert talk.num_frames == 30 * 48000  # Opus is served at 48 kHz


def test_shards_are_split_by_size(shard_dir: str) -> None:
    with ShardSet(shard_dir) as shards:
        shard_files = [shard["file"] for shard in shards.manifest["shards"]]
        assert len(shard_files) > 1
        for name in shard_files:
            assert os.path.getsize(os.path.join(shard_dir, name)) > 0


def test_blobs_are_zero_copy_views_of_the_memory_map(shard_dir: str) -> None:
    with ShardSet(shard_dir) as shards:
        name, start, end = shards.blob_location(3)
        view = shards.blob(3).read(0, end - start)
        assert len(view) == end - start
        with open(os.path.join(shard_dir, name), "rb") as shard_file:
            shard_file.seek(start)
            assert shard_file.read(end - start) == bytes(view)
        # The view points into the memory map of the shard, not into a copy.
        mapped = shards.store.read(name, 0, shards.store.size(name))
        base = pa.py_buffer(mapped).address
        assert pa.py_buffer(view).address == base + start


# -- refusals ------------------------------------------------------------------------------


def _cli_pack(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CUTFS, "pack", "-q", *args], capture_output=True, text=True, check=False
    )


def _lhotse(
    tmp_path: Path, recordings: list[dict[str, object]], cuts: list[dict[str, object]]
) -> list[str]:
    recordings_path = tmp_path / "bad_recordings.jsonl"
    cuts_path = tmp_path / "bad_cuts.jsonl"
    recordings_path.write_text("".join(json.dumps(r) + "\n" for r in recordings))
    cuts_path.write_text("".join(json.dumps(c) + "\n" for c in cuts))
    return [str(recordings_path), str(cuts_path)]


def _recording(rid: str, path: str) -> dict[str, object]:
    return {
        "id": rid,
        "sources": [{"type": "file", "channels": [0], "source": path}],
        "sampling_rate": 16000,
        "num_samples": 480000,
        "duration": 30.0,
    }


def _cut(cid: str, rid: str, start: float, duration: float) -> dict[str, object]:
    return {
        "id": cid,
        "recording_id": rid,
        "start": start,
        "duration": duration,
        "channel": 0,
        "type": "MonoCut",
    }


@pytest.mark.parametrize(
    ("problem", "message"),
    [
        ("duplicate cut", "duplicate cut id 'c1'"),
        ("missing file", "audio file not found"),
        ("not audio", "not a readable audio file"),
        ("beyond the end", "cut 'c2' ends at 31.000000 s, after the end of recording 'r1'"),
        ("unknown recording", "refers to unknown recording 'nope'"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(
    problem: str, message: str, tmp_path: Path, corpus: dict[str, str]
) -> None:
    flac = corpus["flac_mono_16k.flac"]
    not_audio = tmp_path / "fake.wav"
    not_audio.write_bytes(b"this is not audio at all" * 100)
    recordings = [_recording("r1", flac)]
    cuts = [_cut("c1", "r1", 0.0, 1.0)]
    if problem == "duplicate cut":
        cuts.append(_cut("c1", "r1", 2.0, 1.0))
    elif problem == "missing file":
        recordings.append(_recording("r2", str(tmp_path / "gone.flac")))
    elif problem == "not audio":
        recordings.append(_recording("r2", str(not_audio)))
    elif problem == "beyond the end":
        cuts.append(_cut("c2", "r1", 29.0, 2.0))
    elif problem == "unknown recording":
        cuts.append(_cut("c2", "nope", 0.0, 1.0))
    output = tmp_path / "out"
    result = _cli_pack(*_lhotse(tmp_path, recordings, cuts), "-o", str(output))
    assert result.returncode == 1
    assert message in result.stderr
    assert "bad_" in result.stderr or str(tmp_path) in result.stderr  # names the file
    assert not output.exists()
    assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []


def test_an_existing_output_is_never_touched(tmp_path: Path, corpus: dict[str, str]) -> None:
    output = tmp_path / "out"
    output.mkdir()
    (output / "precious.txt").write_text("keep me")
    audio = tmp_path / "audio"
    audio.mkdir()
    os.symlink(corpus["flac_mono_16k.flac"], audio / "a.flac")
    result = _cli_pack(str(audio), "-o", str(output))
    assert result.returncode == 1
    assert "not an empty directory" in result.stderr
    assert (output / "precious.txt").read_text() == "keep me"


def test_a_failing_pipe_names_the_recording(tmp_path: Path) -> None:
    data = tmp_path / "kaldi"
    data.mkdir()
    (data / "wav.scp").write_text("broken sh -c 'echo oops >&2; exit 3' |\n")
    with pytest.raises(SourceError, match="recording 'broken': command exited with status 3"):
        pack([str(data)], str(tmp_path / "out"))


def test_the_cli_prints_a_summary(tmp_path: Path, corpus: dict[str, str]) -> None:
    audio = tmp_path / "audio"
    audio.mkdir()
    for name in ("flac_mono_16k.flac", "aac_pns_mono_16k.m4a"):
        os.symlink(corpus[name], audio / name)
    result = subprocess.run(
        [*CUTFS, "pack", str(audio), "-o", str(tmp_path / "out"), "-j", "2"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "packed 2 recordings" in result.stdout
    assert "1 transcoded to FLAC" in result.stdout
    assert "aac_pns_mono_16k: transcoded to FLAC" in result.stderr
    # Not a terminal: plain progress lines with the share done, hours of audio and an ETA.
    progress = [line for line in result.stderr.splitlines() if line.startswith("packing:")]
    assert progress and "2/2 recordings (100%)" in progress[-1]
    assert " h of audio" in progress[-1] and "ETA" in progress[-1]
    # The phases that count cuts, each as a line when it begins and when it ends.
    names = ("reading", "planning", "sorting", "merging", "writing trees")
    phases = [line for line in result.stderr.splitlines() if line.startswith(names)]
    order = [line.split(":")[0].split(",")[0] for line in phases]
    assert sorted(set(order), key=order.index) == list(names)
    assert "merging: 2 of 2, " in result.stderr


def test_pack_draws_a_progress_bar_on_a_terminal(tmp_path: Path, corpus: dict[str, str]) -> None:
    audio = tmp_path / "audio"
    audio.mkdir()
    os.symlink(corpus["flac_mono_16k.flac"], audio / "a.flac")
    command = " ".join([*CUTFS, "pack", str(audio), "-o", str(tmp_path / "out")])
    result = subprocess.run(
        ["script", "-qec", command, "/dev/null"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout
    assert "packing: 100%|" in result.stdout  # tqdm: bar, rate, hours and bytes
    assert "1/1" in result.stdout and " h, " in result.stdout
