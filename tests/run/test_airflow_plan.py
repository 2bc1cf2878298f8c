"""The Airflow plan streams: discovery's sources go to the run folder in slices, are packed from those
slices into the same batches a plan held whole would get, and publish like any plan, every planned
document once, whether its batch reported or not."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from olmocr_tasks.core.config import ConversionSettings, ServerSettings
from olmocr_tasks.location.run_folders import RunFolder
from olmocr_tasks.run.batching import BatchingRule, pack_batches
from olmocr_tasks.run.pipeline import convert_batch
from olmocr_tasks.run.planning import batch_label, plan_batches
from olmocr_tasks.run.publishing import publish_run
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.storage.store import Storage
from olmocr_testkit import pdfgen
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.live_sources import LiveSourcesStorage
from tests.fixtures.plans import plan_held_whole
from tests.fixtures.reader_view import quick_settings

PAGE = 1000  # bytes per estimated page in these tests


def _request(tmp_path: Path, settings: ConversionSettings | None = None, run_id: str = "airflow") -> RunRequest:
    settings = settings or ConversionSettings(server=ServerSettings(base_urls=("http://127.0.0.1:9",), model="m"))
    return RunRequest(str(tmp_path / "in"), str(tmp_path / "out"), run_id, settings=settings)


def _sized_inbox(inbox: Path, *pages: int) -> None:
    """Files whose sizes estimate ``pages`` pages each (discovery reads names and sizes only)."""
    inbox.mkdir(parents=True, exist_ok=True)
    for index, count in enumerate(pages):
        (inbox / f"d{index:03d}.pdf").write_bytes(b"%" * (count * PAGE))


def _batches(folder: RunFolder, descriptors: list[dict[str, Any]]) -> list[list[str]]:
    return [[source.uri for source in folder.read_batch(batch["batch"])] for batch in descriptors]


def _plan_file(tmp_path: Path, run_id: str, plan_id: str) -> dict[str, Any]:
    return json.loads((tmp_path / "out" / "_runs" / run_id / plan_id / "plan.json").read_text())


def test_the_streamed_plan_packs_the_batches_a_plan_held_whole_gets(tmp_path: Path) -> None:
    """Big documents alone, small ones packed, max_batches forcing the target to double: the batches
    packed from slices of 4 are those of the whole list, and only they stay in the run folder."""
    _sized_inbox(tmp_path / "in", *([1, 3] * 20), 90, 40, *([2] * 30), 70, 1)
    request, storage = _request(tmp_path), Storage()
    rule = BatchingRule(min_pages=4, parallel=4, max_batches=12, bytes_per_page=PAGE, max_documents=8)
    sources = plan_held_whole(request, storage).sources
    expected = pack_batches(sources, rule)
    assert len(pack_batches(sources, replace(rule, max_batches=1024))) > rule.max_batches  # the target doubled
    folder = request.run_folder(storage, "p1-abc")

    descriptors = plan_batches(request, storage, folder, rule, slice_documents=4)

    assert _batches(folder, descriptors) == [[source.uri for source in batch] for batch in expected]
    assert 1 < len(descriptors) <= rule.max_batches
    assert [batch["batch"] for batch in descriptors] == [f"b{index:05d}" for index in range(len(descriptors))]
    assert [(batch["label"], batch["documents"], batch["pages"]) for batch in descriptors] == [
        (batch_label(batch, request.input_uri), len(batch), sum(rule.estimated_pages(s) for s in batch))
        for batch in expected
    ]
    plan = _plan_file(tmp_path, "airflow", "p1-abc")
    assert plan["sources"] == [] and plan["planned"] == 74
    assert plan["batch_keys"] == [batch["batch"] for batch in descriptors]
    # The slices are gone: each source is kept once, in its batch.
    assert not [info.uri for info in storage.list_objects(folder.uri + "/") if "/slices/" in info.uri]


def test_an_empty_run_plans_one_empty_batch(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    request, storage = _request(tmp_path), Storage()
    folder = request.run_folder(storage, "p1-abc")
    (batch,) = plan_batches(request, storage, folder, BatchingRule())
    assert (batch["documents"], batch["label"], folder.read_batch(batch["batch"])) == (0, "nothing to convert", [])
    assert _plan_file(tmp_path, "airflow", "p1-abc")["batch_keys"] == ["b00000"]


def test_a_streamed_plan_publishes_every_planned_document_once(tmp_path: Path, standin: StandinServer) -> None:
    """A cleared run plans again with fewer batches than its first pass: the padding batches are
    no-ops, a batch that never reported has its documents recorded as not converted (and re-driven by
    the next run), and every other planned document is converted and listed once."""
    for doc_id in range(7):
        pdfgen.write_pdf(tmp_path / "in" / f"d{doc_id}.pdf", pdfgen.text_pdf(1, doc_id=doc_id))
    request, storage = _request(tmp_path, quick_settings(standin.url)), Storage()
    one_each = BatchingRule(min_pages=1, parallel=8)
    assert len(plan_batches(request, storage, request.run_folder(storage, "p1-first"), one_each)) == 7
    folder = request.run_folder(storage, "p2-again")

    descriptors = plan_batches(request, storage, folder, BatchingRule(min_pages=4, parallel=2), slice_documents=2)

    assert [batch["documents"] for batch in descriptors] == [3, 4, 0, 0, 0, 0, 0]  # padded to the first pass
    plan = folder.read_plan()
    assert plan.sources == [] and plan.planned == 7
    never_reported = folder.read_batch(descriptors[1]["batch"])
    for batch in descriptors[:1] + descriptors[2:]:
        convert_batch(
            request, storage, batch["batch"], folder.read_batch(batch["batch"]), plan_id=folder.plan_id, try_number=1
        )

    published = publish_run(request, storage, folder, plan)

    documents = list(published.reader(storage).iter_documents())
    assert sorted(Path(doc["source"]).name for doc in documents) == [f"d{doc_id}.pdf" for doc_id in range(7)]
    lost = {doc["source"] for doc in documents if doc["error_class"] == "not_converted"}
    assert lost == {source.uri for source in never_reported} and published.not_converted == 4
    assert published.manifest.counts()["converted"] == 3
    later = plan_held_whole(_request(tmp_path, quick_settings(standin.url), run_id="later"), storage)
    assert {source.uri for source in later.sources} == lost and later.redriven == 4


def test_a_plan_held_whole_still_publishes(tmp_path: Path, standin: StandinServer) -> None:
    """A plan written before the Airflow plan streamed (its sources in plan.json, packed batches beside
    it) publishes its documents once each, an unreported batch's as not converted."""
    for doc_id in range(5):
        pdfgen.write_pdf(tmp_path / "in" / f"d{doc_id}.pdf", pdfgen.text_pdf(1, doc_id=doc_id))
    request, storage = _request(tmp_path, quick_settings(standin.url)), Storage()
    folder = request.run_folder(storage, "p1-old")
    plan = plan_held_whole(request, storage)
    folder.write_plan(plan)
    batches = pack_batches(plan.sources, BatchingRule(min_pages=4, parallel=2))
    assert [len(batch) for batch in batches] == [2, 3]
    for index, batch in enumerate(batches):
        folder.write_batch(f"b{index:05d}", batch)
    convert_batch(request, storage, "b00000", folder.read_batch("b00000"), plan_id=folder.plan_id, try_number=1)

    published = publish_run(request, storage, folder, folder.read_plan())

    documents = list(published.reader(storage).iter_documents())
    assert sorted(Path(doc["source"]).name for doc in documents) == [f"d{doc_id}.pdf" for doc_id in range(5)]
    assert [doc["status"] for doc in documents] == ["converted"] * 2 + ["failed"] * 3
    assert published.not_converted == 3


