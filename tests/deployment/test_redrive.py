"""The scheduler's own runs re-drive a document that failed in an earlier interval (issue 12, item 1).

A PDF uploaded inside one interval fails there: the stand-in answers its only page with garbage, so
the document ends ``failed`` with a recorded reason (not an outage). Once the fault is gone, the next
scheduled run converts it although its LastModified lies in the earlier interval: with the
deployment's lookback of 0 a run lists only its own interval, so only the re-drive of recorded
failures can bring it back.

The lookback overlap (item 2) is not exercised here: the deployment pins ``OLMOCR_LOOKBACK_INTERVALS``
to 0 for every scheduled run (the other scheduled tests tell runs apart by interval), and scheduled
runs take no conf, so no run of this shared deployment looks back.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.deployment.corpus import Bucket, assert_outputs_name_their_pages, converted, documents, statuses
from tests.deployment.harness import Deployment, wait_until

pytestmark = [pytest.mark.deployment, pytest.mark.timeout(1500)]

DAG = "olmocr_ingest"
MINUTE = timedelta(minutes=1)
DOC_ID = 211
# Every request for the document's only page gets an answer that is no olmOCR output.
FAULT = {f"{DOC_ID}:1": "garbage"}
# How long a scheduled run may take to be created, run and publish on a loaded 2-core machine that
# also runs other test sessions: interval ends every minute, runs usually finish within one.
RUN_TIMEOUT_S = 600


def _next_tick(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0) + MINUTE


def _interval(run: dict[str, Any]) -> tuple[datetime, datetime]:
    return datetime.fromisoformat(run["data_interval_start"]), datetime.fromisoformat(run["data_interval_end"])


def _plan_started(deployment: Deployment, run: dict[str, Any]) -> datetime:
    [plan] = [ti for ti in deployment.api.task_instances(DAG, run["dag_run_id"]) if ti["task_id"] == "plan"]
    return datetime.fromisoformat(plan["start_date"])


def test_next_scheduled_run_redrives_a_document_that_failed_in_an_earlier_interval(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None
) -> None:
    deployment.standin.configure(always=FAULT)
    try:
        # Upload well inside one interval: S3 keeps LastModified to the second.
        if datetime.now(UTC).second >= 50:
            time.sleep(61 - datetime.now(UTC).second)
        tick = _next_tick(datetime.now(UTC))
        source = bucket.put_pdf("scheduled/input/redrive/flaky.pdf", doc_id=DOC_ID)
        uploaded = bucket.last_modified("scheduled/input/redrive/flaky.pdf")
        assert tick - MINUTE < uploaded <= tick

        def scheduled_run() -> dict[str, Any] | None:
            for run in deployment.api.dag_runs(DAG, run_type="scheduled"):
                if _interval(run)[1] == tick:
                    return run
            return None

        first = wait_until(scheduled_run, RUN_TIMEOUT_S, 3, what=f"scheduled run of the interval ending {tick}")
        first = deployment.api.wait_for_run(DAG, first["dag_run_id"], timeout=RUN_TIMEOUT_S)
        failing = bucket.manifest(deployment.output_uri, DAG, first["dag_run_id"])
        assert failing is not None, "the first scheduled run published no manifest"
        entry = documents(failing).get(source)
        assert entry is not None, statuses(failing)
        assert entry["status"] == "failed" and entry["error_class"] and entry["error"], entry
        assert entry["failed_attempts"] == 1
        # One failed document of few is over the default error budget: the run fails after publishing.
        assert first["state"] == "failed"
    finally:
        deployment.standin.configure(always={key: None for key in FAULT})
    healed = datetime.now(UTC)

    def later_runs_until_converted() -> list[tuple[dict[str, Any], dict[str, Any]]] | None:
        """The finished scheduled runs after ``tick``, in interval order, up to the one converting it."""
        runs = sorted(
            (run for run in deployment.api.dag_runs(DAG, run_type="scheduled") if _interval(run)[1] > tick),
            key=lambda run: _interval(run)[1],
        )
        seen = []
        for run in runs:
            if run["state"] not in ("success", "failed"):
                return None
            manifest = bucket.manifest(deployment.output_uri, DAG, run["dag_run_id"])
            assert manifest is not None, f"scheduled run {run['dag_run_id']} published no manifest"
            seen.append((run, manifest))
            if source in converted(manifest):
                return seen
        return None

    # Usually the very next interval's run; one more if that run planned before the fault was removed.
    later = wait_until(
        later_runs_until_converted, 2 * RUN_TIMEOUT_S, 3, what=f"a scheduled run after {tick} converting {source}"
    )
    *while_failing, (redriving, manifest) = later
    for run, earlier in while_failing:
        # Planned while the fault stood: re-driven, and failed again (still short of a dead letter).
        assert _plan_started(deployment, run) < healed, run["dag_run_id"]
        assert statuses(earlier).get(source, "").startswith("failed"), statuses(earlier)

    start, _ = _interval(redriving)
    assert start >= tick >= uploaded, "the re-driving run's own interval does not hold the document"
    assert redriving["state"] == "success", statuses(manifest)
    assert manifest["airflow_run"]["run_type"] == "scheduled"
    assert_outputs_name_their_pages(bucket, {"documents": [documents(manifest)[source]]}, {source: DOC_ID})
