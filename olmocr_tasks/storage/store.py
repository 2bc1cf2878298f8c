"""One storage layer for local folders and ``s3://`` buckets: retries and error translation over backends.

Everything here is synchronous; async callers wrap calls in ``asyncio.to_thread``. The bytes move
through a backend per kind of location (``storage_backends.local`` and ``storage_backends.s3``);
this module holds the policy that is the same for every backend.

Retries are layered, each layer with one job:

* botocore's own "standard" retry mode re-sends a single HTTP request a few times on throttling
  (503 SlowDown), 5xx and connection errors with jittered backoff. It is the cheapest layer (it
  rewinds the request body itself) and it absorbs short blips, but it cannot retry an operation
  whose response body broke off half-way (a streaming download) and it gives up quickly.
* tenacity wraps each whole storage operation (one listing page, one download, one upload) and
  retries transient failures with exponential backoff and full jitter, bounded by attempts *and*
  total time. This layer rides out sustained throttling. Local disks are not retried.
* s3fs's own retry loop is switched off (``retries=1``) so the two layers above do not multiply
  into an unbounded number of requests.

Permanent errors are never retried: a missing or forbidden *source* becomes
``UnreadableSourceError`` (only that document fails); anything else that still fails after the
retries becomes ``StorageError``. Error messages are built from the operation, the URI and the
S3 error code and are scrubbed of the configured credentials. An invalid URI is a ``ValueError``.
"""

from __future__ import annotations

import copy
import io
import logging
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_random_exponential,
)

from olmocr_tasks.core.errors import OlmocrTasksError, StorageError, UnreadableSourceError
from olmocr_tasks.core.redaction import environment_secrets, redact, redact_url, secret_values
from olmocr_tasks.storage.backends import TEMP_SUFFIX, Backend, ObjectBody, ObjectInfo
from olmocr_tasks.storage.backends.failures import classify, is_transient, server_message
from olmocr_tasks.storage.backends.local import LocalBackend
from olmocr_tasks.storage.backends.s3 import S3Backend
from olmocr_tasks.storage.uri import is_s3

