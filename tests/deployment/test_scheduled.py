"""The scheduler's own runs of ``olmocr_ingest``: configured only by its environment, real data intervals.

The deployment sets ``OLMOCR_SCHEDULE`` to every minute and ``OLMOCR_INPUT_URI`` /
``OLMOCR_OUTPUT_URI`` to the ``scheduled/`` prefixes, and leaves the lookback at its default of one
interval; the test never passes a conf. It waits for the scheduler to run the interval that holds
the PDFs uploaded now, with one PDF before the run's lookback window and one just after its interval
(their LastModified set as if uploaded then). Then it uploads a PDF late, into an interval whose run
has already finished (as a multipart upload or a slow writer would): the next scheduled run must
convert it through its lookback, and must not convert again what the earlier run converted.

The test's PDFs lie in a folder of its own under that shared input. The runs list other tests' PDFs
there too (and re-drive their failures), so the exact checks are about the test's own folder, and the
count of PDFs a run found already converted is checked against what S3 holds in its window.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

from olmocr_testkit.bucket import Bucket
from olmocr_testkit.cluster import Deployment
from tests.deployment.published import assert_outputs_name_their_pages, converted, only, sources, statuses
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


def _already_converted_in_window(
    bucket: Bucket, deployment: Deployment, run: dict[str, Any], manifest: dict[str, Any]
) -> list[str]:
    """The PDFs under the DAGs' input in the run's listing window that its manifest does not list.

    A run lists every PDF of its window; one it neither converts nor fails nor skips is one it found
    already converted, which its manifest only counts. Read from S3, so other tests' PDFs in the
    shared input count as they should.
    """
    after, until = listing_window(run)
    base = deployment.input_uri.removeprefix(f"s3://{bucket.name}/")
    windowed = [
        bucket.uri(item["Key"])
        for page in bucket.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket.name, Prefix=base)
        for item in page.get("Contents", [])
        if item["Key"].lower().endswith(".pdf") and after < item["LastModified"] <= until
    ]
    listed = set(sources(manifest))
    return sorted(uri for uri in windowed if uri not in listed)


def test_scheduled_runs_convert_their_window_and_pick_up_a_late_upload(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None, scheduled_prefix: str
) -> None:
    own = bucket.uri(scheduled_prefix)
    # Upload well inside one interval. S3 keeps LastModified to the second, rounded down, so an upload
    # in an interval's first second is dated at the end of the interval before.
    while not 2 <= now().second < 50:
        time.sleep(1)
    tick = now().replace(second=0, microsecond=0) + MINUTE
    inside = {
        bucket.put_pdf(f"{scheduled_prefix}inside-1.pdf", pages=2, doc_id=201): 201,
        bucket.put_pdf(f"{scheduled_prefix}deeper/inside-2.pdf", doc_id=202): 202,
    }
    # Before the lookback window of the run ending at ``tick`` (it starts one interval before its own).
    before = bucket.put_pdf(f"{scheduled_prefix}before.pdf", doc_id=203, last_modified=tick - 2 * MINUTE - 20 * SECOND)
    after = bucket.put_pdf(f"{scheduled_prefix}after.pdf", doc_id=204, last_modified=tick + 20 * SECOND)
    assert tick - MINUTE < bucket.last_modified(f"{scheduled_prefix}inside-1.pdf") <= tick

    # The scheduler creates the run once its interval (tick - 1 min, tick] has ended.
    run = run_ending(deployment, tick)

    assert run["state"] == "success"
    assert interval(run) == (tick - MINUTE, tick)
    assert listing_window(run)[0] == tick - 2 * MINUTE
    assert run["conf"] in ({}, None)
    manifest = bucket.manifest(deployment.output_uri, DAG, run["dag_run_id"])
    assert manifest is not None, "the scheduled run published no manifest"
    # Exactly the PDFs of its window among this test's (``before`` and ``after`` lie outside), each once.
    assert sources(only(manifest, own)) == sorted(inside), statuses(manifest)
    assert converted(only(manifest, own)) == sorted(inside)
    assert manifest["input_uri"] == deployment.input_uri
    assert_outputs_name_their_pages(bucket, only(manifest, own), inside)
    del before  # named for the reader: it lies before every window this test reads

    # A late upload: its LastModified lies in an interval whose run already listed the input without it.
    late_key = f"{scheduled_prefix}late/multipart.pdf"
    finished, uploaded = upload_late(deployment, bucket, late_key, doc_id=205)
    late = bucket.uri(late_key)
    finished_manifest = bucket.manifest(deployment.output_uri, DAG, finished["dag_run_id"])
    assert finished_manifest is not None
    assert late not in sources(finished_manifest)

    successor = run_ending(deployment, next_interval_end(finished))
    start, _ = interval(successor)
    after_, until = listing_window(successor)
    assert after_ < uploaded <= start, "the late upload must lie before the next run's own interval"
    picked_up = bucket.manifest(deployment.output_uri, DAG, successor["dag_run_id"])
    assert picked_up is not None, "the next scheduled run published no manifest"
    # Of this test's PDFs it lists exactly the late one, and ``after`` when it is the run of the
    # interval ``after`` lies in (otherwise that earlier run converted it), each converted once.
    expected_own = sorted([late, after] if interval(successor)[1] == tick + MINUTE else [late])
    assert converted(only(picked_up, own)) == sources(only(picked_up, own)) == expected_own, statuses(picked_up)
    assert_outputs_name_their_pages(bucket, only(picked_up, own), {late: 205, after: 204})
    # The overlap is free: what earlier runs converted and this one lists again is only counted.
    skipped = _already_converted_in_window(bucket, deployment, successor, picked_up)
    assert picked_up["counts"]["already_converted"] == len(skipped), (skipped, picked_up["counts"])
    # This test's PDFs the earlier runs converted and this window holds again are among them.
    relisted = {
        uri
        for uri in [*inside, after]
        if after_ < bucket.last_modified(uri.removeprefix(f"s3://{bucket.name}/")) <= until and uri not in expected_own
    }
    assert relisted <= set(skipped), (relisted, skipped)
    assert not set(converted(finished_manifest)) & set(converted(picked_up))
