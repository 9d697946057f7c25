"""Byte ranges of objects in S3-compatible object storage, each GET conditional on the
version that was pinned.

A :class:`cutfs.codec.byte_store.ByteStore`; mounts put a
:class:`cutfs.codec.caching_store.CachingStore` in front of it.  Design notes and
measurements: docs/object-storage-notes.md.  In short: ``pyarrow.fs`` cannot make
a read conditional, so this uses botocore directly.

* An object is *pinned* once (a HEAD: its size and ETag); every later read is a
  ranged GET with ``If-Match`` on that ETag, so an object replaced under a mount
  fails with :class:`ObjectChangedError` instead of serving other bytes.
* Ranges are always bounded.  :meth:`ObjectStore.read_many` merges ranges closer
  than ``merge_gap_bytes``, splits what is longer than ``max_get_bytes`` into parts,
  and fetches the parts concurrently.
* Throttling and server errors (5xx, ``SlowDown``) are retried with exponential
  backoff until ``deadline_seconds`` after the call began; past it,
  :class:`ObjectStoreError`.
* Counters (GETs, bytes, retries, errors) for ``.cutfs/stats``.

Credentials, region and endpoint come from the standard AWS environment and
config files (``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ``AWS_ENDPOINT_URL``, ...),
and from the URI's query: ``s3://bucket/prefix?endpoint_override=host:port&scheme=http``
(the names pyarrow uses), or ``endpoint_url=http://host:port``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn, TypeVar
from urllib.parse import parse_qs, urlsplit

from cutfs.codec.errors import CutfsError, SourceError

#: The most one GET asks for; longer spans are split into parts fetched at once.
MAX_GET_BYTES: Final = 8 << 20
#: Ranges closer than this are fetched by one GET.
MERGE_GAP_BYTES: Final = 64 << 10
_T = TypeVar("_T")
#: Presigned URLs are valid this long, and made again after a quarter of it.
_URL_LIFETIME_SECONDS: Final = 3600
_GET_SIZE_EDGES: Final = (64 << 10, 256 << 10, 1 << 20, 8 << 20)
_RETRYABLE_CODES: Final = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError"}
)


class ObjectStoreError(CutfsError):
    """The store did not answer, or refused, within the deadline."""


class ObjectChangedError(ObjectStoreError):
    """An object is no longer the version that was pinned (its ETag changed)."""


@dataclass(frozen=True, slots=True)
class ObjectLocation:
    """Where a store's objects are: a bucket, a key prefix, and how to reach the server.

    Picklable: worker processes open their own :class:`ObjectStore` from it.
    """

    bucket: str
    prefix: str
    endpoint_url: str | None = None
    region: str | None = None

    @classmethod
    def from_uri(cls, uri: str) -> ObjectLocation:
        """``s3://bucket/prefix[?endpoint_override=host:port&scheme=http&region=r]``.

        Raises :class:`SourceError` for anything else.
        """
        parts = urlsplit(uri)
        if parts.scheme != "s3" or not parts.netloc:
            raise SourceError("expected s3://bucket/prefix", where=uri)
        query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
        unknown = set(query) - {"endpoint_override", "scheme", "region", "endpoint_url"}
        if unknown:
            raise SourceError(f"unknown query parameters: {', '.join(sorted(unknown))}", where=uri)
        endpoint = query.get("endpoint_url")
        if endpoint is None and "endpoint_override" in query:
            endpoint = f"{query.get('scheme', 'https')}://{query['endpoint_override']}"
        prefix = parts.path.strip("/")
        return cls(parts.netloc, prefix + "/" if prefix else "", endpoint, query.get("region"))

    def key(self, name: str) -> str:
        return self.prefix + name

    def uri(self) -> str:
        """The location as a URI that :meth:`from_uri` reads back."""
        query = f"?endpoint_url={self.endpoint_url}" if self.endpoint_url else ""
        if self.region:
            query += ("&" if query else "?") + f"region={self.region}"
        return f"s3://{self.bucket}/{self.prefix}{query}"


@dataclass
class ObjectStoreCounters:
    """What the store did, for ``.cutfs/stats``."""

    gets: int = 0
    heads: int = 0
    puts: int = 0
    lists: int = 0
    bytes_fetched: int = 0
    retries: int = 0
    errors: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    #: GETs by size: at most 64 KiB, 256 KiB, 1 MiB, 8 MiB (upper edges, in bytes).
    get_sizes: dict[int, int] = field(
        default_factory=lambda: dict.fromkeys(_GET_SIZE_EDGES, 0), repr=False
    )

    def add_get(self, size: int) -> None:
        """A GET of ``size`` bytes was sent (counted when sent: a request's statistics then
        hold the GETs it started, even those whose bytes arrive after it is answered)."""
        with self.lock:
            self.gets += 1
            edge = next((edge for edge in _GET_SIZE_EDGES if size <= edge), _GET_SIZE_EDGES[-1])
            self.get_sizes[edge] += 1

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def as_dict(self) -> dict[str, int]:
        return {
            "gets": self.gets,
            "heads": self.heads,
            "puts": self.puts,
            "lists": self.lists,
            "bytes_fetched": self.bytes_fetched,
            "retries": self.retries,
            "errors": self.errors,
            **{f"gets_up_to_{_size_name(edge)}": n for edge, n in self.get_sizes.items()},
        }


@dataclass(frozen=True, slots=True)
class PinnedObject:
    """An object's size and the ETag every read of it must match."""

    size: int
    etag: str


