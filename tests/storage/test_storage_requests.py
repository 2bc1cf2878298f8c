"""What a run's state costs in storage requests: counted by ``Storage`` itself, reported in the manifest.

Covers: a real CLI run (stand-in server) whose summary carries ``metrics.storage_requests`` with
per-kind counts and per-document figures that agree with them (and still validates against the
schema), exactly what one-page documents and their batch cost (16 requests a document, 17 on S3);
on moto S3, the counts a batch reports equal the requests the fault proxy in front of moto
forwarded (an independent count at the HTTP level, no patching), and so do the whole Storage's
totals over plan, convert and publish; a child counter adds to its parent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from olmocr_tasks.location.run_folders import RunFolder
from olmocr_tasks.run.pipeline import convert_batch
from olmocr_tasks.run.publishing import publish_run
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.storage.store import REQUEST_KINDS, RetryPolicy, Storage
from olmocr_testkit import pdfgen
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.cli_process import FAST_CLI, run_cli
from tests.fixtures.manifests import validated_manifest
from tests.fixtures.plans import plan_held_whole
from tests.fixtures.reader_view import quick_settings
from tests.fixtures.s3 import FaultProxy

# botocore's own re-sends are off, so one counted attempt is one HTTP request the proxy sees.
EXACT = RetryPolicy(max_attempts=4, max_elapsed_s=30, initial_backoff_s=0.01, max_backoff_s=0.05, botocore_attempts=1)

# What one uncontended one-page document costs a local output (README "Big runs" quotes the total,
# 16): its source, outputs and state records, its claim (create, fence and release reads, delete)
# and the check that no later attempt of its batch has started. No listing: a one-page document
# saves no page for resuming, so there are no saved pages to look for or discard. Asserted exactly,
# so that a change in the engine's requests shows here and the README's figure is updated with it.
ONE_PAGE_DOCUMENT = {"read": 6, "write": 5, "create": 2, "delete": 1, "list": 0, "stat": 2}
# On S3 the source is downloaded first (one read more: 17); a local source is read in place.
ONE_PAGE_DOCUMENT_ON_S3 = ONE_PAGE_DOCUMENT | {"read": 7}
# What the batch itself adds: its start mark and its part, and the listing of its attempt's objects
# (one page on S3; a local listing counts one request per folder it walks, here two).
BATCH = {"write": 2, "list": 2}
BATCH_ON_S3 = {"write": 2, "list": 1}


def _expected(documents: int, per_document: dict[str, int], batch: dict[str, int]) -> dict[str, int]:
    return {kind: documents * per_document[kind] + batch.get(kind, 0) for kind in REQUEST_KINDS}


def _proxy_counts(proxy: FaultProxy) -> dict[str, int]:
    """The forwarded requests by our kinds: a PUT is a write or a conditional create (the proxy keeps
    no headers to tell them apart), a GET with ``list-type=2`` a listing page, a HEAD a stat."""
    listed = proxy.count("GET", r"list-type=2", outcome="forwarded")
    return {
        "read": proxy.count("GET", outcome="forwarded") - listed,
        "put": proxy.count("PUT", outcome="forwarded"),
        "delete": proxy.count("DELETE", outcome="forwarded"),
        "list": listed,
        "stat": proxy.count("HEAD", outcome="forwarded"),
    }


def _as_proxy_sees(counts: dict[str, int]) -> dict[str, int]:
    return {
        "read": counts["read"],
        "put": counts["write"] + counts["create"],
        "delete": counts["delete"],
        "list": counts["list"],
        "stat": counts["stat"],
    }


def test_a_child_counter_adds_to_its_parent_and_counts_every_kind(tmp_path: Path) -> None:
    storage = Storage()
    child = storage.counting()
    target = str(tmp_path / "state" / "a.json")
    child.write_bytes_atomic(target, b"1")
    assert child.create_exclusive(target, b"2") is False  # an existing object is still one request
    assert child.read_bytes(target) == b"1" and child.exists(target)
    child.download(target, tmp_path / "copy.json")  # a read; the scratch file is not a request
    assert [info.uri for info in child.list_objects(str(tmp_path / "state"))] == [target]
    child.delete(target)
    expected = {"read": 2, "write": 1, "create": 1, "delete": 1, "list": 1, "stat": 1}
    assert child.requests.counts() == expected
    assert storage.requests.counts() == expected and storage.requests.total() == 7
    storage.read_bytes_or_none(target)  # the parent's own request is not the child's
    assert storage.requests.counts()["read"] == 3 and child.requests.counts()["read"] == 2


def test_a_cli_run_reports_its_storage_requests_per_converted_document(tmp_path: Path, standin: StandinServer) -> None:
    for doc_id in range(1, 5):
        pdfgen.write_pdf(tmp_path / "in" / f"d{doc_id}.pdf", pdfgen.text_pdf(1, doc_id=doc_id))
    out = tmp_path / "out"
    result = run_cli(
        "convert", str(tmp_path / "in"), str(out), "--server", standin.url, "--run-id", "counted", *FAST_CLI
    )
    assert result.returncode == 0, result.stderr
    # The summary with its new field still validates against the published schema.
    manifest = validated_manifest(str(out / "manifests" / "counted.json"))
    requests = manifest["metrics"]["storage_requests"]
    assert manifest["counts"]["converted"] == requests["converted_documents"] == 4
    by_kind = requests["by_kind"]
    assert list(by_kind) == list(REQUEST_KINDS)
    assert by_kind == _expected(4, ONE_PAGE_DOCUMENT, BATCH)
    assert sum(ONE_PAGE_DOCUMENT.values()) == 16
    assert requests["total"] == sum(by_kind.values()) and requests["complete"] is True and requests["batches"] == 1
    per_document = requests["per_converted_document"]
    for kind, count in by_kind.items():
        assert per_document[kind] == round(count / 4, 3)
    assert per_document["total"] == round(requests["total"] / 4, 3)
    # Planning listed the input and the location's state and wrote its plan's batch; publishing wrote
    # at least a shard; run_total adds them to the batches'.
    planning, publishing = requests["planning"], requests["publishing"]
    assert planning["by_kind"]["list"] >= 2 and planning["by_kind"]["write"] >= 1, planning
    assert publishing["by_kind"]["write"] >= 1, publishing
    for step in (planning, publishing):
        assert step["total"] == sum(step["by_kind"].values())
    assert requests["run_total"] == requests["total"] + planning["total"] + publishing["total"]
    print("local one-page run, requests per converted document:", json.dumps(per_document))


def test_on_s3_the_counts_match_the_requests_the_server_received(
    tmp_path: Path, standin: StandinServer, s3_bucket: str, s3_fault_proxy: FaultProxy, s3_put_many: Any
) -> None:
    s3_put_many(s3_bucket, {f"in/d{doc_id}.pdf": pdfgen.text_pdf(1, doc_id=doc_id) for doc_id in range(1, 5)})
    storage = Storage(s3_fault_proxy.storage_options, retry=EXACT)
    output_uri = f"s3://{s3_bucket}/out"
    request = RunRequest(f"s3://{s3_bucket}/in", output_uri, "s3counted", settings=quick_settings(standin.url))
    s3_fault_proxy.clear()
    folder = RunFolder(storage, output_uri, "s3counted", "p1-abc")
    plan = plan_held_whole(request, storage)
    folder.write_plan(plan)
    before = _proxy_counts(s3_fault_proxy)
    result = convert_batch(request, storage, "b00000", plan.sources, plan_id=folder.plan_id, try_number=1)
    # What the batch reported in its part is exactly what the server got during the batch.
    during = {kind: count - before[kind] for kind, count in _proxy_counts(s3_fault_proxy).items()}
    part = json.loads(storage.read_bytes(result.summary["part"]))["storage_requests"]
    assert _as_proxy_sees(part) == during and result.summary["storage_requests"] == sum(part.values())
    before_publish = _proxy_counts(s3_fault_proxy)
    published = publish_run(request, storage, folder, plan)
    # The whole Storage's totals (plan, the batch, publish and the test's own read) match the server's.
    assert _as_proxy_sees(storage.requests.counts()) == _proxy_counts(s3_fault_proxy)
    # Publishing's own count is what the server got during publish but the summary's own PUT.
    publishing = published.manifest.to_dict()["metrics"]["storage_requests"]["publishing"]["by_kind"]
    during_publish = {kind: count - before_publish[kind] for kind, count in _proxy_counts(s3_fault_proxy).items()}
    assert during_publish == _as_proxy_sees(publishing) | {"put": _as_proxy_sees(publishing)["put"] + 1}
    metrics = published.manifest.to_dict()["metrics"]["storage_requests"]
    assert metrics["by_kind"] == part and metrics["converted_documents"] == 4
    assert part == _expected(4, ONE_PAGE_DOCUMENT_ON_S3, BATCH_ON_S3)
    assert sum(ONE_PAGE_DOCUMENT_ON_S3.values()) == 17
    assert metrics["per_converted_document"]["total"] == round(sum(part.values()) / 4, 3)
    print("s3 one-page run, requests per converted document:", json.dumps(metrics["per_converted_document"]))
