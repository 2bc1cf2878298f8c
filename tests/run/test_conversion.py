"""The engine end to end: real PDFs, the real render pool, the vLLM stand-in over HTTP, real storage.

Every page's answer names the document and page the stand-in actually saw (decoded from the page
marker), so these tests prove that no page is lost, duplicated or attributed to the wrong place.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from olmocr_tasks.core.config import ConversionSettings, ServerSettings
from olmocr_tasks.core.errors import ServerNotReady, ServerUnavailable
from olmocr_tasks.location.manifest import DocumentEntry, Manifest
from olmocr_tasks.location.manifest_reader import ManifestReader
from olmocr_tasks.location.run_folders import RunFolder
from olmocr_tasks.run.pipeline import run_conversion
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.run.settings import RunSettings
from olmocr_tasks.storage.store import Storage
from olmocr_testkit import pdfgen
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.client import fast_server_settings
from tests.fixtures.plans import plan_held_whole

# Dead letters after two failed runs.
TWO_FAILURES = RunSettings(max_failed_attempts=2)
ANSWER = re.compile(r"Stand-in transcription of document (\d+) page (\d+)\.")


def fast_settings(url: str, **overrides: object) -> ConversionSettings:
    server = fast_server_settings(
        url,
        read_timeout_s=5.0,
        connect_timeout_s=2.0,
        request_retry_budget_s=6.0,
        backoff_initial_s=0.05,
        backoff_max_s=0.5,
        outage_window_s=3.0,
        readiness_timeout_s=3.0,
        max_concurrent_requests=8,
        adaptive_concurrency=True,
    )
    return ConversionSettings(server=server, **overrides)  # type: ignore[arg-type]


def run(tmp_path: Path, settings: ConversionSettings, run_id: str, **request: object) -> Manifest:
    manifest, uri = run_conversion(
        RunRequest(
            input_uri=str(tmp_path / "in"),
            output_uri=str(tmp_path / "out"),
            run_id=run_id,
            settings=settings,
            **request,  # type: ignore[arg-type]
        ),
        Storage(),
    )
    assert Path(uri).is_file() and json.loads(Path(uri).read_text())["run_id"] == run_id
    return manifest


def by_name(manifest: Manifest | ManifestReader) -> dict[str, object]:
    return {Path(doc.source).name: doc for doc in manifest.documents}


def page_answers(markdown: Path) -> list[tuple[int, int]]:
    return [(int(doc), int(page)) for doc, page in ANSWER.findall(markdown.read_text())]


def test_mixed_corpus_every_document_converted_or_failed_with_its_class(tmp_path: Path, standin: StandinServer) -> None:
    corpus = pdfgen.write_corpus(tmp_path / "in")
    manifest = run(tmp_path, fast_settings(standin.url), "mixed")

    docs = by_name(manifest)
    assert set(docs) == set(corpus)
    for name, expected in corpus.items():
        doc = docs[name]
        if expected.error_class:
            assert (doc.status, doc.error_class) == ("failed", expected.error_class), name
            assert doc.error and doc.outputs == {}
            continue
        assert doc.status == "converted", (name, doc.error)
        assert doc.pages == expected.pages and doc.fallback_pages == 0
        markdown = Path(doc.outputs["markdown"])
        # Each page's text names exactly that document and page, in page order.
        assert page_answers(markdown) == [(expected.doc_id, n) for n in range(1, expected.pages + 1)]
        [line] = Path(doc.outputs["dolma"]).read_text().splitlines()
        record = json.loads(line)
        assert record["text"] == markdown.read_text()
        assert record["metadata"]["Source-File"] == doc.source
        assert record["metadata"]["pdf-total-pages"] == expected.pages
        assert [span[2] for span in record["attributes"]["pdf_page_numbers"]] == list(range(1, expected.pages + 1))
    counts = manifest.counts()
    assert counts["converted"] == 5 and counts["failed"] == 6
    assert counts["pages"] == sum(entry.pages for entry in corpus.values() if not entry.error_class)


def test_rotated_pages_are_retried_upright_with_the_cumulative_correction(
    tmp_path: Path, standin: StandinServer
) -> None:
    pdfgen.write_pdf(tmp_path / "in" / "sideways.pdf", pdfgen.rotated_pdf(270, pages=2, doc_id=7))
    manifest = run(tmp_path, fast_settings(standin.url), "rotation")
    (doc,) = manifest.documents
    assert doc.status == "converted" and doc.accepted_attempt_histogram == {"2": 2}
    record = json.loads(Path(doc.outputs["dolma"]).read_text())
    assert record["attributes"]["is_rotation_valid"] == [True, True]
    log = standin.requests()
    first_attempts = [r for r in log if r["temperature"] == 0.1 and r["marker"]["rotation_correction"] == 270]
    upright_retries = [r for r in log if r["marker"]["rotation_correction"] == 0]
    assert len(first_attempts) == 2 and len(upright_retries) == 2


def test_scripted_faults_follow_olmocr_attempt_semantics(tmp_path: Path, standin: StandinServer) -> None:
    pdfgen.write_pdf(tmp_path / "in" / "doc.pdf", pdfgen.text_pdf(3, doc_id=4))
    standin.configure(scripts={"4:2": ["500", "length", "garbage", "invalid_rotation"]})
    manifest = run(tmp_path, fast_settings(standin.url), "faults")
    (doc,) = manifest.documents
    assert doc.status == "converted" and doc.fallback_pages == 0
    record = json.loads(Path(doc.outputs["dolma"]).read_text())
    # The 500 is retried by the client (same attempt); length, garbage and rotation 45 cost attempts 1-3.
    assert record["attributes"]["accepted_attempt"] == [1, 4, 1]
    temperatures = [r["temperature"] for r in standin.requests() if r["marker"]["page_number"] == 2]
    assert temperatures == [0.1, 0.1, 0.1, 0.2, 0.3]
    assert page_answers(Path(doc.outputs["markdown"])) == [(4, 1), (4, 2), (4, 3)]


def test_page_that_never_answers_validly_falls_back_and_trips_the_error_rate(
    tmp_path: Path, standin: StandinServer
) -> None:
    pdfgen.write_pdf(tmp_path / "in" / "doc.pdf", pdfgen.text_pdf(3, doc_id=5))
    standin.configure(always={"5:2": "garbage"})
    strict = run(tmp_path, fast_settings(standin.url), "strict")
    (doc,) = strict.documents
    assert (doc.status, doc.error_class) == ("failed", "error_rate_exceeded")
    assert doc.fallback_pages == 1 and doc.outputs == {}

    tolerant = run(tmp_path, fast_settings(standin.url, max_page_error_rate=0.5), "tolerant")
    (doc,) = tolerant.documents
    assert doc.status == "converted" and doc.fallback_pages == 1
    record = json.loads(Path(doc.outputs["dolma"]).read_text())
    assert record["attributes"]["is_fallback"] == [False, True, False]
    assert record["attributes"]["attempts"][1] == 8
    assert record["metadata"]["total-fallback-pages"] == 1
    # The fallback page is the PDF's own text layer.
    assert pdfgen.page_line(5, 2) in record["text"]


def test_outage_mid_run_aborts_without_fallbacks_and_a_later_run_completes(
    tmp_path: Path, standin: StandinServer
) -> None:
    for doc_id in (1, 2, 3):
        pdfgen.write_pdf(tmp_path / "in" / f"d{doc_id}.pdf", pdfgen.text_pdf(3, doc_id=doc_id))
    standin.configure(latency_s=0.3, capacity=2)
    settings = fast_settings(standin.url)
    request = RunRequest(
        input_uri=str(tmp_path / "in"), output_uri=str(tmp_path / "out"), run_id="down", settings=settings
    )
    outcome: list[BaseException] = []

    def convert() -> None:
        try:
            run_conversion(request, Storage())
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=convert)
    worker.start()
    deadline = time.monotonic() + 20
    while not standin.requests() and time.monotonic() < deadline:
        time.sleep(0.05)
    standin.refuse_for(None, drop_inflight=True)
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], ServerUnavailable)

    out = tmp_path / "out"
    assert not (out / "manifests").exists()
    assert not list(out.rglob("*.failed.*")), "an outage must not count as a document failure"
    for dolma in out.rglob("*.jsonl"):  # documents finished before the outage are complete and fallback-free
        assert json.loads(dolma.read_text())["metadata"]["total-fallback-pages"] == 0

    standin.resume()
    manifest = run(tmp_path, settings, "after-outage")
    assert manifest.already_converted + len(manifest.documents) == 3
    assert all(doc.status == "converted" for doc in manifest.documents)
    assert manifest.counts()["fallback_pages"] == 0


def test_server_down_at_start_is_reported_before_any_work(tmp_path: Path, standin: StandinServer) -> None:
    pdfgen.write_pdf(tmp_path / "in" / "d.pdf", pdfgen.text_pdf(1, doc_id=1))
    standin.refuse_for(None)
    settings = fast_settings(standin.url)
    request = RunRequest(
        input_uri=str(tmp_path / "in"), output_uri=str(tmp_path / "out"), run_id="x", settings=settings
    )
    with pytest.raises(ServerNotReady, match="not ready"):
        run_conversion(request, Storage())
    assert not (tmp_path / "out" / "_state").exists()


def test_idempotency_by_content_model_and_prompt(tmp_path: Path, standin: StandinServer) -> None:
    inbox = tmp_path / "in"
    pdfgen.write_pdf(inbox / "a.pdf", pdfgen.text_pdf(2, doc_id=1))
    settings = fast_settings(standin.url)
    first = run(tmp_path, settings, "r1")
    assert [d.status for d in first.documents] == ["converted"]

    again = run(tmp_path, settings, "r2")
    assert again.documents == [] and again.already_converted == 1

    shutil.copy(inbox / "a.pdf", inbox / "renamed copy.pdf")
    copied = run(tmp_path, settings, "r3")
    (dup,) = copied.documents
    assert (dup.status, dup.skip_reason) == ("skipped", "duplicate_content")
    assert dup.duplicate_of == str(inbox / "a.pdf") and dup.outputs == first.documents[0].outputs

    pdfgen.write_pdf(inbox / "a.pdf", pdfgen.text_pdf(3, doc_id=2))  # new content under the same name
    changed = run(tmp_path, settings, "r4")
    (doc,) = changed.documents
    assert doc.status == "converted" and doc.pages == 3
    assert page_answers(Path(doc.outputs["markdown"])) == [(2, 1), (2, 2), (2, 3)]

    requests_before = len(standin.requests())
    forced = run(tmp_path, settings, "r5", reprocess=True)
    assert sorted(d.status for d in forced.documents) == ["converted", "converted"]
    assert len(standin.requests()) - requests_before == 5

    other_model = fast_settings(standin.url)
    other_model = ConversionSettings(
        server=ServerSettings(**{**other_model.server.__dict__, "model": "other/model"}),
    )
    standin.configure(model="other/model")
    upgraded = run(tmp_path, other_model, "r6")  # a model upgrade converts everything again
    assert sorted(d.status for d in upgraded.documents) == ["converted", "converted"]


def test_identical_files_in_one_run_are_converted_once(tmp_path: Path, standin: StandinServer) -> None:
    data = pdfgen.text_pdf(2, doc_id=9)
    for name in ("one.pdf", "two.pdf", "nested/three.pdf"):
        pdfgen.write_pdf(tmp_path / "in" / name, data)
    manifest = run(tmp_path, fast_settings(standin.url), "dupes")
    statuses = sorted(doc.status for doc in manifest.documents)
    assert statuses == ["converted", "skipped", "skipped"]
    assert len(standin.requests()) == 2


def test_failed_documents_are_retried_by_later_runs_then_dead_lettered(tmp_path: Path, standin: StandinServer) -> None:
    pdfgen.write_pdf(tmp_path / "in" / "broken.pdf", pdfgen.truncated_pdf())
    pdfgen.write_pdf(tmp_path / "in" / "good.pdf", pdfgen.text_pdf(1, doc_id=3))
    settings = fast_settings(standin.url)
    for attempt in (1, 2):
        manifest = run(tmp_path, settings, f"try{attempt}", run_settings=TWO_FAILURES)
        broken = by_name(manifest)["broken.pdf"]
        assert broken.status == "failed" and broken.error_class == "corrupt" and broken.failed_attempts == attempt
    final = run(tmp_path, settings, "try3", run_settings=TWO_FAILURES)
    assert final.documents == []
    (dead,) = final.dead_letters
    assert dead.error_class == "dead_letter" and "corrupt" in (dead.error or "") and dead.failed_attempts == 2


def _totals_held_by_outputs(manifest: Manifest | ManifestReader) -> dict[str, int]:
    """Pages and tokens summed from the Dolma records the manifest's converted documents name."""
    totals = {"pages": 0, "input_tokens": 0, "output_tokens": 0}
    for doc in manifest.documents:
        if doc.status == "converted":
            metadata = json.loads(Path(doc.outputs["dolma"]).read_text())["metadata"]
            totals["pages"] += metadata["pdf-total-pages"]
            totals["input_tokens"] += metadata["total-input-tokens"]
            totals["output_tokens"] += metadata["total-output-tokens"]
    return totals


