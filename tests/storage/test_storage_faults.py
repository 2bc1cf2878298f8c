"""S3 faults end to end through the engine: throttling, errors, timeouts and drops on every call.

Inputs and outputs live in a moto bucket behind the fault proxy (``tests.fixtures.s3``); the engine only
ever talks to the proxy. What a reader sees is checked with a separate, fault-free client.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import boto3
import pytest

from olmocr_tasks.core.errors import StorageError
from olmocr_tasks.run.pipeline import run_conversion
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.storage.store import RetryPolicy, Storage
from olmocr_testkit import pdfgen
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.reader_view import assert_manifest_matches_outputs, assert_reader_view_consistent, quick_settings
from tests.fixtures.s3 import FaultProxy

LIST = r"list-type=2"
OBJECT_IN = r"/in/[^?]+\.pdf"

# Short timeouts and quick backoff so that a fault costs a fraction of a second; the attempt and time
# bounds are as generous as production's in proportion.
FAST_RETRY = RetryPolicy(
    max_attempts=8,
    max_elapsed_s=60.0,
    initial_backoff_s=0.05,
    max_backoff_s=0.5,
    botocore_attempts=2,
    connect_timeout_s=2.0,
    read_timeout_s=1.0,
)


def upload_documents(s3_options: dict[str, Any], bucket: str, pages: dict[int, int]) -> dict[str, int]:
    client = boto3.client(
        "s3",
        endpoint_url=s3_options["client_kwargs"]["endpoint_url"],
        region_name=s3_options["client_kwargs"]["region_name"],
        aws_access_key_id=s3_options["key"],
        aws_secret_access_key=s3_options["secret"],
    )
    for doc_id, count in pages.items():
        client.put_object(Bucket=bucket, Key=f"in/doc{doc_id}.pdf", Body=pdfgen.text_pdf(count, doc_id=doc_id))
    return {f"doc{doc_id}.pdf": doc_id for doc_id in pages}


def request_for(bucket: str, standin: StandinServer, run_id: str) -> RunRequest:
    return RunRequest(f"s3://{bucket}/in/", f"s3://{bucket}/out", run_id, settings=quick_settings(standin.url))


@pytest.mark.slow
def test_throttling_errors_timeouts_and_drops_on_every_call_are_ridden_out(
    s3_bucket: str, s3_storage_options: dict[str, Any], s3_fault_proxy: FaultProxy, standin: StandinServer
) -> None:
    doc_ids = upload_documents(s3_storage_options, s3_bucket, {doc_id: 2 for doc_id in range(61, 67)})
    proxy = s3_fault_proxy
    # A few certain faults on each kind of call, so every kind is exercised whatever the random draws...
    proxy.add_rule(method="GET", path=LIST, action="slowdown", count=2)
    proxy.add_rule(method="GET", path=OBJECT_IN, action="drop", count=2)
    # Beyond the read timeout: the client gives up and retries (the proxy records no outcome for it).
    timed_out = proxy.add_rule(method="GET", path=OBJECT_IN, action="delay", delay_s=1.5, count=1)
    proxy.add_rule(method="PUT", path=r"/out/dolma/", action="slowdown", count=2)
    proxy.add_rule(method="PUT", path=r"/out/markdown/", action="drop", count=1)
    proxy.add_rule(method="PUT", path=r"/out/_state/", action="error500", count=2)
    proxy.add_rule(method="HEAD", action="slowdown", count=1)
    # ...then about one request in five fails at random, on any call.
    proxy.add_rule(action="slowdown", share=0.08, seed=1)
    proxy.add_rule(action="error500", share=0.04, seed=2)
    proxy.add_rule(action="drop", share=0.04, seed=3)
    proxy.add_rule(action="delay", delay_s=1.5, share=0.04, seed=4)
    storage = Storage(proxy.storage_options, retry=FAST_RETRY)

    manifest, uri = run_conversion(request_for(s3_bucket, standin, "throttled"), storage)
    # A delay beyond the read timeout costs one read timeout, not the delay: the client gave up on every
    # delayed request (the proxy forwards it anyway, after 1.5 s) and sent the same request again.
    sent = Counter((request.method, request.target) for request in proxy.requests)
    delayed = Counter((request.method, request.target) for request in proxy.requests if request.outcome == "delay")
    assert delayed and all(sent[call] > times for call, times in delayed.items()), delayed

    assert [doc.status for doc in manifest.documents] == ["converted"] * len(doc_ids), [
        (doc.source, doc.error) for doc in manifest.documents
    ]
    assert manifest.counts()["fallback_pages"] == 0
    for method, path in (("GET", LIST), ("GET", OBJECT_IN), ("PUT", "/out/"), ("HEAD", "")):
        faults = proxy.count(method, path) - proxy.count(method, path, outcome="forwarded")
        assert faults > 0, f"no fault was injected on {method} {path}"
    assert timed_out.applied == 1
    clean = Storage(s3_storage_options)
    assert_manifest_matches_outputs(manifest, clean)
    view = assert_reader_view_consistent(f"s3://{s3_bucket}/out", clean, doc_ids=doc_ids)
    assert len(view.dolma) == len(doc_ids) and view.failed_markers == []
    assert list(view.manifests) == [uri]


@pytest.mark.parametrize(("action", "code"), [("denied", "AccessDenied"), ("not_found", "NoSuchKey")])
def test_a_permanently_unreadable_object_fails_only_that_document(
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_fault_proxy: FaultProxy,
    standin: StandinServer,
    action: str,
    code: str,
) -> None:
    doc_ids = upload_documents(s3_storage_options, s3_bucket, {71: 1, 72: 2, 73: 1})
    # Listed like the others, but every GET of its bytes is refused.
    s3_fault_proxy.add_rule(method="GET", path=r"/in/doc72\.pdf$", action=action)
    storage = Storage(s3_fault_proxy.storage_options, retry=FAST_RETRY)
    manifest, _ = run_conversion(request_for(s3_bucket, standin, "locked"), storage)

    by_name = {Path(doc.source).name: doc for doc in manifest.documents}
    locked = by_name.pop("doc72.pdf")
    assert (locked.status, locked.error_class) == ("failed", "unreadable")
    assert code in (locked.error or "") and "doc72.pdf" in (locked.error or "")
    assert all(doc.status == "converted" for doc in by_name.values())
    # Permanent errors are not retried: one GET per attempt of the operation, not a retry storm.
    assert s3_fault_proxy.count("GET", r"/in/doc72\.pdf$") <= 2
    view = assert_reader_view_consistent(f"s3://{s3_bucket}/out", Storage(s3_storage_options), doc_ids=doc_ids)
    assert len(view.dolma) == 2
    assert [marker["error_class"] for marker in view.failed_markers] == ["unreadable"]


def test_outputs_that_cannot_be_written_abort_the_run_without_blaming_documents(
    s3_bucket: str, s3_storage_options: dict[str, Any], s3_fault_proxy: FaultProxy, standin: StandinServer
) -> None:
    doc_ids = upload_documents(s3_storage_options, s3_bucket, {81: 1, 82: 1})
    rule = s3_fault_proxy.add_rule(method="PUT", path=r"/out/dolma/", action="slowdown")
    quick = RetryPolicy(max_attempts=2, max_elapsed_s=5.0, initial_backoff_s=0.05, max_backoff_s=0.2)
    storage = Storage(s3_fault_proxy.storage_options, retry=quick)
    request = request_for(s3_bucket, standin, "unwritable")
    with pytest.raises(StorageError, match="SlowDown"):
        run_conversion(request, storage)
    assert rule.applied >= 2  # retried before giving up
    clean = Storage(s3_storage_options)
    view = assert_reader_view_consistent(f"s3://{s3_bucket}/out", clean, doc_ids=doc_ids)
    # Storage being down is not the documents' fault: nothing is marked failed, nothing is published.
    assert view.failed_markers == [] and view.manifests == {} and view.dolma == {}

    s3_fault_proxy.clear()
    manifest, _ = run_conversion(request, storage)
    assert [doc.status for doc in manifest.documents] == ["converted", "converted"]
    assert len(assert_reader_view_consistent(f"s3://{s3_bucket}/out", clean, doc_ids=doc_ids).dolma) == 2
