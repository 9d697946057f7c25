"""The piece cache over a real store (local files): exact bytes at every alignment, one
inner request per read, pieces shared between instances, a bounded disk, and pieces that
were damaged or torn on disk fetched again rather than served."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from support.shards import data_bytes

from cutfs.codec.catalogue.shard_set import ShardSet
from cutfs.codec.errors import ShardFormatError, SourceError
from cutfs.codec.storage.cache_usage import FILE_NAME as CACHE_USAGE_FILE
from cutfs.codec.storage.caching_store import CachingStore
from cutfs.codec.storage.local_store import LocalStore

PIECE = 4096


@pytest.fixture
def objects(tmp_path: Path) -> tuple[str, dict[str, bytes]]:
    directory = tmp_path / "objects"
    directory.mkdir()
    rng = random.Random(11)
    data = {"a.arrow": rng.randbytes(100 * PIECE + 123), "b.arrow": rng.randbytes(7 * PIECE)}
    for name, payload in data.items():
        (directory / name).write_bytes(payload)
    return str(directory), data


@contextmanager
def _cache(directory: str, cache: Path, **options: int) -> Iterator[CachingStore]:
    """A piece cache of the local objects in ``directory``, closed afterwards."""
    store = CachingStore(
        LocalStore(directory), str(cache), "test://objects", piece_bytes=PIECE, **options
    )
    try:
        yield store
    finally:
        store.close()


def _inner_reads(store: CachingStore) -> int:
    return store.counters()["requests"]


def test_reads_are_exact_and_each_costs_one_inner_request_at_most(
    objects: tuple[str, dict[str, bytes]], tmp_path: Path
) -> None:
    directory, data = objects
    with _cache(directory, tmp_path / "cache") as store:
        payload = data["a.arrow"]
        rng = random.Random(2)
        for _ in range(200):
            start = rng.randrange(len(payload))
            stop = min(len(payload), start + rng.randrange(1, 5 * PIECE))
            before = _inner_reads(store)
            assert bytes(store.read("a.arrow", start, stop)) == payload[start:stop]
            assert _inner_reads(store) - before <= 1  # missing pieces in one request
        assert bytes(store.read("a.arrow", len(payload) - 5, len(payload))) == payload[-5:]
        before = _inner_reads(store)
        ranges = [(0, 10), (3 * PIECE, 4 * PIECE + 1)]
        assert not store.prefetch("b.arrow", ranges)  # fetched in the background
        assert bytes(store.read("b.arrow", 0, 10)) == data["b.arrow"][:10]
        expected = data["b.arrow"][3 * PIECE : 5 * PIECE]
        assert bytes(store.read("b.arrow", 3 * PIECE, 5 * PIECE)) == expected
        assert _inner_reads(store) - before == 1  # two close runs of pieces: one request
        assert store.prefetch("b.arrow", ranges)  # all at hand now
        assert not store.prefetch("b.arrow", [(5 * PIECE, 5 * PIECE + 1)])
        with pytest.raises(ShardFormatError, match="outside"):
            store.read("b.arrow", 0, len(data["b.arrow"]) + 1)


def test_a_second_store_on_the_same_directory_reads_what_the_first_fetched(
    objects: tuple[str, dict[str, bytes]], tmp_path: Path
) -> None:
    directory, data = objects
    with _cache(directory, tmp_path / "cache") as first:
        assert bytes(first.read("a.arrow", 0, 50 * PIECE)) == data["a.arrow"][: 50 * PIECE]
    with _cache(directory, tmp_path / "cache") as second:
        assert bytes(second.read("a.arrow", 10, 50 * PIECE)) == data["a.arrow"][10 : 50 * PIECE]
        counters = second.counters()
        assert counters["requests"] == 0
        assert counters["disk_hits"] == 50


def test_damaged_or_missing_pieces_on_disk_are_fetched_again(
    objects: tuple[str, dict[str, bytes]], tmp_path: Path
) -> None:
    directory, data = objects
    cache = tmp_path / "cache"
    with _cache(directory, cache) as store:
        store.read("a.arrow", 0, 10 * PIECE)
    (data_file,) = [p for p in cache.iterdir() if p.suffix == ".data"]
    with open(data_file, "r+b") as damaged:
        damaged.seek(3 * PIECE + 17)
        damaged.write(b"\xff\x00\xff")
        damaged.truncate(8 * PIECE + 100)  # pieces 8 and 9 torn
    with _cache(directory, cache) as store:
        assert bytes(store.read("a.arrow", 0, 10 * PIECE)) == data["a.arrow"][: 10 * PIECE]
        counters = store.counters()
        assert counters["corrupt_pieces"] == 3
        assert counters["disk_hits"] == 7
        assert counters["requests"] == 1  # pieces 3 to 9: close enough for one request


def test_the_disk_stays_within_its_bound_and_keeps_the_recent_pieces(
    objects: tuple[str, dict[str, bytes]], tmp_path: Path
) -> None:
    directory, data = objects
    cache = tmp_path / "cache"
    with _cache(directory, cache, disk_bytes=20 * PIECE, memory_bytes=0) as store:
        payload = data["a.arrow"]
        for number in range(100):
            start = number * PIECE
            assert bytes(store.read("a.arrow", start, start + 10)) == payload[start : start + 10]
        counters = store.counters()
        assert counters["sweeps"] >= 1
        allocated = sum(os.stat(p).st_blocks * 512 for p in cache.iterdir() if p.is_file())
        assert allocated <= 20 * PIECE + 8 * PIECE  # data holes punched; maps and lock are small
        reads = _inner_reads(store)
        store.read("a.arrow", 99 * PIECE, 99 * PIECE + 10)  # the most recent: still cached
        assert _inner_reads(store) == reads
        assert bytes(store.read("a.arrow", 0, 10)) == payload[:10]  # evicted: fetched again
        assert _inner_reads(store) == reads + 1


_WRITE_WHEN_TOLD = """
import json, sys
from cutfs.codec.storage.caching_store import CachingStore
from cutfs.codec.storage.local_store import LocalStore

