"""Document text/span assembly (olmOCR's rules) and the manifest's derived counts and metrics."""

from __future__ import annotations

import json
import random
import statistics
from array import array
from collections.abc import Callable
from pathlib import Path

import pytest

from olmocr_tasks.location import manifest as manifest_module
from olmocr_tasks.location.layout import safe_run_id
from olmocr_tasks.location.manifest import DocumentEntry, Manifest, exact_percentiles, manifest_uri
from olmocr_tasks.location.manifest_overview import histogram_bins
from olmocr_tasks.page.protocol import PageResponse
from olmocr_tasks.page.results import DocumentResult, PageResult
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.manifests import manifest_schema, validated_manifest


def _page(number: int, text: str | None, *, fallback: bool = False) -> PageResult:
    if fallback:
        return PageResult.fallback(number, text, attempts=8, latency_s=0.0, reason="exhausted")
    response = PageResponse("en", True, 0, False, False, text)
    return PageResult.from_response(
        number,
        response,
        input_tokens=100,
        output_tokens=10,
        attempts=1,
        accepted_attempt=1,
        latency_s=0.5,
        server_input_tokens=100,
        server_output_tokens=10,
    )


def test_text_joins_pages_with_newlines_except_after_the_last_and_none_pages_add_nothing() -> None:
    doc = DocumentResult("s3://b/x.pdf", 10, "ab", [_page(1, "one"), _page(2, None), _page(3, "three")])
    assert doc.text == "one\nthree"
    assert doc.page_spans() == [[0, 4, 1], [4, 4, 2], [4, 9, 3]]
    for start, end, number in doc.page_spans():
        page_text = doc.pages[number - 1].text
        assert doc.text[start:end].rstrip("\n") == (page_text or "")


def test_fallback_page_carries_olmocr_defaults_and_no_tokens() -> None:
    page = _page(4, "raw text layer", fallback=True)
    assert page.is_fallback and page.accepted_attempt is None
    assert (page.primary_language, page.is_rotation_valid, page.rotation_correction) == (None, True, 0)
    assert (page.input_tokens, page.output_tokens) == (0, 0)
    doc = DocumentResult("a.pdf", 1, "x", [_page(1, "a"), page])
    assert doc.fallback_pages == 1 and doc.input_tokens == 100 and doc.attempts == 9


def _manifest(**extra: object) -> Manifest:
    converted = DocumentEntry(
        source="s3://b/a.pdf",
        status="converted",
        pages=4,
        fallback_pages=1,
        input_tokens=400,
        output_tokens=40,
        attempts=5,
        page_latencies_s=[0.1, 0.2, 0.3],
        accepted_attempt_histogram={"1": 2, "2": 1, "fallback": 1},
    )
    failed = DocumentEntry(source="s3://b/bad.pdf", status="failed", error_class="corrupt", error="truncated")
    skipped = DocumentEntry(source="s3://b/copy.pdf", status="skipped", skip_reason="duplicate_content")
    return Manifest(
        run_id="scheduled__2026-11-30T10:00:00+00:00",
        started_at="2026-11-30T10:00:00.000Z",
        finished_at="2026-11-30T10:00:10.000Z",
        server={"base_urls": ["http://vllm:8000/v1"]},
        model="m",
        prompt_version="p",
        package_version="0.1.0",
        settings={},
        input_uri="s3://b/",
        output_uri="s3://out/x",
        documents=[converted, failed, skipped],
        **extra,
    )


def test_counts_and_metrics_are_derived_from_documents() -> None:
    manifest = _manifest(already_converted=7, gpu_hour_price=3.6)
    counts = manifest.counts()
    assert counts["converted"] == 1 and counts["failed"] == 1 and counts["skipped"] == 1
    assert counts["pages"] == 4 and counts["fallback_pages"] == 1 and counts["already_converted"] == 7
    metrics = manifest.metrics()
    assert metrics["elapsed_s"] == 10.0 and metrics["pages_per_second"] == 0.4
    assert metrics["fallback_rate"] == 0.25
    assert metrics["latency_p50_s"] == 0.2
    assert metrics["accepted_attempt_histogram"] == {"1": 2, "2": 1, "fallback": 1}
    assert metrics["cost"]["estimated_cost"] == 0.01  # 10 s at 3.6 per hour


def test_manifest_round_trips_through_json() -> None:
    manifest = _manifest()
    data = json.loads(manifest.to_json())
    assert data["schema_version"] == 3 and data["counts"]["documents"] == 3
    assert data["error_classes"] == {"corrupt": 1}
    again = Manifest.from_dict(data)
    assert again.to_dict() == manifest.to_dict()


