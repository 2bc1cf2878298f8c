"""Which runs re-drive earlier failures (issue 23) and one run at a time per document (issue 24).

Runs that name their documents plan exactly those; re-drive belongs to reconciliation runs and is
spaced by the retry interval; re-driven failures never turn a run red. Concurrent CLI runs (real
processes) claim each document before converting it, so together they send each page about once; a
run SIGKILLed mid-document leaves claims that a later run takes over once they expire.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from olmocr_tasks.core.config import ConversionSettings, ServerSettings
from olmocr_tasks.location.claims import Blocked, ClaimBook, ClaimHolder
from olmocr_tasks.location.layout import ConversionState
from olmocr_tasks.location.ledger import Ledger
from olmocr_tasks.run.pipeline import SINGLE_BATCH, convert_batch, run_conversion
from olmocr_tasks.run.publishing import publish_run
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.storage.store import Storage
from olmocr_testkit import pdfgen
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.cli_process import descendants, kill_and_reap, start_cli
from tests.fixtures.manifests import load_whole
from tests.fixtures.plans import plan_held_whole
from tests.fixtures.reader_view import assert_manifest_matches_outputs
from tests.task_context import RunTasks

FAST = ["--read-timeout", "5", "--outage-window", "5", "--ready-timeout", "5", "--target-longest-image-dim", "512"]
T0 = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


@pytest.fixture
def standin_conn(monkeypatch: pytest.MonkeyPatch, standin: StandinServer) -> StandinServer:
    extra = {"model": standin.model}
    monkeypatch.setenv(
        "AIRFLOW_CONN_OLMOCR_VLLM", json.dumps({"conn_type": "olmocr_vllm", "host": standin.url, "extra": extra})
    )
    return standin


def _manifest(path: str) -> dict[str, Any]:
    return load_whole(path)


def _docs(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {Path(doc["source"]).name: doc for doc in manifest["documents"]}


def test_a_documents_run_beside_a_recorded_failure_converts_exactly_its_document_and_succeeds(
    tmp_path: Path, standin_conn: StandinServer
) -> None:
    inbox, output = tmp_path / "inbox", tmp_path / "out"
    pdfgen.write_pdf(inbox / "good.pdf", pdfgen.text_pdf(1, doc_id=71))
    (inbox / "empty.pdf").write_bytes(b"")
    # Manual runs, each with its own interval: their run ids (and failure markers) differ.
    reconcile = RunTasks({"input_uri": str(inbox), "output_uri": str(output), "scope": "all"}, interval=(T0, T0 + HOUR))
    reconcile.plan()
    reconcile.convert_all()
    first = _docs(_manifest(reconcile.publish()["manifest"]))
    assert (first["good.pdf"]["status"], first["empty.pdf"]["error_class"]) == ("converted", "empty")

    pdfgen.write_pdf(inbox / "fresh.pdf", pdfgen.text_pdf(2, doc_id=72))
    sent_before = standin_conn.stats()["total"]
    named = RunTasks(
        {"input_uri": str(inbox), "output_uri": str(output), "documents": [str(inbox / "fresh.pdf")]},
        interval=(T0 + HOUR, T0 + 2 * HOUR),
    )
    named.plan()
    named.convert_all()
    summary = named.publish()
    manifest = _manifest(summary["manifest"])
    assert list(_docs(manifest)) == ["fresh.pdf"], "exactly the named document, no re-drive"
    assert _docs(manifest)["fresh.pdf"]["status"] == "converted"
    assert manifest["counts"]["redriven"] == 0
    assert summary["error_budget"] == {"max_document_error_rate": 0.05, "exceeded": False, "problems": []}
    assert standin_conn.stats()["total"] - sent_before == 2, "only fresh.pdf's two pages were requested"

    # The reconciliation path re-drives the failure; failing again does not turn that run red.
    again = RunTasks(
        {"input_uri": str(inbox), "output_uri": str(output), "scope": "all"}, interval=(T0 + 2 * HOUR, T0 + 3 * HOUR)
    )
    again.plan()
    again.convert_all()
    summary = again.publish()
    redriven = _manifest(summary["manifest"])
    assert _docs(redriven)["empty.pdf"]["redriven"] is True
    assert _docs(redriven)["empty.pdf"]["failed_attempts"] == 2
    assert redriven["counts"]["redriven"] == 1 and redriven["counts"]["redriven_failed"] == 1
    assert summary["error_budget"]["exceeded"] is False
    assert summary["error_budget"]["redriven"] == {"documents": 1, "failed": 1}
    page = _runs_page(output, redriven)
    assert "re-driven" in page and "1 (1 failed again; not in the error budget)" in page


def _runs_page(output: Path, manifest: dict[str, Any]) -> str:
    """The OCR runs page of one manifest, rendered by the plugin's app."""
    plugins = str(Path(__file__).resolve().parents[2] / "plugins")
    if plugins not in sys.path:
        sys.path.insert(0, plugins)
    from fastapi.testclient import TestClient
    from olmocr_runs import create_app
    from olmocr_runs.access import every_run

    client = TestClient(create_app(str(output), access=every_run))
    (listed,) = [run for run in client.get("/api/runs").json()["runs"] if run["run_id"] == manifest["run_id"]]
    return client.get(f"/runs/{quote(listed['key'])}").text


