"""The scheduler's own runs re-drive a document that failed in an earlier run (issue 12, item 1).

A PDF arrives late, into an interval whose run has finished, so the next scheduled run lists it
through its lookback; there it fails: the stand-in answers its only page with garbage, so the
document ends ``failed`` with a recorded reason (not an outage). Once the fault is gone, a later
scheduled run converts it although its LastModified lies before that run's whole listing window
(its interval and the lookback): only the re-drive of recorded failures can bring it back.
"""

from __future__ import annotations

from typing import Any

import pytest

from olmocr_testkit.bucket import Bucket
from olmocr_testkit.cluster import Deployment, wait_until
from tests.deployment.published import assert_outputs_name_their_pages, converted, documents, only, sources, statuses
from tests.deployment.schedule import (
    FINISHED,
    RUN_TIMEOUT_S,
    interval,
    listing_window,
    next_interval_end,
    now,
    plan_started,
    run_ending,
    scheduled_runs,
    upload_late,
)

pytestmark = [pytest.mark.deployment, pytest.mark.timeout(1500)]

DAG = "olmocr_ingest"
DOC_ID = 211
# Every request for the document's only page gets an answer that is no olmOCR output.
FAULT = {f"{DOC_ID}:1": "garbage"}


def test_a_later_scheduled_run_redrives_a_failed_document_outside_its_own_window(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None, scheduled_prefix: str
) -> None:
    key = f"{scheduled_prefix}flaky.pdf"
    source = bucket.uri(key)
    # The shared_deployment_restored fixture removes the fault should the test end before it does.
    deployment.standin.configure(always=FAULT)
    finished, uploaded = upload_late(deployment, bucket, key, doc_id=DOC_ID)
    first = run_ending(deployment, next_interval_end(finished))
    failing = bucket.manifest(deployment.output_uri, DAG, first["dag_run_id"])
    assert failing is not None, "the scheduled run that listed the document published no manifest"
    assert sources(only(failing, bucket.uri(scheduled_prefix))) == [source], statuses(failing)
    entry = documents(failing)[source]
    assert entry["status"] == "failed" and entry["error_class"] and entry["error"], entry
    assert entry["failed_attempts"] == 1
    # One failed document of few is over the default error budget: the run fails after publishing.
    assert first["state"] == "failed"
    deployment.standin.configure(always={page: None for page in FAULT})
    healed = now()
    first_end = interval(first)[1]

    def later_runs_until_converted() -> list[tuple[dict[str, Any], dict[str, Any]]] | None:
        """The finished scheduled runs after ``first``, in interval order, up to the one converting it."""
        seen = []
        for run in (run for run in scheduled_runs(deployment) if interval(run)[1] > first_end):
            if run["state"] not in FINISHED:
                return None
            manifest = bucket.manifest(deployment.output_uri, DAG, run["dag_run_id"])
            assert manifest is not None, f"scheduled run {run['dag_run_id']} published no manifest"
            seen.append((run, manifest))
            if converted(only(manifest, source)) == [source]:
                return seen
        return None

    # Usually the next run; one more if that run planned before the fault was removed.
    later = wait_until(
        later_runs_until_converted, 2 * RUN_TIMEOUT_S, 3, what=f"a scheduled run after {first_end} converting {source}"
    )
    *while_failing, (redriving, manifest) = later
    for run, earlier in while_failing:
        # Planned while the fault stood: re-driven, and failed again (still short of a dead letter).
        started = plan_started(deployment, run)
        assert started is not None and started < healed, run["dag_run_id"]
        assert statuses(earlier).get(source, "").startswith("failed"), statuses(earlier)

    # Its LastModified lies before the whole window the converting run listed: only the re-drive found it.
    assert uploaded <= listing_window(redriving)[0], (uploaded, listing_window(redriving))
    assert redriving["state"] == "success", statuses(manifest)
    assert manifest["airflow_run"]["run_type"] == "scheduled"
    assert_outputs_name_their_pages(bucket, {"documents": [documents(manifest)[source]]}, {source: DOC_ID})
