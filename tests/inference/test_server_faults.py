"""Server faults and outages through the whole engine: every page ends converted or accounted for.

The vLLM stand-in decodes each page's identity marker, so its request log tells, per page, exactly
which faults that page met. That makes "fallback only where a page really exhausted its attempts"
checkable page by page instead of by counting: a page's accepted attempt must equal the position of
its first normal answer among the answers that cost an attempt.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from olmocr_tasks.core.errors import ServerUnavailable
from olmocr_tasks.run.batching import BatchingRule
from olmocr_tasks.run.pipeline import convert_batch, run_conversion
from olmocr_tasks.run.planning import plan_batches
from olmocr_tasks.run.publishing import publish_run
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.storage.store import Storage
from olmocr_testkit import pdfgen
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.reader_view import assert_manifest_matches_outputs, assert_reader_view_consistent, quick_settings

# Answers that the page logic rejects, each costing one of the page's attempts (olmOCR semantics).
ATTEMPT_FAULTS = {"garbage", "length", "invalid_rotation", "bad_json", "overlong"}
# Failures the client retries within the same attempt (transport, throttling, server errors, timeouts).
TRANSPORT_FAULTS = {"500", "503", "429", "hang", "drop", "slow"}
MAX_PAGE_RETRIES = 8

# Eight documents, 60 pages; ids start at 11 so no page of one document can pass for another's.
DOCUMENT_PAGES = {11: 4, 12: 6, 13: 8, 14: 10, 15: 5, 16: 7, 17: 9, 18: 11}


def write_documents(folder: Path, pages: dict[int, int] = DOCUMENT_PAGES) -> dict[str, int]:
    names = {}
    for doc_id, count in pages.items():
        name = f"doc{doc_id}.pdf"
        pdfgen.write_pdf(folder / name, pdfgen.text_pdf(count, doc_id=doc_id))
        names[name] = doc_id
    return names


def requests_by_page(standin: StandinServer) -> dict[tuple[int, int], list[dict[str, Any]]]:
    pages: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for record in standin.requests():
        marker = record["marker"]
        assert marker is not None, record
        pages[(marker["doc_id"], marker["page_number"])].append(record)
    return pages


def expected_attempts(records: list[dict[str, Any]]) -> tuple[int | None, int]:
    """From one page's requests in arrival order: (accepted attempt or None, attempts spent)."""
    attempts = 0
    for record in sorted(records, key=lambda r: r["seq"]):
        fault = record["fault"]
        if fault in TRANSPORT_FAULTS:
            continue
        attempts += 1
        if fault is None:
            return attempts, attempts
    return None, attempts


@pytest.mark.slow
def test_fault_matrix_loses_nothing_mixes_nothing_and_finishes_in_bounded_time(
    tmp_path: Path, standin: StandinServer
) -> None:
    doc_ids = write_documents(tmp_path / "in")
    rates = {fault: 0.03 for fault in ATTEMPT_FAULTS | TRANSPORT_FAULTS}
    # Every fault at least once whatever the random draws: scripted on pages of the first document.
    scripted = sorted(ATTEMPT_FAULTS | TRANSPORT_FAULTS)
    scripts = {f"1{4 + i // 10}:{i % 10 + 1}": [fault] for i, fault in enumerate(scripted)}
    # One page that never gets a usable answer: it must exhaust its attempts and fall back.
    always = {"18:11": "invalid_rotation"}
    # The slow answer comes well after the read timeout; hung requests never answer at all.
    standin.configure(fault_rates=rates, scripts=scripts, always=always, slow_s=6.0, seed=5)
    # Every published document must say which pages fell back, so the error-rate guard is opened
    # here: whether a page may fall back is what this test checks, page by page.
    # Hedging off: the page-by-page check below counts every answered request as one page attempt,
    # and a hedge is a second request within the same attempt (whichever copy answers usably first is
    # accepted), so with hedges the stand-in's log no longer tells which attempt an answer belonged to.
    # Hedges under faults: test_client's hedging tests and the deployment tier's test_hung_requests.
    settings = quick_settings(
        standin.url, read_timeout_s=2.0, outage_window_s=20.0, max_page_error_rate=1.0, hedge_requests=False
    )
    request = RunRequest(str(tmp_path / "in"), str(tmp_path / "out"), "faults", settings=settings)

    manifest, _ = run_conversion(request, Storage())

    # Bounded by the client, not by the server: it gave up on every slow request before the answer
    # came (the stand-in logs client_gone, not an answer, so no page waited the 6 s) and sent that page
    # again; every hung request, which never answers, was closed by the client and its page re-sent.
    log = requests_by_page(standin)
    held = [
        (page, record) for page, records in log.items() for record in records if record["fault"] in ("slow", "hang")
    ]
    assert {record["fault"] for _, record in held} == {"slow", "hang"}
    for page, record in held:
        assert record["outcome"] == ("client_gone" if record["fault"] == "slow" else "hang"), record
        assert record["finished"] is not None, record
        assert any(other["seq"] > record["seq"] for other in log[page]), record
    seen = standin.stats()["by_outcome"]
    assert set(scripted) - {"slow"} <= set(seen), seen  # a slow answer is logged as "client_gone"
    assert all(doc.status == "converted" for doc in manifest.documents), [
        (doc.source, doc.error) for doc in manifest.documents
    ]
    assert len(manifest.documents) == len(DOCUMENT_PAGES)
    assert manifest.counts()["pages"] == sum(DOCUMENT_PAGES.values())

    assert set(log) == {(doc, n) for doc, count in DOCUMENT_PAGES.items() for n in range(1, count + 1)}
    view = assert_reader_view_consistent(str(tmp_path / "out"), doc_ids=doc_ids)
    assert len(view.dolma) == len(DOCUMENT_PAGES)
    assert len({record["metadata"]["Source-File"] for record in view.dolma.values()}) == len(DOCUMENT_PAGES)
    assert view.failed_markers == []
    fallbacks = 0
    for record in view.dolma.values():
        doc_id = doc_ids[Path(record["metadata"]["Source-File"]).name]
        attributes = record["attributes"]
        for index, is_fallback in enumerate(attributes["is_fallback"]):
            accepted, spent = expected_attempts(log[(doc_id, index + 1)])
            if is_fallback:
                fallbacks += 1
                assert (accepted, spent) == (None, MAX_PAGE_RETRIES), (doc_id, index + 1)
            else:
                assert attributes["accepted_attempt"][index] == accepted, (doc_id, index + 1)
                assert attributes["attempts"][index] == spent, (doc_id, index + 1)
    assert fallbacks >= 1 and manifest.counts()["fallback_pages"] == fallbacks
    assert_manifest_matches_outputs(manifest)


