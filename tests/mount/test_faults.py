"""Faults injected into real mounts: stalled storage, dead and hung decoders, many open files,
shards that lie.  Each shows that the failing read alone fails and the mount goes on."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from support.mounts import (
    CUTFS,
    holds_fuse,
    is_mounted,
    mounted,
    needs_fuse,
    process_name,
    spawned_pids,
    unmount,
)
from support.shards import write_arrow_file

from cutfs.codec.catalogue.shard_format import CUTS_FILE, RECORDINGS_FILE

pytestmark = [pytest.mark.mount, needs_fuse]
SUPPORT = Path(__file__).resolve().parents[1] / "support"


def _stats(mount: str) -> dict[str, dict[str, int]]:
    with open(os.path.join(mount, ".cutfs", "stats")) as stats:
        return json.load(stats)  # type: ignore[no-any-return]


def _read(path: str, offset: int = 0, size: int = -1) -> bytes:
    with open(path, "rb") as audio:
        audio.seek(offset)
        return audio.read(size)


def _in_thread(function: Callable[[], bytes], timeout: float) -> bytes | BaseException:
    """Run ``function`` in a thread; a read that never returns fails the test instead of hanging."""
    outcome: list[bytes | BaseException] = []

    def run() -> None:
        try:
            outcome.append(function())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert outcome, f"the read did not return within {timeout} s"
    return outcome[0]


def _decoder_pids(mountpoint: str) -> list[int]:
    """The decoder workers of the mount."""
    return [pid for pid in spawned_pids(mountpoint) if process_name(pid) == "cutfs-decoder"]


@pytest.fixture()
def slow_storage(shard_dir: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """The shards seen through a FUSE passthrough that SIGSTOP pauses, like a hung NFS server."""
    storage = tmp_path / "storage"
    storage.mkdir()
    process = subprocess.Popen(
        [sys.executable, str(SUPPORT / "pausable_fs.py"), shard_dir, str(storage)]
    )
    deadline = time.monotonic() + 30
    while not (is_mounted(str(storage)) and os.listdir(storage)):
        assert time.monotonic() < deadline, "the passthrough did not mount"
        time.sleep(0.05)
    try:
        yield process, str(storage)
    finally:
        process.send_signal(signal.SIGCONT)
        unmount(str(storage))
        process.wait(timeout=30)


def test_stalled_storage_fails_reads_at_the_deadline_and_serves_the_rest(
    slow_storage: tuple[subprocess.Popen[bytes], str], tmp_path: Path
) -> None:
    storage_process, storage = slow_storage
    with mounted(
        storage,
        str(tmp_path / "mnt"),
        "--no-decode-in-turn",  # in turn: see the test of decoding in turn below
        "--workers",
        "1",
        "--read-timeout",
        "2",
        "--log-file",
        str(tmp_path / "log"),
    ) as mount:
        cached_cut = os.path.join(mount, "cuts", "flac_mono_16k", "start.wav")
        cached = _read(cached_cut)
        stalled_cut = os.path.join(mount, "cuts", "opus_mono_16k", "overlap-a.wav")
        storage_process.send_signal(signal.SIGSTOP)
        try:
            outcome = _in_thread(lambda: _read(stalled_cut), timeout=60)
            assert isinstance(outcome, OSError) and outcome.errno == errno.EIO
            # Everything that needs no storage is still answered, by the serving process:
            recording = os.path.join(mount, "recordings", "flac_mono_16k.wav")
            assert _in_thread(lambda: _read(recording, 44, 60000), 10) == cached[44:60044]
            assert os.stat(os.path.join(mount, "cuts", "mp3_cbr_mono_16k", "end.wav")).st_size
            assert "cuts" in os.listdir(mount)
            stats = _stats(mount)
            assert stats["errors"]["deadline"] >= 1
            assert stats["workers"]["restarts"] >= 1
        finally:
            storage_process.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 60
        while True:  # the replacement worker finishes starting once storage answers
            try:
                data = _read(stalled_cut)
                break
            except OSError:
                assert time.monotonic() < deadline
                time.sleep(0.5)
        assert len(data) == 44 + 2 * 10 * 48000
    assert "opus_mono_16k" in (tmp_path / "log").read_text()


def test_a_hung_decoder_is_replaced_and_only_its_read_fails(shard_dir: str, tmp_path: Path) -> None:
    # --direct-io: the kernel retries a failed buffered read once (and the retry would reach
    # the new worker); direct reads show the first read's own outcome.
    options = ("--no-decode-in-turn", "--workers", "1", "--read-timeout", "2", "--direct-io")
    with mounted(shard_dir, str(tmp_path / "mnt"), *options) as mount:
        expected = _read(os.path.join(mount, "cuts", "vorbis_mono_16k", "start.wav"))
        (worker,) = _decoder_pids(mount)
        os.kill(worker, signal.SIGSTOP)
        cut = os.path.join(mount, "cuts", "mp3_vbr_stereo_44k", "end.wav")
        outcome = _in_thread(lambda: _read(cut), timeout=20)  # ten deadlines: it did not hang
        assert isinstance(outcome, OSError) and outcome.errno == errno.EIO
        assert _stats(mount)["errors"]["deadline"] == 1
        assert _decoder_pids(mount) != [worker]
        assert _stats(mount)["workers"]["restarts"] == 1
        assert len(_read(cut)) > 44  # the replacement serves it
        assert (
            _read(os.path.join(mount, "recordings", "vorbis_mono_16k.wav"), 0, len(expected))[44:]
            == expected[44:]
        )


def test_a_crashed_decoder_is_replaced_and_only_its_read_fails(
    shard_dir: str, tmp_path: Path
) -> None:
    options = ("--no-decode-in-turn", "--workers", "2", "--direct-io")
    with mounted(shard_dir, str(tmp_path / "mnt"), *options) as mount:
        before = _decoder_pids(mount)
        assert len(before) == 2
        for pid in before:
            os.kill(pid, signal.SIGSTOP)
        cut = os.path.join(mount, "cuts", "flac_s24_stereo_48k", "overlap-b.wav")
        outcomes: list[bytes | BaseException] = []
        reader = threading.Thread(
            target=lambda: outcomes.append(_in_thread(lambda: _read(cut), 60))
        )
        reader.start()
        deadline = time.monotonic() + 20
        while _stats(mount)["workers"]["busy"] == 0:  # the read is parked in a stopped worker
            assert time.monotonic() < deadline, "the read never reached a worker"
            time.sleep(0.05)
        for pid in before:
            os.kill(pid, signal.SIGKILL)
        reader.join(60)
        assert not reader.is_alive()
        (outcome,) = outcomes
        assert isinstance(outcome, OSError) and outcome.errno == errno.EIO
        assert _stats(mount)["errors"]["worker_died"] == 1
        deadline = time.monotonic() + 20  # the watcher replaces idle dead workers each second
        while len(after := _decoder_pids(mount)) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(after) == 2 and not set(after) & set(before)
        stats = _stats(mount)
        assert stats["workers"]["alive"] == 2
        assert stats["workers"]["restarts"] >= 1
        assert len(_read(cut)) == 44 + 2 * 10 * 48000


def test_thousands_of_open_files_cost_the_daemon_no_descriptors(
    shard_dir: str, tmp_path: Path
) -> None:
    with mounted(shard_dir, str(tmp_path / "mnt"), "--serving-processes", "1") as mount:
        (daemon,) = [pid for pid in spawned_pids(mount) if holds_fuse(pid)]  # the one serving
        descriptors_before = len(os.listdir(f"/proc/{daemon}/fd"))
        holders = [
            subprocess.Popen(
                [sys.executable, "-c", _HOLD_OPEN, mount, str(number)],
                stdout=subprocess.PIPE,
                stdin=subprocess.PIPE,
                text=True,
            )
            for number in range(4)
        ]
        try:
            for holder in holders:
                assert holder.stdout is not None
                assert holder.stdout.readline().strip() == "1000 open"
            assert len(os.listdir(f"/proc/{daemon}/fd")) <= descriptors_before + 4
        finally:
            for holder in holders:
                holder.communicate("done\n", timeout=60)
        assert all(holder.returncode == 0 for holder in holders)


_HOLD_OPEN = """
import os, sys
mount, number = sys.argv[1], int(sys.argv[2])
paths = []
for root, _, names in os.walk(os.path.join(mount, "cuts")):
    paths += [os.path.join(root, name) for name in names if name.endswith(".wav")]
