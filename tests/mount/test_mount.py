"""Real mounts read by real clients: Python's wave, soundfile, sox, ffprobe and plain reads."""

from __future__ import annotations

import errno
import hashlib
import json
import mmap
import os
import random
import signal
import subprocess
import time
import wave
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Final

import numpy as np
import pytest
import soundfile
from support.corpus import wav_header
from support.mounts import CUTFS, descendants, is_mounted, mounted, needs_fuse, unmount
from support.references import (
    ODD_IDS,
    Reference,
    close_enough,
    cut_path,
    cut_plan,
    expected_cut,
    expected_file,
    recording_id,
)
from support.shards import copy_and_damage, resident_pages

from cutfs.codec.catalogue.path_escape import unescape_path
from cutfs.vfs.daemon import kernel_tuning

pytestmark = [pytest.mark.mount, needs_fuse]

#: The root of a mount of the test shards, whose cuts carry text and speakers.
ROOT_LISTING = sorted(
    [
        ".cutfs",
        "cuts",
        "cuts.jsonl.gz",
        "nemo.jsonl",
        "recordings",
        "recordings.uem",
        "segments",
        "spk2utt",
        "supervisions.rttm",
        "text",
        "utt2spk",
        "wav.scp",
    ]
)


def test_layout(mount: str) -> None:
    assert sorted(os.listdir(mount)) == ROOT_LISTING
    assert "flac_mono_16k" in os.listdir(os.path.join(mount, "cuts"))
    assert sorted(os.listdir(os.path.join(mount, "cuts", "flac_mono_16k"))) == [
        "end.wav",
        "overlap-a.wav",
        "overlap-b.wav",
        "start.wav",
    ]
    assert "opus_stereo_48k.wav" in os.listdir(os.path.join(mount, "recordings"))


def test_sizes_are_exact(mount: str, references: dict[str, Reference]) -> None:
    for cut in cut_plan(references):
        samples, _ = expected_cut(cut, references)
        assert os.stat(cut_path(mount, str(cut["id"]))).st_size == 44 + 2 * len(samples)


def test_every_cut_equals_the_full_decode(mount: str, references: dict[str, Reference]) -> None:
    for cut in cut_plan(references):
        with open(cut_path(mount, str(cut["id"])), "rb") as cut_file:
            actual = cut_file.read()
        reference = next(r for n, r in references.items() if recording_id(n) == cut["recording"])
        assert close_enough(actual, expected_file(cut, references), reference.lossless), cut["id"]


