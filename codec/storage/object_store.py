"""Byte ranges of objects in object storage, each GET conditional on the version that was
pinned: S3 and S3-compatible stores (``s3://``), Google Cloud Storage (``gs://``) and Azure
Blob Storage (``az://``).

A :class:`cutfs.codec.storage.byte_store.ByteStore`; mounts put a
:class:`cutfs.codec.storage.caching_store.CachingStore` in front of it.  Design notes and
measurements: docs/object-storage-notes.md.  In short: ``pyarrow.fs`` cannot make
a read conditional, so reads are plain HTTP GETs sent with urllib3, and what differs
between services (signing, the version a read is conditional on, uploads, listings) is an
:class:`ObjectService` (:mod:`cutfs.codec.storage.s3_service`,
:mod:`cutfs.codec.storage.gcs_service`, :mod:`cutfs.codec.storage.azure_service`).

* An object is *pinned* once (its size and version: an S3 ETag, a GCS generation); every
  later read is a ranged GET conditional on that version, so an object replaced under a
  mount fails with :class:`ObjectChangedError` instead of serving other bytes.
* Ranges are always bounded.  :meth:`ObjectStore.read_many` merges ranges closer
  than ``merge_gap_bytes``, splits what is longer than ``max_get_bytes`` into parts,
  and fetches the parts concurrently.
* Throttling and server errors (5xx, ``SlowDown``, ``rateLimitExceeded``) are retried with
  exponential backoff until ``deadline_seconds`` after the call began; past it,
  :class:`ObjectStoreError`.
* Counters (GETs, bytes, retries, errors) for ``.cutfs/stats``.

Where the objects are, and how to reach them, is an
:class:`cutfs.codec.storage.object_location.ObjectLocation`; what a service does, the
contract in :mod:`cutfs.codec.storage.object_service`.  Credentials come from each
service's standard places (see its module).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn, TypeVar

from cutfs.codec.storage.object_location import ObjectLocation
from cutfs.codec.storage.object_service import (
    RETRYABLE_CODES,
    ObjectChangedError,
    ObjectService,
    ObjectStoreError,
    PinnedObject,
    RetryableError,
)

#: The most one GET asks for; longer spans are split into parts fetched at once.
MAX_GET_BYTES: Final = 8 << 20
#: Ranges closer than this are fetched by one GET.
MERGE_GAP_BYTES: Final = 64 << 10
#: How long a request may take, retries included, unless the caller says otherwise.
DEFAULT_STORE_DEADLINE_SECONDS: Final = 60.0
_T = TypeVar("_T")
_GET_SIZE_EDGES: Final = (64 << 10, 256 << 10, 1 << 20, 8 << 20)


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


def open_service(
    location: ObjectLocation, deadline_seconds: float, connections: int
) -> ObjectService:
    """The :class:`ObjectService` of ``location``'s scheme."""
    if location.scheme == "gs":
        from cutfs.codec.storage.gcs_service import GcsService  # noqa: PLC0415 - only when used

        return GcsService(location, deadline_seconds, connections)
    if location.scheme == "az":
        from cutfs.codec.storage.azure_service import AzureService  # noqa: PLC0415 - only when used

        return AzureService(location, deadline_seconds, connections)
    from cutfs.codec.storage.s3_service import S3Service  # noqa: PLC0415 - botocore takes 0.2 s

    return S3Service(location, deadline_seconds, connections)