def test_run_ids_become_safe_object_names() -> None:
    assert safe_run_id("scheduled__2026-11-30T10:00:00+00:00") == "scheduled__2026-11-30T10_00_00+00_00"
    assert safe_run_id("../../etc/passwd") == "etc_passwd"
    assert manifest_uri("s3://out/x/", "manual__1") == "s3://out/x/manifests/manual__1.json"


def test_manifest_validates_against_the_published_schema() -> None:
    import jsonschema

    schema = manifest_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    data = json.loads(_manifest(gpu_hour_price=2.5).to_json())
    jsonschema.validate(data, schema)
    data["documents"][0]["status"] = "done"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(data, schema)


def test_entry_and_dolma_record_share_one_set_of_totals() -> None:
    from olmocr_tasks.location.outputs import dolma_record

    retried = PageResult.from_response(
        2,
        PageResponse("en", True, 0, False, False, "two"),
        input_tokens=120,
        output_tokens=12,
        attempts=3,
        accepted_attempt=3,
        latency_s=0.25,
        server_input_tokens=360,
        server_output_tokens=36,
    )
    result = DocumentResult("s3://b/x.pdf", 10, "ab" * 32, [_page(1, "one"), retried, _page(3, "x", fallback=True)])
    entry = DocumentEntry(source=result.source, status="converted")
    entry.record_totals(result.totals)
    metadata = dolma_record(result, model="m", prompt_version="p", package_version="v")["metadata"]
    assert (entry.pages, metadata["pdf-total-pages"]) == (3, 3)
    assert entry.fallback_pages == metadata["total-fallback-pages"] == 1
    assert entry.input_tokens == metadata["total-input-tokens"] == 220
    assert entry.output_tokens == metadata["total-output-tokens"] == 22
    assert entry.attempts == metadata["total-attempts"] == 12
    assert entry.server_input_tokens == metadata["server-input-tokens"] == 460
    assert entry.server_output_tokens == metadata["server-output-tokens"] == 46
    assert entry.accepted_attempt_histogram == {"1": 1, "3": 1, "fallback": 1}
    assert entry.page_latencies_s == [0.5, 0.25]


def test_a_batch_summary_and_the_manifest_count_entries_the_same_way() -> None:
    from olmocr_tasks.location.manifest import count_entries

    manifest = _manifest(already_converted=2)
    lost = DocumentEntry(source="s3://b/lost.pdf", status="failed", error_class="not_converted", pages=3)
    manifest.documents.append(lost)
    counts = manifest.counts()
    assert {key: counts[key] for key in count_entries([])} == count_entries(manifest.documents)
    # Pages of documents that did not convert are not in the outputs, so not in the totals.
    assert counts["pages"] == 4 and counts["not_converted"] == 1 and counts["failed"] == 2


def test_a_page_rescued_by_its_hedge_is_counted_in_the_published_manifest(
    tmp_path: Path, standin_factory: Callable[..., StandinServer]
) -> None:

    from olmocr_tasks.core.config import ConversionSettings, ServerSettings
    from olmocr_tasks.run.pipeline import run_conversion
    from olmocr_tasks.run.request import RunRequest
    from olmocr_tasks.storage.store import Storage
    from olmocr_testkit import pdfgen

    # The last page's first request is accepted and never answered; the other pages give the client
    # the latency history a hedge needs. The read timeout is far away, so only a hedge rescues it.
    server = standin_factory(scripts={"1:25": ["hang"]}, latency_s=0.02)
    pdfgen.write_pdf(tmp_path / "in" / "long.pdf", pdfgen.text_pdf(25, doc_id=1))
    pdfgen.write_pdf(tmp_path / "in" / "short.pdf", pdfgen.text_pdf(1, doc_id=2))
    settings = ConversionSettings(
        server=ServerSettings(
            base_urls=(server.url,),
            read_timeout_s=60.0,
            request_retry_budget_s=90.0,
            outage_window_s=90.0,
            readiness_timeout_s=5.0,
            max_concurrent_requests=8,
            hedge_min_delay_s=0.2,
            hedge_multiple=3.0,
        )
    )
    request = RunRequest(str(tmp_path / "in"), str(tmp_path / "out"), run_id="hedged", settings=settings)
    _, uri = run_conversion(request, Storage())

    published = validated_manifest(uri)
    entries = {Path(doc["source"]).name: doc for doc in published["documents"]}
    assert entries["long.pdf"]["status"] == "converted" and entries["long.pdf"]["fallback_pages"] == 0
    # Every request beyond one per page was a hedge (nothing else failed): the manifest counts exactly
    # those the server received. On a loaded machine other pages may pass the 0.2 s floor too.
    requests = server.requests()
    sent = {doc_id: sum(1 for r in requests if (r["marker"] or {}).get("doc_id") == doc_id) for doc_id in (1, 2)}
    assert entries["long.pdf"]["hedged"] == sent[1] - 25 >= 1
    assert entries["short.pdf"]["hedged"] == sent[2] - 1
    # A hedge is not a page attempt: every page was accepted on its first attempt.
    assert entries["long.pdf"]["attempts"] == 25
    assert published["counts"]["hedged"] == sent[1] - 25 + sent[2] - 1
    last_page = {"doc_id": 1, "page_number": 25}
    outcomes = [r["outcome"] for r in requests if (r["marker"] or {}).items() >= last_page.items()]
    assert outcomes[0] == "hang" and "ok" in outcomes, outcomes
    summary = json.loads(Path(uri).read_text())
    assert Manifest.from_dict(summary).counts() == published["counts"]
    assert Manifest.from_dict(summary).to_dict() == summary