directory, cache, name, pieces = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
piece, bound = int(sys.argv[5]), int(sys.argv[6])
store = CachingStore(LocalStore(directory), cache, "test://objects", piece_bytes=piece,
                     disk_bytes=bound, memory_bytes=0)
store.read(name, 0, 10)  # one piece on disk: the store has counted what the cache holds
print("ready", flush=True)
sys.stdin.readline()
for number in range(1, pieces):
    store.read(name, number * piece, number * piece + 10)
print(json.dumps(store.counters()), flush=True)
store.close()
"""


def test_processes_sharing_a_cache_directory_keep_to_one_bound(tmp_path: Path) -> None:
    """Every process of a mount writes into one cache directory under one bound: what
    the others wrote counts against it as much as its own (each process counted only
    its own writes once, and the second of two writing in turn took the directory to
    1.55 times the bound without sweeping)."""
    directory = tmp_path / "objects"
    directory.mkdir()
    rng = random.Random(5)
    for name in ("first.arrow", "second.arrow"):
        (directory / name).write_bytes(rng.randbytes(60 * PIECE))
    cache, bound = tmp_path / "cache", 40 * PIECE
    writers = {
        name: subprocess.Popen(
            [sys.executable, "-c", _WRITE_WHEN_TOLD, str(directory), str(cache), name, *sizes],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for name, sizes in (
            ("first.arrow", ("60", str(PIECE), str(bound))),
            ("second.arrow", ("30", str(PIECE), str(bound))),
        )
    }
    try:
        for writer in writers.values():  # both have counted before either writes
            assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
        sweeps = {}
        for name, writer in writers.items():  # in turn: the first fills the cache
            assert writer.stdin is not None and writer.stdout is not None
            writer.stdin.write("go\n")
            writer.stdin.flush()
            sweeps[name] = json.loads(writer.stdout.readline())["sweeps"]
            assert writer.wait(timeout=60) == 0
    finally:
        for writer in writers.values():
            writer.kill()
            writer.wait()
            for pipe in (writer.stdin, writer.stdout):
                if pipe is not None:
                    pipe.close()
    data = [path for path in cache.iterdir() if path.suffix == ".data"]
    assert len(data) == 2
    assert sum(data_bytes(path) for path in data) <= bound
    assert sweeps["first.arrow"] >= 1
    assert sweeps["second.arrow"] >= 1  # 30 pieces of its own, but the first's count too


def test_a_damaged_usage_count_is_counted_again_from_the_maps(
    objects: tuple[str, dict[str, bytes]], tmp_path: Path
) -> None:
    """The directory's shared count is data like any other: a count out of range (torn,
    or written by someone else) is made again from the pieces the maps mark, not trusted."""
    directory, data = objects
    cache = tmp_path / "cache"
    with _cache(directory, cache, disk_bytes=20 * PIECE) as store:
        store.read("a.arrow", 0, 10 * PIECE)  # ten pieces on disk
    counted = cache / CACHE_USAGE_FILE
    assert int.from_bytes(counted.read_bytes(), "little", signed=True) == 10 * PIECE
    counted.write_bytes((-5).to_bytes(8, "little", signed=True))
    with _cache(directory, cache, disk_bytes=20 * PIECE, memory_bytes=0) as store:
        payload = data["a.arrow"]
        for number in range(10, 30):  # 20 more pieces: past the bound only if 10 are counted
            start = number * PIECE
            assert bytes(store.read("a.arrow", start, start + 10)) == payload[start : start + 10]
        assert store.counters()["sweeps"] >= 1
    allocated = sum(data_bytes(p) for p in cache.iterdir() if p.suffix == ".data")
    assert allocated <= 20 * PIECE


def test_a_cache_too_small_for_one_piece_still_serves_every_read(
    objects: tuple[str, dict[str, bytes]], tmp_path: Path
) -> None:
    """Pieces that neither memory nor disk can keep are handed to their readers by the
    fetch itself; a disk bound smaller than a piece keeps nothing on disk instead of
    sweeping the whole directory before every write."""
    directory, data = objects
    with _cache(directory, tmp_path / "cache", disk_bytes=PIECE - 1, memory_bytes=0) as store:
        payload = data["a.arrow"]
        for number in range(0, 100, 5):
            start = number * PIECE + 7
            assert (
                bytes(store.read("a.arrow", start, start + 2 * PIECE))
                == payload[start : start + 2 * PIECE]
            )
        counters = store.counters()
        assert counters["misses"] >= 20
        assert counters["sweeps"] == 0
    data = [path for path in (tmp_path / "cache").iterdir() if path.suffix == ".data"]
    assert sum(path.stat().st_blocks for path in data) == 0


def test_a_cache_directory_others_can_write_is_refused(
    objects: tuple[str, dict[str, bytes]], tmp_path: Path
) -> None:
    cache = tmp_path / "shared"
    cache.mkdir()
    cache.chmod(0o777)
    with (
        pytest.raises(SourceError, match="writable by its group or others"),
        _cache(objects[0], cache),
    ):
        pass


def _fetched_pieces(store: CachingStore) -> int:
    """Pieces fetched from the inner store, once the background fetches have settled."""
    deadline = time.monotonic() + 10
    last = -1
    while time.monotonic() < deadline:
        now = store.counters()["misses"]
        if now == last:
            return now
        last = now
        time.sleep(0.3)
    raise AssertionError("the fetches did not settle")


def test_frames_asked_ahead_are_fetched_in_the_background(shard_dir: str, tmp_path: Path) -> None:
    """A decode with ``ahead_frames`` has the bytes of the frames after it fetched too (a
    recording read in order); one without fetches only its own."""
    fetched = {}
    for ahead_seconds in (0, 10):
        cache = tmp_path / f"cache-{ahead_seconds}"
        store = CachingStore(LocalStore(shard_dir), str(cache), "test://shards", piece_bytes=PIECE)
        with ShardSet(shard_dir, store) as shards:
            index = list(shards.recording_ids).index("flac_mono_16k")
            rate = shards.recording(index).sample_rate
            shards.read_frames(index, rate, 3 * rate, ahead_frames=ahead_seconds * rate)
            fetched[ahead_seconds] = _fetched_pieces(store)
            seek = shards.recording(index).seek_index
            ahead_bytes = seek.point_at_or_before(13 * rate).byte_offset
            ahead_bytes -= seek.first_point_after(3 * rate).byte_offset  # type: ignore[union-attr]
    assert fetched[0] > 0
    assert fetched[10] >= fetched[0] + 0.9 * ahead_bytes // PIECE


_READ_EVERYTHING = """
import sys
from cutfs.codec.storage.caching_store import CachingStore
from cutfs.codec.storage.local_store import LocalStore

