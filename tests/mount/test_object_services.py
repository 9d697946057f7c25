"""Shards in the object stores other than S3 (whose tests, against moto, are
test_object_store.py and test_remote_shards.py): Google Cloud Storage (``gs://``, on
fake-gcs-server) and Azure Blob Storage (``az://``, on Azurite), both on loopback.  Each
is packed to and mounted from: the bytes of a local pack and mount, one GET per cold cut,
and an object rewritten under the mount failing its reads instead of serving other audio."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.mounts import (
    CUTFS,
    all_files,
    assert_same_file,
    assert_same_files,
    file_content,
    mounted,
    needs_fuse,
)
from support.references import cut_path
from support.servers import AzuriteServer, GcsServer, S3Server
from support.shards import data_bytes

from cutfs.codec.catalogue.shard_set import ShardSet
from cutfs.codec.storage.object_location import ObjectLocation
from cutfs.codec.storage.object_service import ObjectChangedError
from cutfs.codec.storage.object_store import ObjectStore

BUCKET = "corpus"
Server = GcsServer | AzuriteServer


@pytest.fixture(scope="module", params=["gs", "az"])
def server(request: pytest.FixtureRequest) -> Server:
    found: Server = request.getfixturevalue(
        "gcs_server" if request.param == "gs" else "azurite_server"
    )
    found.create_bucket(BUCKET)
    return found


@pytest.fixture(scope="module")
def packed_uri(server: Server, lhotse_manifests: list[str], shard_dir: str) -> str:
    """The test corpus packed by ``cutfs pack -o gs://...`` or ``az://...`` (several shards)."""
    uri = server.uri(BUCKET, "from-pack")
    command = [*CUTFS, "pack", *lhotse_manifests, "-o", uri, "--shard-size", "8M", "-q"]
    result = _cutfs(*command[len(CUTFS) :])
    assert result.returncode == 0, result.stderr
    return uri


def _cutfs(*arguments: str, environment: dict[str, str] | None = None) -> Any:
    """``cutfs ARGUMENTS`` as a user runs it: its exit status and output."""
    return subprocess.run(
        [*CUTFS, *arguments],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env=environment,
    )


def _stats(mountpoint: str) -> dict[str, dict[str, int]]:
    with open(os.path.join(mountpoint, ".cutfs", "stats"), encoding="utf-8") as stats:
        loaded: dict[str, dict[str, int]] = json.load(stats)
    return loaded


def test_ranges_are_exact_and_a_rewritten_object_is_refused(server: Server, tmp_path: Path) -> None:
    server.create_bucket(BUCKET)
    data = random.Random(7).randbytes(3 << 20)
    path = tmp_path / "object.bin"
    path.write_bytes(data)
    location = ObjectLocation.from_uri(server.uri(BUCKET, "ranges"))
    assert (location.scheme, location.prefix) == (server.uri(BUCKET, "").split(":")[0], "ranges/")
    store = ObjectStore(location, max_get_bytes=1 << 20)
    try:
        store.put("object.bin", str(path))  # a resumable upload: larger than one part
        assert store.size("object.bin") == len(data)
        rng = random.Random(8)
        for _ in range(20):
            start = rng.randrange(len(data))
            stop = min(len(data), start + rng.randrange(1, 300_000))
            assert store.read("object.bin", start, stop) == data[start:stop]
        before = store.counters()["gets"]
        assert store.read("object.bin", 100, 100 + (5 << 19)) == data[100 : 100 + (5 << 19)]
        assert store.counters()["gets"] - before == 3  # split at 1 MiB
        assert b"".join(store.stream("object.bin", 5, 2_000_000, 65536)) == data[5:2_000_000]
        assert store.listing() == {"object.bin": len(data)}
        server.put(BUCKET, "ranges/object.bin", data)  # the same bytes, a new generation
        with pytest.raises(ObjectChangedError, match="changed since it was mounted"):
            store.read("object.bin", 0, 10)
        store.delete_many(["object.bin"])
        assert not store.exists("object.bin")
    finally:
        store.close()


@needs_fuse
def test_pack_to_gs_and_a_mount_from_it_serve_what_the_local_ones_do(
    server: Server, packed_uri: str, shard_dir: str, mount: str, tmp_path: Path
) -> None:
    keys = server.keys(BUCKET, "from-pack/")
    names = sorted(key.removeprefix("from-pack/") for key in keys)
    assert names == sorted(os.listdir(shard_dir))  # no plan or partial tables left behind
    for name in names:
        if name != "manifest.json":
            local = (Path(shard_dir) / name).read_bytes()
            assert server.get(BUCKET, f"from-pack/{name}") == local, name
    cache = str(tmp_path / "cache")
    with mounted(
        packed_uri, str(tmp_path / "mnt"), "--cache-dir", cache, "--serving-processes", "2"
    ) as mnt:
        assert_same_files(mnt, mount)
        assert _stats(mnt)["shards"]["directory"] == packed_uri.split("?", maxsplit=1)[0] + "/"