def test_a_document_claimed_by_a_live_run_is_left_for_later_and_shown_so(
    tmp_path: Path, standin: StandinServer
) -> None:
    inbox, output = tmp_path / "inbox", tmp_path / "out"
    for doc_id in (81, 82):
        pdfgen.write_pdf(inbox / f"doc{doc_id}.pdf", pdfgen.text_pdf(1, doc_id=doc_id))
    storage = Storage()
    request = _request(inbox, output, settings=_settings(standin))
    held = {info.uri: info for info in storage.list_objects(str(inbox))}[str(inbox / "doc81.pdf")]
    state = Ledger(str(output), storage, request.conversion_key).state
    other = ClaimBook(storage, state, ClaimHolder("other-run", "p", "b", 1, T0), 600).acquire(held)
    assert not isinstance(other, Blocked)

    manifest, _ = run_conversion(request, storage)
    docs = _docs(manifest.whole())
    assert docs["doc82.pdf"]["status"] == "converted"
    assert (docs["doc81.pdf"]["status"], docs["doc81.pdf"]["skip_reason"]) == ("skipped", "claimed")
    assert docs["doc81.pdf"]["claimed_by"] == "other-run"
    assert manifest.counts()["claimed"] == 1 and manifest.counts()["judged"] == 1
    assert Ledger(str(output), storage, request.conversion_key).status(held) == "new", "nothing recorded for it"
    page = _runs_page(output, manifest.whole())
    assert "claimed by run other-run" in page and "1 claimed by other runs" in page

    # Once the holder lets go, the next run converts it.
    other.release()
    again, _ = run_conversion(_request(inbox, output, settings=_settings(standin), run_id="again"), storage)
    assert {name: doc["status"] for name, doc in _docs(again.whole()).items()} == {"doc81.pdf": "converted"}


def test_an_attempt_whose_retry_has_started_records_nothing(tmp_path: Path, standin: StandinServer) -> None:
    """A frozen attempt that comes back after its retry started: fenced by the retry's start mark."""
    inbox, output = tmp_path / "inbox", tmp_path / "out"
    pdfgen.write_pdf(inbox / "doc83.pdf", pdfgen.text_pdf(1, doc_id=83))
    storage = Storage()
    request = _request(inbox, output, settings=_settings(standin))
    plan = plan_held_whole(request, storage)
    folder = request.run_folder(storage)
    folder.write_plan(plan)
    folder.attempt(SINGLE_BATCH, 2).start()  # the retry started while attempt 1 was frozen
    stale = convert_batch(request, storage, SINGLE_BATCH, plan.sources, plan_id=folder.plan_id, try_number=1)
    (entry,) = stale.entries
    assert (entry.status, entry.skip_reason, entry.claimed_by) == ("skipped", "claimed", "r")
    ledger = Ledger(str(output), storage, request.conversion_key)
    assert ledger.status(plan.sources[0].info) == "new" and not (output / "dolma").exists()
    # The retry itself converts it.
    retry = convert_batch(request, storage, SINGLE_BATCH, plan.sources, plan_id=folder.plan_id, try_number=2)
    assert [entry.status for entry in retry.entries] == ["converted"]


def _settings(standin: StandinServer) -> ConversionSettings:
    return ConversionSettings(server=ServerSettings(base_urls=(standin.url,), model=standin.model))


