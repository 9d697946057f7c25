"""Shards in object storage, mounted as ``s3://bucket/prefix`` from moto's S3 server on
loopback: the same bytes as the local mount, one GET per cold cut, a cache that later
mounts reuse, and the faults (an object replaced, a stalled server, a server that is down)."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.mounts import (
    CUTFS,
    all_files,
    assert_same_file,
    assert_same_files,
    mounted,
    needs_fuse,
)
from support.references import cut_path, cut_plan, recording_id
from support.servers import HeaderDroppingProxy, S3Server

from cutfs.codec.catalogue.catalogue_copy import CATALOGUE_FILES
from cutfs.codec.catalogue.shard_set import ShardSet

pytestmark = [needs_fuse]
BUCKET = "corpus"


def _stats(mountpoint: str) -> dict[str, dict[str, int]]:
    with open(os.path.join(mountpoint, ".cutfs", "stats"), encoding="utf-8") as stats:
        loaded: dict[str, dict[str, int]] = json.load(stats)
    return loaded


def _store(mountpoint: str) -> dict[str, int]:
    return _stats(mountpoint).get("store", {})


def _read(path: str) -> bytes:
    with open(path, "rb") as file:
        return file.read()


def _uploaded(s3_server: S3Server, shard_dir: str, prefix: str) -> str:
    s3_server.upload(shard_dir, BUCKET, prefix)
    return s3_server.uri(BUCKET, prefix)


@pytest.fixture(scope="module")
def remote(s3_server: S3Server, shard_dir: str) -> str:
    return _uploaded(s3_server, shard_dir, "packed")


def test_every_file_is_the_same_as_from_the_local_directory(
    remote: str, mount: str, tmp_path: Path
) -> None:
    cache = str(tmp_path / "cache")
    with mounted(
        remote, str(tmp_path / "mnt"), "--cache-dir", cache, "--serving-processes", "2"
    ) as mnt:
        assert_same_files(mnt, mount)
        assert _stats(mnt)["shards"]["directory"].startswith(f"s3://{BUCKET}/packed")


def test_a_cold_cut_costs_one_get_and_a_second_mount_fetches_only_the_manifest(
    remote: str, shard_dir: str, references: dict[str, object], tmp_path: Path
) -> None:
    cuts = [cut for cut in cut_plan(references) if "/" in str(cut["id"])]  # type: ignore[arg-type]
    with ShardSet(shard_dir) as shards:
        blob_bytes = {
            shards.recordings.ids[i]: len(shards.blob(i)) for i in range(len(shards.recordings))
        }
    cache = str(tmp_path / "cache")
    options = ("--cache-dir", cache, "--serving-processes", "1", "--cache-size", "1M")
    touched: set[str] = set()
    with mounted(remote, str(tmp_path / "mnt"), *options) as mnt:
        # One listing pins every object (no HEAD each); the manifest and the tables: a GET each.
        opened = _store(mnt)
        assert (opened["lists"], opened["heads"]) == (1, 0), opened
        assert opened["gets"] == 1 + len(CATALOGUE_FILES), opened
        for cut in cuts:
            before = _store(mnt)
            _read(cut_path(mnt, str(cut["id"])))
            after = _store(mnt)
            gets = after.get("gets", 0) - before.get("gets", 0)
            fetched = after.get("bytes_fetched", 0) - before.get("bytes_fetched", 0)
            recording = str(cut["recording"])
            # The first cut of a recording may fetch its header too; never more.
            allowed = 1 if recording in touched else 2
            assert gets <= allowed, (cut["id"], gets)
            # Never a recording's worth more than the recording; the margin covers the end of
            # the previous cut's stream, whose last bytes may land after it was answered.
            assert fetched <= blob_bytes[recording] + (128 << 10), (cut["id"], fetched)
            touched.add(recording)
        first = _store(mnt)
        assert _stats(mnt)["counters"]["frames_fetched_ahead"] == 0  # cuts never read ahead
        assert first["heads"] == 0  # workers get the pins: no HEAD per cut, nor per worker
        assert first["gets"] > 0
    with mounted(remote, str(tmp_path / "again"), *options) as mnt:
        for cut in cuts:
            _read(cut_path(mnt, str(cut["id"])))
        second = _store(mnt)
        # The manifest only: the tables and every piece came from the disk cache.
        assert (second["lists"], second["heads"], second["gets"]) == (1, 0, 1), second
        assert second["disk_hits"] > 0


def test_an_object_replaced_under_the_mount_fails_its_reads_not_serves_other_audio(
    s3_server: S3Server, shard_dir: str, tmp_path: Path
) -> None:
    uri = _uploaded(s3_server, shard_dir, "replaced")
    with ShardSet(shard_dir) as shards:
        name, _, _ = shards.blob_location(0)
        victim = shards.recordings.ids[0]
        cut_ids = [
            shards.cut_ids[i] for i in range(shards.num_cuts) if shards.cut_recording(i) == 0
        ]
    cache = str(tmp_path / "cache")
    with mounted(
        uri, str(tmp_path / "mnt"), "--cache-dir", cache, "--serving-processes", "1"
    ) as mnt:
        original = _read(os.path.join(shard_dir, name))
        replaced = bytearray(original)
        replaced[len(replaced) // 2] ^= 0xFF  # same size, other bytes
        client = s3_server.client()
        client.put_object(Bucket=BUCKET, Key=f"replaced/{name}", Body=bytes(replaced))
        client.close()
        with pytest.raises(OSError) as failure:
            _read(cut_path(mnt, cut_ids[0]))
        assert failure.value.errno == errno.EIO
        assert _stats(mnt)["errors"], "the failure is counted"
        assert _store(mnt)["errors"] >= 1
        assert victim  # the log line names it: checked by the fault tests' log assertions
        # Files that need no audio are still answered.
        assert os.path.getsize(cut_path(mnt, cut_ids[0])) > 44


def test_a_store_that_ignores_the_pinned_version_cannot_serve_a_replaced_object(
    s3_server: S3Server, shard_dir: str, tmp_path: Path
) -> None:
    """Between the mount and the store, something ignores ``If-Match`` (a cache, or a store
    like s3rver): the version of every reply is checked against the pin on this side too,
    so a shard overwritten under the mount fails its reads instead of serving its new
    bytes."""
    uri = _uploaded(s3_server, shard_dir, "unconditional")
    with ShardSet(shard_dir) as shards:  # PCM: other bytes decode as other audio, no error
        victim = list(shards.recordings.ids).index(recording_id("wav_s16_mono_16k.wav"))
        name, start, end = shards.blob_location(victim)
        cut_ids = [
            shards.cut_ids[i] for i in range(shards.num_cuts) if shards.cut_recording(i) == victim
        ]
    proxy = HeaderDroppingProxy(int(s3_server.endpoint.rsplit(":", 1)[1]), b"If-Match")
    through_proxy = uri.replace(
        s3_server.endpoint.removeprefix("http://"), f"127.0.0.1:{proxy.port}"
    )
    options = ("--cache-dir", str(tmp_path / "cache"), "--serving-processes", "1")
    try:
        with mounted(through_proxy, str(tmp_path / "mnt"), *options) as mnt:
            replaced = bytearray(_read(os.path.join(shard_dir, name)))
            samples = slice(start + 1024, end)  # past the WAV header: the samples
            replaced[samples] = bytes(255 - byte for byte in replaced[samples])
            s3_server.put(BUCKET, f"unconditional/{name}", bytes(replaced))
            with pytest.raises(OSError) as failure:
                _read(cut_path(mnt, cut_ids[0]))
            assert failure.value.errno == errno.EIO
            assert _store(mnt)["errors"] >= 1
    finally:
        proxy.close()


def test_a_stalled_store_fails_reads_at_the_deadline_and_recovers(
    s3_server: S3Server, shard_dir: str, tmp_path: Path
) -> None:
    uri = _uploaded(s3_server, shard_dir, "stalled")
    with ShardSet(shard_dir) as shards:
        cut_ids = list(shards.cut_ids)
    cache = str(tmp_path / "cache")
    options = ("--cache-dir", cache, "--serving-processes", "1", "--read-timeout", "3")
    with mounted(uri, str(tmp_path / "mnt"), *options) as mnt:
        s3_server.process.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(OSError) as failure:
                _read(cut_path(mnt, cut_ids[0]))
            assert failure.value.errno == errno.EIO
            assert time.monotonic() - started < 20
            assert os.listdir(os.path.join(mnt, "cuts"))  # the catalogue is local: answered
        finally:
            s3_server.process.send_signal(signal.SIGCONT)
        assert len(_read(cut_path(mnt, cut_ids[0]))) > 44  # answered again
        stats = _stats(mnt)
        assert stats["store"]["errors"] >= 1
        # The store gave up before the read's deadline: its worker was not killed for it.
        assert stats["workers"]["restarts"] == 0


def _refused_mount(uri: str, tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """``cutfs mount`` that must fail with exit status 3 (the source cannot be served)."""
    mountpoint = tmp_path / "refused"
    mountpoint.mkdir(exist_ok=True)
    command = [*CUTFS, "mount", *options, "--cache-dir", str(tmp_path / "cache"), uri]
    result = subprocess.run(
        [*command, str(mountpoint)], capture_output=True, text=True, check=False, timeout=120
    )
    assert result.returncode == 3, result.stderr
    return result


def test_a_server_that_is_down_at_mount_time_is_a_clear_error(tmp_path: Path) -> None:
    uri = "s3://corpus/shards?endpoint_override=127.0.0.1:9&scheme=http"
    result = _refused_mount(uri, tmp_path, "--read-timeout", "1")
    assert "cannot read the manifest" in result.stderr
    assert "s3://corpus/shards" in result.stderr


def test_pack_uploads_to_object_storage_and_a_replaced_shard_is_refused_at_mount(
    s3_server: S3Server, lhotse_manifests: list[str], mount: str, shard_dir: str, tmp_path: Path
) -> None:
    uri = s3_server.uri(BUCKET, "from-pack")
    command = [*CUTFS, "pack", *lhotse_manifests, "-o", uri, "--shard-size", "8M", "-q"]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
    assert result.returncode == 0, result.stderr
    client = s3_server.client()
    try:
        manifest = json.loads(
            client.get_object(Bucket=BUCKET, Key="from-pack/manifest.json")["Body"].read()
        )
        assert len(manifest["shards"]) > 1
        assert all(shard["etag"].strip('"') for shard in manifest["shards"])
        # Partitions packed straight into the bucket hold the bytes of a local pack, and the
        # plan and partial tables are gone once the manifest is written.
        listing = client.list_objects_v2(Bucket=BUCKET, Prefix="from-pack/")["Contents"]
        keys = sorted(entry["Key"].removeprefix("from-pack/") for entry in listing)
        assert keys == sorted(os.listdir(shard_dir))
        for name in keys:
            if name != "manifest.json":
                body = client.get_object(Bucket=BUCKET, Key=f"from-pack/{name}")["Body"].read()
                assert body == _read(os.path.join(shard_dir, name)), name
        cache = str(tmp_path / "cache")
        with mounted(uri, str(tmp_path / "mnt"), "--cache-dir", cache) as mnt:
            for name in all_files(mount):
                if name.endswith(".wav"):
                    assert_same_file(mnt, mount, name)
        again = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
        assert again.returncode != 0
        assert "already holds a shard directory" in again.stderr
        # The same size, other bytes: only the ETag tells.
        first = manifest["shards"][0]["file"]
        body = bytearray(client.get_object(Bucket=BUCKET, Key=f"from-pack/{first}")["Body"].read())
        body[100] ^= 1
        client.put_object(Bucket=BUCKET, Key=f"from-pack/{first}", Body=bytes(body))
    finally:
        client.close()
    refused = _refused_mount(uri, tmp_path)
    assert "is not the one packed" in refused.stderr


def test_a_manifest_naming_objects_outside_its_prefix_is_refused(
    s3_server: S3Server, shard_dir: str, tmp_path: Path
) -> None:
    uri = _uploaded(s3_server, shard_dir, "hostile")
    manifest = json.loads((Path(shard_dir) / "manifest.json").read_text())
    manifest["shards"][0]["file"] = "../packed/shard-00000.arrow"
    client = s3_server.client()
    client.put_object(
        Bucket=BUCKET, Key="hostile/manifest.json", Body=json.dumps(manifest).encode()
    )
    client.close()
    refused = _refused_mount(uri, tmp_path)
    assert "is not a plain name under the prefix" in refused.stderr