@needs_fuse
def test_a_cold_cut_costs_one_get(packed_uri: str, shard_dir: str, tmp_path: Path) -> None:
    with ShardSet(shard_dir) as shards:
        cuts = [(shards.cut_ids[i], shards.cut_recording(i)) for i in range(shards.num_cuts)]
    options = (
        "--cache-dir",
        str(tmp_path / "cache"),
        "--serving-processes",
        "1",
        "--cache-size",
        "1M",
    )
    touched: set[int] = set()
    with mounted(packed_uri, str(tmp_path / "mnt"), *options) as mnt:
        for cut_id, recording in cuts:
            before = _stats(mnt)["store"].get("gets", 0)
            with open(cut_path(mnt, cut_id), "rb") as cut:
                cut.read()
            gets = _stats(mnt)["store"].get("gets", 0) - before
            # The first cut of a recording may fetch its header too; never more.
            assert gets <= (1 if recording in touched else 2), (cut_id, gets)
            touched.add(recording)
        store = _stats(mnt)["store"]
        assert store["heads"] == 0  # the workers got the pins
        assert store["gets"] >= len(touched)


@needs_fuse
def test_a_shard_rewritten_under_a_mount_fails_its_reads_and_the_next_mount(
    server: Server, lhotse_manifests: list[str], shard_dir: str, tmp_path: Path
) -> None:
    uri = server.uri(BUCKET, "rewritten")
    command = [*CUTFS, "pack", *lhotse_manifests, "-o", uri, "--shard-size", "8M", "-q"]
    packed = _cutfs(*command[len(CUTFS) :])
    assert packed.returncode == 0, packed.stderr
    with ShardSet(shard_dir) as shards:
        name, _, _ = shards.blob_location(0)
        victim = next(
            shards.cut_ids[i] for i in range(shards.num_cuts) if shards.cut_recording(i) == 0
        )
    cache = str(tmp_path / "cache")
    with mounted(
        uri, str(tmp_path / "mnt"), "--cache-dir", cache, "--serving-processes", "1"
    ) as mnt:
        # The same bytes under a new generation: only the pinned generation tells.
        server.put(BUCKET, f"rewritten/{name}", (Path(shard_dir) / name).read_bytes())
        with pytest.raises(OSError) as failure, open(cut_path(mnt, victim), "rb") as cut:
            cut.read()
        assert failure.value.errno == errno.EIO
        assert _stats(mnt)["store"]["errors"] >= 1
        assert os.path.getsize(cut_path(mnt, victim)) > 44  # what needs no audio is answered
    (tmp_path / "refused").mkdir()
    refused = _cutfs("mount", uri, str(tmp_path / "refused"), "--cache-dir", str(tmp_path / "c2"))
    assert refused.returncode == 3, refused.stderr
    assert "is not the one packed" in refused.stderr


def test_the_python_api_reads_every_cut_from_the_store_as_from_the_local_directory(
    packed_uri: str, shard_dir: str, tmp_path: Path
) -> None:
    import cutfs  # noqa: PLC0415

    with (
        cutfs.open(packed_uri, cache_dir=str(tmp_path / "cache")) as remote,
        cutfs.open(shard_dir) as local,
    ):
        assert list(remote.cut_ids) == list(local.cut_ids)
        for cut_id in local.cut_ids:
            samples, rate = remote.read_cut(cut_id)
            expected, expected_rate = local.read_cut(cut_id)
            assert rate == expected_rate and samples.shape == expected.shape, cut_id
            assert (samples == expected).all(), cut_id


@pytest.fixture(params=["s3", "gs", "az"])
def audio_store(
    request: pytest.FixtureRequest, corpus: dict[str, str]
) -> tuple[str, dict[str, str], dict[str, str]]:
    """The corpus's audio files uploaded to a store under ``audio/``: the scheme, each file's
    URL, and the environment that tells ``cutfs pack`` where the server is (as a user's
    environment names a real store's endpoint and credentials)."""
    names = {"s3": "s3_server", "gs": "gcs_server", "az": "azurite_server"}
    found: S3Server | Server = request.getfixturevalue(names[request.param])
    urls = _uploaded_corpus(found, request.param, corpus, "audio")
    environment = dict(os.environ)
    if isinstance(found, S3Server):
        environment["AWS_ENDPOINT_URL"] = found.endpoint
    elif isinstance(found, GcsServer):
        environment["STORAGE_EMULATOR_HOST"] = found.endpoint
    return request.param, urls, environment


