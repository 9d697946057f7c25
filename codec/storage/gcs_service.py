"""Google Cloud Storage (``gs://bucket/prefix``) for an
:class:`cutfs.codec.storage.object_store.ObjectStore`, through its JSON API.

An object is pinned at its *generation* (GCS's version number, which changes whenever
the object is written).  Reads are media GETs with ``Range`` and ``ifGenerationMatch``;
the reply's ``x-goog-generation`` is checked as well, so that a server that ignored the
precondition (an emulator) still cannot hand over another version.  Files larger than a
part go up as resumable uploads, a part per request.

Credentials are Google's Application Default Credentials (``GOOGLE_APPLICATION_CREDENTIALS``,
``gcloud auth application-default login``, or the metadata server of a GCE/GKE node),
through the ``google-auth`` package (``pip install 'cutfs[gcs]'``).  With an emulator
(``STORAGE_EMULATOR_HOST``, the variable Google's clients read, or an endpoint in the
URI: ``gs://bucket/prefix?endpoint_override=host:port&scheme=http``) requests go
unauthenticated.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final
from urllib.parse import quote, urlencode

from cutfs.codec.errors import SourceError
from cutfs.codec.storage.object_location import ObjectLocation
from cutfs.codec.storage.object_service import (
    ObjectChangedError,
    ObjectStoreError,
    PinnedObject,
    RangedGet,
    Retried,
    RetryableError,
    same_version,
)

_PUBLIC_ENDPOINT: Final = "https://storage.googleapis.com"
_SCOPE: Final = "https://www.googleapis.com/auth/devstorage.read_write"
#: Resumable uploads take parts in multiples of this.
_UPLOAD_QUANTUM: Final = 256 << 10


class GcsService:
    """The GCS JSON API at one location (see the module docstring)."""

    def __init__(self, location: ObjectLocation, deadline_seconds: float, connections: int) -> None:
        import urllib3  # noqa: PLC0415

        self._location = location
        self._http = urllib3.PoolManager(
            maxsize=connections,
            retries=False,
            timeout=urllib3.Timeout(
                connect=min(deadline_seconds, 10.0), read=min(deadline_seconds, 30.0)
            ),
        )
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        endpoint = location.endpoint_url or emulator
        if endpoint and "://" not in endpoint:
            endpoint = "http://" + endpoint
        self._endpoint = (endpoint or _PUBLIC_ENDPOINT).rstrip("/")
        self._bucket_path = f"/storage/v1/b/{quote(location.bucket, safe='')}/o"
        self._credentials: Any = None if endpoint else _default_credentials(location)
        self._credentials_lock = threading.Lock()
        self._stale = False
        self._deleters = ThreadPoolExecutor(max_workers=4, thread_name_prefix="cutfs-delete")

    def close(self) -> None:
        self._deleters.shutdown(wait=False, cancel_futures=True)
        self._http.clear()

    def head(self, key: str) -> PinnedObject | None:
        reply = self._request("GET", self._object_url(key, fields="size,generation"), key, True)
        if reply is None:
            return None
        metadata = _json(reply.data, key)
        return PinnedObject(int(metadata["size"]), str(metadata["generation"]))

    def ranged_get(self, key: str, pinned: PinnedObject, start: int, stop: int) -> RangedGet:
        url = self._object_url(key, alt="media", ifGenerationMatch=pinned.etag)
        return RangedGet(url, {"Range": f"bytes={start}-{stop - 1}", **self._authorization()})

    def check_version(self, headers: Any, pinned: PinnedObject) -> bool:
        return same_version(headers.get("x-goog-generation"), pinned.etag)

    def error_code(self, body: bytes) -> str:
        """The ``reason`` of a JSON API error, or ''."""
        try:
            error = json.loads(body)["error"]
            return str(error.get("errors", [{}])[0].get("reason", ""))[:64]
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            return ""

    def refused(self, key: str, status: int) -> None:
        """A 401 means the token expired early: the next request gets a new one."""
        if status == 401:
            self._stale = True

    def put_file(self, key: str, path: str, part_bytes: int, retried: Retried[Any]) -> str:
        """One upload, or a resumable one in parts of ``part_bytes`` (rounded to GCS's
        256 KiB), each part retried on its own."""
        size = os.path.getsize(path)
        if size <= part_bytes:
            with open(path, "rb") as file:
                body = file.read()
            return str(retried(key, lambda: self.put_bytes(key, body)))
        part_bytes = max(part_bytes // _UPLOAD_QUANTUM, 1) * _UPLOAD_QUANTUM
        session = retried(key, lambda: self._start_upload(key, size))
        generation = ""
        with open(path, "rb") as file:
            for start in range(0, size, part_bytes):
                body = file.read(part_bytes)
                generation = retried(key, self._part_upload(key, session, start, body, size))
        return generation

    def put_bytes(self, key: str, data: bytes) -> str:
        query = urlencode({"uploadType": "media", "name": key})
        url = f"{self._endpoint}/upload{self._bucket_path}?{query}"
        headers = {"Content-Type": "application/octet-stream"}
        reply = self._request("POST", url, key, body=data, headers=headers)
        assert reply is not None
        return str(_json(reply.data, key)["generation"])

    def list_page(
        self, prefix: str, token: str | None
    ) -> tuple[dict[str, PinnedObject], str | None]:
        query = {"prefix": prefix, "fields": "items(name,size,generation),nextPageToken"}
        if token is not None:
            query["pageToken"] = token
        url = f"{self._endpoint}{self._bucket_path}?{urlencode(query)}"
        reply = self._request("GET", url, prefix)
        assert reply is not None
        listing = _json(reply.data, prefix)
        page = {
            str(item["name"]): PinnedObject(int(item["size"]), str(item["generation"]))
            for item in listing.get("items", [])
        }
        following = listing.get("nextPageToken")
        return page, str(following) if following else None

    def delete(self, key: str) -> None:
        self._request("DELETE", self._object_url(key), key, missing_ok=True)

    def delete_many(self, keys: Sequence[str], retried: Retried[Any]) -> None:
        """One request per object (the JSON API's batches are a format of their own), a few
        at once."""
        list(self._deleters.map(lambda key: retried(key, lambda: self.delete(key)), keys))

    def _start_upload(self, key: str, size: int) -> str:
        """A resumable upload session for ``size`` bytes: the URL its parts go to."""
        query = urlencode({"uploadType": "resumable", "name": key})
        url = f"{self._endpoint}/upload{self._bucket_path}?{query}"
        headers = {"X-Upload-Content-Length": str(size), "Content-Type": "application/json"}
        reply = self._request("POST", url, key, body=b"{}", headers=headers)
        assert reply is not None
        session = reply.headers.get("Location")
        if not session:
            raise ObjectStoreError("the upload was not given a session", where=self._where(key))
        return str(session)

    def _part_upload(
        self, key: str, session: str, start: int, body: bytes, size: int
    ) -> Callable[[], str]:
        return lambda: self._put_part(key, session, start, body, size)

    def _put_part(self, key: str, session: str, start: int, body: bytes, size: int) -> str:
        """One part of a resumable upload; the object's generation once it is complete."""
        headers = {"Content-Range": f"bytes {start}-{start + len(body) - 1}/{size}"}
        reply = self._request("PUT", session, key, body=body, headers=headers, partial_ok=True)
        assert reply is not None
        if reply.status == 308:
            return ""
        return str(_json(reply.data, key)["generation"])

    def _object_url(self, key: str, **query: str) -> str:
        url = f"{self._endpoint}{self._bucket_path}/{quote(key, safe='')}"
        return f"{url}?{urlencode(query)}" if query else url

    def _request(
        self,
        method: str,
        url: str,
        key: str,
        missing_ok: bool = False,
        *,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        partial_ok: bool = False,
    ) -> Any:
        """One request (one attempt), its errors mapped for the store to retry or report;
        ``missing_ok``: a 404 is ``None``; ``partial_ok``: a 308 (upload incomplete) is an
        answer."""
        import urllib3  # noqa: PLC0415

        try:
            reply = self._http.request(
                method, url, body=body, headers={**(headers or {}), **self._authorization()}
            )
        except urllib3.exceptions.HTTPError as exc:  # refused, reset, timed out
            raise RetryableError(f"{method} failed: {exc}") from exc
        status = reply.status
        if 200 <= status < 300 or (partial_ok and status == 308):
            return reply
        if missing_ok and status == 404:
            return None
        if status == 412:
            raise ObjectChangedError(
                "the object changed since it was mounted: remount to serve the new one",
                where=self._where(key),
            )
        self.refused(key, status)
        failure = f"{method} failed: {status} {self.error_code(reply.data)}".strip()
        if status in (401, 408, 429) or status >= 500:
            raise RetryableError(failure)
        raise ObjectStoreError(failure, where=self._where(key))

    def _authorization(self) -> dict[str, str]:
        """The bearer token of the credentials, refreshed when due (none with an emulator)."""
        if self._credentials is None:
            return {}
        from google.auth.transport.urllib3 import Request  # noqa: PLC0415

        with self._credentials_lock:
            if self._stale or not self._credentials.valid:
                try:
                    self._credentials.refresh(Request(self._http))
                except Exception as exc:  # google.auth's errors, the network's
                    raise RetryableError(f"cannot get a token: {exc}") from exc
                self._stale = False
            return {"Authorization": f"Bearer {self._credentials.token}"}

    def _where(self, key: str) -> str:
        return f"gs://{self._location.bucket}/{key}"


def _default_credentials(location: ObjectLocation) -> Any:
    try:
        import google.auth  # noqa: PLC0415
    except ImportError:
        raise SourceError(
            "gs:// needs the google-auth package for credentials: pip install 'cutfs[gcs]'",
            where=location.uri(),
        ) from None
    try:
        credentials, _ = google.auth.default(scopes=[_SCOPE])
    except Exception as exc:  # google.auth.exceptions.DefaultCredentialsError, ...
        raise SourceError(f"no Google credentials: {exc}", where=location.uri()) from exc
    return credentials


def _json(data: bytes, key: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError as exc:
        raise ObjectStoreError(f"unreadable reply: {exc}", where=key) from exc
    if not isinstance(value, dict):
        raise ObjectStoreError("unreadable reply", where=key)
    return value
