"""The contract between :class:`cutfs.codec.storage.object_store.ObjectStore` and one kind
of object storage: :class:`ObjectService`, what its methods take and return, and the
errors they raise.  The services (:mod:`.s3_service`, :mod:`.gcs_service`,
:mod:`.azure_service`) implement it; the store retries, pins versions and counts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar

from cutfs.codec.errors import CutfsError

_T = TypeVar("_T")


class ObjectStoreError(CutfsError):
    """The store did not answer, or refused, within the deadline."""


class ObjectChangedError(ObjectStoreError):
    """An object is no longer the version that was pinned (its ETag changed)."""


class RetryableError(Exception):
    """A failure worth another attempt (throttling, a server error, a lost connection);
    raised by services, retried by the store within its deadline."""


@dataclass(frozen=True, slots=True)
class PinnedObject:
    """An object's size and the version (S3 ETag, GCS generation) every read must match."""

    size: int
    etag: str


#: Runs one attempt of an operation on an object, again while it raises
#: :class:`RetryableError` and the deadline allows (see ``ObjectStore.retried``).
Retried = Callable[[str, Callable[[], _T]], _T]


class ObjectService(Protocol):
    """What one kind of object storage does for an ``ObjectStore``.

    Each method is one attempt: it raises :class:`RetryableError` for what is worth
    another (the store retries within its deadline), :class:`ObjectChangedError` when
    a precondition on a version failed, :class:`ObjectStoreError` for the rest.  Methods
    that send several requests (an upload in parts) take ``retried`` to retry each.
    Thread-safe.
    """

    def head(self, key: str) -> PinnedObject | None:
        """The object's size and version, ``None`` if there is none."""
        ...

    def ranged_get(self, key: str, pinned: PinnedObject, start: int, stop: int) -> RangedGet:
        """How to ask for bytes ``[start, stop)`` of the pinned version."""
        ...

    def check_version(self, headers: Any, pinned: PinnedObject) -> bool:
        """Whether a reply's headers say it is of the pinned version (see
        :func:`same_version`).  The request was conditional on it already, but a server or a
        cache that ignores the condition would otherwise pass other bytes as the pinned
        ones: a reply that does not name its version is not of the pinned one."""
        ...

    def error_code(self, body: bytes) -> str:
        """The service's code for the error a reply's body describes, or ''."""
        ...

    def refused(self, key: str, status: int) -> None:
        """A request was refused for its credentials (401, 403): sign again next time."""
        ...

    def put_file(self, key: str, path: str, part_bytes: int, retried: Retried[Any]) -> str:
        """Upload a file as the object, in parts of ``part_bytes`` when larger; its version."""
        ...

    def put_bytes(self, key: str, data: bytes) -> str: ...

    def list_page(
        self, prefix: str, token: str | None
    ) -> tuple[dict[str, PinnedObject], str | None]:
        """Keys under ``prefix`` with their sizes and versions (as :meth:`head` gives
        them), and the token of the next page."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object; none there is no error."""
        ...

    def delete_many(self, keys: Sequence[str], retried: Retried[Any]) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class RangedGet:
    """One conditional ranged GET: its URL and headers."""

    url: str
    headers: dict[str, str]


#: Error codes worth another attempt, of every service (S3's, GCS's reasons).
RETRYABLE_CODES: Final = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "InternalError",
        "rateLimitExceeded",
        "userRateLimitExceeded",
        "backendError",
        "internalError",
    }
)


def xml_error_code(body: bytes) -> str:
    """The ``<Code>`` of an XML error document (S3's, Azure's), or ''."""
    start, end = body.find(b"<Code>"), body.find(b"</Code>")
    if start < 0 or end < start:
        return ""
    return body[start + len(b"<Code>") : end].decode("ascii", "replace")[:64]


def same_version(stated: object, pinned: str) -> bool:
    """Whether a version a reply states (an ETag, a generation; ``None`` when it states
    none) is ``pinned``, quotes and a weak validator's ``W/`` aside."""
    if stated is None:
        return False
    return _bare(str(stated)) == _bare(pinned)


def _bare(version: str) -> str:
    return version.strip().removeprefix("W/").strip('"')