def _uploaded_corpus(
    found: S3Server | Server, scheme: str, corpus: dict[str, str], prefix: str
) -> dict[str, str]:
    """The corpus's files put under ``prefix/`` of the test bucket: each file's URL."""
    found.create_bucket(BUCKET)
    urls = {}
    for path in sorted(corpus.values()):
        key = f"{prefix}/{os.path.basename(path)}"
        found.put(BUCKET, key, Path(path).read_bytes())
        urls[path] = f"{scheme}://{BUCKET}/{key}"
    return urls


def _url_manifests(
    lhotse_manifests: list[str], urls: dict[str, str], directory: Path
) -> tuple[Path, str]:
    """The test manifests, in ``directory``, with every recording's file source replaced by
    its object's URL."""
    recordings_file, cuts_file = lhotse_manifests
    directory.mkdir(exist_ok=True)
    cuts_file = shutil.copy(cuts_file, directory / "cuts.jsonl")
    remote_recordings = directory / "recordings.jsonl"
    with open(recordings_file) as local, open(remote_recordings, "w") as remote:
        for line in local:
            recording = json.loads(line)
            (source,) = recording["sources"]
            source.update(type="url", source=urls[source["source"]])
            remote.write(json.dumps(recording) + "\n")
    return remote_recordings, str(cuts_file)


def test_recordings_in_object_storage_are_fetched_and_packed_as_local_files_are(
    audio_store: tuple[str, dict[str, str], dict[str, str]],
    lhotse_manifests: list[str],
    shard_dir: str,
    tmp_path: Path,
) -> None:
    scheme, urls, environment = audio_store
    remote_recordings, cuts_file = _url_manifests(lhotse_manifests, urls, tmp_path / "urls")
    output = tmp_path / "packed"
    command = [*CUTFS, "pack", str(remote_recordings), cuts_file, "-o", str(output)]
    command += ["--shard-size", "8M", "-q"]
    result = _cutfs(*command[len(CUTFS) :], environment=environment)
    assert result.returncode == 0, result.stderr
    shards = sorted(path.name for path in output.glob("shard-*.arrow"))
    assert shards == sorted(path.name for path in Path(shard_dir).glob("shard-*.arrow"))
    for name in shards:  # the same blobs, in the same order
        assert (output / name).read_bytes() == (Path(shard_dir) / name).read_bytes(), name
    with ShardSet(str(output)) as fetched, ShardSet(shard_dir) as local:
        assert list(fetched.cut_ids) == list(local.cut_ids)
        assert all(source.startswith(f"{scheme}://") for source in fetched.recording_sources)
        for index in range(local.num_cuts):
            assert fetched.cut(index) == local.cut(index)

    missing = tmp_path / "missing-recordings.jsonl"
    recording = json.loads(Path(remote_recordings).read_text().splitlines()[0])
    recording["sources"][0]["source"] = f"{scheme}://{BUCKET}/audio/no-such-file.flac"
    missing.write_text(json.dumps(recording) + "\n")
    refused = _cutfs(
        "pack", str(missing), "-o", str(tmp_path / "refused"), "-q", environment=environment
    )
    assert refused.returncode != 0
    assert f"recording {recording['id']!r}: cannot fetch it" in refused.stderr
    assert "no-such-file.flac" in refused.stderr
    assert not (tmp_path / "refused").exists()


def test_a_recording_url_with_parameters_is_refused(
    lhotse_manifests: list[str], tmp_path: Path
) -> None:
    """A manifest may not choose the endpoint: the packer's signed requests and tokens
    would go to whatever host it names."""
    recording = json.loads(Path(lhotse_manifests[0]).read_text().splitlines()[0])
    recording["sources"][0].update(
        type="url", source="s3://corpus/a.flac?endpoint_override=elsewhere.example:80"
    )
    manifest = tmp_path / "recordings.jsonl"
    manifest.write_text(json.dumps(recording) + "\n")
    refused = _cutfs("pack", str(manifest), "-o", str(tmp_path / "out"), "-q")
    assert refused.returncode != 0
    assert "may not carry parameters" in refused.stderr
    assert not (tmp_path / "out").exists()


