"""The scheduler's own runs of ``olmocr_ingest``: configured only by its environment, real data intervals.

The deployment sets ``OLMOCR_SCHEDULE`` to every minute and ``OLMOCR_INPUT_URI`` /
``OLMOCR_OUTPUT_URI`` to the ``scheduled/`` prefixes; the test never passes a conf. It waits for the
scheduler to run the interval that holds the PDFs uploaded now, with one PDF just before that interval
and one just after it (their LastModified set as if uploaded then).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from tests.deployment.corpus import Bucket, assert_outputs_name_their_pages, converted, documents
from tests.deployment.harness import Deployment, wait_until

pytestmark = [pytest.mark.deployment, pytest.mark.timeout(1500)]

DAG = "olmocr_ingest"
MINUTE = timedelta(minutes=1)


def _next_tick(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0) + MINUTE


def test_scheduled_run_converts_exactly_its_intervals_pdfs(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None
) -> None:
    # Upload well inside one interval: S3 keeps LastModified to the second.
    if datetime.now(UTC).second >= 50:
        time.sleep(61 - datetime.now(UTC).second)
    tick = _next_tick(datetime.now(UTC))
    inside = {
        bucket.put_pdf("scheduled/input/inside-1.pdf", pages=2, doc_id=201): 201,
        bucket.put_pdf("scheduled/input/deeper/inside-2.pdf", doc_id=202): 202,
    }
    before = bucket.put_pdf("scheduled/input/before.pdf", doc_id=203, last_modified=tick - MINUTE - 20 * SECOND)
    after = bucket.put_pdf("scheduled/input/after.pdf", doc_id=204, last_modified=tick + 20 * SECOND)
    assert all(tick - MINUTE < bucket.last_modified(key) <= tick for key in ("scheduled/input/inside-1.pdf",))

    # The scheduler creates the run once its interval (tick - 1 min, tick] has ended.
    def scheduled_run() -> dict | None:
        for run in deployment.api.dag_runs(DAG, run_type="scheduled"):
            if datetime.fromisoformat(run["data_interval_end"]) == tick:
                return run
        return None

    run = wait_until(scheduled_run, timeout=600, interval=3, what=f"scheduled run of the interval ending {tick}")
    run = deployment.api.wait_for_run(DAG, run["dag_run_id"])

    assert run["state"] == "success"
    assert datetime.fromisoformat(run["data_interval_start"]) == tick - MINUTE
    assert run["conf"] in ({}, None)
    manifest = bucket.manifest(deployment.output_uri, DAG, run["dag_run_id"])
    assert manifest is not None, "the scheduled run published no manifest"
    assert set(documents(manifest)) == set(inside)
    assert converted(manifest) == set(inside)
    assert before not in documents(manifest) and after not in documents(manifest)
    assert manifest["input_uri"] == deployment.input_uri
    assert_outputs_name_their_pages(bucket, manifest, inside)


SECOND = timedelta(seconds=1)