def test_a_batch_that_dies_part_way_reports_what_it_converted_and_its_retry_reports_everything(
    tmp_path: Path, standin: StandinServer
) -> None:
    from olmocr_tasks.run.batching import BatchingRule
    from olmocr_tasks.run.pipeline import convert_batch
    from olmocr_tasks.run.planning import plan_batches
    from olmocr_tasks.run.publishing import publish_run

    for doc_id in (1, 2):
        pdfgen.write_pdf(tmp_path / "in" / f"d{doc_id}.pdf", pdfgen.text_pdf(2, doc_id=doc_id))
    pdfgen.write_pdf(tmp_path / "in" / "d3.pdf", pdfgen.text_pdf(4, doc_id=3))
    # The last document's pages fail with 503 until the outage window closes: the batch aborts.
    standin.configure(always={f"3:{page}": "503" for page in range(1, 5)})
    request = RunRequest(
        input_uri=str(tmp_path / "in"), output_uri=str(tmp_path / "out"), run_id="retried",
        settings=fast_settings(standin.url, max_open_documents=1),
    )  # fmt: skip
    storage = Storage()
    folder = request.run_folder(storage, "p1-retried")
    (batch,) = plan_batches(request, storage, folder, BatchingRule(max_batches=1))
    sources = sorted(folder.read_batch(batch["batch"]), key=lambda source: source.uri)
    with pytest.raises(ServerUnavailable):
        convert_batch(request, storage, batch["batch"], sources, plan_id=folder.plan_id, try_number=1)
    # What publishing would read now: the two documents converted before the outage, nothing of d3.
    partial = folder.latest_report(batch["batch"])
    assert partial is not None
    assert {Path(doc.source).name: doc.status for doc in partial.entries} == {
        "d1.pdf": "converted",
        "d2.pdf": "converted",
    }

    standin.configure(always={f"3:{page}": None for page in range(1, 5)})
    # Airflow's retry of the same task.
    summary = convert_batch(request, storage, batch["batch"], sources, plan_id=folder.plan_id, try_number=2).summary
    published = publish_run(request, storage, folder, folder.read_plan())
    manifest = published.reader(storage)

    docs = by_name(manifest)
    assert {name: (doc.status, doc.pages) for name, doc in docs.items()} == {
        "d1.pdf": ("converted", 2),
        "d2.pdf": ("converted", 2),
        "d3.pdf": ("converted", 4),
    }
    # Converted by attempt 1, reported by attempt 2 with that attempt's identity and numbers.
    assert docs["d1.pdf"].attempts == 2 and docs["d1.pdf"].input_tokens > 0 and docs["d1.pdf"].outputs
    counts = published.manifest.counts()
    assert {key: counts[key] for key in ("pages", "input_tokens", "output_tokens")} == _totals_held_by_outputs(manifest)
    assert (summary["converted"], summary["pages"], summary["try_number"]) == (3, 8, 2)


