"""The scheduler's own runs of ``olmocr_ingest``: configured only by its environment, real data intervals.

The deployment sets ``OLMOCR_SCHEDULE`` to every minute and ``OLMOCR_INPUT_URI`` /
``OLMOCR_OUTPUT_URI`` to the ``scheduled/`` prefixes, and leaves the lookback at its default of one
interval; the test never passes a conf. It waits for the scheduler to run the interval that holds
the PDFs uploaded now, with one PDF before the run's lookback window and one just after its interval
(their LastModified set as if uploaded then). Then it uploads a PDF late, into an interval whose run
has already finished (as a multipart upload or a slow writer would): the next scheduled run must
convert it through its lookback, and must not convert again what the earlier run converted.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from tests.deployment.corpus import Bucket, assert_outputs_name_their_pages, converted, documents
from tests.deployment.harness import Deployment
from tests.deployment.schedule import (
    MINUTE,
    interval,
    listing_window,
    next_interval_end,
    now,
    run_ending,
    upload_late,
)

pytestmark = [pytest.mark.deployment, pytest.mark.timeout(1500)]

DAG = "olmocr_ingest"
SECOND = timedelta(seconds=1)


def test_scheduled_runs_convert_their_window_and_pick_up_a_late_upload(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None
) -> None:
    # Upload well inside one interval. S3 keeps LastModified to the second, rounded down, so an upload
    # in an interval's first second is dated at the end of the interval before.
    while not 2 <= now().second < 50:
        time.sleep(1)
    tick = now().replace(second=0, microsecond=0) + MINUTE
    inside = {
        bucket.put_pdf("scheduled/input/inside-1.pdf", pages=2, doc_id=201): 201,
        bucket.put_pdf("scheduled/input/deeper/inside-2.pdf", doc_id=202): 202,
    }
    # Before the lookback window of the run ending at ``tick`` (it starts one interval before its own).
    before = bucket.put_pdf("scheduled/input/before.pdf", doc_id=203, last_modified=tick - 2 * MINUTE - 20 * SECOND)
    after = bucket.put_pdf("scheduled/input/after.pdf", doc_id=204, last_modified=tick + 20 * SECOND)
    assert tick - MINUTE < bucket.last_modified("scheduled/input/inside-1.pdf") <= tick

    # The scheduler creates the run once its interval (tick - 1 min, tick] has ended.
    run = run_ending(deployment, tick)

    assert run["state"] == "success"
    assert interval(run) == (tick - MINUTE, tick)
    assert listing_window(run)[0] == tick - 2 * MINUTE
    assert run["conf"] in ({}, None)
    manifest = bucket.manifest(deployment.output_uri, DAG, run["dag_run_id"])
    assert manifest is not None, "the scheduled run published no manifest"
    assert set(documents(manifest)) == set(inside)
    assert converted(manifest) == set(inside)
    assert before not in documents(manifest) and after not in documents(manifest)
    assert manifest["input_uri"] == deployment.input_uri
    assert_outputs_name_their_pages(bucket, manifest, inside)

    # A late upload: its LastModified lies in an interval whose run already listed the input without it.
    finished, uploaded = upload_late(deployment, bucket, "scheduled/input/late/multipart.pdf", doc_id=205)
    late = bucket.uri("scheduled/input/late/multipart.pdf")
    finished_manifest = bucket.manifest(deployment.output_uri, DAG, finished["dag_run_id"])
    assert finished_manifest is not None
    assert late not in documents(finished_manifest)

    successor = run_ending(deployment, next_interval_end(finished))
    start, _ = interval(successor)
    after_, until = listing_window(successor)
    assert after_ < uploaded <= start, "the late upload must lie before the next run's own interval"
    picked_up = bucket.manifest(deployment.output_uri, DAG, successor["dag_run_id"])
    assert picked_up is not None, "the next scheduled run published no manifest"
    assert late in converted(picked_up), documents(picked_up).keys()
    assert_outputs_name_their_pages(bucket, {"documents": [documents(picked_up)[late]]}, {late: 205})
    # The overlap is free: what the earlier runs converted and the next one lists again is not converted again.
    relisted = {uri for uri in inside if after_ < bucket.last_modified(uri.split("/", 3)[3]) <= until}
    assert not (relisted | converted(finished_manifest)) & converted(picked_up)
    assert picked_up["counts"]["already_converted"] >= len(relisted)
