"""The object store against a real S3 server on loopback (moto's, started here): exact
ranges, GETs merged and split as planned, ETag pinning, a server that is down."""

from __future__ import annotations

import http.client
import http.server
import os
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from cutfs.codec.errors import SourceError
from cutfs.codec.storage.caching_store import CachingStore
from cutfs.codec.storage.object_location import ObjectLocation
from cutfs.codec.storage.object_service import ObjectChangedError, ObjectStoreError
from cutfs.codec.storage.object_store import ObjectStore

moto_server = pytest.importorskip("moto.server")
botocore_session = pytest.importorskip("botocore.session")

BUCKET = "corpus"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    client = botocore_session.get_session().create_client("s3", endpoint_url=url)
    client.create_bucket(Bucket=BUCKET)
    client.close()
    yield url
    server.stop()


@pytest.fixture
def data(endpoint: str) -> bytes:
    payload = random.Random(3).randbytes(3 << 20)
    client = botocore_session.get_session().create_client("s3", endpoint_url=endpoint)
    client.put_object(Bucket=BUCKET, Key="shards/shard-00000.arrow", Body=payload)
    client.close()
    return payload


def _store(endpoint: str, **options: object) -> ObjectStore:
    host = endpoint.removeprefix("http://")
    uri = f"s3://{BUCKET}/shards?endpoint_override={host}&scheme=http"
    return ObjectStore(ObjectLocation.from_uri(uri), **options)  # type: ignore[arg-type]


def test_uris_name_a_bucket_a_prefix_and_an_endpoint() -> None:
    location = ObjectLocation.from_uri("s3://b/some/prefix/?endpoint_override=h:9000&scheme=http")
    assert (location.bucket, location.prefix) == ("b", "some/prefix/")
    assert location.endpoint_url == "http://h:9000"
    assert location.key("x.arrow") == "some/prefix/x.arrow"
    assert ObjectLocation.from_uri("s3://b").prefix == ""
    with pytest.raises(SourceError, match="s3://bucket/prefix"):
        ObjectLocation.from_uri("/local/path")
    with pytest.raises(SourceError, match="unknown query parameters: anonymous"):
        ObjectLocation.from_uri("s3://b/p?anonymous=true")


def test_ranges_are_exact_and_fetched_as_planned(endpoint: str, data: bytes) -> None:
    store = _store(endpoint, max_get_bytes=1 << 20, merge_gap_bytes=4096)
    try:
        name = "shard-00000.arrow"
        assert store.size(name) == len(data)
        rng = random.Random(5)
        for _ in range(20):
            start = rng.randrange(len(data))
            stop = min(len(data), start + rng.randrange(1, 300_000))
            assert store.read(name, start, stop) == data[start:stop]
        before = store.counters()["gets"]
        # Two ranges 1 KiB apart are one GET; a 2.5 MiB range is three parts of at most 1 MiB.
        near = store.read_many(name, [(0, 100), (1124, 2000)])
        assert near == [data[0:100], data[1124:2000]]
        assert store.counters()["gets"] - before == 1
        before = store.counters()["gets"]
        long_span = store.read(name, 100, 100 + (5 << 19))
        assert long_span == data[100 : 100 + (5 << 19)]
        assert store.counters()["gets"] - before == 3
        assert store.read(name, 10, 10) == b""
        assert store.counters()["heads"] == 1  # pinned once
        with pytest.raises(ObjectStoreError, match="outside the object"):
            store.read(name, len(data) - 1, len(data) + 1)
    finally:
        store.close()


def test_an_object_replaced_after_pinning_is_refused_not_served(endpoint: str, data: bytes) -> None:
    store = _store(endpoint)
    try:
        name = "shard-00000.arrow"
        assert store.read(name, 0, 16) == data[:16]
        client = botocore_session.get_session().create_client("s3", endpoint_url=endpoint)
        client.put_object(Bucket=BUCKET, Key=f"shards/{name}", Body=b"other bytes" * 1000)
        client.close()
        with pytest.raises(ObjectChangedError, match="changed since it was mounted"):
            store.read(name, 0, 16)
        assert store.counters()["errors"] >= 1
    finally:
        store.close()


