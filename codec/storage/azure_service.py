"""Azure Blob Storage (``az://container/prefix``) for an
:class:`cutfs.codec.storage.object_store.ObjectStore`.

Reads are GETs with ``Range`` and ``If-Match`` on the pinned ETag, sent by the store
with urllib3: to a read-only SAS URL of the blob made with the account key, to the URL
with the account's SAS token, or with a bearer token of ``azure-identity``'s
``DefaultAzureCredential`` (managed identity, ``az login``, workload identity, ...).
Everything else (properties, uploads in blocks, listings, deletes) goes through the
``azure-storage-blob`` SDK (``pip install 'cutfs[azure]'``), its own retries off: the
store retries within its deadline.

The account is ``?account=NAME`` in the URI or ``AZURE_STORAGE_ACCOUNT``; credentials
are, in this order, ``AZURE_STORAGE_CONNECTION_STRING``, ``AZURE_STORAGE_KEY``,
``AZURE_STORAGE_SAS_TOKEN``, then ``DefaultAzureCredential``.  The endpoint is
``https://NAME.blob.core.windows.net`` unless the connection string or the URI
(``?endpoint_url=http://127.0.0.1:10000/devstoreaccount1``, Azurite's) names another.
"""

from __future__ import annotations

import datetime
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from cutfs.codec.errors import SourceError
from cutfs.codec.storage.object_location import ObjectLocation
from cutfs.codec.storage.object_service import (
    RETRYABLE_CODES,
    ObjectChangedError,
    ObjectStoreError,
    PinnedObject,
    RangedGet,
    Retried,
    RetryableError,
    same_version,
    xml_error_code,
)

#: SAS URLs and tokens are made for this long, and made again after a quarter of it.
_LIFETIME_SECONDS: Final = 3600
_TOKEN_SCOPE: Final = "https://storage.azure.com/.default"
_AZURE_RETRYABLE: Final = frozenset({"ServerBusy", "OperationTimedOut", "InternalError"})