@needs_fuse
def test_recordings_in_object_storage_are_served_in_place_from_allowed_prefixes_only(
    audio_store: tuple[str, dict[str, str], dict[str, str]],
    lhotse_manifests: list[str],
    mount: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scheme, urls, environment = audio_store
    for name, value in environment.items():  # the daemon inherits the store's endpoint
        if os.environ.get(name) != value:
            monkeypatch.setenv(name, value)
    source = tmp_path / "manifests"
    _url_manifests(lhotse_manifests, urls, source)
    cache = str(tmp_path / "cache")
    (tmp_path / "refused").mkdir()
    refused = _cutfs("mount", str(source), str(tmp_path / "refused"), "--cache-dir", cache)
    assert refused.returncode == 3, refused.stderr
    assert "not beneath the object prefixes allowed (none)" in refused.stderr
    assert "--allow-objects" in refused.stderr
    allowed = ("--allow-objects", f"{scheme}://{BUCKET}/audio/", "--cache-dir", cache)
    with mounted(str(source), str(tmp_path / "mnt"), *allowed, "--serving-processes", "2") as mnt:
        served = [name for name in all_files(mnt) if name.endswith(".wav")]
        assert len(served) > 30
        assert served == [name for name in all_files(mount) if name.endswith(".wav")]
        for name in served:  # every cut and recording file, the samples of the files
            assert_same_file(mnt, mount, name)
        store = _stats(mnt)["store"]
        assert store["gets"] > 0 and store["heads"] > 0
    # Each object was fetched whole once, to index it, and then read by ranges through the
    # piece cache: no copy of it is kept.
    assert not list(Path(cache).rglob("*.audio"))
    pieces = list(Path(cache).rglob("pieces"))
    assert pieces and list(pieces[0].glob("*.data"))
    for directory in pieces:  # the plans stay: the next mount indexes nothing
        shutil.rmtree(directory)
    touched: set[str] = set()
    with mounted(str(source), str(tmp_path / "again"), *allowed, "--serving-processes", "1") as mnt:
        for name in (name for name in served if name.startswith("cuts/")):
            before = _stats(mnt)["store"].get("gets", 0)
            file_content(mnt, name)
            gets = _stats(mnt)["store"].get("gets", 0) - before
            recording = name.split("/")[1]
            # A cold cut is one GET (the first of a recording may fetch its header too).
            assert gets <= (1 if recording in touched else 2), (name, gets)
            touched.add(recording)
    # --disk-cache-size bounds the pieces of objects served in place as it does those of
    # shards in object storage (evicted pieces are fetched again: no count of GETs here).
    for directory in Path(cache).rglob("pieces"):
        shutil.rmtree(directory)
    bound = 256 << 10  # the pieces of a few cuts: the cache is swept as the cuts are read
    bounded = (*allowed, "--serving-processes", "1", "--disk-cache-size", str(bound))
    with mounted(str(source), str(tmp_path / "bounded"), *bounded) as mnt:
        for name in (name for name in served if name.startswith("cuts/")):
            assert_same_file(mnt, mount, name)
        assert _stats(mnt)["store"]["sweeps"] > 0
    (directory,) = list(Path(cache).rglob("pieces"))
    kept = sum(data_bytes(path) for path in directory.glob("*.data"))
    assert 0 < kept <= bound


@needs_fuse
def test_a_stalled_store_fails_reads_of_objects_served_in_place_at_the_deadline(
    s3_server: S3Server,
    corpus: dict[str, str],
    lhotse_manifests: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The objects of url sources are read within the mount's deadline (80% of
    --read-timeout), as shards in object storage are: the store gives up first, the read
    fails with EIO, the decoder worker is not killed for it, and reads succeed again once
    the store answers."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    source = tmp_path / "manifests"
    _url_manifests(lhotse_manifests, _uploaded_corpus(s3_server, "s3", corpus, "stalled"), source)
    options = ("--allow-objects", f"s3://{BUCKET}/stalled/", "--cache-dir", str(tmp_path / "c"))
    options += ("--serving-processes", "1", "--read-timeout", "3")
    with mounted(str(source), str(tmp_path / "mnt"), *options) as mnt:
        recording = next(
            name.split("/")[1]
            for name in all_files(mnt)
            if name.startswith("cuts/") and "flac" in name and name.endswith("/start.wav")
        )
        start, end = (Path(mnt, "cuts", recording, f"{cut}.wav") for cut in ("start", "end"))
        assert len(start.read_bytes()) > 44  # indexed, its first pieces fetched
        s3_server.process.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(OSError) as failure:
                end.read_bytes()  # 27 s later in the recording: pieces not fetched yet
            assert failure.value.errno == errno.EIO
        finally:
            s3_server.process.send_signal(signal.SIGCONT)
        assert len(end.read_bytes()) > 44
        stats = _stats(mnt)
        assert stats["store"]["errors"] >= 1
        assert stats["workers"]["restarts"] == 0  # the store gave up before the read did