def test_a_missing_object_and_a_server_that_is_down_fail_with_a_clear_error(
    endpoint: str,
) -> None:
    store = _store(endpoint)
    try:
        with pytest.raises(ObjectStoreError, match=r"no such object \(404\)"):
            store.pin("no-such-shard.arrow")
    finally:
        store.close()
    down = ObjectStore(
        ObjectLocation(BUCKET, "", "http://127.0.0.1:9"), deadline_seconds=0.5
    )  # port 9 (discard) refuses connections here
    try:
        with pytest.raises(ObjectStoreError, match="failed"):
            down.pin("shard-00000.arrow")
        assert down.counters()["retries"] >= 1  # retried with backoff until the deadline
    finally:
        down.close()


class _ThrottlingProxy:
    """An HTTP proxy in front of the S3 server that answers the next ``throttle`` GETs with
    503 SlowDown, as S3 does under load, holds GETs while ``released`` is clear (a slow
    store), and forwards everything else."""

    def __init__(self, upstream: str) -> None:
        self.throttle = 0
        self.throttled = 0
        self.released = threading.Event()
        self.released.set()
        proxy = self
        target = urlsplit(upstream)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                proxy.released.wait(30)
                if proxy.throttle > 0:
                    proxy.throttle -= 1
                    proxy.throttled += 1
                    body = (
                        b"<Error><Code>SlowDown</Code><Message>Reduce your rate</Message></Error>"
                    )
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self._forward()

            def do_HEAD(self) -> None:
                self._forward()

            def _forward(self) -> None:
                connection = http.client.HTTPConnection(
                    target.hostname or "127.0.0.1", target.port, timeout=30
                )
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = self.headers["Host"]
                connection.request(self.command, self.path, headers=headers)
                reply = connection.getresponse()
                body = reply.read()
                self.send_response(reply.status)
                dropped = ("transfer-encoding", "connection")
                if self.command != "HEAD":
                    dropped += ("content-length",)
                    self.send_header("Content-Length", str(len(body)))
                for key, value in reply.getheaders():
                    if key.lower() not in dropped:
                        self.send_header(key, value)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)
                connection.close()

            def log_message(self, *arguments: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_throttling_is_retried_with_backoff_within_the_deadline(endpoint: str, data: bytes) -> None:
    proxy = _ThrottlingProxy(endpoint)
    store = ObjectStore(ObjectLocation(BUCKET, "shards/", proxy.endpoint), deadline_seconds=2.0)
    try:
        name = "shard-00000.arrow"
        proxy.throttle = 3
        assert store.read(name, 1000, 70_000) == data[1000:70_000]
        assert proxy.throttled == 3
        counters = store.counters()
        assert (counters["retries"], counters["gets"]) == (3, 1)
        proxy.throttle = 10_000  # throttled for longer than the deadline: a clear error
        with pytest.raises(ObjectStoreError, match="503 SlowDown"):
            store.read(name, 0, 10)
        assert 3 < proxy.throttled < 20  # backed off: 50 ms doubling, not a busy loop
    finally:
        store.close()
        proxy.close()


def test_the_gets_a_piece_cache_starts_count_before_they_go_out(
    endpoint: str, data: bytes, tmp_path: Path
) -> None:
    """A piece cache sends its GETs from threads of its own.  Those a caller started are
    in the counters when it returns, before they go out: a decoder worker reports what
    its store did with each reply, and a cut that needed none of the margin pieces it
    asked for is answered before their GET is sent (a test counting GETs per cut once
    saw that GET under the next cut)."""
    proxy = _ThrottlingProxy(endpoint)
    inner = ObjectStore(ObjectLocation(BUCKET, "shards/", proxy.endpoint), deadline_seconds=10)
    store = CachingStore(inner, str(tmp_path / "cache"), "test://held")
    try:
        name = "shard-00000.arrow"
        assert store.size(name) == len(data)  # pinned (a HEAD) before the GETs are held
        # Ten runs of pieces too far apart to merge: more than the cache's fetching
        # threads, so that some wait for a thread while the others are held.
        spacing = len(data) // 10
        ranges = [(n * spacing, n * spacing + 1000) for n in range(10)]
        proxy.released.clear()
        try:
            assert not store.prefetch(name, ranges)
            assert store.counters()["gets"] == 10
        finally:
            proxy.released.set()
        for start, stop in ranges:
            assert bytes(store.read(name, start, stop)) == data[start:stop]
        assert store.counters()["gets"] == 10
    finally:
        store.close()
        proxy.close()
