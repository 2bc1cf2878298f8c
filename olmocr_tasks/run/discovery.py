"""Find the documents to convert (PDFs and page images): by listing a prefix, or from an explicit list."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

from olmocr_tasks.core.errors import ConfigurationError, UnreadableSourceError
from olmocr_tasks.core.formats import ALL_FORMATS, is_document_name
from olmocr_tasks.storage.store import ObjectInfo, Storage


@dataclass(frozen=True)
class MissingSource:
    """An explicitly requested document that cannot be found or read; the caller records it as failed."""

    uri: str
    reason: str
    error_class: str = UnreadableSourceError.error_class


def _check_aware(name: str, value: datetime | None) -> None:
    if value is not None and value.tzinfo is None:
        raise ConfigurationError(f"{name} must be timezone-aware (storage timestamps are UTC)")


def in_interval(last_modified: datetime, modified_after: datetime | None, modified_until: datetime | None) -> bool:
    """``modified_after < last_modified <= modified_until``; a missing bound is open.

    Half-open, so consecutive intervals (a, b], (b, c] take every object exactly once.
    """
    if modified_after is not None and last_modified <= modified_after:
        return False
    return modified_until is None or last_modified <= modified_until


def iter_documents(
    input_uri: str,
    storage: Storage,
    *,
    formats: Iterable[str] = ALL_FORMATS,
    modified_after: datetime | None = None,
    modified_until: datetime | None = None,
) -> Iterator[ObjectInfo]:
    """Stream every document below ``input_uri`` (recursively) last modified in the interval.

    A document is a name whose extension is one of ``formats`` (``core.formats``: ``.pdf``, ``.png``,
    ``.jpg``/``.jpeg``, ``.tif``/``.tiff``, ``.webp`` in any letter case); its content is checked
    before it is rendered. ``input_uri`` may also name a single document. Order: S3 key order, or
    local directory order.
    """
    _check_aware("modified_after", modified_after)
    _check_aware("modified_until", modified_until)
    formats = frozenset(formats)
    if is_document_name(input_uri.rstrip("/"), formats) and not input_uri.endswith("/"):
        single = storage.stat(input_uri)
        if single is not None:
            if in_interval(single.last_modified, modified_after, modified_until):
                yield single
            return
    for info in storage.list_objects(input_uri):
        if is_document_name(info.uri, formats) and in_interval(info.last_modified, modified_after, modified_until):
            yield info


def resolve_explicit(uris: Iterable[str], storage: Storage) -> list[ObjectInfo | MissingSource]:
    """Look up each listed document, in order; exact duplicates are looked up once.

    A missing or forbidden document becomes a ``MissingSource`` rather than disappearing. The
    extension is not checked: an explicitly named file is converted or fails on its content.
    """
    resolved: list[ObjectInfo | MissingSource] = []
    seen: set[str] = set()
    for uri in uris:
        if uri in seen:
            continue
        seen.add(uri)
        try:
            info = storage.stat(uri)
        except UnreadableSourceError as exc:
            resolved.append(MissingSource(uri, str(exc)))
            continue
        except ValueError as exc:  # e.g. a bucket without a key
            resolved.append(MissingSource(uri, f"not an object URI: {exc}"))
            continue
        resolved.append(info if info is not None else MissingSource(uri, "not found"))
    return resolved
