"""``s3://`` buckets as a storage backend, through s3fs's client (botocore underneath).

botocore's own "standard" retry mode re-sends a single HTTP request a few times on throttling, 5xx
and connection errors (it rewinds the request body itself); s3fs's retry loop is switched off
(``retries=1``) so it does not multiply with the retries ``Storage`` wraps around whole operations.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from olmocr_tasks.storage.backends import ObjectInfo
from olmocr_tasks.storage.backends.failures import classify
from olmocr_tasks.storage.uri import split_s3

# Larger listing pages are capped by S3 itself.
_PAGE_SIZE = 1000


class S3Backend:
    """Objects in S3 (or an S3-compatible store) through one lazily built s3fs client per process.

    ``storage_options`` go to s3fs (``key``, ``secret``, ``token``, ``endpoint_url``,
    ``client_kwargs``, ``config_kwargs``...); without them s3fs uses the environment. Given as a function,
    they are asked for once, when the client is first built: credentials are looked up (an Airflow
    connection, a round trip to the API server) only by a storage that reaches S3.
    """

    retries_transient_failures = True
    # botocore, aiohttp and s3fs raise many unrelated types; classification sorts them out.
    failure_types: tuple[type[BaseException], ...] = (Exception,)

    def __init__(
        self,
        storage_options: dict[str, Any] | Callable[[], dict[str, Any]],
        *,
        botocore_attempts: int,
        connect_timeout_s: float,
        read_timeout_s: float,
        multipart_chunksize: int,
    ) -> None:
        self._options_source = storage_options if callable(storage_options) else None
        self._options: dict[str, Any] | None = None if callable(storage_options) else dict(storage_options)
        self._options_lock = threading.Lock()
        self._config = {
            "retries": {"mode": "standard", "total_max_attempts": max(1, botocore_attempts)},
            "connect_timeout": connect_timeout_s,
            "read_timeout": read_timeout_s,
        }
        # Objects up to twice this size are uploaded with one PUT; larger ones as a multipart upload,
        # which S3 only publishes on completion (s3fs aborts it on failure), so both are all-or-nothing.
        self.multipart_chunksize = multipart_chunksize
        self._fs: Any = None
        self._fs_pid: int | None = None
        # Callers run storage calls from many threads (asyncio.to_thread): build the client once.
        self._fs_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # The s3fs client is bound to this process's event loop; a copy rebuilds its own.
        state = self.__dict__.copy()
        state["_fs"] = None
        state["_fs_pid"] = None
        del state["_fs_lock"], state["_options_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._fs_lock = threading.Lock()
        self._options_lock = threading.Lock()

    def options(self) -> dict[str, Any]:
        """The s3fs options, asked of their function the first time they are needed."""
        if self._options is None:
            with self._options_lock:
                if self._options is None:
                    assert self._options_source is not None
                    self._options = dict(self._options_source())
        return self._options

    def known_options(self) -> dict[str, Any]:
        """The options as far as they are known (none before a function gave them), for redaction."""
        return self._options or {}

    def read(self, uri: str) -> bytes:
        # One GET through s3fs's client; s3fs's cat_file would send a HEAD first.
        from fsspec.asyn import sync

        bucket, key = _object_key(uri)
        fs = self._s3fs()

        async def fetch() -> bytes:
            response = await fs._call_s3("get_object", Bucket=bucket, Key=key)
            body = response["Body"]
            try:
                return await body.read()
            finally:
                body.close()

        return sync(fs.loop, fetch)

    def open(self, uri: str, start: int, etag: str | None) -> _S3Body:
        """One GET from byte ``start`` on (a ranged GET when resuming, ``If-Match`` its first ETag),
        whose body is read a chunk at a time on s3fs's event loop."""
        from fsspec.asyn import sync

        bucket, key = _object_key(uri)
        fs = self._s3fs()
        conditions: dict[str, str] = {}
        if start:
            conditions["Range"] = f"bytes={start}-"
        if etag:
            conditions["IfMatch"] = f'"{etag}"'

        async def get() -> Any:
            return await fs._call_s3("get_object", Bucket=bucket, Key=key, **conditions)

        response = sync(fs.loop, get)
        return _S3Body(fs.loop, response["Body"], _clean_etag(response.get("ETag")))

    def download_into(self, uri: str, temp_path: str) -> None:
        bucket, key = _object_key(uri)
        # get_file opens the target with "wb": each attempt rewrites it from the start.
        self._s3fs().get_file(f"{bucket}/{key}", temp_path)

    def write(self, uri: str, data: bytes, content_type: str | None) -> None:
        bucket, key = _object_key(uri)
        extra = {"ContentType": content_type} if content_type else {}
        self._s3fs().pipe_file(f"{bucket}/{key}", data, chunksize=self.multipart_chunksize, **extra)

    def create(self, uri: str, data: bytes) -> bool:
        bucket, key = _object_key(uri)
        try:
            # S3 conditional write: 412 PreconditionFailed when the key exists.
            self._s3fs().call_s3("put_object", Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
        except Exception as exc:
            if classify(exc).kind == "exists":
                return False
            raise
        return True

    def stat(self, uri: str) -> ObjectInfo | None:
        bucket, key = split_s3(uri)
        if not key:
            raise ValueError(f"stat needs an object key, got a bucket: {uri!r}")
        try:
            response = self._s3fs().call_s3("head_object", Bucket=bucket, Key=key)
        except Exception as exc:
            if classify(exc).kind == "not_found":
                return None
            raise
        return ObjectInfo(
            uri,
            int(response.get("ContentLength", 0)),
            _clean_etag(response.get("ETag")),
            _utc(response["LastModified"]),
        )

    def delete(self, uri: str) -> None:
        bucket, key = split_s3(uri)
        self._s3fs().call_s3("delete_object", Bucket=bucket, Key=key)

    def list_pages(self, prefix_uri: str) -> _S3Listing:
        return _S3Listing(self, prefix_uri)

    def call(self, operation: str, **kwargs: Any) -> Any:
        """One S3 API call (``list_objects_v2``, ``head_object``...) through the shared client."""
        return self._s3fs().call_s3(operation, **kwargs)

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

        options = dict(self.options())
        config = {**self._config, **(options.pop("config_kwargs", None) or {})}
        s3fs_retries = options.pop("retries", 1)
        fs = fsspec.filesystem(
            "s3", skip_instance_cache=True, use_listings_cache=False, config_kwargs=config, **options
        )
        # A class attribute in s3fs, not a constructor argument.
        fs.retries = s3fs_retries
        return fs


class _S3Body:
    """A GET's streaming body (aiobotocore's, bound to s3fs's loop) read synchronously, a chunk per call."""

    def __init__(self, loop: Any, body: Any, etag: str | None) -> None:
        self._loop = loop
        self._body = body
        self.etag = etag

    def read(self, size: int) -> bytes:
        from fsspec.asyn import sync

        async def chunk() -> bytes:
            return await self._body.read(size)

        return sync(self._loop, chunk)

    def close(self) -> None:
        from fsspec.asyn import sync

        async def close() -> None:
            # On the loop's own thread: aiohttp's connection is not thread-safe. A body closed before
            # its end drops its connection instead of returning it to the pool.
            self._body.close()

        if not self._loop.is_closed():
            sync(self._loop, close)


class _S3Listing:
    """ListObjectsV2 page by page; a failed page is asked for again with the same continuation token."""

    def __init__(self, backend: S3Backend, prefix_uri: str) -> None:
        self._backend = backend
        self._bucket, key = split_s3(prefix_uri)
        # The prefix is a folder: "s3://b/in" lists "in/..." but not "input/...".
        self._prefix = key.rstrip("/") + "/" if key.strip("/") else ""
        self._token: str | None = None
        self._done = False

    def next_page(self) -> list[ObjectInfo] | None:
        if self._done:
            return None
        kwargs: dict[str, Any] = {"Bucket": self._bucket, "Prefix": self._prefix, "MaxKeys": _PAGE_SIZE}
        if self._token:
            kwargs["ContinuationToken"] = self._token
        page = self._backend.call("list_objects_v2", **kwargs)
        self._token = page.get("NextContinuationToken") if page.get("IsTruncated") else None
        self._done = not self._token
        return [
            ObjectInfo(
                f"s3://{self._bucket}/{item['Key']}",
                int(item.get("Size", 0)),
                _clean_etag(item.get("ETag")),
                _utc(item["LastModified"]),
            )
            for item in page.get("Contents", []) or []
            # zero-byte "folder" markers made by consoles
            if not item["Key"].endswith("/")
        ]

    def close(self) -> None:
        self._done = True


def _object_key(uri: str) -> tuple[str, str]:
    bucket, key = split_s3(uri)
    if not key or key.endswith("/"):
        raise ValueError(f"need an object key, got a folder or bucket: {uri!r}")
    return bucket, key


def _clean_etag(etag: str | None) -> str | None:
    return etag.strip('"') if etag else None


def _utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)