def test_a_retry_tries_again_what_an_earlier_attempt_failed_and_keeps_what_it_converted(tmp_path: Path) -> None:
    """A failure recorded by an attempt that was then retried may come from what stopped the attempt
    (a render limit that ran out while its machine was frozen), so the retry converts it again."""
    folder = RunFolder(Storage(), str(tmp_path / "out"), "run", "p1-abc")
    converted = DocumentEntry(source="/in/a.pdf", status="converted", pages=3, task={"try_number": 1})
    frozen = DocumentEntry(source="/in/b.pdf", status="failed", error_class="error_rate_exceeded", error="render")
    first = folder.attempt("b0", 1)
    first.start()
    first.write_entry(converted)
    first.write_entry(frozen)
    first.write_part([converted, frozen])

    assert folder.attempt("b0", 2).start() == {"/in/a.pdf": converted}
    # Nor does a third attempt bring back what the first one failed.
    assert folder.attempt("b0", 3).start() == {"/in/a.pdf": converted}


def test_a_stale_attempt_cannot_change_what_a_newer_attempt_reports(tmp_path: Path) -> None:
    folder = RunFolder(Storage(), str(tmp_path / "out"), "run", "p1-abc")
    real = DocumentEntry(source="/in/a.pdf", status="converted", pages=3, task={"try_number": 1})
    first = folder.attempt("b0", 1)
    first.start()
    first.write_entry(real)
    second = folder.attempt("b0", 2)
    assert second.start() == {"/in/a.pdf": real}  # carried forward before the newer attempt converts
    # The first attempt's worker was thought dead but goes on: whatever it writes now is ignored.
    first.write_entry(DocumentEntry(source="/in/a.pdf", status="failed", error_class="internal_error"))
    first.write_entry(DocumentEntry(source="/in/b.pdf", status="failed", error_class="internal_error"))
    first.write_part([DocumentEntry(source="/in/a.pdf", status="skipped")])
    assert _reported(folder) == [real]
    second.write_part([real, DocumentEntry(source="/in/b.pdf", status="converted", pages=1)])
    assert {entry.source: entry.status for entry in _reported(folder)} == {
        "/in/a.pdf": "converted",
        "/in/b.pdf": "converted",
    }
    assert folder.next_try("b0") == 3
    # Another planning of the same run (a cleared DAG run) reads nothing of this one.
    assert _reported(RunFolder(Storage(), str(tmp_path / "out"), "run", "p2-def")) == []