class ObjectStore:
    """Bounded, conditional range reads of the objects at one :class:`ObjectLocation`.

    Thread-safe (one service client, shared by threads).  Make one per process:
    clients must not cross a fork.
    """

    def __init__(
        self,
        location: ObjectLocation,
        *,
        deadline_seconds: float = DEFAULT_STORE_DEADLINE_SECONDS,
        max_get_bytes: int = MAX_GET_BYTES,
        merge_gap_bytes: int = MERGE_GAP_BYTES,
        parallel_gets: int = 8,
        pins: dict[str, PinnedObject] | None = None,
    ) -> None:
        """``pins`` are versions pinned elsewhere (by the daemon, for its workers): reads of
        those objects must match them, and need no HEAD."""
        import urllib3  # noqa: PLC0415 - botocore's own HTTP library

        self.location = location
        self.tally = ObjectStoreCounters()
        self._parallel_gets = parallel_gets
        self._deadline_seconds = deadline_seconds
        self._max_get_bytes = max_get_bytes
        self._merge_gap_bytes = merge_gap_bytes
        connections = max(parallel_gets, 4) * 2
        self._service: ObjectService = open_service(location, deadline_seconds, connections)
        self._pins: dict[str, PinnedObject] = dict(pins or {})
        self._pins_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=parallel_gets, thread_name_prefix="cutfs-get")
        self._http = urllib3.PoolManager(
            maxsize=connections,
            retries=False,
            timeout=urllib3.Timeout(
                connect=min(deadline_seconds, 10.0), read=min(deadline_seconds, 30.0)
            ),
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.clear()
        self._service.close()

    def pin(self, name: str) -> PinnedObject:
        """The object's size and version, fetched once (a HEAD) and kept: later reads must
        see this version.  :class:`ObjectStoreError` if it cannot be reached or is not
        there."""
        with self._pins_lock:
            pinned = self._pins.get(name)
        if pinned is not None:
            return pinned
        found = self.retried(name, lambda: self._service.head(self.location.key(name)))
        self.tally.add(heads=1)
        if found is None:
            self.tally.add(errors=1)
            raise ObjectStoreError("no such object (404)", where=self._where(name))
        with self._pins_lock:
            return self._pins.setdefault(name, found)

    def is_pinned(self, name: str) -> bool:
        with self._pins_lock:
            return name in self._pins

    def size(self, name: str) -> int:
        return self.pin(name).size

    def version(self, name: str) -> str:
        return self.pin(name).etag

    def check_unchanged(self, name: str) -> None:
        """Nothing to do ahead: every GET is conditional on the pinned version."""

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
        found = self.retried(name, lambda: self._service.head(self.location.key(name)))
        self.tally.add(heads=1)
        return found is not None

    def put(self, name: str, path: str) -> str:
        """Upload the file ``path`` as object ``name``; returns its version.  Files larger
        than ``max_get_bytes`` go up in parts of that size (memory stays bounded by the
        parts in flight)."""

        def retried(what: str, attempt: Callable[[], _T]) -> _T:
            result = self.retried(what, attempt)
            self.tally.add(puts=1)
            return result

        key = self.location.key(name)
        return self._service.put_file(key, path, self._max_get_bytes, retried)

    def put_bytes(self, name: str, data: bytes) -> str:
        """Store ``data`` (small: a marker, a manifest) as object ``name``; its version."""
        version = self.retried(name, lambda: self._service.put_bytes(self.location.key(name), data))
        self.tally.add(puts=1)
        return version

    def listing(self, prefix: str = "") -> dict[str, int]:
        """The objects whose names start with ``prefix`` (relative to the location's
        prefix), with their sizes, a page per request."""
        return {name: listed.size for page in self._pages(prefix) for name, listed in page.items()}

    def listed(self, most_pages: int) -> dict[str, PinnedObject]:
        """Every object of the location with the size and version a listing gives (a
        request per page of up to 1 000 objects), at most ``most_pages`` pages of it; to
        pin many objects at once with :meth:`pin_from`, where :meth:`pin` sends a HEAD
        per object."""
        found: dict[str, PinnedObject] = {}
        for pages, page in enumerate(self._pages(""), start=1):
            found.update(page)
            if pages >= most_pages:
                break
        return found

    def pin_from(self, listed: dict[str, PinnedObject], names: Iterable[str]) -> list[str]:
        """Pin those of ``names`` that ``listed`` has (see :meth:`listed`) as it says; the
        names it lacks are returned, for :meth:`pin`.  Names already pinned stay as they
        are."""
        missing = []
        with self._pins_lock:
            for name in names:
                if name in listed:
                    self._pins.setdefault(name, listed[name])
                else:
                    missing.append(name)
        return missing

    def _pages(self, prefix: str) -> Iterator[dict[str, PinnedObject]]:
        """The listing of the objects under ``prefix``, a page per request, named relative
        to the location's prefix."""
        token: str | None = None
        while True:
            page, token = self.retried(prefix, self._page_of(self.location.key(prefix), token))
            self.tally.add(lists=1)
            yield {key[len(self.location.prefix) :]: listed for key, listed in page.items()}
            if token is None:
                return

    def delete(self, name: str) -> None:
        """Remove object ``name`` (no error when it is not there)."""
        self.retried(name, lambda: self._service.delete(self.location.key(name)))
        with self._pins_lock:
            self._pins.pop(name, None)

    def delete_many(self, names: Sequence[str]) -> None:
        """Remove the objects ``names`` (absent ones are no error)."""
        if names:
            self._service.delete_many([self.location.key(name) for name in names], self.retried)
        with self._pins_lock:
            for name in names:
                self._pins.pop(name, None)

    def forget(self, name: str) -> None:
        """Drop the pinned version of ``name``: the next read pins the object anew."""
        with self._pins_lock:
            self._pins.pop(name, None)
        self._service.refused(self.location.key(name), 0)

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
            self._check_range(name, pinned, start, stop)
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

    def stream(self, name: str, start: int, stop: int, chunk_bytes: int) -> Iterator[memoryview]:
        """Bytes ``[start, stop)`` of the pinned object in chunks as they arrive, from one
        conditional GET (split at ``max_get_bytes``); a connection that breaks mid-way is
        resumed where it stopped, within the deadline.  Raises like :meth:`read`.

        The first GET is counted now and sent when the stream is first iterated (see
        :meth:`ByteStore.stream`); further parts, and resumptions, when they are sent."""
        pinned = self.pin(name)
        self._check_range(name, pinned, start, stop)
        if start < stop:
            self.tally.add_get(min(stop, start + self._max_get_bytes) - start)
        return self._streamed(name, pinned, start, stop, chunk_bytes)

    def _streamed(
        self, name: str, pinned: PinnedObject, start: int, stop: int, chunk_bytes: int
    ) -> Iterator[memoryview]:
        """The chunks of :meth:`stream`, whose first GET is already counted."""
        import urllib3  # noqa: PLC0415

        begun = time.monotonic()
        position = start
        pending = b""
        counted = True
        while position < stop:
            end = min(stop, position + self._max_get_bytes)
            if not counted:
                self.tally.add_get(end - position)
            counted = False
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

    def retried(self, name: str, attempt: Callable[[], _T], begun: float | None = None) -> _T:
        """``attempt()``, again after a growing pause (50 ms doubling to 2 s) while it raises
        :class:`RetryableError` and the deadline (from ``begun``, default now) allows; every
        failure is counted as an error, every new attempt as a retry."""
        begun = time.monotonic() if begun is None else begun
        pause = 0.05
        while True:
            try:
                return attempt()
            except RetryableError as exc:
                self.tally.add(errors=1)
                if time.monotonic() + pause - begun > self._deadline_seconds:
                    raise ObjectStoreError(str(exc), where=self._where(name)) from None
            except ObjectStoreError:
                self.tally.add(errors=1)
                raise
            self.tally.add(retries=1)
            time.sleep(pause)
            pause = min(pause * 2, 2.0)

    def _page_of(
        self, prefix: str, token: str | None
    ) -> Callable[[], tuple[dict[str, PinnedObject], str | None]]:
        return lambda: self._service.list_page(prefix, token)

    def _check_range(self, name: str, pinned: PinnedObject, start: int, stop: int) -> None:
        if not 0 <= start <= stop <= pinned.size:
            raise ObjectStoreError(
                f"range [{start}, {stop}) is outside the object's {pinned.size} bytes",
                where=self._where(name),
            )

    def _get(self, name: str, pinned: PinnedObject, span: tuple[int, int], begun: float) -> bytes:
        """One ranged, conditional GET of exactly ``span``."""
        start, stop = span
        self.tally.add_get(stop - start)

        def attempt() -> bytes:
            reply = self._send(name, pinned, span, begun, preload=True)
            return bytes(reply.data)

        data = self.retried(name, attempt, begun)
        self.tally.add(bytes_fetched=len(data))
        if len(data) != stop - start:
            self.tally.add(errors=1)
            raise ObjectStoreError(
                f"asked for {stop - start} bytes at {start}, got {len(data)}",
                where=self._where(name),
            )
        return data

    def _open_get(
        self, name: str, pinned: PinnedObject, span: tuple[int, int], begun: float
    ) -> Any:
        """The response of a ranged, conditional GET whose body is still to be read."""
        return self.retried(
            name, lambda: self._send(name, pinned, span, begun, preload=False), begun
        )

    def _send(
        self, name: str, pinned: PinnedObject, span: tuple[int, int], begun: float, preload: bool
    ) -> Any:
        """One attempt of a ranged GET: its response if it is the bytes asked for, of the
        pinned version; raises what else it answered means."""
        import urllib3  # noqa: PLC0415

        get = self._service.ranged_get(self.location.key(name), pinned, *span)
        try:
            reply = self._http.request(
                "GET",
                get.url,
                headers=get.headers,
                preload_content=preload,
                timeout=self._timeout_within(begun),
            )
        except urllib3.exceptions.HTTPError as exc:  # refused, reset, timed out
            raise RetryableError(f"GET failed: {exc}") from exc
        if reply.status == 206 and self._service.check_version(reply.headers, pinned):
            return reply
        body = reply.data if preload else reply.read()
        if not preload:
            reply.release_conn()
        if reply.status == 206:
            self._refuse(name, 412, b"")
        self._refuse(name, reply.status, body)

    def _refuse(self, name: str, status: int, body: bytes) -> NoReturn:
        """Raise what a GET answered with ``status`` (not 206) means."""
        if status == 412:
            raise ObjectChangedError(
                "the object changed since it was mounted: remount to serve the new one",
                where=self._where(name),
            )
        code = self._service.error_code(body)
        if status in (401, 403):
            self._service.refused(self.location.key(name), status)  # sign again
        if status in (401, 403, 408, 429) or status >= 500 or code in RETRYABLE_CODES:
            raise RetryableError(f"GET failed: {status} {code}".strip())
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
            raise RetryableError("no time left before the deadline")
        return urllib3.Timeout(connect=min(remaining, 10.0), read=min(remaining, 30.0))

    def _where(self, name: str) -> str:
        return self.location.where(name)


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
