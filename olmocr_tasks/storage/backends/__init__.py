"""The transports under ``olmocr_tasks.storage.store.Storage``: one per kind of location.

A backend only moves bytes: it reads, writes, stats, deletes and lists, and lets whatever its
library raises propagate. ``Storage`` owns the policy over every backend alike: which failures are
retried, for how long, and which error type a caller sees (as httpx's ``Client`` keeps policy over a
``Transport``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

# Suffix of our own in-flight temp files: listings skip them so a reader never sees half a file.
TEMP_SUFFIX = ".olmocr-tmp"


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object as a listing or a HEAD reports it."""

    uri: str
    size: int
    # S3 ETag without quotes; None for local files (their identity is size + mtime).
    etag: str | None
    last_modified: datetime  # always timezone-aware UTC


class ObjectBody(Protocol):
    """An object being read from ``start``: ``read(size)`` returns at most ``size`` bytes (b"" at the end)."""

    # The version read (S3 ETag without quotes), so a resumed read asks for the same one; None locally.
    etag: str | None

    def read(self, size: int) -> bytes: ...

    def close(self) -> None: ...


class ListingPages(Protocol):
    """A listing in progress. ``next_page`` may be called again after it raised: it resumes where it was."""

    def next_page(self) -> list[ObjectInfo] | None:
        """The next batch of objects, or None once the listing is complete."""
        ...

    def close(self) -> None: ...


class Backend(Protocol):
    """Byte transport for one kind of location. Invalid URIs raise ``ValueError``."""

    # Whether Storage retries this backend's transient failures (network stores yes, local disks no).
    retries_transient_failures: bool
    # Exceptions that mean the store failed (translated by Storage); anything else is a bug and propagates.
    failure_types: tuple[type[BaseException], ...]

    def read(self, uri: str) -> bytes: ...

    def open(self, uri: str, start: int, etag: str | None) -> ObjectBody:
        """The object from byte ``start`` on, streamed; with ``etag``, only that version of it."""
        ...

    def download_into(self, uri: str, temp_path: str) -> None:
        """Copy the object into an existing local file, overwriting it from the start (safe to repeat)."""
        ...

    def write(self, uri: str, data: bytes, content_type: str | None) -> None:
        """Replace the object atomically: readers see the old content or the new one."""
        ...

    def create(self, uri: str, data: bytes) -> bool:
        """Write the object only if it does not exist yet (atomically); False when it already did."""
        ...

    def stat(self, uri: str) -> ObjectInfo | None:
        """None when the object does not exist."""
        ...

    def delete(self, uri: str) -> None:
        """A missing object is not an error."""
        ...

    def list_pages(self, prefix_uri: str) -> ListingPages: ...
