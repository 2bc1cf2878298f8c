"""One storage layer for local folders and ``s3://`` buckets, built on fsspec/s3fs.

Everything here is synchronous; async callers wrap calls in ``asyncio.to_thread``.

Retries are layered, each layer with one job:

* botocore's own "standard" retry mode re-sends a single HTTP request a few times on throttling
  (503 SlowDown), 5xx and connection errors with jittered backoff. It is the cheapest layer (it
  rewinds the request body itself) and it absorbs short blips, but it cannot retry an operation
  whose response body broke off half-way (a streaming download) and it gives up quickly.
* tenacity wraps each whole storage operation (one listing page, one download, one upload) and
  retries transient failures with exponential backoff and full jitter, bounded by attempts *and*
  total time. This layer rides out sustained throttling.
* s3fs's own retry loop is switched off (``retries=1``) so the two layers above do not multiply
  into an unbounded number of requests.

Permanent errors are never retried: a missing or forbidden *source* becomes
``UnreadableSourceError`` (only that document fails); anything else that still fails after the
retries becomes ``StorageError``. Error messages are built from the operation, the URI and the
S3 error code and are scrubbed of the configured credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import hashlib
import logging
import os
import re
import secrets
import socket
import threading
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, BinaryIO, TypeVar
from urllib.parse import unquote, urlsplit

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from olmocr_tasks.errors import StorageError, UnreadableSourceError
from olmocr_tasks.redaction import redact_text, redact_url

logger = logging.getLogger(__name__)

T = TypeVar("T")

S3_SCHEME = "s3://"
# Suffix of our own in-flight temp files: listings skip them so a reader never sees half a file.
TEMP_SUFFIX = ".olmocr-tmp"
_COPY_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object as a listing or a HEAD reports it."""

    uri: str
    size: int
    # S3 ETag without quotes; None for local files (their identity is size + mtime).
    etag: str | None
    last_modified: datetime  # always timezone-aware UTC


@dataclass(frozen=True)
class RetryPolicy:
    """Bounds of the retry layers described in the module docstring."""

    # tenacity: attempts of a whole operation and the wall-clock budget across them.
    max_attempts: int = 5
    max_elapsed_s: float = 120.0
    initial_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    # botocore: total HTTP attempts of one request (1 disables botocore's retries).
    botocore_attempts: int = 3
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 60.0


# --------------------------------------------------------------------------------------- URI helpers


def is_s3(uri: str) -> bool:
    return uri[:5].lower() == S3_SCHEME


