"""Backfills created through ``POST /api/v2/backfills`` and run by the scheduler on the Celery workers.

The PDFs are placed in three past one-minute intervals (their LastModified set as if uploaded then),
plus one just before and one just after the range. Each backfill run must convert only its own
interval's PDFs; a second backfill over the same range (``reprocess_behavior`` "completed", so Airflow
really runs every date again) converts nothing and leaves the outputs untouched; a third with the
``reprocess`` Param converts them all again, as the README says.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.deployment.corpus import Bucket, assert_outputs_name_their_pages, converted, documents, split_s3, statuses
from tests.deployment.harness import Deployment, wait_until

pytestmark = [pytest.mark.deployment, pytest.mark.timeout(1500)]

DAG = "olmocr_ingest"
MINUTE = timedelta(minutes=1)
SECOND = timedelta(seconds=1)


def _backfill(deployment: Deployment, start: datetime, end: datetime, **body: Any) -> list[dict[str, Any]]:
    """Create a backfill over the logical dates [start, end], wait until it completes; its runs by logical date."""
    payload = {"dag_id": DAG, "from_date": start.isoformat(), "to_date": end.isoformat(), **body}
    backfill = deployment.api.ok("POST", "/api/v2/backfills", json=payload)

    def completed() -> bool:
        return deployment.api.ok("GET", f"/api/v2/backfills/{backfill['id']}")["completed_at"] is not None

    wait_until(completed, timeout=900, interval=3, what=f"backfill {backfill['id']} completed")
    runs = deployment.api.dag_runs(
        DAG, run_type="backfill", logical_date_gte=start.isoformat(), logical_date_lte=end.isoformat()
    )
    return sorted(runs, key=lambda run: run["logical_date"])


def test_backfill_runs_convert_only_their_own_intervals(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None
) -> None:
    # Three intervals an hour before this session: no scheduled run can have touched them.
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=3)
    prefix = f"backfill-{start:%H%M}/"
    input_uri, output_uri = bucket.uri(prefix + "input/"), bucket.uri(prefix + "output/")
    expected: list[dict[str, int]] = [{}, {}, {}]
    doc_ids: dict[str, int] = {}
    for interval, offsets in enumerate(([30], [10, 50], [59])):
        for number, offset in enumerate(offsets):
            doc_id = 110 + 10 * interval + number
            key = f"{prefix}input/interval-{interval}-{number}.pdf"
            uri = bucket.put_pdf(key, doc_id=doc_id, last_modified=start + interval * MINUTE + offset * SECOND)
            expected[interval][uri] = doc_id
            doc_ids[uri] = doc_id
    outside = [
        bucket.put_pdf(f"{prefix}input/before.pdf", doc_id=140, last_modified=start - 20 * SECOND),
        bucket.put_pdf(f"{prefix}input/after.pdf", doc_id=141, last_modified=start + 3 * MINUTE + 20 * SECOND),
    ]
    conf = {"input_uri": input_uri, "output_uri": output_uri}
    last = start + 2 * MINUTE

    runs = _backfill(deployment, start, last, dag_run_conf=conf)

    assert [datetime.fromisoformat(run["logical_date"]) for run in runs] == [start + i * MINUTE for i in range(3)]
    manifests = []
    for run, wanted in zip(runs, expected, strict=True):
        assert run["state"] == "success", run
        manifest = bucket.manifest(output_uri, DAG, run["dag_run_id"])
        assert manifest is not None, f"{run['dag_run_id']} published no manifest"
        assert converted(manifest) == set(wanted), (run["dag_run_id"], run["data_interval_start"], statuses(manifest))
        assert set(documents(manifest)) == set(wanted)
        assert_outputs_name_their_pages(bucket, manifest, doc_ids)
        manifests.append(manifest)
    assert not any(uri in documents(manifest) for manifest in manifests for uri in outside)
    outputs = {doc["outputs"]["markdown"] for manifest in manifests for doc in manifest["documents"]}
    written = {uri: bucket.s3.head_object(Bucket=split_s3(uri)[0], Key=split_s3(uri)[1])["ETag"] for uri in outputs}
    stamps = {uri: bucket.last_modified(split_s3(uri)[1]) for uri in outputs}

    again = _backfill(deployment, start, last, dag_run_conf=conf, reprocess_behavior="completed")

    assert len(again) == 3
    for run, wanted in zip(again, expected, strict=True):
        assert run["state"] == "success", run
        manifest = bucket.manifest(output_uri, DAG, run["dag_run_id"])
        assert manifest is not None
        assert converted(manifest) == set(), (run["dag_run_id"], statuses(manifest))
        assert manifest["counts"]["already_converted"] + manifest["counts"]["skipped"] == len(wanted)
    assert {uri: bucket.last_modified(split_s3(uri)[1]) for uri in outputs} == stamps

    forced = _backfill(
        deployment, start, last, dag_run_conf={**conf, "reprocess": True}, reprocess_behavior="completed"
    )

    for run, wanted in zip(forced, expected, strict=True):
        manifest = bucket.manifest(output_uri, DAG, run["dag_run_id"])
        assert manifest is not None
        assert converted(manifest) == set(wanted), (run["dag_run_id"], run["conf"], statuses(manifest))
    assert set(written) == outputs