def _reported(folder: RunFolder) -> list[DocumentEntry]:
    """Every entry publishing reads from the folder: the latest attempt's of each batch."""
    return [entry for report in folder.iter_reports() for entry in report.entries]


def test_the_cli_rerun_with_the_same_run_id_reports_the_whole_run(tmp_path: Path, standin: StandinServer) -> None:
    for doc_id in (1, 2):
        pdfgen.write_pdf(tmp_path / "in" / f"d{doc_id}.pdf", pdfgen.text_pdf(2, doc_id=doc_id))
    pdfgen.write_pdf(tmp_path / "in" / "d3.pdf", pdfgen.text_pdf(3, doc_id=3))
    standin.configure(always={f"3:{page}": "503" for page in range(1, 4)})
    settings = fast_settings(standin.url, max_open_documents=1)
    with pytest.raises(ServerUnavailable):  # the CLI exits 3 here
        run(tmp_path, settings, "nightly")
    assert not (tmp_path / "out" / "manifests").exists()

    standin.configure(always={f"3:{page}": None for page in range(1, 4)})
    manifest = run(tmp_path, settings, "nightly")
    assert {name: (doc.status, doc.pages) for name, doc in by_name(manifest).items()} == {
        "d1.pdf": ("converted", 2),
        "d2.pdf": ("converted", 2),
        "d3.pdf": ("converted", 3),
    }
    assert manifest.already_converted == 0
    counts = manifest.counts()
    assert {key: counts[key] for key in ("pages", "input_tokens", "output_tokens")} == _totals_held_by_outputs(manifest)

    # Once published, the same run id is a new run: everything is already converted.
    again = run(tmp_path, settings, "nightly")
    assert again.documents == [] and again.already_converted == 3