# ObjectInfo and TEMP_SUFFIX are part of this API: listings return the one and skip the other.
__all__ = [
    "REQUEST_KINDS",
    "TEMP_SUFFIX",
    "ObjectInfo",
    "ObjectReader",
    "ReadLimitExceeded",
    "RequestCounter",
    "RetryPolicy",
    "Storage",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Operations on a document's source, where "missing" or "forbidden" fails only that document.
_SOURCE_OPS = frozenset({"read", "download", "stat"})
# The kinds of storage request a ``RequestCounter`` tells apart (a download is a read, a HEAD a stat).
REQUEST_KINDS = ("read", "write", "create", "delete", "list", "stat")
_KIND_OF_OP = {"read": "read", "download": "read", "write": "write", "create": "create"}
_KIND_OF_OP |= {"delete": "delete", "list": "list", "stat": "stat"}
# What ``ObjectReader.read()`` without a size asks its body for at a time.
_READ_ALL_CHUNK = 1024 * 1024


class ReadLimitExceeded(OlmocrTasksError):
    """An object read through ``Storage.open_read`` holds more bytes than its reader allowed."""


class RequestCounter:
    """Storage requests by kind, counted in this process: what a run's state costs in requests.

    Every attempt counts (a retried GET is two requests on the bill); a listing counts once per page.
    botocore's own re-sends of one HTTP request below ``Storage`` are not seen (off in the tests that
    compare with the server's log). A child counter (``Storage.counting``) also adds to its parent, so
    one batch's requests are known while the process's totals stay whole.
    """

    def __init__(self, parent: RequestCounter | None = None) -> None:
        self._counts: Counter[str] = Counter()
        self._parent = parent
        # Storage calls come from many threads (asyncio.to_thread).
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # A Storage is pickled into other processes (Airflow, Celery): the copy counts on its own.
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def add(self, kind: str, count: int = 1) -> None:
        with self._lock:
            self._counts[kind] += count
        if self._parent is not None:
            self._parent.add(kind, count)

    def counts(self) -> dict[str, int]:
        """Every kind of ``REQUEST_KINDS`` with its count (0 included), in that order."""
        with self._lock:
            return {kind: self._counts[kind] for kind in REQUEST_KINDS}

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def since(self, earlier: dict[str, int]) -> dict[str, int]:
        """The requests counted after ``earlier`` (an earlier ``counts()``), by kind."""
        return {kind: count - earlier.get(kind, 0) for kind, count in self.counts().items()}


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


class Storage:
    """Read, write and list objects under local paths, ``file://`` URIs and ``s3://`` URIs.

    ``storage_options`` go to s3fs (``key``, ``secret``, ``token``, ``endpoint_url``,
    ``client_kwargs``, ``config_kwargs``...); without them s3fs uses the environment. A function that
    returns them is called once, when this storage first reaches S3 (``S3Backend``).
    """

    def __init__(
        self,
        storage_options: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
        *,
        retry: RetryPolicy | None = None,
        multipart_chunksize: int = 50 * 1024 * 1024,
    ) -> None:
        self.retry = retry or RetryPolicy()
        # Every request this Storage sends, by kind (``RequestCounter``).
        self.requests = RequestCounter()
        self._local = LocalBackend()
        self._s3 = S3Backend(
            storage_options if callable(storage_options) else dict(storage_options or {}),
            botocore_attempts=self.retry.botocore_attempts,
            connect_timeout_s=self.retry.connect_timeout_s,
            read_timeout_s=self.retry.read_timeout_s,
            multipart_chunksize=multipart_chunksize,
        )

    def __repr__(self) -> str:
        options = self._s3.known_options()
        endpoint = options.get("endpoint_url") or options.get("client_kwargs", {}).get("endpoint_url")
        shown = redact_url(str(endpoint)) if endpoint else None
        return f"Storage(endpoint_url={shown!r}, retry={self.retry!r})"

    # ----------------------------------------------------------------------------- public API

    def counting(self) -> Storage:
        """This storage (same clients and policy) with a counter of its own that also adds to this one's.

        For one batch's requests while other batches share the process's storage.
        """
        child = copy.copy(self)
        child.requests = RequestCounter(parent=self.requests)
        return child

    def read_bytes(self, uri: str) -> bytes:
        """The whole object. Missing or forbidden → ``UnreadableSourceError``."""
        backend = self._backend(uri)
        return self._call(backend, "read", uri, lambda: backend.read(uri))

    def read_bytes_or_none(self, uri: str) -> bytes | None:
        """The whole object, or None if it does not exist (for optional state files)."""
        try:
            return self.read_bytes(uri)
        except UnreadableSourceError as exc:
            if getattr(exc, "storage_failure", None) == "not_found":
                return None
            raise

    def open_read(self, uri: str, *, max_bytes: int) -> ObjectReader:
        """The object as a stream (one GET, read a chunk at a time): never whole in memory.

        Missing or forbidden → ``UnreadableSourceError`` here, before any byte is read. Reading more than
        ``max_bytes`` raises ``ReadLimitExceeded`` (at most one byte past the bound is ever read). A
        read that breaks off on S3 resumes where it stopped (a ranged GET of the same version).
        """
        return ObjectReader(self, uri, max_bytes)

    def open_read_or_none(self, uri: str, *, max_bytes: int) -> ObjectReader | None:
        """``open_read``, or None if the object does not exist (for optional files)."""
        try:
            return self.open_read(uri, max_bytes=max_bytes)
        except UnreadableSourceError as exc:
            if getattr(exc, "storage_failure", None) == "not_found":
                return None
            raise

    def download(self, uri: str, local_file: str | os.PathLike[str]) -> None:
        """Stream an object to a local file (never whole in memory); the file appears complete or not at all."""
        target = os.fspath(local_file)
        backend = self._backend(uri)

        def fetch(temp: str) -> None:
            self._call(backend, "download", uri, lambda: backend.download_into(uri, temp))

        # Source errors and target errors are translated separately: an unwritable scratch folder
        # is an infrastructure problem, not an unreadable document. The scratch file is not a storage
        # request: only the download is counted.
        self._call(
            self._local, "write", target, lambda: self._local.write_file_atomically(target, fetch), counted=False
        )

    def write_bytes_atomic(self, uri: str, data: bytes, *, content_type: str | None = None) -> None:
        """Replace the object with ``data``: readers see the old content or the new one, never a mix."""
        backend = self._backend(uri)
        self._call(backend, "write", uri, lambda: backend.write(uri, data, content_type))

    def create_exclusive(self, uri: str, data: bytes) -> bool:
        """Write the object only if nothing exists at ``uri``; False (nothing written) if something did.

        Atomic on both backends (a hard link locally, an ``If-None-Match: *`` PUT on S3), so of two
        writers racing for one key exactly one gets True.
        """
        backend = self._backend(uri)
        return self._call(backend, "create", uri, lambda: backend.create(uri, data))

    def exists(self, uri: str) -> bool:
        """Whether the object exists; not being allowed to tell is a ``StorageError``."""
        try:
            return self.stat(uri) is not None
        except UnreadableSourceError as exc:
            # exists() serves outputs and state, where a forbidden answer is an environment problem.
            raise StorageError(str(exc)) from None

    def stat(self, uri: str) -> ObjectInfo | None:
        """The object's metadata, None if it does not exist. Forbidden → ``UnreadableSourceError``."""
        backend = self._backend(uri)
        return self._call(backend, "stat", uri, lambda: backend.stat(uri))

    def delete(self, uri: str) -> None:
        """Remove an object; a missing object is not an error."""
        backend = self._backend(uri)
        self._call(backend, "delete", uri, lambda: backend.delete(uri))

    def list_objects(self, prefix_uri: str) -> Iterator[ObjectInfo]:
        """Every object below a folder-like prefix, recursively, streamed page by page.

        The prefix is a folder: ``s3://b/in`` lists ``in/...`` but not ``input/...``. S3 yields keys in
        lexicographic order; local folders in directory order. A missing prefix yields nothing.
        """
        backend = self._backend(prefix_uri)
        pages = backend.list_pages(prefix_uri)
        try:
            while (page := self._call(backend, "list", prefix_uri, pages.next_page)) is not None:
                yield from page
        finally:
            pages.close()

    # ----------------------------------------------------------------------------- internals

    def _open_body(self, backend: Backend, uri: str, start: int, etag: str | None) -> ObjectBody:
        """One GET (a read request, retried and translated like ``read_bytes``) from byte ``start``."""
        return self._call(backend, "read", uri, lambda: backend.open(uri, start, etag))

    def _backend(self, uri: str) -> Backend:
        return self._s3 if is_s3(uri) else self._local

    def _call(self, backend: Backend, op: str, uri: str, call: Callable[[], T], *, counted: bool = True) -> T:
        """Run one operation under the retry policy; translate what still fails into our error types."""
        kind = _KIND_OF_OP[op] if counted else None

        def attempt() -> T:
            # Counted per attempt: a request that fails is still a request. A listing answers None once
            # it is complete, without sending anything (the last page said so).
            if kind is None:
                return call()
            try:
                result = call()
            except BaseException:
                self.requests.add(kind)
                raise
            if result is not None or kind != "list":
                self.requests.add(kind)
            return result

        try:
            if backend.retries_transient_failures:
                return self._retrying(op, uri)(attempt)
            return attempt()
        except (StorageError, UnreadableSourceError, ValueError):
            raise
        except backend.failure_types as exc:
            raise self._translate(op, uri, exc) from None

    def _retrying(self, op: str, uri: str) -> Retrying:
        policy = self.retry

        def log_retry(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            logger.warning(
                "%s %s failed (%s), attempt %d, retrying in %.2fs",
                op,
                uri,
                classify(exc).code if exc else "?",
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

    def _translate(self, op: str, uri: str, exc: BaseException) -> Exception:
        failure = classify(exc)
        detail = failure.code or type(exc).__name__
        message = f"{op} {uri} failed: {detail}"
        if reason := server_message(exc):
            message += f" ({reason})"
        message = self._scrub(message)
        if op in _SOURCE_OPS and failure.kind in ("not_found", "denied"):
            error = UnreadableSourceError(message)
            # Lets read_bytes_or_none tell "missing" from "forbidden" without parsing messages.
            error.storage_failure = failure.kind  # type: ignore[attr-defined]
            return error
        if failure.kind == "transient":
            message += " after retries"
        return StorageError(message)

    def known_secrets(self) -> list[str]:
        """The secrets this storage holds (its credentials, the process's AWS variables), for ``redact``."""
        return [*secret_values(self._s3.known_options()), *environment_secrets()]

    def _scrub(self, text: str) -> str:
        return redact(text, self.known_secrets())


class ObjectReader(io.RawIOBase):
    """One object read as a binary stream (``Storage.open_read``), bounded to ``max_bytes``.

    Each ``read(size)`` asks the backend for at most ``size`` bytes. A transient failure part-way
    (a dropped connection, a read timeout) reopens the object where the read stopped, the same version
    (``If-Match`` its ETag), up to the retry policy's attempts; botocore cannot retry a body that broke
    off, and re-reading from the start would hand the caller its bytes twice.
    """

    def __init__(self, storage: Storage, uri: str, max_bytes: int) -> None:
        super().__init__()
        self.uri = uri
        self.max_bytes = max_bytes
        self._storage = storage
        self._backend = storage._backend(uri)
        self._offset = 0
        # Set before the GET: a failed open still closes (``IOBase.__del__``) without a body.
        self._body: ObjectBody | None = None
        self._body = storage._open_body(self._backend, uri, 0, None)
        self._etag = self._body.etag

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return self.readall()
        self._checkClosed()  # type: ignore[attr-defined]
        # One byte past the bound is enough to know the object is larger.
        data = self._chunk(min(size, self.max_bytes + 1 - self._offset)) if size else b""
        self._offset += len(data)
        if self._offset > self.max_bytes:
            raise ReadLimitExceeded(f"{self.uri} holds more than {self.max_bytes:,} bytes")
        return data

    def readall(self) -> bytes:
        chunks = []
        while chunk := self.read(_READ_ALL_CHUNK):
            chunks.append(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        self._drop_body()
        super().close()

    def _chunk(self, size: int) -> bytes:
        storage, backend = self._storage, self._backend
        resumes = 0
        while True:
            if self._body is None:
                self._body = storage._open_body(backend, self.uri, self._offset, self._etag)
            try:
                return self._body.read(size)
            except backend.failure_types as exc:
                self._drop_body()
                retry = backend.retries_transient_failures and is_transient(exc)
                if not retry or resumes + 1 >= max(1, storage.retry.max_attempts):
                    raise storage._translate("read", self.uri, exc) from None
                resumes += 1
                logger.warning(
                    "read %s broke off at byte %d (%s), resuming there", self.uri, self._offset, classify(exc).code
                )

    def _drop_body(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            try:
                body.close()
            except Exception:  # a broken connection may fail to close; it is dropped either way
                logger.debug("closing %s failed", self.uri, exc_info=True)
