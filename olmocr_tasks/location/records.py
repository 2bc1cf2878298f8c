"""Bounded reads of the small state records runs read back: ledger markers, content records, claims.

Each is a few hundred bytes as written; anyone who can write the output location could put a
gigabyte there instead, and every run that reads it back would hold it whole. So a record is read
through ``Storage.open_read`` up to ``OLMOCR_MAX_RECORD_BYTES`` (default 1 MiB), and a larger one is
``RecordTooLargeError``, which the readers treat as they treat a damaged record.
"""

from __future__ import annotations

from olmocr_tasks.core import environment
from olmocr_tasks.core.errors import OlmocrTasksError
from olmocr_tasks.storage.store import ReadLimitExceeded, Storage

MAX_RECORD_BYTES_SETTING = environment.MAX_RECORD_BYTES
DEFAULT_MAX_RECORD_BYTES = 1024 * 1024


class RecordTooLargeError(OlmocrTasksError):
    """A state record holds more than ``OLMOCR_MAX_RECORD_BYTES``: damaged or planted, never read whole."""


def max_record_bytes() -> int:
    """``OLMOCR_MAX_RECORD_BYTES`` (a positive number of bytes), else 1 MiB."""
    return environment.max_record_bytes(DEFAULT_MAX_RECORD_BYTES)


def read_record(storage: Storage, uri: str) -> bytes | None:
    """The record at ``uri``, or None when there is none; ``RecordTooLargeError`` past the bound."""
    limit = max_record_bytes()
    stream = storage.open_read_or_none(uri, max_bytes=limit)
    if stream is None:
        return None
    with stream:
        try:
            return stream.read()
        except ReadLimitExceeded as exc:
            raise RecordTooLargeError(f"{uri} holds more than {limit:,} bytes ({MAX_RECORD_BYTES_SETTING})") from exc