def split_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` → ``("bucket", "key")``; the key may be empty."""
    if not is_s3(uri):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[5:].partition("/")
    if not bucket:
        raise ValueError(f"s3 URI without a bucket: {uri!r}")
    return bucket, key


def local_path(uri: str) -> str:
    """A local URI (plain path or ``file://``) as a filesystem path."""
    if is_s3(uri):
        raise ValueError(f"not a local path: {uri!r}")
    if uri[:7].lower() == "file://":
        parts = urlsplit(uri)
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file:// URI with a remote host is not supported: {uri!r}")
        return unquote(parts.path) or "/"
    return uri


def join_uri(base: str, *parts: str) -> str:
    """Join key parts onto a base URI with ``/``. No sanitising: see ``safe_join`` for untrusted parts."""
    pieces = [part.strip("/") for part in parts if part and part.strip("/")]
    if not pieces:
        return base
    return "/".join([base.rstrip("/"), *pieces])


def storage_options_from_env(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """s3fs options from the usual AWS_* variables, for handing explicit options to another process.

    In-process this is not needed: with no options s3fs and botocore read the environment themselves.
    """
    env = os.environ if environ is None else environ
    options: dict[str, Any] = {}
    if env.get("AWS_ACCESS_KEY_ID"):
        options["key"] = env["AWS_ACCESS_KEY_ID"]
    if env.get("AWS_SECRET_ACCESS_KEY"):
        options["secret"] = env["AWS_SECRET_ACCESS_KEY"]
    if env.get("AWS_SESSION_TOKEN"):
        options["token"] = env["AWS_SESSION_TOKEN"]
    client_kwargs: dict[str, Any] = {}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        client_kwargs["endpoint_url"] = endpoint
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        client_kwargs["region_name"] = region
    if client_kwargs:
        options["client_kwargs"] = client_kwargs
    return options


# ------------------------------------------------------------------------------------ path safety

# Characters that must never reach a key: C0/C1 controls, lone surrogates (not encodable as UTF-8),
# line/paragraph separators and the bidi overrides used to disguise names.
_BIDI_CONTROLS = frozenset("\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})
# Leave room for suffixes such as ".jsonl" under the usual 255-byte file name limit.
_MAX_COMPONENT_BYTES = 200


def _safe_char(char: str) -> str:
    if char in _BIDI_CONTROLS or unicodedata.category(char) in _UNSAFE_CATEGORIES:
        return "_"
    if char == "\\":
        return "_"
    # Look-alikes that compatibility normalisation turns into separators (fullwidth solidus,
    # division slash...): a consumer applying NFKC must not see new path components.
    if char != "/" and any(c in "/\\" for c in unicodedata.normalize("NFKC", char)):
        return "_"
    return char


def _safe_component(component: str) -> str:
    cleaned = "".join(_safe_char(char) for char in component)
    # Dot-only names (also via NFKC look-alikes such as U+2024 or fullwidth dots) are never
    # followed: they would climb out of the prefix on a consumer that interprets them.
    if unicodedata.normalize("NFKC", cleaned).strip() in ("", ".", ".."):
        return ""
    encoded = cleaned.encode("utf-8")
    if len(encoded) > _MAX_COMPONENT_BYTES:
        digest = hashlib.sha1(encoded).hexdigest()[:10]
        head = encoded[: _MAX_COMPONENT_BYTES - 11].decode("utf-8", errors="ignore")
        cleaned = f"{head}~{digest}"
    return cleaned


def safe_relative_key(key: str) -> str:
    """Neutralise an untrusted relative key so it can only name something *below* a prefix.

    NFC-normalises, replaces backslashes, control and bidi characters with ``_``, drops empty, ``.``
    and ``..`` components (so absolute paths become relative) and caps component length. Returns
    ``""`` when nothing is left; idempotent.
    """
    normalised = unicodedata.normalize("NFC", key)
    components = (_safe_component(part) for part in normalised.split("/"))
    return "/".join(part for part in components if part)


def safe_join(base_uri: str, key: str) -> str:
    """``base_uri`` + a sanitised ``key``; raises ``ValueError`` instead of writing outside the base."""
    relative = safe_relative_key(key)
    if not relative:
        raise ValueError(f"key {key!r} is empty after sanitising")
    joined = join_uri(base_uri, relative)
    base = base_uri.rstrip("/") + "/"
    if not joined.startswith(base) or "/../" in f"/{relative}/":
        raise ValueError(f"key {key!r} escapes {base_uri!r}")
    return joined


# --------------------------------------------------------------------------- error classification

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
class _Failure:
    kind: str  # "not_found" | "denied" | "credentials" | "transient" | "permanent"
    code: str | None
    status: int | None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _classify(exc: BaseException) -> _Failure:
    for item in _chain(exc):
        response = getattr(item, "response", None)
        if isinstance(response, dict) and ("Error" in response or "ResponseMetadata" in response):
            code = str(response.get("Error", {}).get("Code") or "") or None
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in _CREDENTIAL_CODES:
                return _Failure("credentials", code, status)
            if code in _TRANSIENT_CODES or (status is not None and (status >= 500 or status == 429)):
                return _Failure("transient", code, status)
            if code in _NOT_FOUND_CODES or status == 404:
                return _Failure("not_found", code, status)
            if code in _DENIED_CODES or status == 403:
                return _Failure("denied", code, status)
            return _Failure("permanent", code, status)
    for item in _chain(exc):
        if type(item).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
            return _Failure("credentials", type(item).__name__, None)
        if isinstance(item, _transient_exception_types()):
            return _Failure("transient", type(item).__name__, None)
        if isinstance(item, FileNotFoundError):
            return _Failure("not_found", "FileNotFound", None)
        if isinstance(item, PermissionError):
            return _Failure("denied", "PermissionDenied", None)
        if isinstance(item, IsADirectoryError | NotADirectoryError):
            return _Failure("not_found", type(item).__name__, None)
        if isinstance(item, OSError) and item.errno in (errno.EBUSY, errno.ETIMEDOUT, errno.EAGAIN):
            return _Failure("transient", errno.errorcode.get(item.errno or 0), None)
    return _Failure("permanent", type(exc).__name__, None)


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the same storage call later may succeed (throttling, 5xx, network)."""
    return _classify(exc).kind == "transient"


_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]+@")


# ---------------------------------------------------------------------------------------- Storage


class Storage:
    """Read, write and list objects under local paths, ``file://`` URIs and ``s3://`` URIs.

    ``storage_options`` go to s3fs (``key``, ``secret``, ``token``, ``endpoint_url``,
    ``client_kwargs``, ``config_kwargs``...); without them s3fs uses the environment.
    """

    def __init__(
        self,
        storage_options: dict[str, Any] | None = None,
        *,
        retry: RetryPolicy | None = None,
        multipart_chunksize: int = 50 * 1024 * 1024,
    ) -> None:
        self._options = dict(storage_options or {})
        self.retry = retry or RetryPolicy()
        # Objects up to twice this size are uploaded with one PUT; larger ones as a multipart upload,
        # which S3 only publishes on completion (s3fs aborts it on failure), so both are all-or-nothing.
        self.multipart_chunksize = multipart_chunksize
        self._fs: Any = None
        self._fs_pid: int | None = None
        # Callers run storage calls from many threads (asyncio.to_thread): build the client once.
        self._fs_lock = threading.Lock()

    def __repr__(self) -> str:
        endpoint = self._options.get("endpoint_url") or self._options.get("client_kwargs", {}).get("endpoint_url")
        shown = redact_url(str(endpoint)) if endpoint else None
        return f"Storage(endpoint_url={shown!r}, retry={self.retry!r})"

    def __getstate__(self) -> dict[str, Any]:
        # The s3fs client is bound to this process's event loop; a copy rebuilds its own.
        state = self.__dict__.copy()
        state["_fs"] = None
        state["_fs_pid"] = None
        del state["_fs_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._fs_lock = threading.Lock()

    # ----------------------------------------------------------------------------- public API

    def read_bytes(self, uri: str) -> bytes:
        """The whole object. Missing or forbidden → ``UnreadableSourceError``."""
        if not is_s3(uri):
            return self._local_op("read", uri, lambda: _read_file(local_path(uri)), source=True)
        bucket, key = _s3_bucket_key(uri)
        return self._s3_op("read", uri, lambda: self._s3_get(bucket, key), source=True)

    def read_bytes_or_none(self, uri: str) -> bytes | None:
        """The whole object, or None if it does not exist (for optional state files)."""
        try:
            return self.read_bytes(uri)
        except UnreadableSourceError as exc:
            if getattr(exc, "storage_failure", None) == "not_found":
                return None
            raise

    def download(self, uri: str, local_file: str | os.PathLike[str]) -> None:
        """Stream an object to a local file (never whole in memory); the file appears complete or not at all."""
        target = os.fspath(local_file)
        # Source errors and target errors are translated separately: an unwritable scratch folder
        # is an infrastructure problem, not an unreadable document.
        if not is_s3(uri):
            # Opened here (not in a with) so only this call is translated as a source error.
            source = self._local_op("download", uri, lambda: open(local_path(uri), "rb"), source=True)  # noqa: SIM115
            with source:
                self._local_op("write", target, lambda: _atomic_local(target, _copy_into(source)), source=False)
            return
        path = _s3_path(uri)

        def fetch(temp: str) -> None:
            # Each attempt rewrites the temp file from the start (get_file opens it with "wb").
            self._s3_op("download", uri, lambda: self._s3fs().get_file(path, temp), source=True)

        self._local_op("write", target, lambda: _atomic_local(target, fetch), source=False)

    def write_bytes_atomic(self, uri: str, data: bytes, *, content_type: str | None = None) -> None:
        """Replace the object with ``data``: readers see the old content or the new one, never a mix."""
        if not is_s3(uri):
            path = local_path(uri)

            def write(temp: str) -> None:
                with open(temp, "r+b") as handle:
                    handle.write(data)

            self._local_op("write", uri, lambda: _atomic_local(path, write, make_dirs=True), source=False)
            return
        s3_path = _s3_path(uri)
        extra = {"ContentType": content_type} if content_type else {}
        self._s3_op(
            "write",
            uri,
            lambda: self._s3fs().pipe_file(s3_path, data, chunksize=self.multipart_chunksize, **extra),
            source=False,
        )

    def exists(self, uri: str) -> bool:
        """Whether the object exists; not being allowed to tell is a ``StorageError``."""
        try:
            return self.stat(uri) is not None
        except UnreadableSourceError as exc:
            # exists() serves outputs and state, where a forbidden answer is an environment problem.
            raise StorageError(str(exc)) from None

    def stat(self, uri: str) -> ObjectInfo | None:
        """The object's metadata, None if it does not exist. Forbidden → ``UnreadableSourceError``."""
        if not is_s3(uri):
            path = local_path(uri)

            def local_stat() -> ObjectInfo | None:
                try:
                    st = os.stat(path)
                except (FileNotFoundError, NotADirectoryError):
                    return None
                if not os.path.isfile(path):
                    return None
                return ObjectInfo(uri, st.st_size, None, _mtime(st.st_mtime_ns))

            return self._local_op("stat", uri, local_stat, source=True)
        bucket, key = split_s3(uri)
        if not key:
            raise ValueError(f"stat needs an object key, got a bucket: {uri!r}")

        def head() -> ObjectInfo | None:
            try:
                response = self._s3fs().call_s3("head_object", Bucket=bucket, Key=key)
            except Exception as exc:
                if _classify(exc).kind == "not_found":
                    return None
                raise
            return ObjectInfo(
                uri,
                int(response.get("ContentLength", 0)),
                _clean_etag(response.get("ETag")),
                _utc(response["LastModified"]),
            )

        return self._s3_op("stat", uri, head, source=True)

    def delete(self, uri: str) -> None:
        """Remove an object; a missing object is not an error."""
        if not is_s3(uri):
            path = local_path(uri)

            def remove() -> None:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)

            self._local_op("delete", uri, remove, source=False)
            return
        bucket, key = split_s3(uri)
        self._s3_op("delete", uri, lambda: self._s3fs().call_s3("delete_object", Bucket=bucket, Key=key), source=False)

    def list_objects(self, prefix_uri: str) -> Iterator[ObjectInfo]:
        """Every object below a folder-like prefix, recursively, streamed page by page.

        The prefix is a folder: ``s3://b/in`` lists ``in/...`` but not ``input/...``. S3 yields keys in
        lexicographic order; local folders in directory order. A missing prefix yields nothing.
        """
        if is_s3(prefix_uri):
            return self._list_s3(prefix_uri)
        return self._list_local(prefix_uri)

    # ----------------------------------------------------------------------------- internals

    def _s3fs(self) -> Any:
        # A forked child must not reuse the parent's client: its event loop lives in the parent.
        if self._fs is not None and self._fs_pid == os.getpid():
            return self._fs
        with self._fs_lock:
            if self._fs is None or self._fs_pid != os.getpid():
                self._fs = self._new_s3fs()
                self._fs_pid = os.getpid()
        return self._fs

    def _new_s3fs(self) -> Any:
        import fsspec

        options = dict(self._options)
        config = {
            "retries": {"mode": "standard", "total_max_attempts": max(1, self.retry.botocore_attempts)},
            "connect_timeout": self.retry.connect_timeout_s,
            "read_timeout": self.retry.read_timeout_s,
        }
        config.update(options.pop("config_kwargs", None) or {})
        s3fs_retries = options.pop("retries", 1)
        fs = fsspec.filesystem(
            "s3",
            skip_instance_cache=True,
            use_listings_cache=False,
            config_kwargs=config,
            **options,
        )
        # A class attribute in s3fs, not a constructor argument.
        fs.retries = s3fs_retries
        return fs

    def _s3_get(self, bucket: str, key: str) -> bytes:
        # One GET through s3fs's client; s3fs's cat_file would send a HEAD first.
        from fsspec.asyn import sync

        fs = self._s3fs()

        async def fetch() -> bytes:
            response = await fs._call_s3("get_object", Bucket=bucket, Key=key)
            body = response["Body"]
            try:
                return await body.read()
            finally:
                body.close()

        return sync(fs.loop, fetch)

    def _retrying(self, op: str, uri: str) -> Retrying:
        policy = self.retry

        def log_retry(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            logger.warning(
                "%s %s failed (%s), attempt %d, retrying in %.2fs",
                op,
                uri,
                _classify(exc).code if exc else "?",
                state.attempt_number,
                state.next_action.sleep if state.next_action else 0.0,
            )

        return Retrying(
            stop=stop_after_attempt(max(1, policy.max_attempts)) | stop_after_delay(policy.max_elapsed_s),
            wait=wait_random_exponential(multiplier=policy.initial_backoff_s, max=policy.max_backoff_s),
            retry=retry_if_exception(is_transient),
            before_sleep=log_retry,
            reraise=True,
        )

    def _s3_op(self, op: str, uri: str, call: Callable[[], T], *, source: bool) -> T:
        try:
            return self._retrying(op, uri)(call)
        except (StorageError, UnreadableSourceError):
            raise
        except Exception as exc:
            raise self._translate(op, uri, exc, source=source) from None

    def _local_op(self, op: str, uri: str, call: Callable[[], T], *, source: bool) -> T:
        try:
            return call()
        except (StorageError, UnreadableSourceError):
            raise
        except OSError as exc:
            raise self._translate(op, uri, exc, source=source) from None

    def _translate(self, op: str, uri: str, exc: BaseException, *, source: bool) -> Exception:
        failure = _classify(exc)
        detail = failure.code or type(exc).__name__
        server_message = _server_message(exc)
        message = f"{op} {uri} failed: {detail}"
        if server_message:
            message += f" ({server_message})"
        message = self._scrub(message)
        if source and op in ("read", "download", "stat") and failure.kind in ("not_found", "denied"):
            error = UnreadableSourceError(message)
            # Lets read_bytes_or_none tell "missing" from "forbidden" without parsing messages.
            error.storage_failure = failure.kind  # type: ignore[attr-defined]
            return error
        if failure.kind == "transient":
            message += " after retries"
        return StorageError(message)

    def _scrub(self, text: str) -> str:
        client_kwargs = self._options.get("client_kwargs") or {}
        known = [self._options.get(name) for name in ("key", "secret", "token", "username", "password")] + [
            client_kwargs.get(name) for name in ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
        ]
        known += [os.environ.get(name) for name in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")]
        text = redact_text(text, [str(value) for value in known if value])
        return _URL_USERINFO.sub(r"\g<scheme>***@", text)

    def _list_s3(self, prefix_uri: str) -> Iterator[ObjectInfo]:
        bucket, key = split_s3(prefix_uri)
        prefix = key.rstrip("/") + "/" if key.strip("/") else ""
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": 1000}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._s3_op(
                "list",
                prefix_uri,
                lambda kwargs=kwargs: self._s3fs().call_s3("list_objects_v2", **kwargs),
                source=False,
            )
            for item in page.get("Contents", []) or []:
                object_key = item["Key"]
                if object_key.endswith("/"):
                    continue  # zero-byte "folder" markers made by consoles
                yield ObjectInfo(
                    f"s3://{bucket}/{object_key}",
                    int(item.get("Size", 0)),
                    _clean_etag(item.get("ETag")),
                    _utc(item["LastModified"]),
                )
            token = page.get("NextContinuationToken") if page.get("IsTruncated") else None
            if not token:
                return

    def _list_local(self, prefix_uri: str) -> Iterator[ObjectInfo]:
        root = local_path(prefix_uri)
        if not os.path.isdir(root):
            return
        base = prefix_uri.rstrip("/") or "/"
        # Depth-first with one open directory iterator per level: memory grows with depth, not with
        # the number of files (a flat folder of 100,000 files is never held as a list).
        stack: list[tuple[str, Iterator[os.DirEntry[str]]]] = []
        try:
            stack.append(("", os.scandir(root)))
            while stack:
                relative_dir, entries = stack[-1]
                entry = next(entries, None)
                if entry is None:
                    _close(entries)
                    stack.pop()
                    continue
                relative = f"{relative_dir}/{entry.name}" if relative_dir else entry.name
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append((relative, os.scandir(entry.path)))
                        continue
                    if entry.name.endswith(TEMP_SUFFIX) or not entry.is_file():
                        continue
                    st = entry.stat()
                except OSError:
                    continue  # vanished or unreadable while we walked: not listable
                uri = f"{base}/{relative}" if base != "/" else f"/{relative}"
                yield ObjectInfo(uri, st.st_size, None, _mtime(st.st_mtime_ns))
        except OSError as exc:
            raise self._translate("list", prefix_uri, exc, source=False) from None
        finally:
            for _, entries in stack:
                _close(entries)


# ------------------------------------------------------------------------------------- helpers


def _server_message(exc: BaseException) -> str | None:
    for item in _chain(exc):
        response = getattr(item, "response", None)
        if isinstance(response, dict) and "Error" in response:
            message = response["Error"].get("Message")
            return str(message)[:300] if message else None
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return None


def _s3_bucket_key(uri: str) -> tuple[str, str]:
    bucket, key = split_s3(uri)
    if not key or key.endswith("/"):
        raise ValueError(f"need an object key, got a folder or bucket: {uri!r}")
    return bucket, key


def _s3_path(uri: str) -> str:
    bucket, key = _s3_bucket_key(uri)
    return f"{bucket}/{key}"


def _clean_etag(etag: str | None) -> str | None:
    return etag.strip('"') if etag else None


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def _mtime(mtime_ns: int) -> datetime:
    # Integer arithmetic so a listing and a stat of the same file give the identical timestamp.
    seconds, nanos = divmod(mtime_ns, 1_000_000_000)
    return datetime.fromtimestamp(seconds, UTC).replace(microsecond=nanos // 1000)


def _close(entries: Iterator[os.DirEntry[str]]) -> None:
    close = getattr(entries, "close", None)
    if close is not None:
        close()


def _read_file(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _copy_into(source: BinaryIO) -> Callable[[str], None]:
    def copy(temp: str) -> None:
        with open(temp, "r+b") as dst:
            while chunk := source.read(_COPY_CHUNK):
                dst.write(chunk)

    return copy


def _atomic_local(path: str, fill: Callable[[str], None], *, make_dirs: bool = True) -> None:
    """Create a temp file next to ``path``, let ``fill`` write it, fsync, then rename over ``path``.

    The rename is atomic on POSIX within one filesystem, which is why the temp file lives in the
    target's own folder rather than in /tmp.
    """
    folder = os.path.dirname(os.path.abspath(path))
    if make_dirs:
        os.makedirs(folder, exist_ok=True)
    temp = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(6)}{TEMP_SUFFIX}")
    # "x" mode gives normal umask permissions (mkstemp would force 0600) and never clobbers.
    with open(temp, "xb"):
        pass
    try:
        fill(temp)
        with open(temp, "r+b") as handle:
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temp)
        raise
    _fsync_dir(folder)


def _fsync_dir(folder: str) -> None:
    # Makes the rename itself durable; not every filesystem allows opening a folder.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
