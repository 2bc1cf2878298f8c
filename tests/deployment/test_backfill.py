"""Backfills created through ``POST /api/v2/backfills`` and run by the scheduler on the Celery workers.

The PDFs are placed in three past one-minute intervals (their LastModified set as if uploaded then),
plus one just before and one just after the range. Each backfill run must convert only its own
interval's PDFs, even with a lookback (it applies to scheduled runs only); a second backfill over
the same range (``reprocess_behavior`` "completed", so Airflow really runs every date again) converts
nothing and leaves the outputs untouched; one more with the ``reprocess`` Param converts them all
again, as the README says.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from olmocr_testkit.bucket import Bucket, split_s3
from olmocr_testkit.cluster import Deployment, wait_until
from tests.deployment.published import assert_outputs_name_their_pages, converted, sources, statuses

pytestmark = [pytest.mark.deployment, pytest.mark.timeout(1500)]

DAG = "olmocr_ingest"
MINUTE = timedelta(minutes=1)
SECOND = timedelta(seconds=1)


def run_backfill(deployment: Deployment, start: datetime, end: datetime, **body: Any) -> list[dict[str, Any]]:
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


@dataclass
class Backfilled:
    start: datetime
    last: datetime
    conf: dict[str, Any]
    output_uri: str
    expected: list[dict[str, int]]  # per interval: source URI -> doc id
    doc_ids: dict[str, int]
    outside: list[str]
    runs: list[dict[str, Any]]  # the first backfill's
    manifests: list[dict[str, Any]]  # what the first backfill's runs published
    stamps: dict[str, datetime]  # LastModified of their markdown after the first backfill
    again: list[dict[str, Any]]  # the second backfill's runs (reprocess_behavior "completed")
    # What the second backfill's runs published and the markdown stamps right after it, read in the
    # fixture: a later test's backfill over the same dates republishes the same run ids' manifests.
    again_manifests: list[dict[str, Any] | None]
    stamps_after_again: dict[str, datetime]


@pytest.fixture(scope="module")
def backfilled(deployment: Deployment, bucket: Bucket, ingest_unpaused: None) -> Backfilled:
    """Three intervals three hours before this session (no scheduled run touched them), backfilled twice."""
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=3)
    prefix = f"backfill-{start:%H%M}-{uuid.uuid4().hex[:6]}/"
    output_uri = bucket.uri(prefix + "output/")
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
    # A lookback of one interval (the deployment's default is 0) would make each run list its
    # neighbour's interval too; backfill runs do not look back, so each converts only its own.
    conf = {"input_uri": bucket.uri(prefix + "input/"), "output_uri": output_uri, "lookback_intervals": 1}
    last = start + 2 * MINUTE
    runs = run_backfill(deployment, start, last, dag_run_conf=conf)
    manifests = [bucket.manifest(output_uri, DAG, run["dag_run_id"]) for run in runs]
    stamps = _markdown_stamps(bucket, [manifest for manifest in manifests if manifest is not None])
    again = run_backfill(deployment, start, last, dag_run_conf=conf, reprocess_behavior="completed")
    again_manifests = [bucket.manifest(output_uri, DAG, run["dag_run_id"]) for run in again]
    stamps_after_again = _markdown_stamps(bucket, [manifest for manifest in manifests if manifest is not None])
    return Backfilled(
        start,
        last,
        conf,
        output_uri,
        expected,
        doc_ids,
        outside,
        runs,
        manifests,
        stamps,
        again,
        again_manifests,
        stamps_after_again,
    )


def _markdown_stamps(bucket: Bucket, manifests: list[dict[str, Any]]) -> dict[str, datetime]:
    outputs = {doc["outputs"]["markdown"] for manifest in manifests for doc in manifest["documents"]}
    return {uri: bucket.last_modified(split_s3(uri)[1]) for uri in outputs}


def test_backfill_runs_convert_only_their_own_intervals_and_a_second_backfill_nothing(
    deployment: Deployment, bucket: Bucket, backfilled: Backfilled
) -> None:
    runs = backfilled.runs
    assert [datetime.fromisoformat(run["logical_date"]) for run in runs] == [
        backfilled.start + i * MINUTE for i in range(3)
    ]
    for run, manifest, wanted in zip(runs, backfilled.manifests, backfilled.expected, strict=True):
        assert run["state"] == "success", run
        assert manifest is not None, f"{run['dag_run_id']} published no manifest"
        assert converted(manifest) == sorted(wanted), (
            run["dag_run_id"],
            run["data_interval_start"],
            statuses(manifest),
        )
        assert sources(manifest) == sorted(wanted), "each of the interval's PDFs listed exactly once"
        assert_outputs_name_their_pages(bucket, manifest, backfilled.doc_ids)
    assert not any(uri in sources(manifest) for manifest in backfilled.manifests for uri in backfilled.outside)

    again = backfilled.again
    assert len(again) == 3
    for run, first, manifest, wanted in zip(
        again, backfilled.manifests, backfilled.again_manifests, backfilled.expected, strict=True
    ):
        assert run["state"] == "success", run
        assert manifest is not None
        # The same run id publishes to the same key: a manifest the second pass did not replace would
        # still list the first pass's conversions and read as a double conversion.
        assert manifest["finished_at"] > first["finished_at"], (
            f"the second backfill did not publish {run['dag_run_id']} again (Airflow says {run['state']}, "
            f"started {run['start_date']}, ended {run['end_date']}; manifest finished {manifest['finished_at']})"
        )
        assert converted(manifest) == [], (run["dag_run_id"], statuses(manifest))
        assert manifest["counts"]["already_converted"] + manifest["counts"]["skipped"] == len(wanted)
    assert backfilled.stamps_after_again == backfilled.stamps, "a second backfill rewrote outputs"


def test_backfill_with_the_reprocess_param_converts_every_interval_again(
    deployment: Deployment, bucket: Bucket, backfilled: Backfilled
) -> None:
    """The README: ``reprocess=true`` forces a reconversion; here on dates that already have runs.

    The runs are cleared and run again (``reprocess_behavior`` "completed"), after a previous pass in
    which they had nothing to convert (``convert`` mapped to no instance): each must convert its
    interval's PDFs again and say so in its manifest.
    """
    forced = run_backfill(
        deployment,
        backfilled.start,
        backfilled.last,
        dag_run_conf={**backfilled.conf, "reprocess": True},
        reprocess_behavior="completed",
    )

    assert len(forced) == 3
    for run, wanted in zip(forced, backfilled.expected, strict=True):
        manifest = bucket.manifest(backfilled.output_uri, DAG, run["dag_run_id"])
        assert manifest is not None
        assert converted(manifest) == sorted(wanted), (run["dag_run_id"], run["conf"], statuses(manifest))
        assert sources(manifest) == sorted(wanted), "each of the interval's PDFs listed exactly once"
        assert run["state"] == "success", run
