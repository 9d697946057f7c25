"""Attacks on a root mount by another user of the node, and bad numbers in sources.

Each test plays one attack from the trust issue: ``nobody`` writes a source
(or plants a file), root mounts it with ``allow_other`` as a shared node's
administrator would, and ``nobody`` reads the mount.  The test states what
must hold: no command of theirs runs, no file of someone else's is served,
nothing serves wrong audio, and one bad entry never takes the rest down.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import gzip
import io
import json
import logging
import multiprocessing
import os
import pickle
import shutil
import signal
import subprocess
import tarfile
import time
import wave
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from support.corpus import ffmpeg_decode, wav_header
from support.mounts import (
    CUTFS,
    daemon_pid,
    descendants,
    holds_fuse,
    mounted,
    needs_fuse,
    process_name,
    spawned_pids,
)
from support.references import Reference
from support.shards import write_arrow_file
from support.users import (
    OTHER_USER,
    as_other_user,
    give_to_other_user,
    needs_root,
    other_gid,
    other_uid,
    public_directory,
)

from cutfs.codec.audio.cut import seconds_to_frames
from cutfs.codec.catalogue.shard_set import ShardSet
from cutfs.codec.errors import ShardFormatError, SourceError
from cutfs.codec.sources import Refusals, read_source
from cutfs.codec.sources.source_index import SourceIndex, prepare_index
from cutfs.vfs.frames.decode_pool import DecodePool, WorkerDiedError
from cutfs.vfs.sandbox.serving_user import ServingUser, kill_command_group

pytestmark = [pytest.mark.mount, needs_fuse, needs_root]

FLAC = "flac_mono_16k.flac"

#: How a mount may be served: processes decoding in turn (the default), event loops with
#: decoder workers, event loops decoding in threads.
SERVING_KINDS = {
    "in turn": ("--serving-processes", "2"),
    "loops": ("--no-decode-in-turn", "--serving-processes", "2", "--workers", "2"),
    "threads": ("--no-decode-in-turn", "--workers", "0"),
}


#: gdb runs code inside a process of a mount, as code that took it over would.
needs_gdb = pytest.mark.skipif(shutil.which("gdb") is None, reason="needs gdb")


@pytest.fixture
def public() -> Iterator[Path]:
    with public_directory() as path:
        yield path


def _stats(mountpoint: Path) -> dict[str, dict[str, object]]:
    loaded: dict[str, dict[str, object]] = json.loads((mountpoint / ".cutfs" / "stats").read_text())
    return loaded


def _recording(recording_id: str, path: str, rate: int, frames: object) -> dict[str, object]:
    return {
        "id": recording_id,
        "sources": [{"type": "file", "channels": [0], "source": path}],
        "sampling_rate": rate,
        "num_samples": frames,
        "duration": 1.0,
        "channel_ids": [0],
    }


def _cut(cut_id: str, recording: str, start: object, duration: object) -> str:
    """A cuts-manifest line; numbers are written as given (``Infinity`` included)."""
    return (
        f'{{"id": {json.dumps(cut_id)}, "type": "MonoCut", "recording_id": '
        f'{json.dumps(recording)}, "start": {start}, "duration": {duration}, "channel": 0}}\n'
    )


@contextmanager
def _mounted_in(
    environment: dict[str, str], source: Path, mountpoint: Path, *options: str
) -> Iterator[Path]:
    """``cutfs mount`` with the given environment; always unmounted afterwards."""
    mountpoint.mkdir(exist_ok=True)
    result = subprocess.run(
        [*CUTFS, "mount", *options, str(source), str(mountpoint)],
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    try:
        yield mountpoint
    finally:
        subprocess.run(["fusermount3", "-u", str(mountpoint)], check=False)


def _expected(reference: Reference, start_seconds: float, duration_seconds: float) -> bytes:
    first = seconds_to_frames(start_seconds, reference.rate)
    count = seconds_to_frames(duration_seconds, reference.rate)
    samples = reference.samples[first : first + count, :1]
    return wav_header(reference.rate, 1, len(samples)) + samples.astype("<i2").tobytes()


# -- bad numbers: one entry refused, the rest served --------------------------------------------


def _lhotse_with_bad_numbers(
    source: Path, corpus: dict[str, str], references: dict[str, Reference]
) -> None:
    audio = source / "good.flac"
    shutil.copy(corpus[FLAC], audio)
    frames = len(references[FLAC].samples)
    recordings = [
        _recording("good", str(audio), 16000, frames),
        _recording("huge", str(audio), 16000, 5 * 10**18),  # OverflowError in readdir before
        _recording("beyond-int64", str(audio), 16000, 10**19),  # a traceback at mount before
        _recording("zero-rate", str(audio), 0, frames),
    ]
    with open(source / "recordings.jsonl", "w") as out:
        out.writelines(json.dumps(recording) + "\n" for recording in recordings)
    transformed = _recording("perturbed", str(audio), 16000, frames)
    transformed["transforms"] = [{"name": "Speed", "kwargs": {"factor": 1.1}}]
    with open(source / "cuts.jsonl", "w") as out:
        out.write(_cut("good-1", "good", 1.0, 2.0))
        out.write(_cut("good-2", "good", 5.5, 3.25))
        out.write(_cut("of-huge", "huge", 0.0, 1.0))
        out.write(_cut("of-beyond", "beyond-int64", 0.0, 1.0))
        out.write(_cut("of-zero-rate", "zero-rate", 0.0, 1.0))
        out.write(_cut("negative-start", "good", -1.0, 1.0))  # killed a worker per read before
        out.write(_cut("infinite", "good", 0.0, "Infinity"))
        out.write(_cut("nan", "good", "NaN", 1.0))
        out.write(_cut("too-big-for-a-float", "good", 10**400, 1.0))  # stopped the source before
        out.write("{not json\n")
        cut = json.loads(_cut("speed-perturbed", "perturbed", 0.0, 1.0))
        del cut["recording_id"]
        cut["recording"] = transformed
        out.write(json.dumps(cut) + "\n")


def test_bad_numbers_refuse_their_entries_and_the_rest_is_served(
    public: Path, corpus: dict[str, str], references: dict[str, Reference]
) -> None:
    source = public / "source"
    source.mkdir()
    _lhotse_with_bad_numbers(source, corpus, references)
    mountpoint = public / "mnt"
    with mounted(
        str(source), str(mountpoint), "--allow-other", "--cache-dir", str(public / "cache")
    ):
        listing = as_other_user("ls", str(mountpoint / "cuts"))
        assert listing.returncode == 0, listing.stderr
        assert listing.stdout.decode().split() == ["good-1.wav", "good-2.wav", "metadata.jsonl"]
        read = as_other_user("cat", str(mountpoint / "cuts" / "good-2.wav"))
        assert read.returncode == 0, read.stderr
        assert read.stdout == _expected(references[FLAC], 5.5, 3.25)
        recordings = as_other_user("ls", str(mountpoint / "recordings"))
        assert recordings.stdout.decode().split() == ["good.wav"]
        shards = _stats(mountpoint)["shards"]
        # 3 recordings with bad numbers and their 3 cuts; 4 cuts with bad times; a line
        # that is not JSON; the cut of a transformed recording
        assert shards["refused_entries"] == 3 + 3 + 4 + 1 + 1, shards


def _peak_memory_bytes(pid: int) -> int:
    """The most resident memory the process has had (``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_line_of_hundreds_of_megabytes_costs_a_megabyte_not_the_line(
    public: Path, corpus: dict[str, str], references: dict[str, Reference]
) -> None:
    """A gzipped manifest of about a megabyte can hold one line of 400 MB: the daemon reads
    at most --max-line-size of it (1 MiB), refuses that entry and serves the rest."""
    source = public / "source"
    source.mkdir()
    audio = source / "a.flac"
    shutil.copy(corpus[FLAC], audio)
    frames = len(references[FLAC].samples)
    recording = _recording("a", str(audio), 16000, frames)
    (source / "recordings.jsonl").write_text(json.dumps(recording) + "\n")
    with gzip.open(source / "supervisions.jsonl.gz", "wb", compresslevel=1) as supervisions:
        good = {"id": "good", "recording_id": "a", "start": 1.0, "duration": 2.0, "channel": 0}
        supervisions.write(json.dumps(good).encode() + b"\n")
        supervisions.write(
            b'{"id": "huge", "recording_id": "a", "start": 0, "duration": 1, "text": "'
        )
        for _ in range(400):
            supervisions.write(b"a" * (1 << 20))
        supervisions.write(b'"}\n')
    assert (source / "supervisions.jsonl.gz").stat().st_size < 4 << 20
    give_to_other_user(source)
    mountpoint = public / "mnt"
    with mounted(str(source), str(mountpoint), "--allow-other"):
        (daemon,) = _processes_with(f"cutfs.vfs.cli mount .*{mountpoint}")
        listing = as_other_user("ls", str(mountpoint / "cuts")).stdout.decode().split()
        assert listing == ["good.wav", "metadata.jsonl"]
        assert _stats(mountpoint)["shards"]["refused_entries"] == 1
        assert _peak_memory_bytes(daemon) < 300 << 20  # the line alone is 400 MiB


def test_a_source_past_its_entries_is_refused_with_one_line(
    public: Path, corpus: dict[str, str]
) -> None:
    source = public / "kaldi"
    source.mkdir()
    shutil.copy(corpus[FLAC], source / "a.flac")
    lines = "".join(f"utt{n} a.flac\n" for n in range(3))
    (source / "wav.scp").write_text(lines)
    mountpoint = public / "mnt"
    mountpoint.mkdir()
    result = subprocess.run(
        [*CUTFS, "mount", "--max-entries", "2", str(source), str(mountpoint)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 3, result.stderr
    assert "more than 2 entries" in result.stderr and "wav.scp:3" in result.stderr


def test_rendered_manifests_carry_no_command_for_lhotse_to_run(
    public: Path, corpus: dict[str, str], references: dict[str, Reference]
) -> None:
    """A cut's Lhotse ``custom`` field holds a Recording whose source is a shell command
    (Lhotse deserialises it on load, and runs the command when its audio is loaded): the
    mount's ``cuts.jsonl.gz`` keeps the plain values and drops that one, so loading the
    manifest with Lhotse, as a training job does, runs nothing."""
    lhotse = pytest.importorskip("lhotse")
    source = public / "source"
    source.mkdir()
    shutil.copy(corpus[FLAC], source / "a.flac")
    frames = len(references[FLAC].samples)
    (source / "recordings.jsonl").write_text(
        json.dumps(_recording("a", str(source / "a.flac"), 16000, frames)) + "\n"
    )
    marker = public / "ran"
    hidden = {
        "id": "hidden",
        "sources": [{"type": "command", "channels": [0], "source": f"touch {marker}; false"}],
        "sampling_rate": 16000,
        "num_samples": 16000,
        "duration": 1.0,
        "channel_ids": [0],
    }
    cut = json.loads(_cut("c", "a", 1.0, 2.0))
    cut["custom"] = {"speaker_age": 42, "tags": ["a", "b"], "extra_audio": hidden}
    (source / "cuts.jsonl").write_text(json.dumps(cut) + "\n")
    give_to_other_user(source)
    mountpoint = public / "mnt"
    with mounted(str(source), str(mountpoint), "--allow-other"):
        rendered = [
            json.loads(line)
            for line in gzip.decompress((mountpoint / "cuts.jsonl.gz").read_bytes()).splitlines()
        ]
        assert rendered[0]["custom"] == {"speaker_age": 42, "tags": ["a", "b"]}
        for loaded in lhotse.CutSet.from_file(mountpoint / "cuts.jsonl.gz"):
            for name, value in (loaded.custom or {}).items():
                if isinstance(value, lhotse.Recording):  # what a job would then load
                    with contextlib.suppress(Exception):
                        value.load_audio()
                    pytest.fail(f"the manifest carries a Recording in custom[{name!r}]")
    assert not marker.exists()


def test_pack_stops_at_the_first_bad_number_with_one_line(
    tmp_path: Path, corpus: dict[str, str], references: dict[str, Reference]
) -> None:
    _lhotse_with_bad_numbers(tmp_path, corpus, references)
    manifests = [str(tmp_path / "recordings.jsonl"), str(tmp_path / "cuts.jsonl")]
    result = subprocess.run(
        [*CUTFS, "pack", "-q", *manifests, "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "recordings.jsonl:2" in result.stderr
    assert "5000000000000000000" in result.stderr
    assert not (tmp_path / "out").exists()


def test_transforms_are_refused_naming_the_cut_and_the_transform(
    tmp_path: Path, corpus: dict[str, str], references: dict[str, Reference]
) -> None:
    _lhotse_with_bad_numbers(tmp_path, corpus, references)
    refusals = Refusals(strict=False)
    read_source([str(tmp_path / "recordings.jsonl"), str(tmp_path / "cuts.jsonl")], refusals)
    perturbed = [m for m in refusals.messages if "speed-perturbed" in m]
    assert len(perturbed) == 1
    assert "Speed(factor=1.1)" in perturbed[0]


def _shar(directory: Path, audio: bytes, cuts: list[dict[str, object]]) -> None:
    with tarfile.open(directory / "recording.000000.tar", "w") as archive:
        for cut in cuts:
            member = tarfile.TarInfo(f"{cut['id']}.flac")
            member.size = len(audio)
            archive.addfile(member, io.BytesIO(audio))
    with gzip.open(directory / "cuts.000000.jsonl.gz", "wt") as out:
        for cut in cuts:
            out.write(json.dumps(cut) + "\n")


def test_shar_with_negative_or_infinite_durations_keeps_its_listing(
    public: Path, corpus: dict[str, str], references: dict[str, Reference]
) -> None:
    audio = Path(corpus[FLAC]).read_bytes()
    frames = len(references[FLAC].samples)
    recording = {"sampling_rate": 16000, "num_samples": frames, "channel_ids": [0]}
    source = public / "shar"
    source.mkdir()
    _shar(
        source,
        audio,
        [
            {"id": "fine", "start": 0.0, "duration": frames / 16000, "recording": recording},
            {"id": "negative", "start": 0.0, "duration": -3.0, "recording": recording},
            {"id": "infinite", "start": 0.0, "duration": float("inf"), "recording": recording},
            {"id": "negative-start", "start": -2.0, "duration": 1.0, "recording": recording},
        ],
    )
    mountpoint = public / "mnt"
    with mounted(
        str(source), str(mountpoint), "--allow-other", "--cache-dir", str(public / "cache")
    ):
        listing = as_other_user("ls", str(mountpoint / "cuts"))
        assert listing.returncode == 0, listing.stderr
        assert listing.stdout.decode().split() == ["fine.wav", "metadata.jsonl"]
        read = as_other_user("cat", str(mountpoint / "cuts" / "fine.wav"))
        assert read.stdout == _expected(references[FLAC], 0.0, frames / 16000)
        assert _stats(mountpoint)["shards"]["refused_entries"] == 3


def test_kaldi_files_may_use_tabs(tmp_path: Path, corpus: dict[str, str]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "wav.scp").write_text(f"rec1\t{corpus[FLAC]}\n")
    (data / "segments").write_text("utt1\trec1\t1.0\t2.5\nutt2 rec1\t3\t-1\nutt3 rec1 4 -1.00\n")
    (data / "text").write_text("utt1\thello world\n")
    cuts = list(read_source([str(data)]).cuts)
    assert [cut.cut_id for cut in cuts] == ["utt1", "utt2", "utt3"]
    assert cuts[2].duration_seconds is None  # any negative end: to the end
    assert cuts[0].start_seconds == 1.0
    assert cuts[0].duration_seconds == 1.5
    assert cuts[1].duration_seconds is None
    assert cuts[0].metadata["text"] == "hello world"
    (data / "segments").write_text("utt1 rec1 nan 2.5\n")
    with pytest.raises(SourceError, match="utt1"):
        read_source([str(data)])


def test_header_only_flac_fails_pack_with_one_clear_line(tmp_path: Path) -> None:
    full = tmp_path / "full.flac"
    sine = ["-f", "lavfi", "-i", "sine=f=440:d=2", "-ar", "16000"]
    subprocess.run(["ffmpeg", "-loglevel", "error", *sine, str(full)], check=True)
    data = full.read_bytes()
    source = tmp_path / "audio"
    source.mkdir()
    (source / "header-only.flac").write_bytes(data[: data.index(b"\xff\xf8")])
    result = subprocess.run(
        [*CUTFS, "pack", "-q", str(source), "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and "BufferError" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert "header-only.flac" in result.stderr
    assert "no samples" in result.stderr


def test_lhotse_tolerance_follows_the_environment(
    public: Path, corpus: dict[str, str], references: dict[str, Reference]
) -> None:
    """0.3 s more declared than the audio has: padded under Lhotse's default (0.5 s), an
    error under LHOTSE_AUDIO_DURATION_MISMATCH_TOLERANCE=0.1."""
    source = public / "source"
    source.mkdir()
    audio = source / "a.flac"
    shutil.copy(corpus[FLAC], audio)
    frames = len(references[FLAC].samples)
    declared = frames + 4800
    with open(source / "recordings.jsonl", "w") as out:
        out.write(json.dumps(_recording("a", str(audio), 16000, declared)) + "\n")
    tail = source / "cuts.jsonl"
    tail.write_text(_cut("tail", "a", (frames - 16000) / 16000, 1.3))
    for tolerance, readable in ((None, True), ("0.1", False)):
        environment = dict(os.environ)
        environment.pop("LHOTSE_AUDIO_DURATION_MISMATCH_TOLERANCE", None)
        if tolerance is not None:
            environment["LHOTSE_AUDIO_DURATION_MISMATCH_TOLERANCE"] = tolerance
        mountpoint = public / f"mnt-{tolerance}"
        options = ("--cache-dir", str(public / "cache"))
        with (
            _mounted_in(environment, source, mountpoint, *options),
            open(mountpoint / "cuts" / "tail.wav", "rb") as cut_file,
        ):
            if readable:
                samples = np.frombuffer(cut_file.read()[44:], dtype="<i2")
                assert len(samples) == seconds_to_frames(1.3, 16000)
            else:
                with pytest.raises(OSError):
                    cut_file.read()


# -- commands from data -------------------------------------------------------------------------


def _kaldi_by_other_user(public: Path, corpus: dict[str, str], command: str) -> Path:
    """A Kaldi directory written by the other user: one file and one command recording."""
    data = public / "data"
    data.mkdir()
    shutil.copy(corpus[FLAC], data / "a.flac")
    (data / "wav.scp").write_text(f"plain a.flac\npiped {command} |\n")
    give_to_other_user(data)
    return data


def _read_as_other_user(mountpoint: Path, name: str) -> subprocess.CompletedProcess[bytes]:
    return as_other_user("cat", str(mountpoint / "cuts" / name))


def test_commands_never_run_by_default(
    public: Path, corpus: dict[str, str], references: dict[str, Reference]
) -> None:
    marker = public / "ran"
    flac = public / "data" / "a.flac"
    data = _kaldi_by_other_user(public, corpus, f"id -u > {marker}; cat {flac}")
    mountpoint = public / "mnt"
    with mounted(str(data), str(mountpoint), "--allow-other"):
        assert as_other_user("ls", str(mountpoint / "cuts")).stdout.decode().split() == [
            "metadata.jsonl",
            "plain.wav",
        ]
        assert _read_as_other_user(mountpoint, "piped.wav").returncode != 0
        plain = _read_as_other_user(mountpoint, "plain.wav")
        assert plain.stdout == _expected(references[FLAC], 0, len(references[FLAC].samples) / 16000)
    assert not marker.exists()  # as root (uid 0) on main


@pytest.mark.parametrize("kind", ["in turn", "threads"])
def test_allowed_commands_run_as_the_files_owner_never_root(
    public: Path, corpus: dict[str, str], references: dict[str, Reference], kind: str
) -> None:
    """Decoding in the serving process's threads too (``--workers 0``: refused before the
    process split, when the process that would start it kept root as its saved id)."""
    marker = public / "uid"
    marker.touch()
    give_to_other_user(marker)
    flac = public / "data" / "a.flac"
    data = _kaldi_by_other_user(public, corpus, f"id -u > {marker}; cat {flac}")
    mountpoint = public / "mnt"
    serving = ("--serving-processes", "1") if kind == "in turn" else SERVING_KINDS["threads"]
    with mounted(str(data), str(mountpoint), "--allow-other", "--allow-commands", *serving):
        read = _read_as_other_user(mountpoint, "piped.wav")
        assert read.returncode == 0, read.stderr
        assert read.stdout == _expected(references[FLAC], 0, len(references[FLAC].samples) / 16000)
    assert marker.read_text().strip() == str(other_uid())


def test_commands_in_a_file_others_can_write_are_refused(
    public: Path, corpus: dict[str, str]
) -> None:
    marker = public / "ran"
    data = _kaldi_by_other_user(public, corpus, f"touch {marker}; cat a.flac")
    (data / "wav.scp").chmod(0o666)
    mountpoint = public / "mnt"
    with mounted(str(data), str(mountpoint), "--allow-other", "--allow-commands"):
        assert _read_as_other_user(mountpoint, "piped.wav").returncode != 0
        assert _stats(mountpoint)["shards"]["refused_entries"] == 2  # the recording and its cut
    assert not marker.exists()


def _processes_with(pattern: str) -> list[int]:
    result = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False)
    return [int(pid) for pid in result.stdout.split()]


def test_a_command_past_its_timeout_is_killed_with_its_group(
    public: Path, corpus: dict[str, str]
) -> None:
    data = _kaldi_by_other_user(public, corpus, "sleep 313.25 & sleep 313.5; cat a.flac")
    mountpoint = public / "mnt"
    options = (
        "--allow-other",
        "--allow-commands",
        "--command-timeout",
        "2",
        "--serving-processes",
        "1",
    )
    with mounted(str(data), str(mountpoint), *options):
        read = _read_as_other_user(mountpoint, "piped.wav")
        assert read.returncode != 0
        assert _processes_with("^sleep 313") == []  # both sleeps, not only the shell
        assert _read_as_other_user(mountpoint, "plain.wav").returncode == 0


def test_a_command_group_a_decoder_names_is_killed_with_the_users_rights_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The group number of a command comes from a decoder, which may have parsed hostile
    media; the supervisor that kills it is root, which may kill any process, so the
    number must reach only the user's."""
    caplog.set_level(logging.INFO, logger="cutfs.serving_user")
    user = ServingUser.named(OTHER_USER)
    roots = subprocess.Popen(["sleep", "301.5"], start_new_session=True)
    users = subprocess.Popen(
        ["sleep", "301.75"], start_new_session=True, user=OTHER_USER, group=other_gid()
    )
    try:
        kill_command_group(user, roots.pid)  # from root, as the supervisor does
        kill_command_group(None, roots.pid)  # a mount reading as root runs no command
        kill_command_group(user, users.pid)
        kill_command_group(user, 0)  # the daemon's own group: never
        kill_command_group(user, os.getpgrp())
        assert users.wait(timeout=20) == -signal.SIGKILL
        assert roots.poll() is None  # root's process lives on
        messages = [record.getMessage() for record in caplog.records]
        assert any(f"group {roots.pid} " in text and "not permitted" in text for text in messages)
        assert any(f"killed the process group {users.pid} " in text for text in messages)
        assert any(f"ignored the process group {roots.pid} " in text for text in messages)
    finally:
        roots.kill()
        users.kill()
        roots.wait()
        users.wait()


@pytest.mark.parametrize("in_turn", [False, True], ids=["worker", "in turn"])
def test_a_killed_worker_takes_its_command_with_it(
    public: Path, corpus: dict[str, str], in_turn: bool
) -> None:
    """A process killed mid-command (the OOM killer, say), a decoder worker or one decoding
    in turn: the command's whole group goes too."""
    data = _kaldi_by_other_user(public, corpus, "sleep 317.25 & sleep 317.5; cat a.flac")
    mountpoint = public / "mnt"
    kind = ("--serving-processes", "1") if in_turn else ("--no-decode-in-turn", "--workers", "1")
    options = ("--allow-other", "--allow-commands", *kind)
    with mounted(str(data), str(mountpoint), *options):
        reader = subprocess.Popen(
            ["cat", str(mountpoint / "cuts" / "piped.wav")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 20
        while len(_processes_with("^sleep 317")) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_processes_with("^sleep 317")) == 2
        shell = _processes_with("^/bin/sh -c sleep 317")[0]
        worker = int(Path(f"/proc/{shell}/stat").read_text().rsplit(")", 1)[1].split()[1])
        os.kill(worker, signal.SIGKILL)
        _, errors = reader.communicate(timeout=30)
        assert reader.returncode != 0, errors  # that read fails (EIO), nothing hangs
        deadline = time.monotonic() + 10
        while _processes_with("^sleep 317") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _processes_with("^sleep 317") == []
        # The replacement (started by a daemon acting as the user) serves, as the user.
        deadline = time.monotonic() + 20
        while (read := _read_as_other_user(mountpoint, "plain.wav")).returncode != 0:
            assert time.monotonic() < deadline, read.stderr  # in turn, it starts meanwhile
            time.sleep(0.2)
        (replacement,) = [p for p in _decoder_pids(mountpoint) if holds_fuse(p) == in_turn]
        assert replacement != worker
        assert _ids(replacement)[0] == [other_uid()] * 4


# -- files of other users -----------------------------------------------------------------------


@pytest.fixture
def secret(public: Path, corpus: dict[str, str]) -> Path:
    """Audio only root may read: a 0600 file in a 0700 directory."""
    private = public / "private"
    private.mkdir(mode=0o700)
    path = private / "secret.flac"
    shutil.copy(corpus[FLAC], path)
    path.chmod(0o600)
    return path


def _assert_not_served(mountpoint: Path, name: str) -> None:
    listing = as_other_user("ls", str(mountpoint / "cuts"))
    assert listing.returncode == 0
    assert name not in listing.stdout.decode().split()
    assert _read_as_other_user(mountpoint, name).stdout == b""


def test_manifest_paths_outside_the_source_are_not_served(public: Path, secret: Path) -> None:
    source = public / "manifests"
    source.mkdir()
    with open(source / "recordings.jsonl", "w") as out:
        out.write(json.dumps(_recording("stolen", str(secret), 16000, 480000)) + "\n")
        out.write(json.dumps(_recording("decoy", "decoy.flac", 16000, 480000)) + "\n")
    shutil.copy(secret, source / "decoy.flac")
    give_to_other_user(source)
    mountpoint = public / "mnt"
    with mounted(str(source), str(mountpoint), "--allow-other"):
        _assert_not_served(mountpoint, "stolen.wav")
        assert _read_as_other_user(mountpoint, "decoy.wav").returncode == 0


def test_links_in_an_audio_folder_do_not_reach_other_files(
    public: Path, secret: Path, corpus: dict[str, str]
) -> None:
    source = public / "audio"
    source.mkdir()
    shutil.copy(corpus[FLAC], source / "own.flac")
    (source / "stolen.flac").symlink_to(secret)
    (source / "loop").symlink_to(source)  # a directory link loop: must not hang the mount
    (source / "self.flac").symlink_to(source / "self.flac")
    os.mkfifo(source / "fifo.flac")  # must not block the daemon
    give_to_other_user(source)
    mountpoint = public / "mnt"
    with mounted(str(source), str(mountpoint), "--allow-other"):
        _assert_not_served(mountpoint, "stolen.wav")
        listing = as_other_user("ls", str(mountpoint / "cuts")).stdout.decode().split()
        assert listing == ["metadata.jsonl", "own.wav"]


def test_ffconcat_named_wav_is_not_followed(
    public: Path, secret: Path, corpus: dict[str, str]
) -> None:
    source = public / "audio"
    source.mkdir()
    relative = os.path.relpath(secret, "/")  # concat resolves names against the daemon's cwd, /
    (source / "playlist.wav").write_text(f"ffconcat version 1.0\nfile '{relative}'\n")
    shutil.copy(corpus[FLAC], source / "own.flac")
    give_to_other_user(source)
    mountpoint = public / "mnt"
    with mounted(str(source), str(mountpoint), "--allow-other", "--user", "root"):
        read = _read_as_other_user(mountpoint, "playlist.wav")
        assert read.returncode != 0 and read.stdout == b""


def test_absolute_shard_names_are_refused(tmp_path: Path, shard_dir: str) -> None:
    copy = tmp_path / "shards"
    shutil.copytree(shard_dir, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["shards"][0]["file"] = os.path.abspath(copy / manifest["shards"][0]["file"])
    (copy / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "mnt").mkdir()
    result = subprocess.run(
        [*CUTFS, "mount", str(copy), str(tmp_path / "mnt")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 3
    assert "not a plain name" in result.stderr


# -- the index cache ----------------------------------------------------------------------------


def test_a_cache_others_can_write_or_own_is_refused(public: Path, corpus: dict[str, str]) -> None:
    source = public / "audio"
    source.mkdir()
    shutil.copy(corpus[FLAC], source / "a.flac")
    shared = public / "shared-cache"
    shared.mkdir(mode=0o777)
    shared.chmod(0o1777)  # sticky and world-writable, like /tmp
    theirs = public / "their-cache"
    theirs.mkdir(mode=0o700)
    give_to_other_user(theirs)
    for cache, message in ((shared, "writable by its group or others"), (theirs, "belongs to")):
        (public / "mnt").mkdir(exist_ok=True)
        result = subprocess.run(
            [*CUTFS, "mount", "--cache-dir", str(cache), str(source), str(public / "mnt")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 3, result.stderr
        assert message in result.stderr


def test_the_cache_is_private(public: Path, corpus: dict[str, str]) -> None:
    source = public / "audio"
    source.mkdir()
    shutil.copy(corpus[FLAC], source / "a.flac")
    cache = public / "cache"
    with (
        mounted(str(source), str(public / "mnt"), "--cache-dir", str(cache)) as mountpoint,
        open(os.path.join(mountpoint, "cuts", "a.wav"), "rb") as cut_file,
    ):
        cut_file.read(100)
    modes = {}
    for root, directories, files in os.walk(cache):
        for name in directories:
            modes[os.path.join(root, name)] = os.stat(os.path.join(root, name)).st_mode & 0o777
        for name in files:
            modes[os.path.join(root, name)] = os.stat(os.path.join(root, name)).st_mode & 0o777
    assert len(modes) >= 5  # index directory, plans, tables, a plan
    assert {mode & 0o077 for mode in modes.values()} == {0}, modes


def test_a_planted_plan_is_not_served(tmp_path: Path, corpus: dict[str, str]) -> None:
    """A plan that names another file (here /etc/hostname) is recomputed, never read."""
    source = tmp_path / "audio"
    source.mkdir()
    shutil.copy(corpus[FLAC], source / "a.flac")
    directory = prepare_index(str(source), str(tmp_path / "cache"))
    with SourceIndex(directory) as index:
        index.index(0)
    (plan,) = (tmp_path / "cache").glob("*/plans/*.arrow")
    row = pa.ipc.open_file(pa.memory_map(str(plan))).read_all().to_pylist()[0]
    row["source"] = "/etc/hostname"
    row["blob_offset"] = 0
    table = pa.Table.from_pylist([row], schema=pa.ipc.open_file(pa.memory_map(str(plan))).schema)
    write_arrow_file(plan, table)
    with SourceIndex(directory) as index:
        recording = index.index(0)
        frames = index.read_frames(0, 0, recording.num_frames)
    reference = subprocess.run(
        ["ffmpeg", "-v", "error", "-i", corpus[FLAC], "-f", "s16le", "-"],
        capture_output=True,
        check=True,
    ).stdout
    assert frames.tobytes() == reference


# -- least privilege ----------------------------------------------------------------------------


def _ids(pid: int) -> tuple[list[int], list[int]]:
    """(real, effective, saved, fs) user and group ids of a process."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Uid", "Gid"):
            fields[key] = [int(number) for number in value.split()]
    return fields["Uid"], fields["Gid"]


@pytest.mark.parametrize("kind", SERVING_KINDS)
def test_only_a_supervisor_that_holds_nothing_of_the_source_keeps_root(
    public: Path, corpus: dict[str, str], kind: str
) -> None:
    """The process split of issue 37: in a root mount of a user's source, every process
    that holds a descriptor or a mapping of the source or of its index cache (manifests,
    tables, media) is that user in every id, with no capability, ``no_new_privs`` and a
    system call filter, and so is every process the mount spawned; the one process that
    keeps root (the supervisor, which mounts, tunes and unmounts) holds nothing of either.
    (Before, the daemon kept root as its saved id and its capabilities while it mapped
    the catalogue.)"""
    source = _users_flac_source(public, corpus)
    mountpoint = public / "mnt"
    cache = f"/var/cache/cutfs/{other_uid()}"
    with mounted(str(source), str(mountpoint), "--allow-other", *SERVING_KINDS[kind]):
        assert _read_as_other_user(mountpoint, "a.wav").returncode == 0
        assert _stats(mountpoint)["serving"]["running"] == (2 if kind == "threads" else 3)
        supervisor = daemon_pid(str(mountpoint))
        below = descendants(supervisor)
        roots = (str(source), cache)
        assert _holds_any(supervisor, roots) == [], "the supervisor holds the user's data"
        holders = [pid for pid in below if _holds_any(pid, roots)]
        spawned = spawned_pids(str(mountpoint))
        assert holders and spawned
        for pid in {*holders, *spawned}:
            uid, gid = _ids(pid)
            assert uid == [other_uid()] * 4 and gid == [other_gid()] * 4, pid
            status = _status(pid)
            assert status["CapPrm"] == status["CapEff"] == "0" * 16, pid
            assert status["NoNewPrivs"] == "1", pid
            assert status["Seccomp"] == "2", pid  # filtered (cutfs.vfs.sandbox.syscall_filter)
        assert _ids(supervisor)[0] == [0] * 4
    assert not os.path.ismount(mountpoint)  # the supervisor unmounts


@needs_fuse
@needs_root
@pytest.mark.mount
@needs_gdb
@pytest.mark.parametrize("kind", ["in turn", "loops"])
def test_code_taken_over_in_a_serving_process_or_decoder_opens_only_the_source_and_cache(
    public: Path, corpus: dict[str, str], kind: str
) -> None:
    """What crafted media that took over a decoder could do, run for real: code injected
    (with gdb, as root) into every process of the mount that parses data opens the
    source, but neither reads the user's other files nor creates a file outside the
    mount's cache, though the user it runs as may do both.  Before issue 37's
    confinement, all of it succeeded."""
    source = _users_flac_source(public, corpus)
    home = public / "home"
    home.mkdir()
    (home / "key").write_text("secret")
    (home / "key").chmod(0o600)
    give_to_other_user(home)
    mountpoint = public / "mnt"
    with mounted(str(source), str(mountpoint), "--allow-other", *SERVING_KINDS[kind]):
        assert _read_as_other_user(mountpoint, "a.wav").returncode == 0
        parsers = [
            pid
            for pid in spawned_pids(str(mountpoint))
            if process_name(pid) in {"cutfs-serving", "cutfs-decoder"}
        ]
        assert len(parsers) == (2 if kind == "in turn" else 4), parsers
        for pid in parsers:
            opened = _open_in(
                pid,
                [
                    (source / "a.flac", os.O_RDONLY),
                    (home / "key", os.O_RDONLY),
                    (home / ".bashrc", os.O_WRONLY | os.O_CREAT),
                    (source / "planted", os.O_WRONLY | os.O_CREAT),
                ],
            )
            assert opened[0] >= 0, (pid, opened)  # the user may: the code ran
            assert opened[1:] == [-1, -1, -1], (pid, opened)
        assert sorted(os.listdir(home)) == ["key"] and sorted(os.listdir(source)) == ["a.flac"]
        as_other_user("cat", str(home / "key")).check_returncode()  # the user may read it
        assert _read_as_other_user(mountpoint, "a.wav").returncode == 0  # and all serve on


@needs_fuse
@needs_root
@pytest.mark.mount
@needs_gdb
def test_processes_reading_roots_own_source_are_root_without_its_power(
    public: Path, corpus: dict[str, str]
) -> None:
    """A source of root's is read as root, but by processes with no capability at all
    (bounding set included, so no program they run gets one back): code taken over in one
    opens root's files but not a user's private file that root could read, and every
    serving process and decoder shows no capability.  Before, they held all of root's."""
    source = public / "audio"
    source.mkdir()
    shutil.copy(corpus[FLAC], source / "a.flac")
    private = source / "private.bin"
    private.write_text("a user's")
    private.chmod(0o600)
    give_to_other_user(private)
    mountpoint = public / "mnt"
    with mounted(str(source), str(mountpoint), *SERVING_KINDS["loops"]):
        assert (mountpoint / "cuts" / "a.wav").read_bytes()[:4] == b"RIFF"
        parsers = [
            pid
            for pid in spawned_pids(str(mountpoint))
            if process_name(pid) in {"cutfs-serving", "cutfs-zygote", "cutfs-decoder"}
        ]
        assert len(parsers) == 6, parsers  # 2 serving processes, 2 zygotes, 2 decoders
        for pid in parsers:
            status = _status(pid)
            assert _ids(pid)[0] == [0] * 4, pid
            for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
                assert status[field] == "0" * 16, (pid, field, status[field])
            assert status["NoNewPrivs"] == "1", pid
        for pid in (p for p in parsers if process_name(p) != "cutfs-zygote"):
            opened = _open_in(pid, [(source / "a.flac", os.O_RDONLY), (private, os.O_RDONLY)])
            assert opened[0] >= 0 and opened[1] == -1, (pid, opened)
        assert _status(daemon_pid(str(mountpoint)))["CapEff"] != "0" * 16  # the supervisor


def _open_in(pid: int, attempts: list[tuple[Path, int]]) -> list[int]:
    """Call ``open(path, flags, 0644)`` inside process ``pid`` for each attempt (gdb, as
    root), and what each returned."""
    calls = [f'(int)open("{path}", {flags}, 420)' for path, flags in attempts]
    results, printed = _call_in(pid, calls)
    assert len(results) == len(attempts), printed
    return results


def _call_in(pid: int, calls: list[str]) -> tuple[list[int], str]:
    """Evaluate each C expression in ``calls`` inside process ``pid`` (gdb, as root), as
    code that took the process over would: the values returned, and what gdb printed."""
    command = ["gdb", "-p", str(pid), "-batch", "-nx"]
    # gdb may hit an internal error when the process dies under it: no core file of gdb's.
    command += ["-iex", "maint set internal-error corefile no"]
    for call in calls:
        command += ["-ex", f"call {call}"]
    printed = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    results = [
        int(line.split("=", 1)[1]) for line in printed.stdout.splitlines() if line.startswith("$")
    ]
    return results, printed.stdout + printed.stderr


@needs_fuse
@needs_root
@pytest.mark.mount
@needs_gdb
@pytest.mark.parametrize("name", ["cutfs-serving", "cutfs-decoder"])
def test_a_process_taken_over_that_makes_a_forbidden_call_dies_and_is_replaced(
    public: Path, corpus: dict[str, str], name: str
) -> None:
    """Code injected into a serving process or a decoder (gdb, as root) that starts a
    program is killed by the kernel on the spot (the program never runs); the mount
    replaces the process and serves the same audio on."""
    source = _users_flac_source(public, corpus)
    mountpoint = public / "mnt"
    marker = public / "ran"
    log = public / "log"
    options = ("--allow-other", *SERVING_KINDS["loops"], "--log-file", str(log))
    with mounted(str(source), str(mountpoint), *options):
        assert _read_as_other_user(mountpoint, "a.wav").returncode == 0
        victim = next(p for p in spawned_pids(str(mountpoint)) if process_name(p) == name)
        _call_in(victim, [f'(int)execl("/bin/touch", "touch", "{marker}", 0)'])
        deadline = time.monotonic() + 60
        while os.path.exists(f"/proc/{victim}") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not os.path.exists(f"/proc/{victim}"), "the process survived its call"
        assert not marker.exists(), "the program ran"
        served = None
        while time.monotonic() < deadline:  # a read in flight as it died fails; the next serve
            served = _read_as_other_user(mountpoint, "a.wav")
            if (
                served.returncode == 0
                and sum(process_name(p) == name for p in spawned_pids(str(mountpoint))) == 2
            ):
                break
            time.sleep(0.2)
        assert served is not None and served.returncode == 0, served
        samples, rate, channels = ffmpeg_decode(corpus[FLAC])
        assert served.stdout == wav_header(rate, channels, len(samples)) + samples.tobytes()


def _users_flac_source(public: Path, corpus: dict[str, str]) -> Path:
    """A folder of the other user's in ``public`` holding one FLAC file, ``a.flac``."""
    source = public / "audio"
    source.mkdir()
    shutil.copy(corpus[FLAC], source / "a.flac")
    give_to_other_user(source)
    return source


def _holds_any(pid: int, roots: tuple[str, ...]) -> list[str]:
    """The files beneath ``roots`` that process ``pid`` has open or mapped."""
    held = []
    with contextlib.suppress(FileNotFoundError):
        for descriptor in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(FileNotFoundError):
                held.append(os.readlink(f"/proc/{pid}/fd/{descriptor}"))
    with contextlib.suppress(FileNotFoundError):
        held += [
            line.split(maxsplit=5)[-1]
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
            if len(line.split()) == 6
        ]
    return [
        path for path in held if any(path.startswith(root + "/") or path == root for root in roots)
    ]


def _status(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def test_a_root_source_with_a_users_folder_never_decodes_it_as_root(
    public: Path, corpus: dict[str, str]
) -> None:
    """SOURCE belongs to root, so the mount reads as root; a folder inside it belongs to
    a user, who controls the media there: root decodes none of it (its reads fail with
    EIO and a log line naming the file), and root's own files are served."""
    source = public / "audio"
    source.mkdir()
    shutil.copy(corpus[FLAC], source / "root.flac")
    users = source / "alice"
    users.mkdir()
    shutil.copy(corpus[FLAC], users / "hers.flac")
    give_to_other_user(users)
    mountpoint = public / "mnt"
    log = public / "log"
    with mounted(str(source), str(mountpoint), "--allow-other", "--log-file", str(log)):
        assert _read_as_other_user(mountpoint, "root.wav").returncode == 0
        hers = as_other_user("cat", str(mountpoint / "cuts" / "alice" / "hers.wav"))
        assert hers.returncode != 0 and b"Input/output error" in hers.stderr
    assert "hers.flac" in log.read_text() and "decodes only root's files" in log.read_text()


def test_processes_decoding_in_turn_keep_no_id_of_root(
    public: Path, corpus: dict[str, str]
) -> None:
    """They decode what others wrote in the process that holds a /dev/fuse descriptor:
    they become the source's owner for good, as decoder workers do."""
    source = _users_flac_source(public, corpus)
    mountpoint = public / "mnt"
    options = ("--allow-other", "--serving-processes", "2")  # in turn: the default
    with mounted(str(source), str(mountpoint), *options):
        assert _read_as_other_user(mountpoint, "a.wav").returncode == 0
        (daemon,) = _processes_with(f"cutfs.vfs.cli mount .*{mountpoint}")
        children = [
            int(child)
            for child in Path(f"/proc/{daemon}/task/{daemon}/children").read_text().split()
        ]
        serving = [
            pid
            for pid in children
            if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text() and holds_fuse(pid)
        ]
        assert len(serving) == 2
        for process in serving:
            uid, gid = _ids(process)
            assert uid == [other_uid()] * 4 and gid == [other_gid()] * 4
    assert not os.path.ismount(mountpoint)


# -- bounded by configuration -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["in turn", "loops"])
def test_serving_processes_stopped_by_the_sources_owner_are_replaced(
    public: Path, corpus: dict[str, str], references: dict[str, Reference], kind: str
) -> None:
    """The serving processes run as the source's owner, who can stop them (SIGSTOP) while
    they hold no request: requests would wait in the kernel for a reader that never comes.
    Another user's read is served anyway: stopped processes are seen (they stop beating)
    and replaced.  (Before the process split, the event loops of --no-decode-in-turn were
    not watched so: a read hung.)"""
    source = _users_flac_source(public, corpus)
    mountpoint = public / "mnt"
    options = ("--allow-other", *SERVING_KINDS[kind], "--read-timeout", "5")
    with mounted(str(source), str(mountpoint), *options):
        serving = [pid for pid in spawned_pids(str(mountpoint)) if holds_fuse(pid)]
        assert len(serving) == 2
        stopped = as_other_user("kill", "-STOP", *map(str, serving))
        assert stopped.returncode == 0, stopped.stderr  # the owner may signal them
        read = as_other_user("cat", str(mountpoint / "cuts" / "a.wav"))  # hangs if unseen
        assert read.returncode == 0, read.stderr
        expected = wav_header(16000, 1, len(references[FLAC].samples))
        assert read.stdout[:44] == expected
        assert len(read.stdout) == 44 + 2 * len(references[FLAC].samples)
        for pid in serving:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def test_read_timeout_covers_waiting_for_a_busy_worker(
    public: Path, corpus: dict[str, str]
) -> None:
    """With the only worker busy for minutes, a read fails after --read-timeout, not later."""
    data = _kaldi_by_other_user(public, corpus, "sleep 331.5; cat a.flac")
    mountpoint = public / "mnt"
    log = public / "log"
    options = ("--allow-other", "--allow-commands", "--no-decode-in-turn", "--workers", "1")
    options = (*options, "--read-timeout", "2")
    with mounted(str(data), str(mountpoint), *options, "--log-file", str(log)):
        busy = subprocess.Popen(
            ["cat", str(mountpoint / "cuts" / "piped.wav")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 20
        while not _processes_with("^sleep 331.5") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _processes_with("^sleep 331.5"), "the command never started"
        # 20 s is ten deadlines: before, this read waited for the worker (minutes here).
        waiting = as_other_user("cat", str(mountpoint / "cuts" / "plain.wav"), timeout=20)
        assert waiting.returncode != 0
        assert b"Input/output error" in waiting.stderr
        _, errors = busy.communicate(timeout=20)  # its own read gave up at its deadline too
        assert busy.returncode != 0, errors
        assert _processes_with("^sleep 331.5"), "indexing goes on in the background"
        assert _stats(mountpoint)["indexing"]["in_progress"] == 2  # both wait for the worker
        # and is reported in the log every 10 s
        _assert_logged_soon(log, "indexing: 0 of 2 recordings indexed, 2 in progress", 30)
    _assert_gone_soon("^sleep 331.5", log)
    # By the daemon, as it stopped.  The group dies a moment before the line is written
    # (the killing child is reaped first), and the unmount does not wait for the daemon.
    _assert_logged_soon(log, "killed the process group", 20)
    # The worker the unmount interrupted is stopped, not replaced only to be killed.
    assert "was interrupted as the mount stopped" in log.read_text()
    assert "replacing it" not in log.read_text()


def _assert_logged_soon(log: Path, text: str, seconds: float) -> None:
    """The daemon's log holds ``text`` within ``seconds``; its tail shows why if not."""
    deadline = time.monotonic() + seconds
    while text not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()[-4000:]
        time.sleep(0.1)


def _assert_gone_soon(pattern: str, log: Path) -> None:
    """No process matches ``pattern`` within 20 s (the daemon's exit kills it, on a busy
    machine a moment after the unmount returns); the daemon's log says why if one does."""
    deadline = time.monotonic() + 20
    while _processes_with(pattern) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _processes_with(pattern) == [], log.read_text()[-4000:]


def test_absurd_rates_fail_their_own_reads_without_stalling_others(
    public: Path, corpus: dict[str, str], references: dict[str, Reference]
) -> None:
    """A WAV at 1 000 003 Hz and one at 16 001 Hz with --sample-rate 16000: each fails alone."""
    source = public / "audio"
    source.mkdir()
    samples = np.zeros(16001, dtype="<i2")
    for name, rate in (("too-fast", 1_000_003), ("odd", 16001)):
        (source / f"{name}.wav").write_bytes(wav_header(rate, 1, len(samples)) + samples.tobytes())
    shutil.copy(corpus["wav_s16_mono_16k.wav"], source / "plain.wav")
    mountpoint = public / "mnt"
    with mounted(str(source), str(mountpoint), "--allow-other", "--sample-rate", "16000"):
        cuts = mountpoint / "cuts"
        assert as_other_user("ls", str(cuts)).stdout.decode().split() == [
            "metadata.jsonl",
            "odd.wav",
            "plain.wav",
            "too-fast.wav",
        ]
        assert as_other_user("stat", "-c", "%s", str(cuts / "too-fast.wav")).returncode != 0
        assert os.stat(cuts / "odd.wav").st_size == 44 + 2 * 16000  # exact, arithmetic only
        assert as_other_user("cat", str(cuts / "odd.wav"), timeout=20).returncode != 0
        plain = as_other_user("cat", str(cuts / "plain.wav"))
        reference = references["wav_s16_mono_16k.wav"]
        assert plain.returncode == 0
        assert plain.stdout[:44] == wav_header(16000, 1, len(reference.samples))
        log = _stats(mountpoint)["errors"]
        assert log.get("unsupported_audio", 0) >= 2, log


def test_time_ranges_are_freed_when_the_kernel_forgets_them(
    public: Path, corpus: dict[str, str]
) -> None:
    """Each range looked up holds an inode only while the kernel remembers it."""
    source = public / "audio"
    source.mkdir()
    shutil.copy(corpus[FLAC], source / "a.flac")
    mountpoint = public / "mnt"
    with mounted(str(source), str(mountpoint), "--allow-other"):
        ranges = mountpoint / "recordings" / "a"
        for number in range(300):
            start = number / 100
            size = as_other_user("stat", "-c", "%s", str(ranges / f"{start:g}-{start + 1:g}.wav"))
            assert size.stdout.decode().strip() == str(44 + 2 * 16000)
        held = _stats(mountpoint)["views"]["time_ranges"]
        assert held == 300
        Path("/proc/sys/vm/drop_caches").write_text("2\n")  # the kernel forgets its dentries
        deadline = time.monotonic() + 10
        while _stats(mountpoint)["views"]["time_ranges"] > 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _stats(mountpoint)["views"]["time_ranges"] == 0  # 300 for ever before


def test_windows_of_a_week_long_recording_cost_no_memory(
    public: Path, corpus: dict[str, str]
) -> None:
    """6 million windows of a declared week: a deep window is found at once, by arithmetic."""
    source = public / "source"
    source.mkdir()
    audio = source / "a.flac"
    shutil.copy(corpus[FLAC], audio)
    week = 7 * 24 * 3600 * 16000
    with open(source / "recordings.jsonl", "w") as out:
        out.write(json.dumps(_recording("long", str(audio), 16000, week)) + "\n")
    mountpoint = public / "mnt"
    options = ("--allow-other", "--window", "0.1")
    with mounted(str(source), str(mountpoint), *options):
        window = mountpoint / "windows" / "long" / "100000-100000.1.wav"
        size = as_other_user("stat", "-c", "%s", str(window), timeout=20)
        assert size.stdout.decode().strip() == str(44 + 2 * 1600), size.stderr
        with os.scandir(mountpoint / "windows" / "long") as entries:
            first = [entry.name for _, entry in zip(range(3), entries, strict=False)]
        assert first == ["0-0.1.wav", "0.1-0.2.wav", "0.2-0.3.wav"]
        assert not (mountpoint / "windows" / "long" / "100000.05-100000.15.wav").exists()
        (daemon,) = _processes_with(f"cutfs.vfs.cli mount .*{mountpoint}")
        status = Path(f"/proc/{daemon}/status").read_text()
        rss_kib = int(next(line for line in status.splitlines() if line.startswith("VmRSS"))[6:-3])
        assert rss_kib < 400 * 1024  # a list of 6M windows took gigabytes before


# -- pinned versions ----------------------------------------------------------------------------


def _tone(path: Path, frequency: int) -> None:
    sine = ["-f", "lavfi", "-i", f"sine=f={frequency}:d=240", "-ar", "16000"]
    subprocess.run(["ffmpeg", "-v", "error", *sine, str(path)], check=True)


def _decoder_pids(mountpoint: Path) -> list[int]:
    """Serving processes and decoder workers of the mount (not the zygotes)."""
    return [pid for pid in spawned_pids(str(mountpoint)) if process_name(pid) != "cutfs-zygote"]


def _first_and_second_packed(root: Path) -> Path:
    """Two shard directories of one tone each (440 and 1000 Hz): the first at
    ``root/shards`` (returned), the second at ``root/second``, to be moved in its place."""
    for name, frequency in (("first", 440), ("second", 1000)):
        (root / f"{name}-audio").mkdir()
        _tone(root / f"{name}-audio" / "a.flac", frequency)
        subprocess.run(
            [*CUTFS, "pack", "-q", str(root / f"{name}-audio"), "-o", str(root / name)],
            check=True,
        )
    (root / "first").rename(root / "shards")
    return root / "shards"


def test_a_shard_directory_replaced_under_a_live_mount_is_not_served(public: Path) -> None:
    """Another directory moved into the mounted path: EIO and a log line, never its audio;
    a decoder worker started afterwards refuses it, and so does a serving process (when
    every replacement refuses, the supervisor takes the mount down: reads fail, none
    hangs)."""
    shards, mountpoint = _first_and_second_packed(public), public / "mnt"
    log = public / "log"
    options = ("--no-decode-in-turn", "--workers", "1", "--direct-io", "--log-file", str(log))
    with mounted(str(shards), str(mountpoint), *options):
        served = mountpoint / "recordings" / "a.wav"
        assert len(_read_range(served, 0, 64000)) == 64000
        shards.rename(public / "first")
        (public / "second").rename(shards)
        (serving,) = [pid for pid in _decoder_pids(mountpoint) if holds_fuse(pid)]
        for worker in _decoder_pids(mountpoint):
            if worker != serving:
                os.kill(worker, signal.SIGKILL)  # a restart opens the path again
        deadline = time.monotonic() + 20
        while _stats(mountpoint)["workers"]["restarts"] == 0:  # replaced by the pool's watcher
            assert time.monotonic() < deadline
            time.sleep(0.1)
        with pytest.raises(OSError):
            _read_range(
                served, 6_400_044, 64000
            )  # 200 s in, beyond the read-ahead: the second directory's audio before
        os.kill(serving, signal.SIGKILL)  # its replacements open the path again
        started = time.monotonic()
        with pytest.raises(OSError):  # the mount taken down, not the second directory's audio
            _read_range(served, 12_800_044, 64000)
        assert time.monotonic() - started < 120
    text = log.read_text()
    assert "changed since it was mounted" in text, text
    assert "serving process 1 is not started again" in text, text


def test_a_decoder_worker_that_finds_another_directory_says_so_before_it_ends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker that cannot open what was mounted sends why and ends at once; the pool
    that finds it dead logs that reason with the replacement (the failure on record:
    a read sent to such a worker failed as "the decoder worker died", with no reason in
    the log), and the read fails with it."""
    shards = _first_and_second_packed(tmp_path)
    caplog.set_level(logging.WARNING, logger="cutfs.decode_pool")
    with ShardSet(str(shards)) as library:
        shards.rename(tmp_path / "first")
        (tmp_path / "second").rename(shards)
        pool = DecodePool(library, 1)
        pool.start()
        try:
            deadline = time.monotonic() + 60
            while pool.statistics().alive:  # it ends as soon as it has opened the path
                assert time.monotonic() < deadline, "the worker served another directory"
                time.sleep(0.05)
            with pytest.raises(ShardFormatError, match="changed since it was mounted"):
                trio.run(pool.decode, 0, 0, 1600)
        finally:
            pool.close()
    replaced = [r.getMessage() for r in caplog.records if "replacing it" in r.getMessage()]
    assert any("found dead" in line and "changed since it was mounted" in line for line in replaced)


class _Hostile:
    """What a worker taken over by hostile media would send to get code run by its reader:
    unpickled, it runs ``touch`` on the marker."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return (os.system, (f"touch {self.marker}",))


def _steal_descriptor(pid: int, descriptor: int) -> int:
    """A copy of another process's descriptor (pidfd_getfd(2), Linux 5.6; root may)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        stolen = int(libc.syscall(_SYS_PIDFD_GETFD, pidfd, descriptor, 0))
        if stolen < 0:
            raise OSError(ctypes.get_errno(), "pidfd_getfd")
        return stolen
    finally:
        os.close(pidfd)


_SYS_PIDFD_GETFD = 438  # the same on every architecture's generic table


def test_a_decoder_worker_taken_over_by_its_media_gets_no_code_run_by_its_reader(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A decoder worker parses other people's media; one taken over (an FFmpeg or
    libsndfile bug) writes what it likes to its pipe.  Its reader (a serving process
    that keeps root as its saved id) must not unpickle it: the request fails alone,
    the worker is replaced, and the next decode is exact."""
    (tmp_path / "audio").mkdir()
    flac = tmp_path / "audio" / "a.flac"
    _tone(flac, 440)
    shards = tmp_path / "shards"
    subprocess.run([*CUTFS, "pack", "-q", str(flac.parent), "-o", str(shards)], check=True)
    marker = tmp_path / "code-ran"
    caplog.set_level(logging.WARNING, logger="cutfs.decode_pool")
    with ShardSet(str(shards)) as library:
        pool = DecodePool(library, 1)
        pool.start()
        pool.wait_ready()
        try:
            (worker,) = [p for p in multiprocessing.active_children() if p.name == "cutfs-decoder"]
            assert worker.pid is not None
            os.kill(worker.pid, signal.SIGSTOP)  # the worker's own code no longer answers
            (pipe,) = [  # the worker's end of its pipe: its only socket
                int(entry.name)
                for entry in Path(f"/proc/{worker.pid}/fd").iterdir()
                if os.readlink(entry).startswith("socket:")
            ]
            taken_over = Connection(_steal_descriptor(worker.pid, pipe))
            taken_over.send_bytes(pickle.dumps(_Hostile(marker)))
            with pytest.raises(WorkerDiedError):
                trio.run(pool.decode, 0, 0, 1600)
            taken_over.close()
            assert not marker.exists(), "the reader ran code a decoder worker sent"
            frames = trio.run(pool.decode, 0, 16000, 17600)  # by the replacement
        finally:
            pool.close()
    samples, _, _ = ffmpeg_decode(str(flac))
    assert np.array_equal(frames, samples[16000:17600])
    replaced = [r.getMessage() for r in caplog.records if "replacing it" in r.getMessage()]
    assert any("not a message" in line for line in replaced), replaced


def test_an_audio_file_rewritten_after_indexing_is_not_served(public: Path) -> None:
    source = public / "audio"
    source.mkdir()
    _tone(source / "a.flac", 440)
    mountpoint = public / "mnt"
    log = public / "log"
    with mounted(str(source), str(mountpoint), "--direct-io", "--log-file", str(log)):
        served = mountpoint / "recordings" / "a.wav"
        assert len(_read_range(served, 0, 64000)) == 64000
        _tone(public / "other.flac", 1000)
        shutil.copy(public / "other.flac", source / "a.flac")  # same name, other audio
        with pytest.raises(OSError):  # whichever serving process answers this read
            _read_range(served, 6_400_044, 64000)
        # "since its recording was indexed" from the process that indexed it, "since the
        # source was catalogued" from another one
        _wait_for_line(log, "changed since")


def test_an_audio_file_rewritten_with_its_time_put_back_is_not_served(public: Path) -> None:
    """The file's owner rewrites its samples in place, same size, and puts the modification
    time back (``touch -d``): the change time, which no user can set, still tells."""
    source = public / "audio"
    source.mkdir()
    samples = (np.sin(np.arange(16000 * 20) * 0.05) * 10000).astype("<i2")
    with wave.open(str(source / "a.wav"), "wb") as audio:
        audio.setnchannels(1)
        audio.setsampwidth(2)
        audio.setframerate(16000)
        audio.writeframes(samples.tobytes())
    give_to_other_user(source)
    mountpoint = public / "mnt"
    log = public / "log"
    # A small cache: a decode covers at most a quarter of it, so the second read decodes.
    options = ("--direct-io", "--cache-size", "1M", "--log-file", str(log))
    with mounted(str(source), str(mountpoint), *options):
        served = mountpoint / "recordings" / "a.wav"
        assert _read_range(served, 44, 64000) == samples[:32000].tobytes()
        before = os.stat(source / "a.wav")
        with open(source / "a.wav", "r+b") as audio:  # as its owner could: same inode, size
            audio.seek(44)
            audio.write((-samples).tobytes())
        os.utime(source / "a.wav", ns=(before.st_atime_ns, before.st_mtime_ns))
        assert os.stat(source / "a.wav").st_mtime_ns == before.st_mtime_ns
        try:
            rest = _read_range(served, 44 + 16000 * 2 * 15, 64000)
        except OSError as exc:
            assert exc.errno == errno.EIO
        else:
            assert rest == samples[16000 * 15 : 16000 * 17].tobytes(), "other audio served"
        _wait_for_line(log, "changed since")


def _wait_for_line(log: Path, text: str) -> None:
    """Until the mount's log holds ``text`` (a serving process's line reaches the daemon's
    log through the log channel, a moment after the read it concerns failed)."""
    deadline = time.monotonic() + 120  # only a guard against a line that never comes
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"no {text!r} in the log"
        time.sleep(0.05)


def _board_of(mountpoint: Path) -> Path:
    """The statistics board of the mount at ``mountpoint`` (the supervisor's private
    directory holds it; its subdirectory belongs to the serving user)."""
    for process in spawned_pids(str(mountpoint)):
        for descriptor in Path(f"/proc/{process}/fd").iterdir():
            with contextlib.suppress(OSError):
                for parent in Path(os.readlink(descriptor)).parents:
                    if parent.name.startswith("cutfs-serving-"):
                        return parent / "statistics"
    raise AssertionError("no serving process holds anything of the shared directory open")


def test_a_sources_owner_cannot_hang_or_forge_what_stats_prints(
    public: Path, corpus: dict[str, str]
) -> None:
    """The serving processes run as the source's owner and publish their figures in a
    directory that owner can write.  The owner puts a FIFO where one process publishes,
    a file with names made of escape sequences and line breaks where another does, and
    keeps both processes from replacing them: root's ``cutfs stats`` neither hangs nor
    prints a control character, and ``--prometheus`` gives only cutfs's own families."""
    source = _users_flac_source(public, corpus)
    mountpoint = public / "mnt"
    with mounted(str(source), str(mountpoint), "--allow-other", "--serving-processes", "2"):
        assert _read_as_other_user(mountpoint, "a.wav").returncode == 0
        board = _board_of(mountpoint)
        forged = {
            "pid": 1,
            "sequence": 1,
            "published": time.time(),
            "statistics": {
                "started": 0,
                "counters": {"requests.read": 1, "x\x1b[2J\ncutfs_forged_total 1\n#": 7},
                "errors": {"\x1b]0;owned\x07": 1},
                "latencies": {},
            },
            "sections": {"serving": {"note": "\x1b[31mred\x1b[0m"}},
        }
        (public / "forged.json").write_text(json.dumps(forged))
        give_to_other_user(public / "forged.json")
        script = (
            f"mkdir {board}/1.json.new {board}/2.json.new; "  # neither can publish again
            f"mv {public}/forged.json {board}/1.json; "
            f"rm -f {board}/2.json; mkfifo {board}/2.json"
        )
        assert as_other_user("sh", "-c", script).returncode == 0
        for _ in range(4):  # whichever process answers, it reads the other's file
            shown = subprocess.run(
                [*CUTFS, "stats", str(mountpoint)],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert shown.returncode == 0, shown.stderr
            assert not any(c != "\n" and not c.isprintable() for c in shown.stdout), shown.stdout
            metrics = subprocess.run(
                [*CUTFS, "stats", "--prometheus", str(mountpoint)],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert metrics.returncode == 0, metrics.stderr
            families = {f.name for f in text_string_to_metric_families(metrics.stdout)}
            assert families and all(name.startswith("cutfs_") for name in families)
            assert "cutfs_forged" not in metrics.stdout


def _read_range(path: Path, offset: int, size: int) -> bytes:
    with open(path, "rb") as audio:
        audio.seek(offset)
        return audio.read(size)


def test_transcodes_into_the_index_cache_are_bounded(public: Path, corpus: dict[str, str]) -> None:
    """A WebM (no seeking in place: transcoded to FLAC) past --index-cache-size fails alone."""
    source = public / "audio"
    source.mkdir()
    webm = source / "long.webm"
    sine = ["-f", "lavfi", "-i", "sine=f=440:d=120", "-ar", "48000", "-c:a", "libopus"]
    subprocess.run(["ffmpeg", "-v", "error", *sine, "-b:a", "12k", str(webm)], check=True)
    shutil.copy(corpus[FLAC], source / "plain.flac")
    cache, mountpoint = public / "cache", public / "mnt"
    options = ("--cache-dir", str(cache), "--index-cache-size", "1M")
    with mounted(str(source), str(mountpoint), *options):
        with pytest.raises(OSError):
            os.stat(mountpoint / "cuts" / "long.wav")  # 120 s at 48 kHz: 11.5 MB of PCM
        assert os.stat(mountpoint / "cuts" / "plain.wav").st_size > 44
    copies = [path.stat().st_size for path in cache.glob("*/plans/*") if path.suffix != ".arrow"]
    assert sum(copies) <= 1 << 20, copies
    with mounted(str(source), str(mountpoint), "--cache-dir", str(cache)):  # default 8G
        assert os.stat(mountpoint / "cuts" / "long.wav").st_size == 44 + 2 * 120 * 48000


# -- found in review ----------------------------------------------------------------------------


@pytest.mark.parametrize("processes", [1, 2])
def test_a_source_others_can_write_needs_a_user(public: Path, secret: Path, processes: int) -> None:
    """A root-owned, world-writable directory (like /tmp) is not read as root by default;
    serving processes read it as the user too."""
    shared = public / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    shutil.copy(secret, shared / "own.flac")
    (shared / "own.flac").chmod(0o644)
    (shared / "wav.scp").write_text(f"stolen {secret}\nown own.flac\n")
    give_to_other_user(shared / "wav.scp")
    mountpoint = public / "mnt"
    mountpoint.mkdir()
    refused = subprocess.run(
        [*CUTFS, "mount", str(shared), str(mountpoint)], capture_output=True, text=True, check=False
    )
    assert refused.returncode == 2
    assert "--user" in refused.stderr
    options = ("--allow-other", "--user", "nobody", "--allow-root", str(secret.parent))
    with mounted(str(shared), str(mountpoint), *options, "--serving-processes", str(processes)):
        for _ in range(3 * processes):  # whichever process answers
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
            assert _read_as_other_user(mountpoint, "stolen.wav").stdout == b""  # as nobody
            assert _read_as_other_user(mountpoint, "own.wav").returncode == 0
            assert _stats(mountpoint)["counters"]  # its snapshots are written as nobody too


def test_a_side_file_linked_outside_the_source_refuses_it(
    public: Path, corpus: dict[str, str]
) -> None:
    source = public / "data"
    source.mkdir()
    shutil.copy(corpus[FLAC], source / "a.flac")
    (source / "wav.scp").write_text("a a.flac\n")
    private = public / "private"
    private.mkdir(mode=0o700)
    (private / "notes").write_text("a TOP SECRET TRANSCRIPT\n")
    (source / "text").symlink_to(private / "notes")
    (public / "mnt").mkdir()
    result = subprocess.run(
        [*CUTFS, "mount", "--user", "root", str(source), str(public / "mnt")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 3
    assert "links to" in result.stderr and "TOP SECRET" not in result.stderr


def test_commands_get_none_of_the_daemons_environment(public: Path, corpus: dict[str, str]) -> None:
    marker = public / "environment"
    marker.touch()
    give_to_other_user(marker)
    data = _kaldi_by_other_user(public, corpus, f"env > {marker}; cat a.flac")
    environment = {**os.environ, "ADMIN_SECRET_TOKEN": "hunter2"}
    options = ("--allow-commands", "--allow-other")
    with _mounted_in(environment, data, public / "mnt", *options) as mountpoint:
        assert _read_as_other_user(mountpoint, "piped.wav").returncode == 0
    seen = marker.read_text()
    assert "hunter2" not in seen and "PATH=/usr/local/bin:/usr/bin:/bin" in seen


def test_a_cache_path_through_a_users_link_is_not_made_by_root(
    public: Path, corpus: dict[str, str]
) -> None:
    source = _kaldi_by_other_user(public, corpus, "true")
    root_only = public / "root-only"
    root_only.mkdir(mode=0o700)
    home = public / "home"
    home.mkdir()
    (home / "cache").symlink_to(root_only)
    give_to_other_user(home)
    (public / "mnt").mkdir()
    mount_arguments = [str(source), str(public / "mnt")]
    result = subprocess.run(
        [*CUTFS, "mount", "--cache-dir", str(home / "cache" / "cutfs"), *mount_arguments],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 3
    assert not (root_only / "cutfs").exists()  # made and chowned by root before
