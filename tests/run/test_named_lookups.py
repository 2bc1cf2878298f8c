"""A run that names its documents reads their state only, not the location's whole history (moto S3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from olmocr_tasks.location.ledger import Ledger, fingerprint, source_id
from olmocr_tasks.run import planning
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.storage.store import Storage
from olmocr_testkit import pdfgen
from tests.fixtures.plans import plan_held_whole
from tests.fixtures.s3 import FaultProxy

# More done markers than one listing page holds (1,000 keys): a whole-state listing is at least two.
HISTORY = 1_200


def _listings(proxy: FaultProxy, since: int) -> list[str]:
    return [request.target for request in proxy.requests[since:] if "list-type=2" in request.target]


@pytest.fixture
def location(s3_bucket: str, s3_fault_proxy: FaultProxy, s3_put_many, tmp_path: Path) -> dict[str, object]:
    """An S3 output with a long history, and three inputs: converted before, failed before, new."""
    storage = Storage(s3_fault_proxy.storage_options)
    inbox, output = f"s3://{s3_bucket}/in", f"s3://{s3_bucket}/out"
    for name, doc_id in (("converted.pdf", 1), ("failed.pdf", 2), ("new.pdf", 3)):
        local = tmp_path / name
        pdfgen.write_pdf(local, pdfgen.text_pdf(1, doc_id=doc_id))
        storage.write_bytes_atomic(f"{inbox}/{name}", local.read_bytes())
    names = ("converted.pdf", "failed.pdf", "new.pdf")
    request = RunRequest(inbox, output, "named", documents=tuple(f"{inbox}/{name}" for name in names))
    ledger = Ledger(output, storage, request.conversion_key)
    state_key = ledger.state.sources_uri.split(f"s3://{s3_bucket}/", 1)[1]
    s3_put_many(s3_bucket, {f"{state_key}/{index:040x}/{index:016x}.done": b"{}" for index in range(HISTORY)})
    converted = storage.stat(f"{inbox}/converted.pdf")
    ledger.mark_done(converted, "0" * 64, {"dolma": f"{output}/dolma/converted.jsonl"}, "earlier")
    ledger.mark_failed(storage.stat(f"{inbox}/failed.pdf"), "unreadable", "a test failure", "earlier")
    return {"storage": storage, "request": request, "ledger": ledger}


def _planned(plan: planning.RunPlan) -> list[str]:
    return sorted(Path(source.info.uri).name for source in plan.sources)


def test_a_few_named_documents_are_looked_up_one_small_listing_each(
    location: dict[str, object], s3_fault_proxy: FaultProxy
) -> None:
    storage, request, ledger = location["storage"], location["request"], location["ledger"]
    before = len(s3_fault_proxy.requests)
    plan = plan_held_whole(request, storage)
    listings = _listings(s3_fault_proxy, before)
    # One listing per named source, each scoped to that source's own folder of the state.
    assert len(listings) == 3, listings
    for info_uri in request.documents:
        folder = ledger.state.source_folder(source_id(info_uri)).split("/", 3)[3]
        assert sum(folder.replace("/", "%2F") in target or folder in target for target in listings) == 1
    assert (plan.already_converted, _planned(plan)) == (1, ["failed.pdf", "new.pdf"])


def test_many_named_documents_take_one_listing_of_the_whole_state(
    location: dict[str, object], s3_fault_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage, request = location["storage"], location["request"]
    monkeypatch.setattr(planning, "NAMED_LOOKUPS_MAX", 2)
    before = len(s3_fault_proxy.requests)
    plan = plan_held_whole(request, storage)
    # The whole state: the history's 1,200 markers and the named ones take two pages.
    assert len(_listings(s3_fault_proxy, before)) == 2
    assert (plan.already_converted, _planned(plan)) == (1, ["failed.pdf", "new.pdf"])


def test_lookups_see_the_same_state_as_the_whole_listing(location: dict[str, object]) -> None:
    storage, request, ledger = location["storage"], location["request"], location["ledger"]
    infos = [storage.stat(uri) for uri in request.documents]
    looked_up = ledger.snapshot([source_id(info.uri) for info in infos])
    whole = ledger.snapshot()
    for info in infos:
        assert looked_up.status(info) == whole.status(info), fingerprint(info)
        assert looked_up.last_failure_marker(info) == whole.last_failure_marker(info)
    assert [looked_up.status(info) for info in infos] == ["done", ("failed", 1), "new"]
