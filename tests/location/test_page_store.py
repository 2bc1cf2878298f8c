"""Saved pages of unfinished documents: what is saved reads back identically, and nothing else does."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from olmocr_tasks.location.ledger import Ledger, conversion_key
from olmocr_tasks.location.page_store import PageStore
from olmocr_tasks.page.results import DocumentResult, PageResult
from olmocr_tasks.storage.store import Storage

SHA = hashlib.sha256(b"a document").hexdigest()
OTHER_SHA = hashlib.sha256(b"another document").hexdigest()


def _page(number: int, text: str | None = None, **changes: Any) -> PageResult:
    page = PageResult(
        page_number=number,
        text=text if text is not None else f'Text of page {number}\n\nwith \u00e9 and \ud800 and "quotes".',
        primary_language="en",
        is_rotation_valid=True,
        rotation_correction=0,
        is_table=number % 3 == 0,
        is_diagram=False,
        input_tokens=1000 + number,
        output_tokens=50 + number,
        attempts=1 + number % 2,
        accepted_attempt=1 + number % 2,
        latency_s=0.1 + number / 1000,
        is_fallback=False,
        server_input_tokens=2000 + number,
        server_output_tokens=100 + number,
    )
    return dataclasses.replace(page, **changes)


def _store(root: str, storage: Storage | None = None) -> PageStore:
    ledger = Ledger(root, storage or Storage(), conversion_key("model", "prompt", 1288))
    return PageStore(ledger.storage, ledger.state)


def test_saved_pages_read_back_identically_and_assemble_the_same_document(tmp_path: Path) -> None:
    store = _store(str(tmp_path))
    pages = [_page(number) for number in range(1, 8)]
    for page in pages[:5]:
        store.save(SHA, page)
    store.save(OTHER_SHA, _page(6, text="another document's page"))

    saved = store.load(SHA, page_count=7)
    assert sorted(saved) == [1, 2, 3, 4, 5]
    assert [saved[number] for number in range(1, 6)] == pages[:5]
    resumed = DocumentResult(source="x.pdf", size=10, sha256=SHA, pages=[*saved.values(), *pages[5:]])
    uninterrupted = DocumentResult(source="x.pdf", size=10, sha256=SHA, pages=pages)
    assert resumed.text == uninterrupted.text and resumed.totals == uninterrupted.totals
    assert resumed.page_spans() == uninterrupted.page_spans()


def test_records_live_beside_the_ledger_state_under_the_conversion_key(tmp_path: Path) -> None:
    store = _store(str(tmp_path))
    store.save(SHA, _page(2))
    (record,) = (tmp_path / "_state").rglob("*.json")
    conv = conversion_key("model", "prompt", 1288)
    assert record.relative_to(tmp_path).as_posix() == f"_state/{conv}/pages/{SHA}/00002.json"
    # Another model, prompt or render size reads nothing of it.
    other = Ledger(str(tmp_path), Storage(), conversion_key("model", "prompt", 1024))
    assert PageStore(other.storage, other.state).load(SHA, page_count=5) == {}


def test_damaged_foreign_and_out_of_range_records_are_ignored(tmp_path: Path) -> None:
    store = _store(str(tmp_path))
    for number in (1, 2, 3, 4, 9):
        store.save(SHA, _page(number))
    folder = next((tmp_path / "_state").rglob(SHA))
    (folder / "00001.json").write_text("{not json")
    record = json.loads((folder / "00002.json").read_text())
    record["sha256"] = OTHER_SHA  # copied from another document
    (folder / "00002.json").write_text(json.dumps(record))
    record = json.loads((folder / "00003.json").read_text())
    record["page"]["page_number"] = 4  # says it is another page than its name
    (folder / "00003.json").write_text(json.dumps(record))
    (folder / "notes.txt").write_text("not a page")
    assert sorted(store.load(SHA, page_count=5)) == [4]  # page 9 is beyond the document


def test_fallback_pages_are_never_read_back(tmp_path: Path) -> None:
    store = _store(str(tmp_path))
    store.save(SHA, PageResult.fallback(1, "text layer", attempts=8, latency_s=3.0, reason="no valid answer"))
    store.save(SHA, _page(2))
    assert sorted(store.load(SHA, page_count=2)) == [2]


def test_discard_removes_only_that_documents_pages(tmp_path: Path) -> None:
    store = _store(str(tmp_path))
    for number in range(1, 4):
        store.save(SHA, _page(number))
    store.save(OTHER_SHA, _page(1))
    assert store.discard(SHA) == 3
    assert store.load(SHA, page_count=3) == {}
    assert sorted(store.load(OTHER_SHA, page_count=3)) == [1]
    assert store.discard(SHA) == 0


def test_bad_keys_are_refused(tmp_path: Path) -> None:
    store = _store(str(tmp_path))
    with pytest.raises(ValueError, match="SHA-256"):
        store.save("../../escape", _page(1))
    with pytest.raises(ValueError, match="start at 1"):
        store.save(SHA, _page(0))


def test_round_trip_on_s3_and_what_it_costs_in_requests(s3_bucket: str, s3_storage_options: dict[str, Any]) -> None:
    """RELIABILITY.md's cost of resuming: one PUT per saved page, one LIST when a document starts (plus
    a GET per saved page), one LIST and a DELETE per page on commit."""
    storage = Storage(s3_storage_options)
    store = _store(f"s3://{s3_bucket}/out", storage)
    pages = [_page(number) for number in range(1, 4)]

    def requests_of(step: Callable[[], Any]) -> tuple[Any, dict[str, int]]:
        """What ``step`` returned and the requests it sent, by kind."""
        before = storage.requests.counts()
        result = step()
        return result, {kind: n - before[kind] for kind, n in storage.requests.counts().items() if n != before[kind]}

    for page in pages:
        assert requests_of(lambda page=page: store.save(SHA, page))[1] == {"write": 1}
    loaded, load_cost = requests_of(lambda: store.load(SHA, page_count=3))
    assert list(loaded.values()) == pages and load_cost == {"list": 1, "read": 3}
    assert requests_of(lambda: store.discard(SHA)) == (3, {"list": 1, "delete": 3})
    assert requests_of(lambda: store.load(SHA, page_count=3)) == ({}, {"list": 1})