def _request(inbox: Path, output: Path, **changes: Any) -> RunRequest:
    return RunRequest(**{"input_uri": str(inbox), "output_uri": str(output), "run_id": "r", **changes})


def test_re_drive_waits_one_retry_interval_and_only_reconciliation_runs_reach_outside_their_window(
    tmp_path: Path,
) -> None:
    inbox, output = tmp_path / "inbox", tmp_path / "out"
    pdfgen.write_pdf(inbox / "flaky.pdf", pdfgen.text_pdf(1, doc_id=73))
    storage = Storage()
    base = _request(inbox, output)
    (info,) = list(storage.list_objects(str(inbox)))
    Ledger(str(output), storage, base.conversion_key).mark_failed(info, "corrupt", "boom", "scheduled-10", run_time=T0)
    window = {"modified_after": T0 + HOUR, "modified_until": T0 + 2 * HOUR}  # lists nothing

    def plan(**changes: Any) -> Any:
        return plan_held_whole(_request(inbox, output, retry_interval=HOUR, **changes), storage)

    # Within the interval: a run that lists it reports it as left for later; one that does not, nothing.
    early = plan(run_time=T0 + HOUR / 2)
    assert early.sources == [] and [entry.skip_reason for entry in early.left_for_later] == ["retry_later"]
    (later,) = early.left_for_later
    assert later.claimed_by == "scheduled-10" and later.retry_from == (T0 + HOUR).isoformat()
    published = publish_run(base, storage, base.run_folder(storage), early)
    assert published.manifest.counts()["retry_later"] == 1 and published.verdict["exceeded"] is False
    assert plan(run_time=T0 + HOUR / 2, **window).left_for_later == []

    # One interval later: a reconciliation run re-drives it although its window lists nothing ...
    due = plan(run_time=T0 + HOUR, **window)
    assert [(source.uri, source.redriven) for source in due.sources] == [(info.uri, True)] and due.redriven == 1
    # ... a backfill (no re-drive) does not reach outside its window ...
    assert plan(run_time=T0 + HOUR, redrive=False, **window).sources == []
    # ... and a run naming a document converts exactly that one, not as a re-drive, at any time.
    named = plan(run_time=T0 + HOUR / 2, documents=(info.uri,), redrive=False)
    assert [(source.uri, source.redriven) for source in named.sources] == [(info.uri, False)]


def _cli(tmp_path: Path, standin: StandinServer, run_id: str, *extra: str) -> Any:
    return start_cli(
        "convert", str(tmp_path / "in"), str(tmp_path / "out"), "--server", standin.url, "--run-id", run_id,
        "--max-concurrent-requests", "4", *FAST, *extra, log=tmp_path / f"{run_id}.log",
    )  # fmt: skip