def _at(path: Path, moment: datetime) -> None:
    os.utime(path, (moment.timestamp(), moment.timestamp()))


def test_failures_outside_a_runs_window_are_re_driven_until_they_are_dead_letters(
    tmp_path: Path, standin: StandinServer
) -> None:
    from olmocr_tasks.run.planning import list_dead_letters

    hour = datetime(2026, 3, 1, 10, tzinfo=UTC)
    pdfgen.write_pdf(tmp_path / "in" / "broken.pdf", pdfgen.truncated_pdf())
    pdfgen.write_pdf(tmp_path / "in" / "good.pdf", pdfgen.text_pdf(1, doc_id=3))
    _at(tmp_path / "in" / "broken.pdf", hour + timedelta(minutes=5))
    _at(tmp_path / "in" / "good.pdf", hour + timedelta(minutes=10))
    settings = fast_settings(standin.url)

    def interval(number: int, run_id: str, **request: object) -> Manifest:
        start = hour + timedelta(hours=number)
        return run(tmp_path, settings, run_id, modified_after=start, modified_until=start + timedelta(hours=1),
                   run_settings=TWO_FAILURES, **request)  # fmt: skip

    first = interval(0, "h10")
    statuses = {name: doc.status for name, doc in by_name(first).items()}
    assert statuses == {"broken.pdf": "failed", "good.pdf": "converted"}
    # The next interval lists nothing of its own, and still tries the failed document again.
    second = interval(1, "h11")
    (again,) = second.documents
    assert (Path(again.source).name, again.error_class, again.failed_attempts) == ("broken.pdf", "corrupt", 2)
    # Now a dead letter: later runs leave it alone until someone takes it back.
    assert interval(2, "h12").documents == []
    key = RunRequest(str(tmp_path / "in"), str(tmp_path / "out"), "x", settings=settings).conversion_key
    (dead,) = list_dead_letters(str(tmp_path / "out"), Storage(), key, max_failed_attempts=2)
    assert Path(dead.source).name == "broken.pdf" and dead.failed_attempts == 2 and "corrupt" in (dead.error or "")
    taken_back = interval(3, "h13", retry_dead_letters=True)
    assert [(Path(doc.source).name, doc.failed_attempts) for doc in taken_back.documents] == [("broken.pdf", 3)]


