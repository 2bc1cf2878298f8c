"""Pages of unfinished documents, saved as each completes, so an interrupted document resumes.

A 400-page document whose task dies at page 399 would otherwise cost 400 pages again. Each accepted
page is one small object beside the ledger's state, under the ledger's conversion key (model, prompt
version, render settings) and the document's content hash (keys named by ``olmocr_tasks.location.layout``)::

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
from typing import Any

from olmocr_tasks.location.layout import ConversionState
from olmocr_tasks.page.results import PageResult
from olmocr_tasks.storage.store import Storage

log = logging.getLogger(__name__)

# Part of every record: a change of PageResult's fields starts over instead of misreading old pages.
RECORD_VERSION = 1

_FIELDS = {field.name: field for field in dataclasses.fields(PageResult)}


class PageStore:
    """Saved pages of the documents of one conversion key (``state``: the ledger's, ``Ledger.state``)."""

    def __init__(self, storage: Storage, state: ConversionState) -> None:
        self.storage = storage
        self.state = state

    def save(self, sha256: str, page: PageResult) -> None:
        """Record one accepted page of the document with content ``sha256``."""
        record = {"version": RECORD_VERSION, "sha256": sha256, "page": dataclasses.asdict(page)}
        # ASCII-escaped JSON keeps lone surrogates a model may answer with, and reads back identically.
        body = json.dumps(record, separators=(",", ":")).encode("ascii")
        self.storage.write_bytes_atomic(self.state.page(sha256, page.page_number), body)

    def load(self, sha256: str, page_count: int) -> dict[int, PageResult]:
        """The saved pages of the document in page order, by 1-based page number (up to ``page_count``)."""
        found: dict[int, PageResult] = {}
        for info in self.storage.list_objects(self.state.pages_of(sha256)):
            number = self.state.page_number(info.uri)
            if number is None or not 1 <= number <= page_count:
                continue
            raw = self.storage.read_bytes_or_none(info.uri)
            page = _page_from_record(raw, sha256, number) if raw is not None else None
            if page is not None:
                found[page.page_number] = page
        return dict(sorted(found.items()))

    def discard(self, sha256: str) -> int:
        """Remove every saved page of the document (its outputs are committed); returns how many."""
        removed = 0
        for info in list(self.storage.list_objects(self.state.pages_of(sha256))):
            self.storage.delete(info.uri)
            removed += 1
        return removed


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