files = [open(paths[(number * 1000 + i) % len(paths)], "rb") for i in range(1000)]
assert all(f.read(44)[:4] == b"RIFF" for f in files)
print("1000 open", flush=True)
sys.stdin.readline()
for f in files:
    f.close()
"""


def _rewrite_column(path: Path, column: str, change: Callable[[list[object]], None]) -> None:
    with pa.OSFile(str(path), "rb") as source:
        table = pa.ipc.open_file(source).read_all()
    values = table.column(column).to_pylist()
    change(values)
    index = table.schema.get_field_index(column)
    table = table.set_column(index, column, pa.array(values, table.schema.field(index).type))
    write_arrow_file(path, table)


def _far_past_the_end(values: list[object]) -> None:
    values[0] = 10**12


def _seek_point_past_the_blob(values: list[object]) -> None:
    values[3] = [*values[3][:-1], 10**12]  # type: ignore[index]


def _version_from_the_future(directory: Path) -> None:
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["version"] = 99
    (directory / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("lie", "message"),
    [
        (_version_from_the_future, "version 99 is not supported"),
        (lambda d: (d / CUTS_FILE).write_bytes(b"garbage"), "cannot read table"),
        (lambda d: (d / "cuts.entries.arrow").write_bytes(b"garbage"), "cannot read table"),
    ],
)
def test_a_shard_directory_that_cannot_be_read_is_refused_at_mount(
    shard_dir: str, tmp_path: Path, lie: Callable[[Path], None], message: str
) -> None:
    copy = tmp_path / "lying"
    shutil.copytree(shard_dir, copy)
    lie(copy)
    result = subprocess.run(
        [*CUTFS, "mount", str(copy), str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 3
    assert message in result.stderr
    assert not is_mounted(str(tmp_path))


@pytest.mark.parametrize("processes", ["1", "3"])
def test_rows_that_lie_fail_only_the_reads_they_reach(
    shard_dir: str, tmp_path: Path, processes: str
) -> None:
    """Rows are checked where they are used (a mount of millions does not read them all):
    a cut past its recording's end and a seek index past its blob each fail the files that
    use them, with a log line naming them; every other file is served.  The same through
    serving processes, whose log lines reach the daemon's log."""
    copy = tmp_path / "lying"
    shutil.copytree(shard_dir, copy)
    cuts = pa.ipc.open_file(pa.memory_map(str(copy / CUTS_FILE))).read_all()
    recordings = pa.ipc.open_file(pa.memory_map(str(copy / RECORDINGS_FILE))).read_all()
    lying_cut = cuts.column("cut_id")[0].as_py()
    paths = pa.ipc.open_file(pa.memory_map(str(copy / "cuts.paths.arrow"))).read_all()
    lying_path = paths.column("path")[0].as_py()  # ids may be escaped in their paths
    lying_recording = recordings.column("recording_id")[3].as_py()
    honest_path = next(
        path
        for path, recording in zip(
            paths.column("path").to_pylist(), cuts.column("recording").to_pylist(), strict=True
        )
        if recording != 3 and path != lying_path
    )
    _rewrite_column(copy / CUTS_FILE, "num_frames", _far_past_the_end)
    _rewrite_column(copy / RECORDINGS_FILE, "seek_byte_offsets", _seek_point_past_the_blob)
    log = tmp_path / "log"
    options = ("--log-file", str(log), "--serving-processes", processes)
    with mounted(str(copy), str(tmp_path / "mnt"), *options) as mount:
        for _ in range(int(processes)):  # whichever process answers
            Path("/proc/sys/vm/drop_caches").write_text("3\n")
            for path in (
                os.path.join(mount, "cuts", lying_path),
                os.path.join(mount, "recordings", f"{lying_recording}.wav"),
            ):
                with pytest.raises(OSError) as failed:
                    _read(path)
                assert failed.value.errno == errno.EIO
        assert _read(os.path.join(mount, "cuts", honest_path))[:4] == b"RIFF"
    text = log.read_text()
    assert f"cut {lying_cut!r} lies outside its recording" in text
    assert f"recording {lying_recording}: its seek index points outside" in text