directory, cache, piece = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = CachingStore(LocalStore(directory), cache, "test://objects", piece_bytes=piece)
for name in ("a.arrow", "b.arrow"):
    with open(f"{directory}/{name}", "rb") as file:
        expected = file.read()
    for start in range(0, len(expected), 3 * piece):
        stop = min(start + 5 * piece + 7, len(expected))
        assert bytes(store.read(name, start, stop)) == expected[start:stop], (name, start)
print(store.counters()["requests"])
store.close()
"""


@contextmanager
def _full_filesystem(kind: str, where: Path) -> Iterator[Path]:
    """A small file system of ``kind`` (tmpfs, or ext4 on a loop device) mounted at ``where``
    and filled to the last block; skips the test where it cannot be made."""
    where.mkdir()
    if kind == "tmpfs":
        mounting = ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)]
    else:
        image = where.with_suffix(".img")
        with open(image, "wb") as sparse:
            sparse.truncate(8 << 20)
        if shutil.which("mkfs.ext4") is None:
            pytest.skip("no mkfs.ext4 (e2fsprogs: scripts/setup.sh installs it)")
        made = subprocess.run(
            ["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, check=False
        )
        if made.returncode != 0:
            pytest.skip(f"cannot make an ext4 image here: {made.stderr!r}")
        mounting = ["mount", "-o", "loop", str(image), str(where)]
    if subprocess.run(mounting, capture_output=True, check=False).returncode != 0:
        pytest.skip(f"cannot mount a {kind} here")
    try:
        os.chmod(where, 0o700)
        with open(where / "filler", "wb", buffering=0) as filler, contextlib.suppress(OSError):
            while True:
                filler.write(bytes(4096))
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small file system (root)")
@pytest.mark.parametrize("kind", ["tmpfs", "ext4"])
def test_a_full_cache_disk_costs_fetches_not_reads(
    objects: tuple[str, dict[str, bytes]], tmp_path: Path, kind: str
) -> None:
    """On a full disk, writing a piece fails with ENOSPC; touching a map page the file
    system has no room for would fault the process (on tmpfs even reading a hole needs a
    page): each read is served, from the store, by a process that lives."""
    directory, _ = objects
    with _full_filesystem(kind, tmp_path / "full") as full:
        reader = subprocess.run(
            [sys.executable, "-c", _READ_EVERYTHING, directory, str(full / "cache"), str(PIECE)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert reader.returncode == 0, reader.stderr
        assert int(reader.stdout) > 0  # fetched, since nothing could be kept


def test_the_maps_kept_mapped_stay_within_their_bound(tmp_path: Path) -> None:
    """Three 16 GiB objects (sparse files) in 4 KiB pieces have maps of 32 MiB each: after
    a read of each, the process keeps two mapped (64 MiB), not all three.

    Which two depends on timing: a fetch writes its pieces after the read is answered,
    and may open its object again (closing another).  So the maps are counted once the
    fetches have ended, and while they end, never more than two."""
    directory = tmp_path / "objects"
    directory.mkdir()
    names = [f"big-{number}.arrow" for number in range(3)]
    for name in names:
        with open(directory / name, "wb") as sparse:
            sparse.truncate(16 << 30)
    cache = tmp_path / "cache"
    with _cache(str(directory), cache) as store:
        most = 0
        for name in names:
            assert bytes(store.read(name, (8 << 30) + 5, (8 << 30) + 9)) == bytes(4)
            most = max(most, len(_maps_under(cache)))
        while not store.wait_for_fetches(0.001):
            most = max(most, len(_maps_under(cache)))
        assert len(_maps_under(cache)) == 2
        assert most <= 2, most


def _maps_under(directory: Path) -> set[str]:
    """The ``.map`` files under ``directory`` that this process has mapped now."""
    return {
        line.split()[-1]
        for line in Path("/proc/self/maps").read_text().splitlines()
        if line.endswith(".map") and str(directory) in line
    }