def stall_or_refuse(standin: StandinServer, mode: str, seconds: float | None) -> None:
    if mode == "stall":
        standin.stall_for(seconds)
    else:
        standin.refuse_for(seconds, drop_inflight=True)


def wait_for_requests(standin: StandinServer, count: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while len(standin.requests()) < count:
        assert time.monotonic() < deadline, "the run never reached the server"
        time.sleep(0.02)


@pytest.mark.slow
def test_stalled_server_mid_run_fails_the_task_as_retryable_and_the_retry_completes(
    tmp_path: Path, standin: StandinServer
) -> None:
    """Accepts connections, never answers: the Airflow path (plan, batch, parts, manifest)."""
    doc_ids = write_documents(tmp_path / "in", {21: 3, 22: 3, 23: 3, 24: 3})
    standin.configure(latency_s=0.2, capacity=2)
    settings = quick_settings(standin.url, read_timeout_s=1.0, outage_window_s=2.0, max_concurrent_requests=2)
    request = RunRequest(str(tmp_path / "in"), str(tmp_path / "out"), "stalled", settings=settings)
    storage = Storage()
    folder = request.run_folder(storage, "p1-stalled")
    (batch,) = plan_batches(request, storage, folder, BatchingRule(max_batches=1))
    sources = folder.read_batch(batch["batch"])
    outcome: list[BaseException] = []

    def attempt() -> None:
        try:
            convert_batch(request, storage, batch["batch"], sources, plan_id=folder.plan_id)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=attempt)
    worker.start()
    wait_for_requests(standin, 3)
    stalled_from = len(standin.requests())
    standin.stall_for(None)
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], ServerUnavailable), outcome
    # Detected by the outage window (2 s), not after every page's retry budget (30 s): each of the two
    # request slots sent at most window / read timeout + 2 requests into the stall, where spending
    # the budget would send one per read timeout and backoff for 30 s (over 20 each). A loaded
    # machine sends fewer in the same window, never more.
    assert "outage window 2 s" in str(outcome[0])
    assert len(standin.requests(since=stalled_from)) <= 2 * (2 / 1 + 2)

    out = tmp_path / "out"
    assert not list(Path(folder.uri).rglob("part.json")), "a failed batch must not report its documents"
    view = assert_reader_view_consistent(str(out), doc_ids=doc_ids)
    assert view.failed_markers == [] and view.manifests == {}
    assert all(record["metadata"]["total-fallback-pages"] == 0 for record in view.dolma.values())

    standin.resume()
    # Airflow's retry
    summary = convert_batch(request, storage, batch["batch"], sources, plan_id=folder.plan_id).summary
    assert summary["failed"] == 0 and summary["fallback_pages"] == 0
    published = publish_run(request, storage, folder, folder.read_plan())
    manifest = published.reader(storage)
    assert [doc.status for doc in manifest.documents].count("failed") == 0
    assert len(manifest.documents) == 4 and published.manifest.counts()["fallback_pages"] == 0
    assert_manifest_matches_outputs(manifest)
    view = assert_reader_view_consistent(str(out), doc_ids=doc_ids)
    assert len(view.dolma) == 4 and view.failed_markers == []


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["refuse", "stall"])
def test_outage_shorter_than_the_window_is_ridden_out_without_fallbacks(
    tmp_path: Path, standin: StandinServer, mode: str
) -> None:
    doc_ids = write_documents(tmp_path / "in", {31: 4, 32: 4, 33: 4})
    standin.configure(latency_s=0.1, capacity=2)
    settings = quick_settings(standin.url, read_timeout_s=1.0, outage_window_s=15.0, max_concurrent_requests=2)
    request = RunRequest(str(tmp_path / "in"), str(tmp_path / "out"), f"short-{mode}", settings=settings)
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(run_conversion(request, Storage())))
    worker.start()
    wait_for_requests(standin, 2)
    stall_or_refuse(standin, mode, 2.0)
    worker.join(timeout=90)
    assert not worker.is_alive() and result, "the run did not finish"
    manifest, uri = result[0]
    assert [doc.status for doc in manifest.documents] == ["converted"] * 3
    assert manifest.counts()["fallback_pages"] == 0
    assert json.loads(Path(uri).read_text())["counts"]["failed"] == 0
    view = assert_reader_view_consistent(str(tmp_path / "out"), doc_ids=doc_ids)
    assert len(view.dolma) == 3 and view.failed_markers == []