class ObjectStore:
    """Bounded, conditional range reads of the objects at one :class:`ObjectLocation`.

    Thread-safe (one botocore client, shared by threads).  Make one per process:
    botocore clients must not cross a fork.
    """

    def __init__(
        self,
        location: ObjectLocation,
        *,
        deadline_seconds: float = 60.0,
        max_get_bytes: int = MAX_GET_BYTES,
        merge_gap_bytes: int = MERGE_GAP_BYTES,
        parallel_gets: int = 8,
        pins: dict[str, PinnedObject] | None = None,
    ) -> None:
        """``pins`` are versions pinned elsewhere (by the daemon, for its workers): reads of
        those objects must match them, and need no HEAD."""
        import botocore.session  # noqa: PLC0415 - 0.2 s to import: only when a store is used
        from botocore.config import Config  # noqa: PLC0415

        self.location = location
        self.tally = ObjectStoreCounters()
        self._parallel_gets = parallel_gets
        self._deadline_seconds = deadline_seconds
        self._max_get_bytes = max_get_bytes
        self._merge_gap_bytes = merge_gap_bytes
        config = Config(
            signature_version="s3v4",
            max_pool_connections=max(parallel_gets, 4) * 2,
            retries={"total_max_attempts": 1, "mode": "standard"},  # retried here, under a deadline
            connect_timeout=min(deadline_seconds, 10.0),
            read_timeout=min(deadline_seconds, 30.0),
            s3={"addressing_style": "path"} if location.endpoint_url else {},
        )
        session = botocore.session.get_session()
        self._client: Any = session.create_client(
            "s3", endpoint_url=location.endpoint_url, region_name=location.region, config=config
        )
        self._pins: dict[str, PinnedObject] = dict(pins or {})
        self._pins_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=parallel_gets, thread_name_prefix="cutfs-get")
        self._urls: dict[str, tuple[str, float]] = {}
        import urllib3  # noqa: PLC0415

        self._http = urllib3.PoolManager(
            maxsize=max(parallel_gets, 4) * 2,
            retries=False,
            timeout=urllib3.Timeout(
                connect=min(deadline_seconds, 10.0), read=min(deadline_seconds, 30.0)
            ),
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.clear()
        self._client.close()

    def pin(self, name: str) -> PinnedObject:
        """The object's size and ETag, fetched once (a HEAD) and kept: later reads must see
        this version.  :class:`ObjectStoreError` if it cannot be reached or does not exist."""
        with self._pins_lock:
            pinned = self._pins.get(name)
        if pinned is not None:
            return pinned
        reply = self._call(
            name, "head_object", Bucket=self.location.bucket, Key=self.location.key(name)
        )
        self.tally.add(heads=1)
        pinned = PinnedObject(int(reply["ContentLength"]), str(reply["ETag"]))
        with self._pins_lock:
            return self._pins.setdefault(name, pinned)

    def size(self, name: str) -> int:
        return self.pin(name).size

    def version(self, name: str) -> str:
        return self.pin(name).etag

    def check_unchanged(self, name: str) -> None:
        """Nothing to do ahead: every GET is conditional on the pinned ETag."""

    def prefetch(self, name: str, ranges: Sequence[tuple[int, int]]) -> bool:
        """Nothing kept here: a :class:`CachingStore` in front keeps what it fetched."""
        return not any(stop > start for start, stop in ranges)

    def counters(self) -> dict[str, int]:
        return self.tally.as_dict()

    def read(self, name: str, start: int, stop: int) -> memoryview:
        """Bytes ``[start, stop)`` of the pinned object, in GETs of at most ``max_get_bytes``."""
        return self.read_many(name, [(start, stop)])[0]

    def download(self, name: str, path: str) -> None:
        """Write the whole pinned object to the file ``path``, a few parts at a time (memory
        stays bounded by the parts in flight, whatever the object's size)."""
        size = self.size(name)
        window = self._max_get_bytes * self._parallel_gets
        with open(path, "wb") as sink:
            for start in range(0, size, window):
                for part in self.read_many(name, [(start, min(start + window, size))]):
                    sink.write(part)

    def exists(self, name: str) -> bool:
        """Whether an object is there (a HEAD; not pinned)."""
        from botocore.exceptions import ClientError  # noqa: PLC0415

        try:
            self._client.head_object(Bucket=self.location.bucket, Key=self.location.key(name))
        except ClientError as exc:
            status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
            if status == 404:
                return False
            raise ObjectStoreError(f"head_object failed: {exc}", where=self._where(name)) from exc
        return True

    def put(self, name: str, path: str) -> str:
        """Upload the file ``path`` as object ``name``; returns its ETag.  Files larger than
        ``max_get_bytes`` go up in parts of that size, a few at once (a multipart upload,
        aborted if a part fails), so memory stays bounded by the parts in flight."""
        size = os.path.getsize(path)
        key = self.location.key(name)
        if size <= self._max_get_bytes:
            with open(path, "rb") as file:
                body = file.read()
            reply = self._call(name, "put_object", Bucket=self.location.bucket, Key=key, Body=body)
            self.tally.add(puts=1)
            return str(reply["ETag"])
        upload = self._call(name, "create_multipart_upload", Bucket=self.location.bucket, Key=key)[
            "UploadId"
        ]
        try:
            parts = list(
                self._pool.map(
                    lambda number: self._put_part(name, path, upload, number),
                    range(1, -(-size // self._max_get_bytes) + 1),
                )
            )
            reply = self._call(
                name,
                "complete_multipart_upload",
                Bucket=self.location.bucket,
                Key=key,
                UploadId=upload,
                MultipartUpload={"Parts": parts},
            )
        except BaseException:
            with contextlib.suppress(Exception):
                self._client.abort_multipart_upload(
                    Bucket=self.location.bucket, Key=key, UploadId=upload
                )
            raise
        return str(reply["ETag"])

    def put_bytes(self, name: str, data: bytes) -> str:
        """Store ``data`` (small: a marker, a manifest) as object ``name``; returns its ETag."""
        reply = self._call(
            name, "put_object", Bucket=self.location.bucket, Key=self.location.key(name), Body=data
        )
        self.tally.add(puts=1)
        return str(reply["ETag"])

    def listing(self, prefix: str = "") -> dict[str, int]:
        """The objects whose names start with ``prefix`` (relative to the location's
        prefix), with their sizes, a page of 1 000 per request."""
        found: dict[str, int] = {}
        arguments: dict[str, Any] = {
            "Bucket": self.location.bucket,
            "Prefix": self.location.key(prefix),
        }
        while True:
            reply = self._call(prefix, "list_objects_v2", **arguments)
            self.tally.add(lists=1)
            for entry in reply.get("Contents", []):
                found[str(entry["Key"])[len(self.location.prefix) :]] = int(entry["Size"])
            if not reply.get("IsTruncated"):
                return found
            arguments["ContinuationToken"] = reply["NextContinuationToken"]

    def delete(self, name: str) -> None:
        """Remove object ``name`` (no error when it is not there)."""
        self._call(name, "delete_object", Bucket=self.location.bucket, Key=self.location.key(name))
        with self._pins_lock:
            self._pins.pop(name, None)

    def delete_many(self, names: Sequence[str]) -> None:
        """Remove the objects ``names``, up to 1 000 per request (absent ones are no error)."""
        for first in range(0, len(names), 1000):
            batch = names[first : first + 1000]
            reply = self._call(
                batch[0],
                "delete_objects",
                Bucket=self.location.bucket,
                Delete={
                    "Objects": [{"Key": self.location.key(name)} for name in batch],
                    "Quiet": True,
                },
            )
            failed = reply.get("Errors", [])
            if failed:
                raise ObjectStoreError(
                    f"delete_objects failed for {len(failed)} objects: "
                    f"{failed[0].get('Code', '')} {failed[0].get('Message', '')}".strip(),
                    where=self._where(batch[0]),
                )
        with self._pins_lock:
            for name in names:
                self._pins.pop(name, None)

    def forget(self, name: str) -> None:
        """Drop the pinned version of ``name``: the next read pins the object anew."""
        with self._pins_lock:
            self._pins.pop(name, None)
        self._forget_url(name)

    def _put_part(self, name: str, path: str, upload: str, number: int) -> dict[str, Any]:
        with open(path, "rb") as file:
            file.seek((number - 1) * self._max_get_bytes)
            body = file.read(self._max_get_bytes)
        reply = self._call(
            name,
            "upload_part",
            Bucket=self.location.bucket,
            Key=self.location.key(name),
            UploadId=upload,
            PartNumber=number,
            Body=body,
        )
        self.tally.add(puts=1)
        return {"PartNumber": number, "ETag": reply["ETag"]}

    def get_whole(self, name: str, limit_bytes: int) -> bytes:
        """A small object's bytes (a manifest), refused when larger than ``limit_bytes``."""
        size = self.size(name)
        if size > limit_bytes:
            raise ObjectStoreError(
                f"{size} bytes is more than the {limit_bytes} this object may have",
                where=self._where(name),
            )
        return bytes(self.read(name, 0, size))

    def read_many(self, name: str, ranges: Sequence[tuple[int, int]]) -> list[memoryview]:
        """Each range's bytes, fetched with as few GETs as :meth:`plan` makes, at once.

        Raises :class:`ObjectStoreError` for a range outside the object.
        """
        pinned = self.pin(name)
        for start, stop in ranges:
            if not 0 <= start <= stop <= pinned.size:
                raise ObjectStoreError(
                    f"range [{start}, {stop}) is outside the object's {pinned.size} bytes",
                    where=self._where(name),
                )
        gets = self.plan(ranges)
        begun = time.monotonic()
        if len(gets) == 1:  # the usual cold cut: no hand-off to a thread
            fetched = [self._get(name, pinned, gets[0], begun)]
        else:
            fetched = list(self._pool.map(lambda span: self._get(name, pinned, span, begun), gets))
        pieces = dict(zip(gets, fetched, strict=True))
        return [memoryview(_cut_out(pieces, start, stop)) for start, stop in ranges]

    def plan(self, ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """The GETs that cover ``ranges``: merged where closer than ``merge_gap_bytes``, split
        where longer than ``max_get_bytes``; empty ranges need none."""
        merged: list[list[int]] = []
        for start, stop in sorted(span for span in ranges if span[1] > span[0]):
            if merged and start - merged[-1][1] <= self._merge_gap_bytes:
                merged[-1][1] = max(merged[-1][1], stop)
            else:
                merged.append([start, stop])
        gets = []
        for start, stop in merged:
            for part in range(start, stop, self._max_get_bytes):
                gets.append((part, min(part + self._max_get_bytes, stop)))
        return gets

    def _get(self, name: str, pinned: PinnedObject, span: tuple[int, int], begun: float) -> bytes:
        """One ranged, conditional GET, sent with urllib3 to a presigned URL: a third of
        botocore's client CPU per request (measured: 0.5 ms against 1.6 ms), the same
        signature (Range and If-Match are not signed headers, so any S3 server accepts
        them on a presigned URL)."""
        import urllib3  # noqa: PLC0415 - botocore's own HTTP library

        start, stop = span
        headers = {"Range": f"bytes={start}-{stop - 1}", "If-Match": pinned.etag}

        def attempt() -> bytes:
            try:
                reply = self._http.request(
                    "GET", self._url(name), headers=headers, timeout=self._timeout_within(begun)
                )
            except urllib3.exceptions.HTTPError as exc:  # refused, reset, timed out
                raise _RetryableError(f"GET failed: {exc}") from exc
            if reply.status == 206:
                return bytes(reply.data)
            self._refuse(name, reply.status, reply.data)

        self.tally.add_get(stop - start)
        data = self._retrying(name, begun, attempt)
        self.tally.add(bytes_fetched=len(data))
        if len(data) != stop - start:
            self.tally.add(errors=1)
            raise ObjectStoreError(
                f"asked for {stop - start} bytes at {start}, got {len(data)}",
                where=self._where(name),
            )
        return data

    def stream(self, name: str, start: int, stop: int, chunk_bytes: int) -> Iterator[memoryview]:
        """Bytes ``[start, stop)`` of the pinned object in chunks as they arrive, from one
        conditional GET (split at ``max_get_bytes``); a connection that breaks mid-way is
        resumed where it stopped, within the deadline.  Raises like :meth:`read`."""
        import urllib3  # noqa: PLC0415

        pinned = self.pin(name)
        if not 0 <= start <= stop <= pinned.size:
            raise ObjectStoreError(
                f"range [{start}, {stop}) is outside the object's {pinned.size} bytes",
                where=self._where(name),
            )
        begun = time.monotonic()
        position = start
        pending = b""
        while position < stop:
            end = min(stop, position + self._max_get_bytes)
            self.tally.add_get(end - position)
            reply = self._open_get(name, pinned, (position, end), begun)
            received = 0
            try:
                for data in reply.stream(chunk_bytes):
                    received += len(data)
                    self.tally.add(bytes_fetched=len(data))
                    pending += data
                    while len(pending) >= chunk_bytes:
                        yield memoryview(pending[:chunk_bytes])
                        pending = pending[chunk_bytes:]
            except urllib3.exceptions.HTTPError as exc:
                self.tally.add(errors=1)
                if time.monotonic() - begun > self._deadline_seconds:
                    raise ObjectStoreError(f"GET failed: {exc}", where=self._where(name)) from exc
                self.tally.add(retries=1)
            finally:
                if received == end - position:
                    reply.release_conn()
                else:  # a body left unread must not meet the next request on the connection
                    reply.close()
            if received > end - position:
                raise ObjectStoreError("the server sent more than asked", where=self._where(name))
            position += received
        if pending:
            yield memoryview(pending)

    def _open_get(
        self, name: str, pinned: PinnedObject, span: tuple[int, int], begun: float
    ) -> Any:
        """The response of a ranged, conditional GET whose body is still to be read."""
        import urllib3  # noqa: PLC0415

        start, stop = span
        headers = {"Range": f"bytes={start}-{stop - 1}", "If-Match": pinned.etag}

        def attempt() -> Any:
            try:
                reply = self._http.request(
                    "GET",
                    self._url(name),
                    headers=headers,
                    preload_content=False,
                    timeout=self._timeout_within(begun),
                )
            except urllib3.exceptions.HTTPError as exc:  # refused, reset, timed out
                raise _RetryableError(f"GET failed: {exc}") from exc
            if reply.status == 206:
                return reply
            body = reply.read()
            reply.release_conn()
            self._refuse(name, reply.status, body)

        return self._retrying(name, begun, attempt)

    def _refuse(self, name: str, status: int, body: bytes) -> NoReturn:
        """Raise what a GET answered with ``status`` (not 206) means."""
        if status == 412:
            raise ObjectChangedError(
                "the object changed since it was mounted: remount to serve the new one",
                where=self._where(name),
            )
        code = _error_code(body)
        if status == 403:
            self._forget_url(name)  # expired, or the credentials changed: sign again
        if status in (403, 429) or status >= 500 or code in _RETRYABLE_CODES:
            raise _RetryableError(f"GET failed: {status} {code}".strip())
        if status == 200:
            raise ObjectStoreError(
                "the server ignored the byte range (answered with the whole object)",
                where=self._where(name),
            )
        raise ObjectStoreError(f"GET failed: {status} {code}".strip(), where=self._where(name))

    def _timeout_within(self, begun: float) -> Any:
        """Socket timeouts that end the attempt by the deadline (from ``begun``): a retry
        never waits a whole timeout past it."""
        import urllib3  # noqa: PLC0415

        remaining = self._deadline_seconds - (time.monotonic() - begun)
        if remaining <= 0:
            raise _RetryableError("no time left before the deadline")
        return urllib3.Timeout(connect=min(remaining, 10.0), read=min(remaining, 30.0))

    def _url(self, name: str) -> str:
        """A presigned GET URL of the object, made again when older than a quarter of its
        lifetime (credentials that rotate are picked up then)."""
        now = time.monotonic()
        with self._pins_lock:
            made = self._urls.get(name)
        if made is not None and now - made[1] < _URL_LIFETIME_SECONDS / 4:
            return made[0]
        url: str = self._client.generate_presigned_url(
            "get_object",
            Params={"Bucket": self.location.bucket, "Key": self.location.key(name)},
            ExpiresIn=_URL_LIFETIME_SECONDS,
        )
        with self._pins_lock:
            self._urls[name] = (url, now)
        return url

    def _forget_url(self, name: str) -> None:
        with self._pins_lock:
            self._urls.pop(name, None)

    def _call(self, name: str, operation: str, begun: float | None = None, **arguments: Any) -> Any:
        """One botocore request (HEAD, PUT, ...), retried like a GET."""
        from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

        def attempt() -> Any:
            try:
                return getattr(self._client, operation)(**arguments)
            except ClientError as exc:
                error = exc.response.get("Error", {})
                code = str(error.get("Code", ""))
                status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
                if code == "PreconditionFailed" or status == 412:
                    raise ObjectChangedError(
                        "the object changed since it was mounted: remount to serve the new one",
                        where=self._where(name),
                    ) from exc
                failure = f"{operation} failed: {code or status} {error.get('Message', '')}".strip()
                if status >= 500 or code in _RETRYABLE_CODES:
                    raise _RetryableError(failure) from exc
                raise ObjectStoreError(failure, where=self._where(name)) from exc
            except BotoCoreError as exc:  # connection refused, timed out, ...
                raise _RetryableError(f"{operation} failed: {exc}") from exc

        return self._retrying(name, time.monotonic() if begun is None else begun, attempt)

    def _retrying(self, name: str, begun: float, attempt: Callable[[], _T]) -> _T:
        """``attempt()``, again after a growing pause (50 ms doubling to 2 s) while it raises
        :class:`_RetryableError` and the deadline (from ``begun``) allows; every failure is
        counted as an error, every new attempt as a retry."""
        pause = 0.05
        while True:
            try:
                return attempt()
            except _RetryableError as exc:
                self.tally.add(errors=1)
                if time.monotonic() + pause - begun > self._deadline_seconds:
                    raise ObjectStoreError(str(exc), where=self._where(name)) from None
            except ObjectStoreError:
                self.tally.add(errors=1)
                raise
            self.tally.add(retries=1)
            time.sleep(pause)
            pause = min(pause * 2, 2.0)

    def _where(self, name: str) -> str:
        return f"s3://{self.location.bucket}/{self.location.key(name)}"


class _RetryableError(Exception):
    """A failure worth another attempt (throttling, a server error, a lost connection)."""


def _error_code(body: bytes) -> str:
    """The ``<Code>`` of an S3 error document, or ''."""
    start, end = body.find(b"<Code>"), body.find(b"</Code>")
    if start < 0 or end < start:
        return ""
    return body[start + len(b"<Code>") : end].decode("ascii", "replace")[:64]


def _size_name(size: int) -> str:
    return f"{size >> 20}MiB" if size >= 1 << 20 else f"{size >> 10}KiB"


def _cut_out(pieces: dict[tuple[int, int], bytes], start: int, stop: int) -> bytes:
    """Bytes ``[start, stop)`` from the fetched pieces that cover them."""
    if stop == start:
        return b""
    parts = []
    for (piece_start, piece_stop), data in sorted(pieces.items()):
        if piece_stop <= start or piece_start >= stop:
            continue
        parts.append(
            data[max(start, piece_start) - piece_start : min(stop, piece_stop) - piece_start]
        )
    return b"".join(parts)