class AzureService:
    """Blob Storage at one location (see the module docstring)."""

    def __init__(self, location: ObjectLocation, deadline_seconds: float, connections: int) -> None:
        try:
            from azure.storage.blob import BlobServiceClient  # noqa: PLC0415
        except ImportError:
            raise SourceError(
                "az:// needs the azure-storage-blob package: pip install 'cutfs[azure]'",
                where=location.uri(),
            ) from None
        self._location = location
        options: dict[str, Any] = {
            "retry_total": 0,  # retried by the store, within its deadline
            "connection_timeout": min(deadline_seconds, 10.0),
            "read_timeout": min(deadline_seconds, 30.0),
        }
        settings = _connection_settings(os.environ.get("AZURE_STORAGE_CONNECTION_STRING", ""))
        account = location.account or settings.get("AccountName") or _account_from_env()
        if not account:
            raise SourceError(
                "az:// needs the storage account: ?account=NAME in the URI, "
                "AZURE_STORAGE_ACCOUNT, or AZURE_STORAGE_CONNECTION_STRING",
                where=location.uri(),
            )
        endpoint = (
            location.endpoint_url
            or settings.get("BlobEndpoint")
            or f"https://{account}.blob.core.windows.net"
        ).rstrip("/")
        self._account = account
        self._key = settings.get("AccountKey") or os.environ.get("AZURE_STORAGE_KEY")
        self._sas = (settings.get("SharedAccessSignature") or _sas_from_env()).lstrip("?")
        credential: Any
        if self._key:
            credential = {"account_name": account, "account_key": self._key}
        elif self._sas:
            credential = self._sas
        else:
            credential = _default_credential(location)
        self._token_credential = None if self._key or self._sas else credential
        self._credential = credential
        self._endpoint = endpoint
        self._options = options
        self._client = BlobServiceClient(endpoint, credential=credential, **options)
        self._container = self._client.get_container_client(location.bucket)
        self._signed: dict[str, tuple[str, float]] = {}
        self._token: tuple[str, float] | None = None
        self._lock = threading.Lock()
        self._deleters = ThreadPoolExecutor(max_workers=4, thread_name_prefix="cutfs-delete")

    def close(self) -> None:
        self._deleters.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    def head(self, key: str) -> PinnedObject | None:
        blob = self._container.get_blob_client(key)
        properties = self._call("get_blob_properties", key, blob.get_blob_properties, True)
        if properties is None:
            return None
        return PinnedObject(int(properties.size), str(properties.etag))

    def ranged_get(self, key: str, pinned: PinnedObject, start: int, stop: int) -> RangedGet:
        headers = {
            "Range": f"bytes={start}-{stop - 1}",
            "If-Match": pinned.etag,
            "x-ms-version": self._client.api_version,
        }
        url = self._container.get_blob_client(key).url
        if self._key:
            url = f"{url}?{self._signed_query(key)}"
        elif self._sas:
            url = f"{url}?{self._sas}"
        else:
            headers["Authorization"] = f"Bearer {self._bearer()}"
        return RangedGet(url, headers)

    def check_version(self, headers: Any, pinned: PinnedObject) -> bool:
        return same_version(headers.get("ETag"), pinned.etag)

    def error_code(self, body: bytes) -> str:
        return xml_error_code(body)

    def refused(self, key: str, status: int) -> None:
        """Expired, or the credentials changed: sign again, or get a new token."""
        with self._lock:
            self._signed.pop(key, None)
            self._token = None

    def put_file(self, key: str, path: str, part_bytes: int, retried: Retried[Any]) -> str:
        """One upload of the file, in blocks of ``part_bytes``, a few at once."""
        from azure.storage.blob import BlobClient  # noqa: PLC0415

        blob = BlobClient(
            self._endpoint,
            self._location.bucket,
            key,
            credential=self._credential,
            max_block_size=part_bytes,
            max_single_put_size=part_bytes,
            **self._options,
        )

        def upload() -> dict[str, Any]:
            with open(path, "rb") as file:
                return dict(blob.upload_blob(file, overwrite=True, max_concurrency=4))

        reply = retried(key, lambda: self._call("upload_blob", key, upload))
        return str(reply["etag"])

    def put_bytes(self, key: str, data: bytes) -> str:
        blob = self._container.get_blob_client(key)
        reply = self._call("upload_blob", key, lambda: blob.upload_blob(data, overwrite=True))
        return str(reply["etag"])

    def list_page(
        self, prefix: str, token: str | None
    ) -> tuple[dict[str, PinnedObject], str | None]:
        def page() -> tuple[dict[str, PinnedObject], str | None]:
            pages: Any = self._container.list_blobs(
                name_starts_with=prefix, results_per_page=1000
            ).by_page(continuation_token=token)
            listed = {
                str(blob.name): PinnedObject(int(blob.size), _quoted(str(blob.etag)))
                for blob in next(pages)
            }
            following = pages.continuation_token
            return listed, str(following) if following else None

        listed: tuple[dict[str, PinnedObject], str | None] = self._call("list_blobs", prefix, page)
        return listed

    def delete(self, key: str) -> None:
        self._call("delete_blob", key, lambda: self._container.delete_blob(key), True)

    def delete_many(self, keys: Sequence[str], retried: Retried[Any]) -> None:
        """One request per blob (batches need a feature Azurite lacks), a few at once."""
        list(self._deleters.map(lambda key: retried(key, lambda: self.delete(key)), keys))

    def _signed_query(self, key: str) -> str:
        """A read-only SAS of the blob, made again when older than a quarter of its life."""
        from azure.storage.blob import BlobSasPermissions, generate_blob_sas  # noqa: PLC0415

        now = time.monotonic()
        with self._lock:
            made = self._signed.get(key)
        if made is not None and now - made[1] < _LIFETIME_SECONDS / 4:
            return made[0]
        expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=_LIFETIME_SECONDS)
        query: str = generate_blob_sas(
            self._account,
            self._location.bucket,
            key,
            account_key=self._key,
            permission=BlobSasPermissions(read=True),
            expiry=expiry,
        )
        with self._lock:
            self._signed[key] = (query, now)
        return query

    def _bearer(self) -> str:
        """An access token of the token credential, fetched again a quarter-life early."""
        with self._lock:
            if self._token is not None and time.time() < self._token[1]:
                return self._token[0]
        assert self._token_credential is not None
        try:
            token = self._token_credential.get_token(_TOKEN_SCOPE)
        except Exception as exc:  # azure.identity's errors, the network's
            raise RetryableError(f"cannot get a token: {exc}") from exc
        lifetime = max(float(token.expires_on) - time.time(), 0.0)
        with self._lock:
            self._token = (str(token.token), time.time() + lifetime * 0.75)
        return str(token.token)

    def _call(
        self, operation: str, key: str, attempt: Callable[[], Any], missing_ok: bool = False
    ) -> Any:
        """One SDK request (one attempt), its errors mapped for the store to retry or
        report; ``missing_ok``: a 404 is ``None``."""
        from azure.core.exceptions import (  # noqa: PLC0415
            HttpResponseError,
            ResourceModifiedError,
            ResourceNotFoundError,
            ServiceRequestError,
            ServiceResponseError,
        )

        try:
            return attempt()
        except ResourceNotFoundError as exc:
            if missing_ok:
                return None
            raise ObjectStoreError(f"{operation} failed: 404", where=self._where(key)) from exc
        except ResourceModifiedError as exc:
            raise ObjectChangedError(
                "the object changed since it was mounted: remount to serve the new one",
                where=self._where(key),
            ) from exc
        except HttpResponseError as exc:
            status = int(exc.status_code or 0)
            code = str(getattr(exc, "error_code", None) or "")  # set by the storage SDK
            failure = f"{operation} failed: {status} {code}".strip()
            if status in (408, 429) or status >= 500 or code in RETRYABLE_CODES | _AZURE_RETRYABLE:
                raise RetryableError(failure) from exc
            raise ObjectStoreError(failure, where=self._where(key)) from exc
        except (ServiceRequestError, ServiceResponseError) as exc:  # refused, reset, timed out
            raise RetryableError(f"{operation} failed: {exc}") from exc

    def _where(self, key: str) -> str:
        return f"az://{self._location.bucket}/{key}"


def _connection_settings(connection_string: str) -> dict[str, str]:
    """``Name=value;...`` pairs of an Azure Storage connection string."""
    settings = {}
    for part in connection_string.split(";"):
        name, _, value = part.partition("=")
        if name and value:
            settings[name.strip()] = value.strip()
    return settings


def _account_from_env() -> str | None:
    return os.environ.get("AZURE_STORAGE_ACCOUNT") or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")


def _sas_from_env() -> str:
    return os.environ.get("AZURE_STORAGE_SAS_TOKEN", "")


def _default_credential(location: ObjectLocation) -> Any:
    try:
        from azure.identity import DefaultAzureCredential  # noqa: PLC0415
    except ImportError:
        raise SourceError(
            "no Azure credentials: set AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_KEY or "
            "AZURE_STORAGE_SAS_TOKEN, or install azure-identity for managed identities and "
            "az login",
            where=location.uri(),
        ) from None
    return DefaultAzureCredential()


def _quoted(etag: str) -> str:
    """An ETag as a blob's properties give it (quoted); a listing gives it bare."""
    return f'"{etag.strip(chr(34))}"'