def test_documents_whose_batch_never_reported_are_re_driven(tmp_path: Path) -> None:
    from olmocr_tasks.run.publishing import publish_run

    hour = datetime(2026, 3, 1, 10, tzinfo=UTC)
    pdfgen.write_pdf(tmp_path / "in" / "lost.pdf", pdfgen.text_pdf(1, doc_id=1))
    _at(tmp_path / "in" / "lost.pdf", hour + timedelta(minutes=5))
    storage = Storage()

    def request(number: int) -> RunRequest:
        start = hour + timedelta(hours=number)
        return RunRequest(str(tmp_path / "in"), str(tmp_path / "out"), f"h{number}",
                          modified_after=start, modified_until=start + timedelta(hours=1))  # fmt: skip

    plan = plan_held_whole(request(0), storage)
    published = publish_run(request(0), storage, request(0).run_folder(storage), plan)  # its batch never reported
    assert [doc.error_class for doc in published.reader(storage).documents] == ["not_converted"]
    assert published.not_converted == 1
    later = plan_held_whole(request(1), storage)
    assert [source.uri for source in later.sources] == [str(tmp_path / "in" / "lost.pdf")] and later.redriven == 1


def test_the_cli_lists_dead_letters_and_takes_them_back(
    tmp_path: Path, standin: StandinServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from olmocr_tasks.cli import EXIT_BUDGET_EXCEEDED, EXIT_OK, main

    pdfgen.write_pdf(tmp_path / "in" / "broken.pdf", pdfgen.truncated_pdf())
    inbox, out = str(tmp_path / "in"), str(tmp_path / "out")
    convert = ["convert", inbox, out, "--server", standin.url, "--model", standin.model, "--max-failed-attempts", "1"]
    assert main([*convert, "--run-id", "r1"]) == EXIT_BUDGET_EXCEEDED
    assert main([*convert, "--run-id", "r2"]) == EXIT_OK  # a dead letter now: listed in the manifest, not tried
    capsys.readouterr()
    assert main(["dead-letters", out, "--model", standin.model, "--max-failed-attempts", "1"]) == EXIT_OK
    (line,) = capsys.readouterr().out.splitlines()
    source, failures, error = line.split("\t")
    assert (source, failures) == (str(tmp_path / "in" / "broken.pdf"), "1") and "corrupt" in error
    requests = len(standin.requests())
    # Taken back, it fails again: a re-driven failure, listed but outside the error budget (as in Airflow).
    assert main([*convert, "--run-id", "r3", "--retry-dead-letters"]) == EXIT_OK
    assert "failed (re-driven):" in capsys.readouterr().out
    main(["dead-letters", out, "--model", standin.model, "--max-failed-attempts", "1"])
    assert capsys.readouterr().out.split("\t")[1] == "2"
    assert len(standin.requests()) == requests  # a corrupt PDF fails before any page request
