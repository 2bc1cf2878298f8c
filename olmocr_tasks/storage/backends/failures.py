"""Which storage failures are worth retrying, and which mean "missing", "forbidden" or "bad credentials".

S3 errors are judged by their error code and HTTP status; local ones by their exception type and
errno. ``Storage`` uses the verdict to decide what to retry and which error its caller sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import socket
from collections.abc import Iterator
from dataclasses import dataclass

_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404", "NoSuchBucket", "NoSuchVersion"})
_DENIED_CODES = frozenset({"AccessDenied", "403", "AllAccessDisabled", "InvalidObjectState"})
# Broken credentials or configuration fail every object alike: an infrastructure problem, not a
# property of one document, so they must not dead-letter the whole collection.
_CREDENTIAL_CODES = frozenset(
    {
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "TokenRefreshRequired",
        "InvalidToken",
        "RequestTimeTooSkewed",
        "AuthorizationHeaderMalformed",
        "PermanentRedirect",
    }
)
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "ServiceUnavailable",
        "InternalError",
        "RequestTimeout",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
        "OperationAborted",
        "BandwidthLimitExceeded",
        # A conditional write raced another write to the same key: asking again gets a clear answer.
        "ConditionalRequestConflict",
        "500",
        "502",
        "503",
        "504",
    }
)


@functools.cache
def _transient_exception_types() -> tuple[type[BaseException], ...]:
    # Built on first use: importing botocore costs ~0.3 s of CPU that local-only runs never need.
    types: list[type[BaseException]] = [
        TimeoutError,
        asyncio.TimeoutError,
        socket.timeout,
        ConnectionError,
    ]
    with contextlib.suppress(ImportError):
        from botocore.exceptions import HTTPClientError, ResponseStreamingError

        types += [HTTPClientError, ResponseStreamingError]
    with contextlib.suppress(ImportError):
        from botocore.exceptions import ResponseParserError

        # Throttled responses sometimes arrive as truncated XML.
        types.append(ResponseParserError)
    with contextlib.suppress(ImportError):
        from fsspec.exceptions import FSTimeoutError

        types.append(FSTimeoutError)
    with contextlib.suppress(ImportError):
        import aiohttp

        types.append(aiohttp.ClientError)
    return tuple(types)


@dataclass(frozen=True)
class Failure:
    kind: str  # "not_found" | "denied" | "credentials" | "transient" | "exists" | "permanent"
    code: str | None
    status: int | None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def classify(exc: BaseException) -> Failure:
    for item in _chain(exc):
        response = getattr(item, "response", None)
        if isinstance(response, dict) and ("Error" in response or "ResponseMetadata" in response):
            code = str(response.get("Error", {}).get("Code") or "") or None
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in _CREDENTIAL_CODES:
                return Failure("credentials", code, status)
            if code in _TRANSIENT_CODES or (status is not None and (status >= 500 or status == 429)):
                return Failure("transient", code, status)
            if code in _NOT_FOUND_CODES or status == 404:
                return Failure("not_found", code, status)
            if code in _DENIED_CODES or status == 403:
                return Failure("denied", code, status)
            if code == "PreconditionFailed" or status == 412:
                return Failure("exists", code, status)
            return Failure("permanent", code, status)
    for item in _chain(exc):
        if type(item).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
            return Failure("credentials", type(item).__name__, None)
        if isinstance(item, _transient_exception_types()):
            return Failure("transient", type(item).__name__, None)
        if isinstance(item, FileNotFoundError):
            return Failure("not_found", "FileNotFound", None)
        if isinstance(item, PermissionError):
            return Failure("denied", "PermissionDenied", None)
        if isinstance(item, IsADirectoryError | NotADirectoryError):
            return Failure("not_found", type(item).__name__, None)
        if isinstance(item, OSError) and item.errno in (errno.EBUSY, errno.ETIMEDOUT, errno.EAGAIN):
            return Failure("transient", errno.errorcode.get(item.errno or 0), None)
    return Failure("permanent", type(exc).__name__, None)


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the same storage call later may succeed (throttling, 5xx, network)."""
    return classify(exc).kind == "transient"


def server_message(exc: BaseException) -> str | None:
    for item in _chain(exc):
        response = getattr(item, "response", None)
        if isinstance(response, dict) and "Error" in response:
            message = response["Error"].get("Message")
            return str(message)[:300] if message else None
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return None
