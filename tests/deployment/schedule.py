"""The scheduler's own runs of ``olmocr_ingest`` as the scheduled tests read them: intervals, plans, late uploads.

The deployment schedules ``olmocr_ingest`` every minute with the default lookback of one interval,
so a scheduled run lists ``(start - 1 interval, end]``. Times come from Airflow's REST API and from
moto, both on this machine's clock.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from olmocr_testkit.bucket import Bucket
from olmocr_testkit.cluster import Deployment, wait_until

DAG = "olmocr_ingest"
MINUTE = timedelta(minutes=1)
FINISHED = ("success", "failed")
# OLMOCR_LOOKBACK_INTERVALS is not set by the deployment: its scheduled runs use the default.
LOOKBACK_INTERVALS = 1
# How long one scheduled run may take to be created, run and publish on a loaded 2-core machine that
# also runs other test sessions: intervals end every minute, runs usually finish within one.
RUN_TIMEOUT_S = 600


def interval(run: dict[str, Any]) -> tuple[datetime, datetime]:
    return datetime.fromisoformat(run["data_interval_start"]), datetime.fromisoformat(run["data_interval_end"])


def listing_window(run: dict[str, Any]) -> tuple[datetime, datetime]:
    """The LastModified window ``(after, until]`` a scheduled run lists, lookback included."""
    start, end = interval(run)
    return start - (end - start) * LOOKBACK_INTERVALS, end


def scheduled_runs(deployment: Deployment) -> list[dict[str, Any]]:
    """The scheduler's runs of the ingestion DAG, oldest interval first."""
    return sorted(deployment.api.dag_runs(DAG, run_type="scheduled"), key=lambda run: interval(run)[1])


def plan_instance(deployment: Deployment, run: dict[str, Any]) -> dict[str, Any] | None:
    found = [ti for ti in deployment.api.task_instances(DAG, run["dag_run_id"]) if ti["task_id"] == "plan"]
    return found[0] if found else None


def plan_started(deployment: Deployment, run: dict[str, Any]) -> datetime | None:
    plan = plan_instance(deployment, run)
    return datetime.fromisoformat(plan["start_date"]) if plan and plan.get("start_date") else None


def run_ending(deployment: Deployment, end: datetime, timeout: float = RUN_TIMEOUT_S) -> dict[str, Any]:
    """The scheduled run of the interval ending at ``end``, once it has finished."""

    def created() -> dict[str, Any] | None:
        return next((run for run in scheduled_runs(deployment) if interval(run)[1] == end), None)

    run = wait_until(created, timeout, 3, what=f"scheduled run of the interval ending {end}")
    return deployment.api.wait_for_run(DAG, run["dag_run_id"], timeout=timeout)


def upload_late(
    deployment: Deployment, bucket: Bucket, key: str, *, doc_id: int, timeout: float = RUN_TIMEOUT_S
) -> tuple[dict[str, Any], datetime]:
    """Upload a PDF whose LastModified lies in an interval whose scheduled run has already listed it.

    That is what a late upload looks like to the scheduler (or a multipart upload, whose LastModified
    is when it started): the run of its interval finished without it. The chosen interval is the
    latest one whose run has finished while the run after it has not started planning, so only the
    next run can still list it through its lookback. Returns that finished run and the LastModified.
    """

    def finished_run_with_unplanned_successor() -> dict[str, Any] | None:
        runs = scheduled_runs(deployment)
        by_end = {interval(run)[1]: run for run in runs}
        for run in reversed(runs):
            if run["state"] not in FINISHED:
                continue
            start, end = interval(run)
            successor = by_end.get(end + (end - start))
            if successor is not None and plan_started(deployment, successor) is not None:
                return None  # too late for this interval: wait for the next one to finish
            return run
        return None

    finished = wait_until(
        finished_run_with_unplanned_successor, timeout, 1, what="a finished scheduled run, its successor not planning"
    )
    start, end = interval(finished)
    moment = start + (end - start) / 2
    bucket.put_pdf(key, doc_id=doc_id, last_modified=moment)
    uploaded = bucket.last_modified(key)
    assert start < uploaded <= end, (start, uploaded, end)
    return finished, uploaded


def next_interval_end(run: dict[str, Any]) -> datetime:
    start, end = interval(run)
    return end + (end - start)


def now() -> datetime:
    return datetime.now(UTC)