def _waits_for_requests(pid: int) -> bool:
    """Whether a serving process is idle, waiting on its device (not on storage)."""
    with open(f"/proc/{pid}/wchan") as wchan:
        return "epoll" in wchan.read()


def _serving_pids(mount: str) -> list[int]:
    """The processes serving a mount that decodes in turn (not the daemon)."""
    pids: list[int] = _stats(mount)["serving"]["pids"]  # type: ignore[assignment]
    return pids[1:]


def _published(
    mount: str, condition: Callable[[dict[str, dict[str, int]]], bool]
) -> dict[str, dict[str, int]]:
    """The statistics once they show ``condition`` (each process publishes every second)."""
    deadline = time.monotonic() + 10
    while not condition(stats := _stats(mount)):
        assert time.monotonic() < deadline, stats
        time.sleep(0.2)
    return stats


def test_decoding_in_turn_a_stalled_read_fails_at_the_deadline_and_a_crash_fails_only_its_read(
    slow_storage: tuple[subprocess.Popen[bytes], str], tmp_path: Path
) -> None:
    storage_process, storage = slow_storage
    options = ("--serving-processes", "2", "--read-timeout", "2")
    log_file = tmp_path / "log"
    # --direct-io: the kernel would retry a failed buffered read once, on another process.
    with mounted(
        storage, str(tmp_path / "mnt"), *options, "--direct-io", "--log-file", str(log_file)
    ) as mount:
        deadline = time.monotonic() + 30
        while _stats(mount)["serving"]["ready"] < 3:
            assert time.monotonic() < deadline, "the serving processes did not start"
            time.sleep(0.1)
        stalled_cut = os.path.join(mount, "cuts", "opus_mono_16k", "overlap-a.wav")
        other_cut = os.path.join(mount, "cuts", "flac_mono_16k", "start.wav")
        storage_process.send_signal(signal.SIGSTOP)
        try:
            # The process answering it is killed at the deadline, and the read fails EIO.
            outcome = _in_thread(lambda: _read(stalled_cut), timeout=30)
            assert isinstance(outcome, OSError) and outcome.errno == errno.EIO
            assert "cuts" in os.listdir(mount)  # the other process answers meanwhile
            stats = _published(mount, lambda stats: "deadline" in stats["errors"])
            assert stats["errors"]["deadline"] == 1
            assert stats["serving"]["restarts"] >= 1  # type: ignore[operator]
            # A process dying mid-read (a decoder crash): its read fails EIO, not with the
            # kernel's ECONNABORTED, and nothing else does.
            before = _serving_pids(mount)
            reader = threading.Thread(
                target=lambda: outcomes.append(_in_thread(lambda: _read(other_cut), 60))
            )
            outcomes: list[bytes | BaseException] = []
            # (the replacement of the process killed above may be stuck starting)
            deadline = time.monotonic() + 20
            while not (idle := [pid for pid in before if _waits_for_requests(pid)]):
                assert time.monotonic() < deadline, "no process is waiting for requests"
                time.sleep(0.05)
            reader.start()
            # The read reaches a process, which then waits on storage: away from its
            # device for half a second, it has long begun answering it.
            deadline, busy_since = time.monotonic() + 20, None
            while busy_since is None or time.monotonic() < busy_since + 0.5:
                assert time.monotonic() < deadline, "the read never reached a process"
                busy = not all(_waits_for_requests(pid) for pid in idle)
                busy_since = (busy_since or time.monotonic()) if busy else None
                time.sleep(0.05)
            for pid in before:
                os.kill(pid, signal.SIGKILL)
            reader.join(60)
            (outcome,) = outcomes
            assert isinstance(outcome, OSError) and outcome.errno == errno.EIO, outcome
        finally:
            storage_process.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 60
        while not set(_serving_pids(mount)).isdisjoint(before) or (
            _stats(mount)["serving"]["ready"] < 3
        ):
            assert time.monotonic() < deadline, "the processes were not replaced"
            time.sleep(0.2)
        stats = _published(mount, lambda stats: "worker_died" in stats["errors"])
        assert stats["errors"]["worker_died"] == 1
        assert len(_read(stalled_cut)) == 44 + 2 * 10 * 48000
        assert len(_read(other_cut)) > 44
    text = log_file.read_text()
    assert "for longer than its deadline" in text and "died answering a request" in text