def test_two_concurrent_cli_runs_send_each_page_about_once_and_convert_each_document_once(
    tmp_path: Path, standin: StandinServer
) -> None:
    pages = {doc_id: 3 for doc_id in range(130, 142)}
    for doc_id, count in pages.items():
        pdfgen.write_pdf(tmp_path / "in" / f"doc{doc_id}.pdf", pdfgen.text_pdf(count, doc_id=doc_id))
    # Every page's first request is held until both runs hold claims, so they overlap whatever the load
    # (a run started after the other finished would meet no claim at all); the read timeout outlasts
    # the hold, so holding costs no retry.
    held = {f"{doc_id}:{page}": ["slow"] for doc_id, count in pages.items() for page in range(1, count + 1)}
    standin.configure(latency_s=0.2, capacity=8, scripts=held, slow_s=3600)
    processes = {run_id: _cli(tmp_path, standin, run_id, "--read-timeout", "600") for run_id in ("left", "right")}
    try:
        deadline = time.monotonic() + 120
        while {json.loads(path.read_text())["run_id"] for path in (tmp_path / "out").rglob("*.claim")} != set(
            processes
        ):
            assert time.monotonic() < deadline, "both runs never held claims at once"
            assert all(process.poll() is None for process in processes.values()), "a run ended before the other began"
            time.sleep(0.05)
    finally:
        standin.configure(slow_s=0)
    for run_id, process in processes.items():
        assert process.wait(timeout=180) == 0, (tmp_path / f"{run_id}.log").read_text()
    total_pages = sum(pages.values())
    sent = standin.stats()["total"]
    assert sent <= 1.05 * total_pages, f"{sent} page requests for {total_pages} pages"
    converted: dict[str, list[str]] = {}
    manifests = {run_id: load_whole(str(tmp_path / "out" / "manifests" / f"{run_id}.json")) for run_id in processes}
    # The runs overlapped, by their own records: each started before the other finished.
    started = max(manifest["started_at"] for manifest in manifests.values())
    finished = min(manifest["finished_at"] for manifest in manifests.values())
    assert started < finished, {run_id: (m["started_at"], m["finished_at"]) for run_id, m in manifests.items()}
    claimed = [
        doc for manifest in manifests.values() for doc in manifest["documents"] if doc.get("skip_reason") == "claimed"
    ]
    assert claimed, "neither run met a document the other held"
    for run_id, manifest in manifests.items():
        assert manifest["counts"]["failed"] == 0
        assert manifest["counts"]["already_converted"] + len(manifest["documents"]) == len(pages)
        assert_manifest_matches_outputs(manifest)
        for doc in manifest["documents"]:
            if doc["status"] == "converted":
                converted.setdefault(Path(doc["source"]).name, []).append(run_id)
            elif doc["skip_reason"] == "claimed":
                assert doc["claimed_by"] in set(processes) - {run_id}, doc
            else:
                assert doc["skip_reason"] == "already_converted", doc
    assert {name: len(runs) for name, runs in converted.items()} == {f"doc{doc_id}.pdf": 1 for doc_id in pages}
    assert not list((tmp_path / "out").rglob("*.claim*")), "finished runs leave no claims behind"


@pytest.mark.slow
def test_a_run_killed_mid_document_leaves_claims_a_later_run_takes_over_after_expiry(
    tmp_path: Path, standin: StandinServer
) -> None:
    for doc_id in (151, 152, 153):
        pdfgen.write_pdf(tmp_path / "in" / f"doc{doc_id}.pdf", pdfgen.text_pdf(6, doc_id=doc_id))
    standin.configure(latency_s=0.5, capacity=4)
    expiry = "4"
    process = _cli(tmp_path, standin, "killed", "--claim-expiry", expiry)
    deadline = time.monotonic() + 120
    while standin.stats()["total"] < 6:
        assert time.monotonic() < deadline and process.poll() is None, (tmp_path / "killed.log").read_text()
        time.sleep(0.02)
    children = descendants(process.pid)
    assert kill_and_reap(process, children) == [] and process.returncode == -9

    claims = sorted((tmp_path / "out").rglob("*.claim"))
    assert claims, "the killed run held claims"
    records = [json.loads(path.read_text()) for path in claims]
    assert {record["run_id"] for record in records} == {"killed"}
    # While they are live, another run is turned away from those documents.
    storage = Storage()
    state = ConversionState(str(claims[0].parent.parent.parent))
    book = ClaimBook(storage, state, ClaimHolder("probe", "p", "b", 1, datetime.now(UTC)), float(expiry))
    infos = {info.uri: info for info in storage.list_objects(str(tmp_path / "in"))}
    held = [book.acquire(info) for info in infos.values()]
    assert any(isinstance(result, Blocked) and result.record.run_id == "killed" for result in held)
    for result in held:
        if not isinstance(result, Blocked):
            result.release()
    # Wait for the expiry the records state (the short setting, not the default), then run again.
    expires = max(datetime.fromisoformat(record["expires_at"]) for record in records)
    time.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.2)
    later = _cli(tmp_path, standin, "later", "--claim-expiry", expiry)
    assert later.wait(timeout=180) == 0, (tmp_path / "later.log").read_text()
    manifest = load_whole(str(tmp_path / "out" / "manifests" / "later.json"))
    assert {doc["status"] for doc in manifest["documents"]} == {"converted"}
    assert len(manifest["documents"]) == 3
    assert not list((tmp_path / "out").rglob("*.claim")), "the killed run's claims are released with the outcomes"
    # What stays are the take-overs, expired: each fences the killed run, should it ever come back.
    left = [json.loads(path.read_text()) for path in (tmp_path / "out").rglob("*.claim.after-*")]
    assert {record["run_id"] for record in left} == {"later"}
    assert all(datetime.fromisoformat(record["expires_at"]) <= datetime.now(UTC) for record in left)