def test_the_airflow_plan_and_its_publish_never_hold_the_whole_run(tmp_path: Path) -> None:
    """60 documents planned in slices of 5 into batches of 2: no write of the plan (slices, batches,
    plan) happens while more than a slice and three batches' documents are alive (the batch being
    handed to a writer, which holds its bytes only, the pack the end-of-run remainder may join and the
    one being cut), nor any write
    of its publish (shards, the ledger's marks of the documents no batch reported, summary) while more
    than one batch's are."""
    _sized_inbox(tmp_path / "in", *([1] * 60))
    request = _request(tmp_path)
    rule = BatchingRule(min_pages=64, parallel=4, bytes_per_page=PAGE, max_documents=2)
    LiveSourcesStorage.reset()
    storage = LiveSourcesStorage()
    folder = request.run_folder(storage, "p1-abc")

    descriptors = plan_batches(request, storage, folder, rule, slice_documents=5)

    assert [batch["documents"] for batch in descriptors] == [2] * 30
    assert 0 < LiveSourcesStorage.most_live_sources <= 5 + 3 * 2
    LiveSourcesStorage.reset()
    published = publish_run(request, storage, folder, folder.read_plan(), shard_entries=10)
    assert published.not_converted == 60 and published.manifest.counts()["documents"] == 60
    assert 0 < LiveSourcesStorage.most_live_sources <= 2