def test_an_output_collision_failure_is_recorded_in_a_manifest_that_validates(
    tmp_path: Path, standin: StandinServer
) -> None:
    import hashlib

    from olmocr_tasks.core.config import ConversionSettings, ServerSettings
    from olmocr_tasks.location.layout import OutputLocation
    from olmocr_tasks.run.pipeline import run_conversion
    from olmocr_tasks.run.request import RunRequest
    from olmocr_tasks.storage.store import Storage
    from olmocr_testkit import pdfgen

    source = pdfgen.write_pdf(tmp_path / "in" / "taken.pdf", pdfgen.text_pdf(1, doc_id=1))
    pdfgen.write_pdf(tmp_path / "in" / "free.pdf", pdfgen.text_pdf(1, doc_id=2))
    # Both names taken.pdf may be written under already belong to other sources' outputs.
    digest = hashlib.sha1(str(source).encode()).hexdigest()[:10]
    for stem in ("taken", f"taken~{digest}"):
        record = Path(OutputLocation(str(tmp_path / "out")).owner_record(stem))
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"stem": stem, "source": f"s3://elsewhere/{stem}.pdf"}))
    settings = ConversionSettings(server=ServerSettings(base_urls=(standin.url,), readiness_timeout_s=5.0))
    request = RunRequest(str(tmp_path / "in"), str(tmp_path / "out"), run_id="collision", settings=settings)
    _, uri = run_conversion(request, Storage())

    published = validated_manifest(uri)
    entries = {Path(doc["source"]).name: doc for doc in published["documents"]}
    assert entries["taken.pdf"]["status"] == "failed"
    assert entries["taken.pdf"]["error_class"] == "output_collision"
    assert "s3://elsewhere/taken.pdf" in entries["taken.pdf"]["error"]
    assert entries["free.pdf"]["status"] == "converted"
    assert not (tmp_path / "out" / "markdown" / "taken.md").exists()


@pytest.mark.parametrize("chunk", [3, 65_536])
def test_latency_percentiles_are_exact_from_the_array_merged_in_sorted_chunks(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The percentiles a publish folds from its 8-byte latency array, sorted in place a chunk at a time, are
    statistics.quantiles' inclusive cuts (ties, two values, one, none), and the histogram reads the
    array in place the same as a list."""
    monkeypatch.setattr(manifest_module, "_SORT_CHUNK", chunk)
    rng = random.Random(7)
    for count in (0, 1, 2, 3, 10, 101, 1000):
        values = [rng.choice([rng.uniform(0.1, 30.0), float(rng.randint(1, 4))]) for _ in range(count)]
        if count > 1:
            cuts = statistics.quantiles(values, n=100, method="inclusive")
            expected = [round(cuts[49], 4), round(cuts[94], 4)]
        else:
            expected = [round(values[0], 4) if values else None] * 2
        latencies = array("d", values)
        assert exact_percentiles(latencies, (50, 95)) == expected
        # Sorted in place by chunks, not changed: asked again, the same answer.
        assert sorted(latencies) == sorted(values) and exact_percentiles(latencies, (50, 95)) == expected
        assert histogram_bins(array("d", values)) == histogram_bins(values)
