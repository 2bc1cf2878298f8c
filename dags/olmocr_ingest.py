"""Convert new PDFs to markdown with olmOCR on vLLM, every interval, on demand or as a backfill.

    [check_server, plan] ─► convert[batch…] ─► publish_manifest ─► enforce_error_budget

* Scheduled and backfill runs convert the PDFs last modified in their data interval; manual and REST
  runs convert everything not converted yet (the ``scope`` Param changes this), or exactly the
  ``documents`` listed.
* One convert instance per document, small documents packed together when a run has more than
  ``[core] max_map_length`` of them; instances run in the ``olmocr_vllm`` pool.
* The manifest is published under ``<output>/manifests/`` even when documents failed; the run then
  fails if more than ``max_document_error_rate`` of them did.

Configuration (environment, read when the DAG is parsed): ``OLMOCR_SCHEDULE`` (cron, default hourly),
``OLMOCR_MAX_ACTIVE_RUNS`` (default 2), ``OLMOCR_START_DATE`` (first interval for backfills, default
2024-01-01), ``OLMOCR_INPUT_URI`` / ``OLMOCR_OUTPUT_URI`` (Param defaults). Connections:
``olmocr_vllm`` (server) and ``aws_default`` (S3, ``endpoint_url`` extra for MinIO and test servers).
Read when a task runs: ``OLMOCR_SERVER_READY_TIMEOUT`` (seconds ``check_server`` waits, deferred in the
triggerer, for a starting vLLM; default 1800). A failed run is reported through the notifier the
Airflow Variable ``olmocr_failure_notifier`` names (``olmocr_tasks.provider.notifications``); with
``apache-airflow-providers-openlineage`` configured, convert and publish report their datasets.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

from airflow.sdk import CronDataIntervalTimetable, dag

from olmocr_tasks.provider.flow import conversion_flow
from olmocr_tasks.provider.notifications import notify_run_failure
from olmocr_tasks.provider.params import ingest_params


@dag(
    dag_id="olmocr_ingest",
    # A data-interval timetable: each run owns the window (previous tick, this tick], which is what
    # discovery and backfills filter LastModified on. Plain cron strings would give empty windows.
    schedule=CronDataIntervalTimetable(os.environ.get("OLMOCR_SCHEDULE", "0 * * * *"), timezone="UTC"),
    start_date=datetime.fromisoformat(os.environ.get("OLMOCR_START_DATE", "2024-01-01")).replace(tzinfo=UTC),
    catchup=False,
    max_active_runs=int(os.environ.get("OLMOCR_MAX_ACTIVE_RUNS", "2")),
    params=ingest_params(),
    tags=["olmocr"],
    # Sends the failed run's report through the notifier the olmocr_failure_notifier Variable names.
    on_failure_callback=notify_run_failure,
    doc_md=__doc__,
)
def olmocr_ingest() -> None:
    conversion_flow()


olmocr_ingest()