def test_soundfile_reads_cuts(mount: str, references: dict[str, Reference]) -> None:
    for cut in cut_plan(references)[:40]:
        expected, rate = expected_cut(cut, references)
        data, file_rate = soundfile.read(
            cut_path(mount, str(cut["id"])), dtype="int16", always_2d=True
        )
        assert file_rate == rate
        assert data.shape == expected.shape
        assert np.abs(data.astype(np.int32) - expected).max(initial=0) <= 1
        # and a seek into the middle, as Lhotse does
        with soundfile.SoundFile(cut_path(mount, str(cut["id"]))) as sound:
            sound.seek(len(expected) // 2)
            middle = sound.read(100, dtype="int16", always_2d=True)
        assert (
            np.abs(middle.astype(np.int32) - expected[len(expected) // 2 :][:100]).max(initial=0)
            <= 1
        )


def test_wave_module_reads_header_and_frames(mount: str, references: dict[str, Reference]) -> None:
    cut = next(c for c in cut_plan(references) if c["id"] == "mp3_vbr_stereo_44k/channel1")
    expected, rate = expected_cut(cut, references)
    with wave.open(cut_path(mount, str(cut["id"]))) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, rate)
        assert wav.getnframes() == len(expected)
        frames = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    assert np.abs(frames.astype(np.int32) - expected[:, 0]).max() <= 1


def test_sox_and_ffprobe_read_cuts(mount: str, references: dict[str, Reference]) -> None:
    cut = next(c for c in cut_plan(references) if c["id"] == "flac_s24_stereo_48k/end")
    expected, rate = expected_cut(cut, references)
    path = cut_path(mount, str(cut["id"]))
    raw = subprocess.run(
        ["sox", path, "-t", "raw", "-e", "signed", "-b", "16", "-"], capture_output=True, check=True
    ).stdout
    assert np.array_equal(np.frombuffer(raw, dtype="<i2"), expected[:, 0])
    probe = subprocess.run(
        [
            "ffprobe",
            "-v",
            "error",
            "-count_packets",
            "-show_entries",
            "stream=sample_rate,channels,codec_name,duration_ts",
            "-of",
            "compact=p=0:nk=1",
            path,
        ],
        capture_output=True,
        check=True,
        text=True,
    ).stdout.strip()
    assert probe == f"pcm_s16le|{rate}|1|{len(expected)}"


def test_recordings_are_whole(mount: str, references: dict[str, Reference]) -> None:
    for name, reference in references.items():
        path = os.path.join(mount, "recordings", recording_id(name) + ".wav")
        with open(path, "rb") as recording_file:
            data = recording_file.read()
        frames, channels = reference.samples.shape
        assert data[:44] == wav_header(reference.rate, channels, frames)
        samples = np.frombuffer(data[44:], dtype="<i2").reshape(-1, channels)
        reference.assert_matches(samples, 0)


def test_random_byte_ranges_in_any_order(mount: str, references: dict[str, Reference]) -> None:
    rng = random.Random(5)
    cuts = [c for c in cut_plan(references) if "vorbis" in str(c["id"]) or "opus" in str(c["id"])]
    for cut in cuts:
        expected = expected_file(cut, references)
        path = cut_path(mount, str(cut["id"]))
        descriptor = os.open(path, os.O_RDONLY)
        try:
            for _ in range(20):
                offset = rng.randrange(len(expected) + 10)
                size = rng.choice([1, 2, 3, 43, 44, 45, 4095, 65536, 200_000])
                actual = os.pread(descriptor, size, offset)
                assert close_enough(
                    actual, expected[offset : offset + size], lossless=True
                ) or _within_one(actual, expected[offset : offset + size], offset)
        finally:
            os.close(descriptor)


def _within_one(actual: bytes, expected: bytes, offset: int) -> bool:
    """Lossy data may differ by 1 LSB; compare the aligned 16-bit samples both cover."""
    if len(actual) != len(expected):
        return False
    header = max(0, 44 - offset)
    if actual[:header] != expected[:header]:
        return False
    start = header + ((offset + header - 44) % 2)
    a = np.frombuffer(actual[start : start + (len(actual) - start) // 2 * 2], dtype="<i2")
    b = np.frombuffer(expected[start : start + (len(expected) - start) // 2 * 2], dtype="<i2")
    return bool(np.abs(a.astype(np.int32) - b).max(initial=0) <= 1)


def _digest(path: str) -> str:
    with open(path, "rb") as cut_file:
        return hashlib.sha256(cut_file.read()).hexdigest()


def test_many_readers_at_once(mount: str, references: dict[str, Reference]) -> None:
    cuts = [c for c in cut_plan(references) if "flac" in str(c["id"]) or "wav_" in str(c["id"])]
    expected = {
        str(c["id"]): hashlib.sha256(expected_file(c, references)).hexdigest() for c in cuts
    }
    paths = [cut_path(mount, str(c["id"])) for c in cuts] * 3
    random.Random(3).shuffle(paths)
    with ProcessPoolExecutor(max_workers=8) as readers:
        digests = list(readers.map(_digest, paths))
    by_path = {cut_path(mount, cut_id): digest for cut_id, digest in expected.items()}
    assert all(by_path[path] == digest for path, digest in zip(paths, digests, strict=True))


def test_wav_scp_lists_every_cut(mount: str, references: dict[str, Reference]) -> None:
    with open(os.path.join(mount, "wav.scp"), encoding="utf-8", errors="surrogateescape") as scp:
        lines = scp.read().splitlines()
    plan = cut_plan(references)
    assert len(lines) == len(plan)
    cuts_dir = os.path.join(mount, "cuts") + "/"
    ids = set()
    for line in lines:
        key, path = line.split(" ", 1)
        assert os.path.isfile(path)
        ids.add(unescape_path(path.removeprefix(cuts_dir)))
        assert " " not in key
    assert ids == {str(cut["id"]) for cut in plan}


def test_odd_ids_are_escaped_reversibly(mount: str) -> None:
    for odd in ODD_IDS:
        path = cut_path(mount, odd)
        assert os.path.isfile(path), odd
        relative = os.path.relpath(path, os.path.join(mount, "cuts"))
        assert unescape_path(relative) == odd
        for component in relative.split("/"):
            assert len(component.encode()) <= 255 and component not in ("", ".", "..")


def test_writes_are_refused(mount: str) -> None:
    path = cut_path(mount, "flac_mono_16k/start")
    with pytest.raises(OSError) as raised:
        open(path, "r+b")  # noqa: SIM115
    assert raised.value.errno == errno.EROFS
    with pytest.raises(OSError) as raised:
        os.mkdir(os.path.join(mount, "cuts", "new"))
    assert raised.value.errno == errno.EROFS
    with pytest.raises(OSError) as raised:
        os.unlink(path)
    assert raised.value.errno == errno.EROFS


# -- failures and lifecycle ----------------------------------------------------------------


@pytest.fixture()
def corrupt_shard_dir(shard_dir: str, tmp_path: Path) -> str:
    """A copy of the shards with the middle of one FLAC recording overwritten."""
    copy = tmp_path / "corrupt"
    copy_and_damage(
        shard_dir,
        copy,
        "flac_mono_16k",
        lambda size: [
            (size // 2 - 60_000, bytes(range(256)) * 480),  # 120 kB of garbage
            (size - 40_000, b"\xff" * 40_000),
        ],
    )
    return str(copy)


def test_corrupt_data_fails_that_read_only(
    corrupt_shard_dir: str, tmp_path: Path, references: dict[str, Reference]
) -> None:
    log_file = tmp_path / "cutfs.log"
    with mounted(
        corrupt_shard_dir,
        str(tmp_path / "mnt"),
        "--serving-processes",
        "1",
        "--log-file",
        str(log_file),
    ) as mount:
        path = os.path.join(mount, "recordings", "flac_mono_16k.wav")
        assert os.stat(path).st_size > 44  # stat needs no decoding and still works
        with open(path, "rb") as recording_file, pytest.raises(OSError) as raised:
            recording_file.read()
        assert raised.value.errno == errno.EIO
        # Every other file is still served, correctly.
        cut = next(c for c in cut_plan(references) if c["id"] == "mp3_cbr_mono_16k/start")
        with open(cut_path(mount, str(cut["id"])), "rb") as cut_file:
            assert close_enough(cut_file.read(), expected_file(cut, references), False)
        assert os.listdir(mount)
    log_text = log_file.read_text()
    assert "flac_mono_16k" in log_text
    assert "ERROR" in log_text


def _foreground_daemon(shard_dir: str, mountpoint: str, stderr: int) -> subprocess.Popen[bytes]:
    """``cutfs mount --foreground`` as a child, returned once the mount answers."""
    os.mkdir(mountpoint)
    daemon = subprocess.Popen(
        [*CUTFS, "mount", "--foreground", "--serving-processes", "1", shard_dir, mountpoint],
        stderr=stderr,
    )
    try:
        _wait_until(lambda: is_mounted(mountpoint) and bool(os.listdir(mountpoint)))
    except BaseException:
        daemon.kill()
        daemon.wait()
        unmount(mountpoint)
        raise
    return daemon


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT])
def test_signal_unmounts_cleanly(shard_dir: str, tmp_path: Path, signal_number: int) -> None:
    mountpoint = str(tmp_path / "mnt")
    daemon = _foreground_daemon(shard_dir, mountpoint, subprocess.PIPE)
    try:
        daemon.send_signal(signal_number)
        _, stderr = daemon.communicate(timeout=30)
        assert daemon.returncode == 0, stderr
        assert b"Traceback" not in stderr
        assert b"unmounted" in stderr
        assert not is_mounted(mountpoint)
        assert os.listdir(mountpoint) == []
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        unmount(mountpoint)


def test_a_killed_daemon_leaves_a_stale_mount_that_the_next_mount_clears(
    shard_dir: str, tmp_path: Path
) -> None:
    mountpoint = str(tmp_path / "mnt")
    daemon = _foreground_daemon(shard_dir, mountpoint, subprocess.DEVNULL)
    try:
        children = Path(f"/proc/{daemon.pid}/task/{daemon.pid}/children").read_text().split()
        assert children  # the processes serving in turn, which end with it
        daemon.kill()
        daemon.wait()
        _wait_until(lambda: all(_ended(pid) for pid in children))
        with pytest.raises(OSError) as raised:
            os.listdir(mountpoint)
        assert raised.value.errno == errno.ENOTCONN
        with mounted(shard_dir, mountpoint) as mount:
            assert sorted(os.listdir(mount)) == ROOT_LISTING
    finally:
        unmount(mountpoint)


def test_mount_errors_have_clear_messages_and_exit_codes(shard_dir: str, tmp_path: Path) -> None:
    not_shards = tmp_path / "empty"
    not_shards.mkdir()
    result = subprocess.run(
        [*CUTFS, "mount", str(not_shards), str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 3
    assert "not a shard directory" in result.stderr
    result = subprocess.run(
        [*CUTFS, "mount", shard_dir, str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 4
    assert "missing" in result.stderr


def test_mounting_over_a_live_mount_is_refused(mount: str, shard_dir: str) -> None:
    result = subprocess.run(
        [*CUTFS, "mount", shard_dir, mount], capture_output=True, text=True, check=False
    )
    assert result.returncode == 4
    assert "already a mounted FUSE filesystem" in result.stderr
    assert sorted(os.listdir(mount)) == ROOT_LISTING


def _ended(pid: str) -> bool:
    """Whether a process is gone, or a zombie (its descriptors closed)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait_until(condition: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():  # type: ignore[operator]
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError("timed out")


def _counters(mount: str) -> dict[str, int]:
    # Unbuffered: a buffered open would cost the mount a request (see below).
    with open(os.path.join(mount, ".cutfs", "stats"), "rb", buffering=0) as stats_file:
        counters: dict[str, int] = json.loads(stats_file.readall())["counters"]
    return counters


def test_stats_count_requests_and_read_consistently(mount: str) -> None:
    path = os.path.join(mount, ".cutfs", "stats")
    first = _counters(mount)
    with open(path, "rb") as older:  # many small reads of one snapshot
        head = older.read(7)
        with open(path, "rb") as newer:  # opened meanwhile: a snapshot of its own
            newest = json.loads(newer.read())
        older_text = head + b"".join(iter(lambda: older.read(7), b""))
    older_counters = json.loads(older_text)["counters"]
    assert first["requests.lookup"] < older_counters["requests.lookup"]
    assert older_counters["requests.lookup"] < newest["counters"]["requests.lookup"]
    assert os.stat(path).st_size > 0


def _read_warm_cut_three_times(mount: str, buffering: int) -> dict[str, int]:
    """Reads a cut once to warm it, then three times more with ``buffering``; returns the
    counters' growth over those three reads."""
    cut = cut_path(mount, "flac_mono_16k/overlap-a")
    with open(cut, "rb") as cut_file:
        expected = cut_file.read()
    before = _counters(mount)
    for _ in range(3):
        with open(cut, "rb", buffering=buffering) as cut_file:
            assert cut_file.read() == expected
        assert os.stat(cut).st_size == len(expected)
    after = _counters(mount)
    return {name: after.get(name, 0) - before.get(name, 0) for name in after}


def test_a_warm_cut_costs_the_daemon_no_request(mount: str) -> None:
    """The kernel opens files without asking and keeps their pages across opens."""
    growth = _read_warm_cut_three_times(mount, buffering=0)
    for name in ("reads", "requests.open", "requests.release", "requests.getattr"):
        assert growth.get(name, 0) == 0, name
    assert growth.get("requests.ioctl", 0) == 0
    # Only the stats file's own lookups (a new snapshot each time), none for the cut.
    assert growth["requests.lookup"] <= 2
    assert _counters(mount)["requests.open"] <= 1  # the mount's first, answered ENOSYS


def test_pythons_buffered_open_costs_one_request_per_open(mount: str) -> None:
    """Python's buffered ``open`` asks whether the file is a terminal (``isatty``, an
    ioctl); the kernel sends every ioctl on a FUSE file to the daemon, which refuses it.
    Counted, since it is a round trip per warm open; an unbuffered open asks nothing."""
    growth = _read_warm_cut_three_times(mount, buffering=-1)
    assert growth.get("requests.ioctl", 0) == 3
    assert growth.get("reads", 0) == 0  # the pages stayed cached


def _kernel_settings(mount: str) -> dict[str, str]:
    """The mount's ``kernel`` statistics, once there: they are applied after the kernel's
    INIT exchange, a moment after the mount is ready."""
    kernel: dict[str, str] = {}
    deadline = time.monotonic() + 20
    while not kernel and time.monotonic() < deadline:
        with open(os.path.join(mount, ".cutfs", "stats"), encoding="utf-8") as stats_file:
            kernel = json.load(stats_file)["kernel"]
        time.sleep(0.05)
    return kernel


def test_kernel_settings_are_applied_when_asked_and_reported(
    shard_dir: str, tmp_path: Path
) -> None:
    with mounted(
        shard_dir,
        str(tmp_path / "mnt"),
        "-o",
        "read_ahead_kb=512,max_background=32",
        "--serving-processes",
        "1",
    ) as mount:
        device = kernel_tuning.device_of(mount)
        assert device is not None and device[0] == 0  # FUSE mounts have anonymous devices
        kernel = _kernel_settings(mount)
        assert set(kernel) == {"read_ahead_kb", "max_background"}
        if os.geteuid() == 0:
            assert kernel["read_ahead_kb"].startswith("set to 512")
            bdi = f"/sys/class/bdi/{device[0]}:{device[1]}/read_ahead_kb"
            assert Path(bdi).read_text().strip() == "512"
        assert all(outcome.startswith(("set to", "not applied")) for outcome in kernel.values())


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can set a mount's read-ahead")
def test_a_root_daemon_reads_a_short_cut_in_one_request_by_default(
    shard_dir: str, tmp_path: Path
) -> None:
    with mounted(shard_dir, str(tmp_path / "mnt"), "--serving-processes", "1") as mount:
        kernel = _kernel_settings(mount)
        assert kernel["read_ahead_kb"].startswith("set to 1024")
        path = os.path.join(mount, "cuts", "flac_mono_16k", "overlap-a.wav")  # 320 044 bytes
        os.stat(path)
        with open(os.path.join(mount, ".cutfs", "stats"), encoding="utf-8") as stats_file:
            before = json.load(stats_file)["counters"].get("reads", 0)  # file reads, not stats
        with open(path, "rb") as cut:
            assert len(cut.read()) == 44 + 2 * 160_000
        with open(os.path.join(mount, ".cutfs", "stats"), encoding="utf-8") as stats_file:
            after = json.load(stats_file)["counters"].get("reads", 0)
        assert after - before == 1  # three of 128 KiB at the kernel's default read-ahead


def _cuts_apart(references: dict[str, Reference]) -> list[dict[str, object]]:
    """The planned cuts that overlap no cut before them: a cut that does starts in the
    cache, where its first read decodes nothing, so nothing past it is cached to push."""
    cuts, spans = [], []
    for cut in cut_plan(references):
        span = (cut["recording"], float(cut["start"]), float(cut["start"]) + cut["duration"])
        if not any(r == span[0] and s < span[2] and span[1] < e for r, s, e in spans):
            cuts.append(cut)
        spans.append(span)
    return cuts


def test_in_turn_a_cut_is_decoded_once_whichever_process_its_reads_reach(
    shard_dir: str, tmp_path: Path, references: dict[str, Reference]
) -> None:
    """Two processes decode in turn, each with its own block cache: the reply to a cut's
    first read waits for the push of the rest, so the reader's next reads, made at once,
    find the pages stored and reach neither process (a later read that reached the
    other one would decode the cut again)."""
    cuts = _cuts_apart(references)
    with mounted(shard_dir, str(tmp_path / "mnt"), "--serving-processes", "2") as mount:
        before = _counters(mount)
        for cut in cuts:
            path = cut_path(mount, str(cut["id"]))
            with open(path, "rb", buffering=0) as cut_file:
                header = cut_file.read(44)
                assert len(header + cut_file.readall()) == os.stat(path).st_size
        after = _counters(mount)
    assert after["reads"] - before.get("reads", 0) == len(cuts)
    assert after["decodes"] - before.get("decodes", 0) == len(cuts)
    assert after["pushes_dropped"] == 0 and after["pushes_refused"] == 0


#: Tries per cut of the push test: pushed pages are clean page cache, which the machine may
#: reclaim before they are read (see the test).
_PUSH_TRIES: Final = 3


def _first_read_then_rest(mount: str, path: str) -> tuple[bytes, tuple[int, int, int, int]]:
    """A cut read as soundfile begins (its header, one kernel read), then, once the daemon
    has pushed the rest into the page cache, the rest; the cut's bytes, and for a failure's
    message: reads it took, bytes of the first, size, pages of the rest not resident
    (mincore) just before the rest was read."""
    with open(path, "rb") as cut_file:
        start = _counters(mount)
        header = cut_file.read(44)  # one kernel read: a page, or a window
        answered = _counters(mount)["read_bytes"] - start.get("read_bytes", 0)
        size = os.stat(path).st_size
        if answered < size:  # a thread of the daemon pushes the rest: wait for it
            deadline = time.monotonic() + 10
            rest = start["pushed_bytes"] + size - answered
            while _counters(mount)["pushed_bytes"] < rest:
                assert time.monotonic() < deadline, f"the rest of {path} not pushed"
                time.sleep(0.005)
        pages = -(-size // mmap.PAGESIZE)
        missing = resident_pages(path, answered // mmap.PAGESIZE, pages).count(False)
        content = header + cut_file.read()
        reads = _counters(mount)["reads"] - start.get("reads", 0)
    return content, (reads, answered, size, missing)


def test_the_rest_of_a_cut_reaches_the_page_cache_with_its_first_read(
    shard_dir: str, tmp_path: Path, references: dict[str, Reference]
) -> None:
    """A reader asking for the header only (soundfile's first read) costs the one
    request, and so does the rest of the cut read after it: the first read's decode is
    pushed into the kernel's pages, byte for byte what a read would have returned.

    The pages pushed are ordinary clean page cache, which the kernel may reclaim before
    they are read (on the machines this runs on, a DAMON thread pages out page cache by
    physical region every few seconds, pages a few milliseconds old included); a cut whose
    rest took more reads is evicted and read again, its frames still in the daemon's cache
    so that its first read is pushed again. A push that does not happen fails every try."""
    cuts = _cuts_apart(references)
    with mounted(shard_dir, str(tmp_path / "mnt"), "--serving-processes", "1") as mount:
        contents = {}
        reads_of: dict[str, tuple[int, int, int, int]] = {}
        retried: list[tuple[str, tuple[int, int, int, int]]] = []
        for cut in cuts:  # a fresh mount: none of their pages is cached yet
            path = cut_path(mount, str(cut["id"]))
            for _ in range(_PUSH_TRIES):
                content, seen = _first_read_then_rest(mount, path)
                if seen[0] == 1:
                    break
                retried.append((str(cut["id"]), seen))
                with open(path, "rb") as cut_file:
                    os.posix_fadvise(cut_file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            contents[str(cut["id"])] = content
            reads_of[str(cut["id"])] = seen
        after = _counters(mount)
        with open(os.path.join(mount, ".cutfs", "stats"), encoding="utf-8") as stats_file:
            assert json.load(stats_file)["errors"] == {}
    assert after["pushes_dropped"] == 0 and after["pushes_refused"] == 0
    # Without the push, a cut of 10 s takes three or four kernel reads more.
    more = {name: seen for name, seen in reads_of.items() if seen[0] != 1}
    assert not more, f"(reads, first, size, pages missing before the rest): {more}, {retried}"
    for cut in cuts:
        lossless = next(
            r for n, r in references.items() if recording_id(n) == cut["recording"]
        ).lossless
        actual = contents[str(cut["id"])]
        assert close_enough(actual, expected_file(cut, references), lossless), cut["id"]


@pytest.mark.parametrize("victim", ["daemon", "serving process"])
def test_a_start_killed_before_the_mount_is_ready_says_so_in_one_line(
    shard_dir: str, tmp_path: Path, victim: str
) -> None:
    """Whatever stops a background start before the mount is ready reaches the caller as
    a line with the cause; the mount is not left behind."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    starting = subprocess.Popen(
        [*CUTFS, "mount", "--serving-processes", "1", shard_dir, str(mountpoint)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        target = _first_seen(starting, victim)
        assert target is not None, "the start ended before it could be stopped"
        os.kill(target, signal.SIGKILL)
        _, printed = starting.communicate(timeout=120)
        assert starting.returncode != 0 and not is_mounted(str(mountpoint))
    finally:
        starting.kill()
        unmount(str(mountpoint))
    lines = printed.strip().splitlines()
    if victim == "daemon":
        assert lines[0].startswith("cutfs mount: the daemon was killed by SIGKILL before"), lines
    else:
        assert lines == [
            "cutfs mount: the serving process was killed by SIGKILL before it opened the "
            "source (see the log)"
        ]


def _first_seen(starting: subprocess.Popen[str], victim: str) -> int | None:
    """The pid of the daemon a background start began, or of its first serving process,
    as soon as it runs (None if the start ended first, or in a minute)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and starting.poll() is None:
        daemon = _starting_daemon(starting.pid)
        if daemon is not None and victim == "daemon":
            return daemon
        if daemon is not None:  # the first process it spawns is serving process 1
            spawned = [p for p in descendants(daemon) if b"spawn_main" in _cmdline(p)]
            if spawned:
                return spawned[0]
        time.sleep(0.005)
    return None


def _starting_daemon(caller: int) -> int | None:
    """The daemon a background ``cutfs mount`` (pid ``caller``) started, once it runs."""
    return next((p for p in descendants(caller) if b"--ready-fd" in _cmdline(p)), None)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
