"""Pages of unfinished documents, saved as each completes, so an interrupted document resumes.

A 400-page document whose task dies at page 399 would otherwise cost 400 pages again. Each accepted
page is one small object beside the ledger's state, under the ledger's conversion key (model, prompt
version, render settings) and the document's content hash::

    _state/<conv>/pages/<sha256>/<page-number>.json     one accepted page (a ``PageResult``)

so only a conversion that would produce the same page reuses it, whichever run, task or Airflow try
comes next, and whatever the document is called by then. The document's outputs are assembled from
saved and new pages alike, so they have the same form as an uninterrupted conversion's; its records
are discarded once those outputs are committed.

Fallback pages (attempts exhausted) are not saved: a rerun asks the server for them again, as it
would without resuming. A damaged or foreign record is ignored and its page converted again. Every
write is one whole-object atomic PUT of a uniquely named object, so two attempts of one document
writing at once cannot corrupt each other's pages (both wrote the same answer to the same page).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from typing import Any

from olmocr_tasks.results import PageResult
from olmocr_tasks.storage import Storage
from olmocr_tasks.uri import join_uri

log = logging.getLogger(__name__)

PAGES_DIR = "pages"
# Part of every record: a change of PageResult's fields starts over instead of misreading old pages.
RECORD_VERSION = 1

_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_RECORD_NAME = re.compile(r"^(?P<page>[0-9]{1,9})\.json$")
_FIELDS = {field.name: field for field in dataclasses.fields(PageResult)}


class PageStore:
    """Saved pages of the documents of one conversion key (``state_uri`` is the ledger's ``_state/<conv>``)."""

    def __init__(self, storage: Storage, state_uri: str) -> None:
        self.storage = storage
        self.pages_uri = join_uri(state_uri, PAGES_DIR)

    def save(self, sha256: str, page: PageResult) -> None:
        """Record one accepted page of the document with content ``sha256``."""
        record = {"version": RECORD_VERSION, "sha256": sha256, "page": dataclasses.asdict(page)}
        # ASCII-escaped JSON keeps lone surrogates a model may answer with, and reads back identically.
        body = json.dumps(record, separators=(",", ":")).encode("ascii")
        self.storage.write_bytes_atomic(self._record_uri(sha256, page.page_number), body)

    def load(self, sha256: str, page_count: int) -> dict[int, PageResult]:
        """The saved pages of the document in page order, by 1-based page number (up to ``page_count``)."""
        found: dict[int, PageResult] = {}
        for info in self.storage.list_objects(self._document_uri(sha256)):
            match = _RECORD_NAME.match(info.uri.rsplit("/", 1)[-1])
            if match is None or not 1 <= int(match["page"]) <= page_count:
                continue
            raw = self.storage.read_bytes_or_none(info.uri)
            page = _page_from_record(raw, sha256, int(match["page"])) if raw is not None else None
            if page is not None:
                found[page.page_number] = page
        return dict(sorted(found.items()))

    def discard(self, sha256: str) -> int:
        """Remove every saved page of the document (its outputs are committed); returns how many."""
        removed = 0
        for info in list(self.storage.list_objects(self._document_uri(sha256))):
            self.storage.delete(info.uri)
            removed += 1
        return removed

    def _document_uri(self, sha256: str) -> str:
        if not _HEX64.match(sha256):
            raise ValueError(f"not a hex SHA-256: {sha256!r}")
        return join_uri(self.pages_uri, sha256)

    def _record_uri(self, sha256: str, page_number: int) -> str:
        if page_number < 1:
            raise ValueError(f"page numbers start at 1, got {page_number}")
        return join_uri(self._document_uri(sha256), f"{page_number:05d}.json")


def _page_from_record(raw: bytes, sha256: str, page_number: int) -> PageResult | None:
    try:
        record = json.loads(raw)
        if record.get("version") != RECORD_VERSION or record.get("sha256") != sha256:
            return None
        fields: dict[str, Any] = record["page"]
        if set(fields) != set(_FIELDS) or fields["page_number"] != page_number or fields["is_fallback"]:
            return None
        return PageResult(**fields)
    except (ValueError, KeyError, TypeError, AttributeError):
        log.warning("ignoring a damaged saved page %d of %s; it will be converted again", page_number, sha256)
        return None
