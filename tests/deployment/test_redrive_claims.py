"""Re-drive belongs to reconciliation runs, and claims keep concurrent runs apart (issues 23 and 24).

Through the real scheduler, Celery workers and API: a run that names its documents (REST
``documents``, an S3 event) converts exactly those beside a recorded failure and succeeds; two manual
``scope=all`` runs started together re-drive the failed document once, not twice, and convert a new
document once. The stand-in answers the failing document's only page with garbage, so it fails as a
document (``error_rate_exceeded``), never as an outage; requests are counted at the stand-in by the
document and page each image shows.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest

from olmocr_testkit.bucket import Bucket
from olmocr_testkit.cluster import Deployment, wait_until
from tests.deployment.published import converted, documents, sources, statuses
from tests.fixtures.s3 import s3_notification

pytestmark = [pytest.mark.deployment, pytest.mark.timeout(900)]

DAG = "olmocr_ingest"
EVENTS_DAG = "olmocr_s3_events"
# The tier's schedule (OLMOCR_SCHEDULE "* * * * *"): attempts at a failing document are spaced by it.
INTERVAL = timedelta(minutes=1)


def _pages_requested(deployment: Deployment, since: int) -> Counter[int]:
    """Page requests the stand-in received since request ``since``, by the document each image shows."""
    return Counter(
        record["marker"]["doc_id"] for record in deployment.standin.requests(since=since) if record.get("marker")
    )


def _run(deployment: Deployment, conf: dict[str, Any]) -> dict[str, Any]:
    response = deployment.api.trigger(DAG, conf)
    assert response.status_code == 200, response.text
    return deployment.api.wait_for_run(DAG, response.json()["dag_run_id"])


def _record_a_failure(
    deployment: Deployment, bucket: Bucket, key: str, doc_id: int, conf: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """Upload a PDF the stand-in answers with garbage and let a named run fail it (a recorded failure)."""
    flaky = bucket.put_pdf(key, doc_id=doc_id)
    deployment.standin.configure(always={f"{doc_id}:1": "garbage"})
    run = _run(deployment, {**conf, "documents": [flaky]})
    manifest = bucket.manifest(conf.get("output_uri") or deployment.output_uri, DAG, run["dag_run_id"])
    assert manifest is not None and documents(manifest)[flaky]["status"] == "failed", manifest and statuses(manifest)
    assert run["state"] == "failed", "one failed document of one is over the budget"
    return flaky, run


def test_a_rest_documents_run_beside_a_failure_converts_exactly_its_document_and_concurrent_runs_redrive_once(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None, prefix: str
) -> None:
    conf = {"input_uri": bucket.uri(f"{prefix}input/"), "output_uri": bucket.uri(f"{prefix}output/")}
    output = conf["output_uri"]
    since = deployment.standin.stats()["total"]
    flaky, failing = _record_a_failure(deployment, bucket, f"{prefix}input/flaky.pdf", 231, conf)
    one_attempt = _pages_requested(deployment, since)[231]
    assert one_attempt > 0

    # A run naming one fresh document: exactly that document, no re-drive of the failure, green.
    fresh = bucket.put_pdf(f"{prefix}input/fresh.pdf", pages=2, doc_id=232)
    since = deployment.standin.stats()["total"]
    named = _run(deployment, {**conf, "documents": [fresh]})
    manifest = bucket.manifest(output, DAG, named["dag_run_id"])
    assert manifest is not None
    assert sources(manifest) == [fresh], statuses(manifest)
    assert converted(manifest) == [fresh] and manifest["counts"]["redriven"] == 0
    assert named["state"] == "success", manifest["error_budget"]
    assert _pages_requested(deployment, since) == Counter({232: 2}), "only the named document's pages"

    # Two reconciliation runs at once, once the failure's next attempt is due (one schedule interval).
    new = bucket.put_pdf(f"{prefix}input/new.pdf", doc_id=233)
    due = datetime.fromisoformat(failing["run_after"]) + INTERVAL
    wait_until(lambda: datetime.now(due.tzinfo) >= due or None, 2 * INTERVAL.total_seconds(), 1, what="retry due")
    since = deployment.standin.stats()["total"]
    responses = [deployment.api.trigger(DAG, {**conf, "scope": "all"}) for _ in range(2)]
    assert all(response.status_code == 200 for response in responses), [response.text for response in responses]
    runs = [deployment.api.wait_for_run(DAG, response.json()["dag_run_id"]) for response in responses]
    manifests = [bucket.manifest(output, DAG, run["dag_run_id"]) for run in runs]
    assert all(manifest is not None for manifest in manifests)
    entries = [documents(manifest)[flaky] for manifest in manifests if flaky in documents(manifest)]
    tried = [entry for entry in entries if entry["status"] == "failed"]
    assert len(tried) == 1 and tried[0]["redriven"] is True, entries
    # The other run found it claimed, or cooling down after the first one's failure: left for later.
    assert all(entry["skip_reason"] in ("claimed", "retry_later") for entry in entries if entry not in tried)
    assert sum(converted(manifest).count(new) for manifest in manifests) == 1, [statuses(m) for m in manifests]
    requested = _pages_requested(deployment, since)
    assert requested[231] == one_attempt, f"re-driven once, not twice: {requested}"
    assert requested[233] == 1 and set(requested) == {231, 233}, requested
    # A re-driven failure never turns a run red whose own documents converted.
    assert [run["state"] for run in runs] == ["success", "success"], [m["error_budget"] for m in manifests]


def test_an_event_run_beside_a_failure_converts_exactly_its_document(
    deployment: Deployment,
    bucket: Bucket,
    ingest_unpaused: None,
    prefix: str,
    scheduled_prefix: str,
    unpause: Any,
) -> None:
    # The failure lies under the event DAG's own input (the DAGs' default), where event runs used to
    # re-drive it; the notified object lies outside it, so scheduled runs never list it.
    flaky, _ = _record_a_failure(deployment, bucket, f"{scheduled_prefix}flaky.pdf", 241, {})
    key = f"{prefix}events/{prefix.strip('/')}.pdf"
    fresh = bucket.put_pdf(key, doc_id=242)
    earlier = {run["dag_run_id"] for run in deployment.api.dag_runs(EVENTS_DAG)}
    bucket.sqs.send_message(QueueUrl=deployment.queue_url, MessageBody=s3_notification(bucket.name, key))
    unpause(EVENTS_DAG)
    deployment.api.reparse(EVENTS_DAG)

    def finished_runs() -> list[tuple[dict[str, Any], dict[str, Any]]] | None:
        runs = [run for run in deployment.api.dag_runs(EVENTS_DAG) if run["dag_run_id"] not in earlier]
        if not runs or any(run["state"] not in ("success", "failed") for run in runs):
            return None
        found = [(run, bucket.manifest(deployment.output_uri, EVENTS_DAG, run["dag_run_id"])) for run in runs]
        return found if all(manifest is not None for _, manifest in found) else None

    ((run, manifest),) = wait_until(finished_runs, 300, 3, what="the event run")
    assert sources(manifest) == [fresh], statuses(manifest)
    assert converted(manifest) == [fresh] and manifest["counts"]["redriven"] == 0
    assert flaky not in sources(manifest)
    assert run["state"] == "success", manifest["error_budget"]
