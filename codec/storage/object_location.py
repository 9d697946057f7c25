"""Where objects are: a bucket (or container), a key prefix, and how to reach the server.

Read from ``s3://bucket/prefix[?endpoint_override=host:port&scheme=http&region=r]`` (the
names pyarrow uses; or ``endpoint_url=http://host:port``), ``gs://bucket/prefix`` (the same
endpoint parameters, for an emulator) or ``az://container/prefix[?account=name]``
(``endpoint_url`` for an emulator).  Object URLs found in manifests are read by
:func:`split_object_url`, which refuses parameters.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final
from urllib.parse import parse_qs, urlsplit

from cutfs.codec.errors import SourceError

#: The URI schemes of the services this module speaks.
SCHEMES: Final = ("s3", "gs", "az")
_QUERY_NAMES: Final = {
    "s3": frozenset({"endpoint_override", "scheme", "region", "endpoint_url"}),
    "gs": frozenset({"endpoint_override", "scheme", "endpoint_url"}),
    "az": frozenset({"endpoint_override", "scheme", "endpoint_url", "account"}),
}


def is_remote(source: str) -> bool:
    """Whether ``source`` names object storage (``s3://``, ``gs://``) rather than a path."""
    return source.startswith(tuple(f"{scheme}://" for scheme in SCHEMES))


def split_object_url(url: str) -> tuple[ObjectLocation, str]:
    """The location (the bucket, no prefix) and the key of one object's URL, such as a
    recording's ``s3://bucket/audio/a.flac``; :class:`SourceError` when it names none.

    Such URLs come from manifests, which others write: they may not carry parameters,
    whose endpoint would send the reader's signed requests or tokens to any host; the
    endpoint and credentials come from the reader's environment alone.
    """
    parts = urlsplit(url)
    if parts.query or parts.fragment:
        raise SourceError(
            "an object's URL may not carry parameters (the endpoint and credentials come "
            "from the environment: AWS_ENDPOINT_URL, STORAGE_EMULATOR_HOST, ...)",
            where=url,
        )
    location = ObjectLocation.from_uri(url)
    key = location.prefix.rstrip("/")
    if not key:
        raise SourceError("the URL names a bucket, not an object", where=url)
    return replace(location, prefix=""), key


@dataclass(frozen=True, slots=True)
class ObjectLocation:
    """Where a store's objects are: a bucket, a key prefix, and how to reach the server.

    Picklable: worker processes open their own :class:`ObjectStore` from it.
    """

    bucket: str
    prefix: str
    endpoint_url: str | None = None
    region: str | None = None
    scheme: str = "s3"
    #: The storage account (Azure), when the URI names it.
    account: str | None = None

    @classmethod
    def from_uri(cls, uri: str) -> ObjectLocation:
        """``s3://bucket/prefix[?endpoint_override=host:port&scheme=http&region=r]``,
        ``gs://bucket/prefix[?endpoint_override=host:port&scheme=http]`` or
        ``az://container/prefix[?account=name&endpoint_url=...]``.

        Raises :class:`SourceError` for anything else.
        """
        parts = urlsplit(uri)
        if parts.scheme not in SCHEMES or not parts.netloc:
            raise SourceError(
                "expected s3://bucket/prefix, gs://bucket/prefix or az://container/prefix",
                where=uri,
            )
        query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
        unknown = set(query) - _QUERY_NAMES[parts.scheme]
        if unknown:
            raise SourceError(f"unknown query parameters: {', '.join(sorted(unknown))}", where=uri)
        endpoint = query.get("endpoint_url")
        if endpoint is None and "endpoint_override" in query:
            endpoint = f"{query.get('scheme', 'https')}://{query['endpoint_override']}"
        prefix = parts.path.strip("/")
        return cls(
            parts.netloc,
            prefix + "/" if prefix else "",
            endpoint,
            query.get("region"),
            parts.scheme,
            query.get("account"),
        )

    def key(self, name: str) -> str:
        return self.prefix + name

    def where(self, name: str) -> str:
        """An object's URI, for messages."""
        return f"{self.scheme}://{self.bucket}/{self.key(name)}"

    def uri(self) -> str:
        """The location as a URI that :meth:`from_uri` reads back."""
        query = f"?endpoint_url={self.endpoint_url}" if self.endpoint_url else ""
        if self.region:
            query += ("&" if query else "?") + f"region={self.region}"
        if self.account:
            query += ("&" if query else "?") + f"account={self.account}"
        return f"{self.scheme}://{self.bucket}/{self.prefix}{query}"
