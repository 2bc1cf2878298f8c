"""The manifest's layout: a small summary written last, the entries in gzip JSON Lines shards before it.

Covers: old single-file manifests (schema 1 and 2, written here as the old code wrote them) read
through the same reader; a large run's summary stays small and its shards hold every entry exactly
once, in order; the summary is written after every shard it names (write order recorded by a
``Storage`` subclass, and a publish that dies between the two leaves no summary); ``olmocr-tasks
manifest`` prints the summary and streams the entries of both layouts; retention removes the shards
no summary names; a real run (stand-in server) through the streaming publish, locally and on moto S3.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from olmocr_tasks.location.manifest import (
    SHARD_ENTRIES,
    DocumentEntry,
    Manifest,
    ManifestWriter,
    manifest_uri,
)
from olmocr_tasks.location.manifest_reader import ManifestReader, read_manifest
from olmocr_tasks.location.retention import clean_output
from olmocr_tasks.run.pipeline import convert_batch
from olmocr_tasks.run.publishing import publish_run
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.run.settings import RunSettings
from olmocr_tasks.storage.store import ObjectReader, Storage
from olmocr_tasks.storage.uri import join_uri
from olmocr_testkit import pdfgen
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.manifests import load_whole, manifest_header, write_manifest
from tests.fixtures.plans import plan_held_whole
from tests.fixtures.reader_view import quick_settings

# The bound on a summary, whatever the run's size.
SUMMARY_LIMIT = 256 * 1024
REPO_ROOT = Path(__file__).resolve().parents[2]


def _entry(index: int, output_uri: str = "s3://archive/out") -> DocumentEntry:
    """A realistic one-page entry: converted, except every 50th failed and every 70th a skipped duplicate."""
    source = f"s3://archive/in/collection-{index // 1000:04d}/scan-{index:07d}.pdf"
    if index % 50 == 7:
        return DocumentEntry(
            source=source, status="failed", size=48_213, error_class="corrupt", error="no trailer found", attempts=1
        )
    entry = DocumentEntry(
        source=source,
        status="skipped" if index % 70 == 3 else "converted",
        size=48_213,
        sha256=f"{index:064x}",
        pages=1,
        input_tokens=1784,
        output_tokens=38 + index % 9,
        attempts=1,
        seconds=0.3,
        outputs={
            "dolma": f"{output_uri}/dolma/collection-{index // 1000:04d}/scan-{index:07d}.jsonl",
            "markdown": f"{output_uri}/markdown/collection-{index // 1000:04d}/scan-{index:07d}.md",
        },
        page_latencies_s=[0.1 + (index % 100) / 1000],
        accepted_attempt_histogram={"1": 1},
        server_input_tokens=1784,
        server_output_tokens=38,
    )
    if entry.status == "skipped":
        entry.skip_reason, entry.duplicate_of = "duplicate_content", source.replace("scan", "orig")
    return entry


def _header(output_uri: str, run_id: str, documents: list[DocumentEntry] | None = None) -> Manifest:
    return manifest_header(output_uri, run_id, documents=documents or [], gpu_hour_price=2.0)


class RecordingStorage(Storage):
    """A real local/S3 storage that records the order of its writes, and can fail the summary's."""

    def __init__(self, *args: Any, fail_on: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.writes: list[str] = []
        self.fail_on = fail_on

    def write_bytes_atomic(self, uri: str, data: bytes, *, content_type: str | None = None) -> None:
        if self.fail_on is not None and uri.endswith(self.fail_on):
            raise OSError(f"the publishing process died before writing {uri}")
        super().write_bytes_atomic(uri, data, content_type=content_type)
        self.writes.append(uri)


# ------------------------------------------------------------------------------ old manifests


def _old_manifest(schema_version: int) -> dict[str, Any]:
    """A manifest as schema 1 or 2 wrote it: one JSON object, every entry inline, no error_classes."""
    documents = [_entry(index).to_dict() for index in range(10)]
    dead = DocumentEntry(source="s3://archive/in/broken.pdf", status="failed", error_class="dead_letter")
    if schema_version == 1:
        for doc in documents:
            for key in ("redriven", "claimed_by", "retry_from"):
                del doc[key]
    counts = {"documents": 10, "converted": 8, "failed": 1, "skipped": 1, "dead_letters": 1}
    counts |= {"already_converted": 4, "pages": 8, "fallback_pages": 0, "input_tokens": 14272}
    counts |= {"output_tokens": 340, "attempts": 10}
    if schema_version == 2:
        counts |= {"redriven": 0, "redriven_failed": 0, "claimed": 0, "retry_later": 0, "judged": 10}
        counts |= {"judged_failed": 1}
    return {
        "schema_version": schema_version,
        "run_id": f"old-{schema_version}",
        "started_at": "2026-06-01T10:00:00.000Z",
        "finished_at": "2026-06-01T10:00:20.000Z",
        "package_version": "0.0.9",
        "server": {},
        "model": "m",
        "prompt_version": "p",
        "input_uri": "/in",
        "output_uri": "/out",
        "settings": {},
        "counts": counts,
        "metrics": {
            "elapsed_s": 20.0,
            "pages_per_second": 0.4,
            "fallback_rate": 0.0,
            "latency_p50_s": 0.105,
            "latency_p95_s": 0.109,
            "accepted_attempt_histogram": {"1": 8},
            "output_tokens_per_page": 42.5,
            "cost": None,
        },
        "error_budget": None,
        "airflow_run": None,
        "documents": documents,
        "dead_letters": [dead.to_dict()],
    }


@pytest.mark.parametrize("schema_version", [1, 2])
def test_an_old_single_file_manifest_reads_through_the_same_reader(tmp_path: Path, schema_version: int) -> None:
    import importlib.resources

    import jsonschema

    old = _old_manifest(schema_version)
    schema = json.loads(importlib.resources.files("olmocr_tasks").joinpath("schemas/manifest.schema.json").read_text())
    jsonschema.validate(old, schema)  # the published schema still accepts what old versions wrote
    output = tmp_path / "out"
    (output / "manifests").mkdir(parents=True)
    (output / "manifests" / f"old-{schema_version}.json").write_text(json.dumps(old, indent=1))

    manifest = read_manifest(Storage(), str(output), f"old-{schema_version}")
    assert manifest is not None and not manifest.sharded and manifest.schema_version == schema_version
    assert "documents" not in manifest.summary and manifest.counts() == old["counts"]
    assert list(manifest.iter_documents()) == old["documents"]
    assert list(manifest.iter_dead_letters()) == old["dead_letters"]
    assert manifest.document_count() == 10 and manifest.page(8, 5) == old["documents"][8:]
    # Old manifests carry no error classes: they are counted from the entries.
    assert manifest.error_classes() == {"corrupt": 1}
    assert [doc.source for doc in manifest.iter_entries()] == [doc["source"] for doc in old["documents"]]
    assert manifest.whole() == old and load_whole(str(output / "manifests" / f"old-{schema_version}.json")) == old
    assert manifest.manifest().counts()["failed"] == 1
    # The CLI reads it like a new one.
    summary = json.loads(_cli("manifest", str(output), f"old-{schema_version}").stdout)
    assert summary == {key: value for key, value in old.items() if key not in ("documents", "dead_letters")}
    lines = _cli("manifest", str(output), f"old-{schema_version}", "--documents").stdout.splitlines()
    assert [json.loads(line) for line in lines] == old["documents"]
    dead = _cli("manifest", str(output), f"old-{schema_version}", "--dead-letters").stdout.splitlines()
    assert [json.loads(line) for line in dead] == old["dead_letters"]


# ------------------------------------------------------------------------------- large runs


def test_a_large_runs_summary_stays_small_and_its_shards_hold_every_entry_once(tmp_path: Path) -> None:
    documents = 100_000
    output = str(tmp_path / "out")
    storage = RecordingStorage()
    writer = ManifestWriter(storage, output, "archive")
    for index in range(documents):
        writer.add(_entry(index, output))
    writer.add_dead_letter(DocumentEntry(source="s3://archive/in/broken.pdf", status="failed", error_class="x"))
    summary_uri = writer.commit(_header(output, "archive"))

    size = os.path.getsize(summary_uri)
    print(f"summary of a {documents:,}-document run: {size:,} bytes; shards: {len(storage.writes) - 1}")
    assert size <= SUMMARY_LIMIT
    summary = json.loads(Path(summary_uri).read_text())
    assert summary["schema_version"] == 3 and "documents" not in summary
    shards = summary["entries"]["documents"]["shards"]
    assert len(shards) == documents // SHARD_ENTRIES and {shard["entries"] for shard in shards} == {SHARD_ENTRIES}
    counts = summary["counts"]
    failed = len(range(7, documents, 50))
    assert (counts["documents"], counts["failed"], counts["dead_letters"]) == (documents, failed, 1)
    assert counts["converted"] + counts["skipped"] == documents - failed
    assert summary["error_classes"] == {"corrupt": failed}
    assert summary["metrics"]["latency_p50_s"] is not None and summary["metrics"]["accepted_attempt_histogram"]
    # What the runs page shows besides the counts is folded into the summary, bounded.
    overview = summary["overview"]
    assert overview["failed"]["total"] == failed and len(overview["failed"]["first"]) == 25
    assert [problem["index"] for problem in overview["failed"]["first"][:2]] == [7, 57]
    assert overview["dead_letters"]["total"] == 1 and overview["failure_classes"] == {"corrupt": failed, "x": 1}
    latencies = documents - failed  # one per converted or skipped entry of _entry
    assert sum(n for _, n in overview["latency_histogram"]) == overview["latency_count"] == latencies
    points = overview["progress"]["points"]
    assert 300 <= len(points) <= 601 and points[-1][2] == counts["pages"]
    # Each shard counts its entries per status: the page finds the n-th failed document's shard.
    assert sum(shard["statuses"].get("failed", 0) for shard in shards) == failed

    reader = read_manifest(Storage(), output, "archive")
    assert reader is not None and reader.document_count() == documents
    sources = [doc["source"] for doc in reader.iter_documents()]
    assert sources == [_entry(index).source for index in range(documents)]  # each once, in order
    assert reader.page(25_000, 3) == [_entry(index, output).to_dict() for index in range(25_000, 25_003)]
    assert reader.page(documents - 1, 10) == [_entry(documents - 1, output).to_dict()]
    # Each shard on disk is gzip JSON Lines holding exactly the entries the summary says.
    for shard, uri in zip(shards, reader.shard_uris("documents"), strict=True):
        assert len(gzip.decompress(Path(uri).read_bytes()).splitlines()) == shard["entries"]
    assert [doc["source"] for doc in reader.iter_dead_letters()] == ["s3://archive/in/broken.pdf"]


# ----------------------------------------------------------------------------- commit order


def test_the_summary_is_written_after_every_shard_it_names(tmp_path: Path) -> None:
    output = str(tmp_path / "out")
    storage = RecordingStorage()
    manifest = _header(output, "ordered", [_entry(index, output) for index in range(25)])
    manifest.dead_letters = [DocumentEntry(source="/in/dead.pdf", status="failed", error_class="dead_letter")]
    uri = write_manifest(manifest, storage, shard_entries=10)
    assert storage.writes[-1] == uri == manifest_uri(output, "ordered")
    shard_writes = storage.writes[:-1]
    assert len(shard_writes) == 4 and all(write.endswith(".jsonl.gz") for write in shard_writes)
    reader = read_manifest(Storage(), output, "ordered")
    assert reader is not None and sorted(reader.shard_uris()) == sorted(shard_writes)

    # A publish that dies between its shards and its summary publishes nothing: the earlier summary
    # (and the shards it names) stay as they were, and readers never see the new shards.
    dying = RecordingStorage(fail_on=".json")
    again = _header(output, "ordered", [_entry(index, output) for index in range(30, 35)])
    with pytest.raises(OSError, match="died before writing"):
        write_manifest(again, dying, shard_entries=10)
    assert len(dying.writes) == 1 and dying.writes[0].endswith(".jsonl.gz")
    still = read_manifest(Storage(), output, "ordered")
    assert still is not None and still.shard_uris() == reader.shard_uris()
    assert [doc["source"] for doc in still.iter_documents()] == [_entry(index).source for index in range(25)]
    # A run that never published before has no summary at all after such a crash.
    with pytest.raises(OSError):
        write_manifest(_header(output, "crashed", [_entry(1, output)]), RecordingStorage(fail_on=".json"))
    assert read_manifest(Storage(), output, "crashed") is None


# ------------------------------------------------------------------------------------- CLI


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-m", "olmocr_tasks.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result


def test_the_manifest_command_prints_the_summary_and_streams_the_documents(tmp_path: Path) -> None:
    output = str(tmp_path / "out")
    entries = [_entry(index, output) for index in range(23)]
    write_manifest(_header(output, "scheduled__2026-12-01T10:00:00+00:00", entries), Storage(), shard_entries=10)

    # The run id as Airflow spells it: the command finds the file it was published under.
    summary = json.loads(_cli("manifest", output, "scheduled__2026-12-01T10:00:00+00:00").stdout)
    assert summary["counts"]["documents"] == 23 and len(summary["entries"]["documents"]["shards"]) == 3
    lines = _cli("manifest", output, "scheduled__2026-12-01T10:00:00+00:00", "--documents").stdout.splitlines()
    assert [json.loads(line) for line in lines] == [entry.to_dict() for entry in entries]
    # What the README shows: jq over the stream, failed documents with their reasons.
    jq = subprocess.run(
        ["jq", "-r", 'select(.status == "failed") | [.source, .error_class] | @tsv'],
        input="\n".join(lines),
        capture_output=True,
        text=True,
        check=True,
    )
    assert jq.stdout.splitlines() == [f"{entries[7].source}\tcorrupt"]
    missing = subprocess.run(
        [sys.executable, "-m", "olmocr_tasks.cli", "manifest", output, "nope"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=120,
    )
    assert missing.returncode == 2 and "no published manifest for run 'nope'" in missing.stderr


# ------------------------------------------------------------------------------- retention


def _shards_on_disk(output: Path) -> set[str]:
    return {str(path) for path in (output / "manifests").rglob("*.jsonl.gz")}


def test_retention_removes_the_shards_no_summary_names(tmp_path: Path) -> None:
    output = tmp_path / "out"
    storage = Storage()
    entries = [_entry(index, str(output)) for index in range(12)]
    # "kept": published twice; the second publish supersedes the first one's shards.
    write_manifest(_header(str(output), "kept", entries), storage, shard_entries=5)
    first_shards = _shards_on_disk(output)
    write_manifest(_header(str(output), "kept", entries[:4]), storage, shard_entries=5)
    kept = read_manifest(storage, str(output), "kept")
    assert kept is not None and set(kept.shard_uris()).isdisjoint(first_shards)
    # "deleted": its summary was removed by hand, so its shards with it. "crashed": never committed.
    write_manifest(_header(str(output), "deleted", entries), storage, shard_entries=5)
    (output / "manifests" / "deleted.json").unlink()
    with pytest.raises(OSError):
        write_manifest(_header(str(output), "crashed", entries), RecordingStorage(fail_on=".json"), shard_entries=5)
    named = set(kept.shard_uris())

    # Nothing is old enough yet: a publish writing its shards right now loses nothing.
    before = _shards_on_disk(output)
    assert clean_output(str(output), storage, older_than=timedelta(days=7)).manifest_shards == 0
    assert _shards_on_disk(output) == before
    report = clean_output(str(output), storage, older_than=timedelta(days=7), now=datetime.now(UTC) + timedelta(days=8))
    assert report.manifest_shards == len(before) - len(named) > 0
    assert _shards_on_disk(output) == named
    assert "manifest shards no summary names" in report.summary()
    again = read_manifest(storage, str(output), "kept")
    assert again is not None and [doc["source"] for doc in again.iter_documents()] == [e.source for e in entries[:4]]


# ------------------------------------------------------------------------- a real run, streamed


def _real_run(output_uri: str, storage: RecordingStorage, standin: StandinServer, inbox: Path) -> ManifestReader:
    for doc_id in range(1, 7):
        pdfgen.write_pdf(inbox / f"d{doc_id}.pdf", pdfgen.text_pdf(1, doc_id=doc_id))
    budget = RunSettings(max_document_error_rate=0.5)
    request = RunRequest(str(inbox), output_uri, "streamed", settings=quick_settings(standin.url), run_settings=budget)
    folder = request.run_folder(storage, "p1-abc")
    plan = plan_held_whole(request, storage)
    folder.write_plan(plan)
    # Two batches, as Airflow would map them, and one planned document no batch ever reported.
    convert_batch(request, storage, "b00000", plan.sources[:3], plan_id=folder.plan_id, try_number=1)
    convert_batch(request, storage, "b00001", plan.sources[3:5], plan_id=folder.plan_id, try_number=1)
    storage.writes.clear()
    published = publish_run(request, storage, folder, plan, shard_entries=2)
    assert storage.writes[-1] == published.uri and published.not_converted == 1
    # Every shard, then the ledger's failure marker of the lost document, then the summary.
    shard_writes = [uri for uri in storage.writes if uri.endswith(".jsonl.gz")]
    assert len(shard_writes) == 3 and storage.writes[: len(shard_writes)] == shard_writes
    ledger_writes = storage.writes[len(shard_writes) : -1]
    assert ledger_writes and all("/_state/" in uri for uri in ledger_writes), storage.writes
    manifest = read_manifest(storage, output_uri, "streamed")
    assert manifest is not None and manifest.shard_uris() == shard_writes
    return manifest


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_real_run_publishes_its_entries_to_shards_before_its_summary(
    where: str, tmp_path: Path, standin: StandinServer, request: pytest.FixtureRequest
) -> None:
    if where == "s3":
        bucket = request.getfixturevalue("s3_bucket")
        storage = RecordingStorage(request.getfixturevalue("s3_storage_options"))
        output_uri = f"s3://{bucket}/out"
    else:
        storage, output_uri = RecordingStorage(), str(tmp_path / "out")
    manifest = _real_run(output_uri, storage, standin, tmp_path / "in")
    documents = list(manifest.iter_documents())
    assert sorted(Path(doc["source"]).name for doc in documents) == [f"d{doc_id}.pdf" for doc_id in range(1, 7)]
    statuses = [(doc["status"], doc["error_class"]) for doc in documents]
    assert statuses.count(("converted", None)) == 5 and statuses.count(("failed", "not_converted")) == 1
    counts = manifest.counts()
    assert (counts["documents"], counts["converted"], counts["not_converted"]) == (6, 5, 1)
    assert manifest.summary["error_budget"]["exceeded"] is True  # a batch never reported
    assert manifest.document_count() == 6 and manifest.page(2, 2) == documents[2:4]
    # Shards sit in the run's own folder next to its summary.
    assert all(uri.startswith(join_uri(output_uri, "manifests", "streamed") + "/") for uri in manifest.shard_uris())


# --------------------------------------------------------------------------- the runs page


class ReadRecordingStorage(Storage):
    """A real local storage that records which objects were read (whole or streamed)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def read_bytes(self, uri: str) -> bytes:
        self.reads.append(uri)
        return super().read_bytes(uri)

    def open_read(self, uri: str, *, max_bytes: int) -> ObjectReader:
        self.reads.append(uri)
        return super().open_read(uri, max_bytes=max_bytes)


def test_the_runs_page_serves_one_documents_output_reading_only_its_shard(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    plugins = str(REPO_ROOT / "plugins")
    if plugins not in sys.path:
        sys.path.insert(0, plugins)
    from olmocr_runs import create_app
    from olmocr_runs.access import every_run

    output = tmp_path / "out"
    entries = [_entry(index, str(output)) for index in range(30)]
    write_manifest(_header(str(output), "paged", entries), Storage(), shard_entries=10)
    markdown = Path(entries[25].outputs["markdown"])
    markdown.parent.mkdir(parents=True)
    markdown.write_text("# page twenty-five")
    storage = ReadRecordingStorage()
    client = TestClient(create_app(str(output), storage_for=lambda uri: storage, access=every_run))

    response = client.get("/runs/paged/documents/25/markdown")
    assert response.status_code == 200 and response.text == "# page twenty-five"
    reader = read_manifest(Storage(), str(output), "paged")
    assert reader is not None
    third_shard = reader.shard_uris("documents")[2]
    assert storage.reads == [manifest_uri(str(output), "paged"), third_shard, str(markdown)]
    assert client.get("/runs/paged/documents/30/markdown").status_code == 404
