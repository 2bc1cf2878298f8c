"""The CLI converts a big run slice by slice: one batch of the run folder per slice, one manifest for all."""

from __future__ import annotations

import json
from pathlib import Path

from olmocr_tasks.core.config import ConversionSettings, ServerSettings
from olmocr_tasks.location.manifest import DocumentEntry
from olmocr_tasks.run.pipeline import cli_batch_key, convert_batch, run_conversion
from olmocr_tasks.run.planning import stream_plan
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.storage.store import Storage
from olmocr_testkit import pdfgen
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.live_sources import LiveSourcesStorage
from tests.fixtures.plans import plan_held_whole


def _request(inbox: Path, output: Path, standin: StandinServer) -> RunRequest:
    settings = ConversionSettings(server=ServerSettings(base_urls=(standin.url,), model=standin.model))
    return RunRequest(input_uri=str(inbox), output_uri=str(output), run_id="sliced", settings=settings)


def _write_inbox(inbox: Path, documents: int) -> None:
    for doc_id in range(documents):
        pdfgen.write_pdf(inbox / f"doc{doc_id:02d}.pdf", pdfgen.text_pdf(1, doc_id=doc_id))


def _part_sizes(output: Path) -> dict[str, int]:
    """batch key → entries in its latest part."""
    sizes = {}
    for part in sorted((output / "_runs" / "sliced" / "plan" / "attempts").glob("*/try-*/part.json")):
        sizes[part.parents[1].name] = len(json.loads(part.read_text())["entries"])
    return sizes


def test_a_run_is_converted_in_slices_and_published_as_one_manifest(tmp_path: Path, standin: StandinServer) -> None:
    inbox, output = tmp_path / "inbox", tmp_path / "out"
    _write_inbox(inbox, 5)
    reader, _ = run_conversion(_request(inbox, output, standin), Storage(), batch_documents=2)

    assert _part_sizes(output) == {cli_batch_key(0): 2, cli_batch_key(1): 2, cli_batch_key(2): 1}
    documents = reader.whole()["documents"]
    assert sorted(Path(doc["source"]).name for doc in documents) == [f"doc{i:02d}.pdf" for i in range(5)]
    assert {doc["status"] for doc in documents} == {"converted"}
    assert reader.counts()["converted"] == 5 and reader.counts()["pages"] == 5


def test_a_resumed_run_converts_only_the_slices_it_had_not_finished(tmp_path: Path, standin: StandinServer) -> None:
    """A CLI stopped after its first slice: the rerun carries that slice forward and converts the rest."""
    inbox, output = tmp_path / "inbox", tmp_path / "out"
    _write_inbox(inbox, 5)
    storage = Storage()
    request = _request(inbox, output, standin)
    plan = plan_held_whole(request, storage)
    folder = request.run_folder(storage)
    folder.write_plan(plan)
    convert_batch(request, storage, cli_batch_key(0), plan.sources[:2], plan_id=folder.plan_id)
    sent_before = standin.stats()["completed"]

    reader, _ = run_conversion(request, storage, batch_documents=2)

    assert standin.stats()["completed"] - sent_before == 3, "only the three unfinished documents are sent"
    assert reader.counts()["converted"] == 5
    assert _part_sizes(output) == {cli_batch_key(0): 2, cli_batch_key(1): 2, cli_batch_key(2): 1}


def test_a_plan_written_source_by_source_reads_back_whole(tmp_path: Path, standin: StandinServer) -> None:
    inbox, output = tmp_path / "inbox", tmp_path / "out"
    _write_inbox(inbox, 3)
    storage = Storage()
    request = _request(inbox, output, standin)
    plan = plan_held_whole(request, storage)
    plan.dead_letters.append(DocumentEntry(source=str(inbox / "gone.pdf"), status="failed", error='"sources": []'))
    folder = request.run_folder(storage)
    folder.write_plan(plan)

    assert folder.read_plan().to_dict() == plan.to_dict()
    assert json.loads(plan.to_json()) == plan.to_dict()


def test_the_run_never_holds_its_whole_plan(tmp_path: Path, standin: StandinServer) -> None:
    """Planned 2 at a time, 9 documents: no write of the run (batches, entries, parts, manifest) happens
    while more than two slices' documents are alive, and the plan object keeps no sources."""
    inbox, output = tmp_path / "inbox", tmp_path / "out"
    _write_inbox(inbox, 9)
    LiveSourcesStorage.reset()

    reader, _ = run_conversion(_request(inbox, output, standin), LiveSourcesStorage(), batch_documents=2)

    assert reader.counts()["converted"] == 9
    assert 0 < LiveSourcesStorage.most_live_sources <= 4
    plan = json.loads((output / "_runs" / "sliced" / "plan" / "plan.json").read_text())
    assert plan["sources"] == [] and plan["planned"] == 9
    assert plan["batch_keys"] == [cli_batch_key(index) for index in range(5)]


def test_a_resumed_streamed_plan_converts_only_its_unfinished_batches(tmp_path: Path, standin: StandinServer) -> None:
    """A CLI stopped after its first slice of a streamed plan: the rerun converts the rest, whatever
    was added to the input since (the plan is fixed), and the manifest reports the whole run."""
    inbox, output = tmp_path / "inbox", tmp_path / "out"
    _write_inbox(inbox, 5)
    storage = Storage()
    request = _request(inbox, output, standin)
    folder = request.run_folder(storage)
    plan = stream_plan(request, storage, folder, 2, cli_batch_key)
    convert_batch(request, storage, plan.batch_keys[0], folder.read_batch(plan.batch_keys[0]), plan_id=folder.plan_id)
    pdfgen.write_pdf(inbox / "later.pdf", pdfgen.text_pdf(1, doc_id=99))
    sent_before = standin.stats()["completed"]

    reader, _ = run_conversion(request, storage, batch_documents=2)

    assert standin.stats()["completed"] - sent_before == 3, "only the three unfinished documents are sent"
    documents = reader.whole()["documents"]
    assert sorted(Path(doc["source"]).name for doc in documents) == [f"doc{i:02d}.pdf" for i in range(5)]
    assert reader.counts()["converted"] == 5


def test_a_plan_stopped_while_streaming_is_planned_again(tmp_path: Path, standin: StandinServer) -> None:
    """Batches written but no plan (the process died while planning): the rerun plans from scratch."""
    inbox, output = tmp_path / "inbox", tmp_path / "out"
    _write_inbox(inbox, 3)
    storage = Storage()
    request = _request(inbox, output, standin)
    folder = request.run_folder(storage)
    stream_plan(request, storage, folder, 2, cli_batch_key)
    (output / "_runs" / "sliced" / "plan" / "plan.json").unlink()
    folder.write_batch(cli_batch_key(7), [])  # a stray batch of the unfinished planning

    reader, _ = run_conversion(request, storage, batch_documents=2)

    assert reader.counts()["converted"] == 3
    assert _part_sizes(output) == {cli_batch_key(0): 2, cli_batch_key(1): 1}
