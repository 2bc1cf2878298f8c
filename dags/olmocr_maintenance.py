"""Retention for an output location: remove finished run folders and state nobody needs any more. Off by default.

    clean_output

Daily, paused when first deployed: unpause it (or trigger it) to turn retention on. Removes the
``_runs/<run>/`` folders of published runs and the failure markers and saved pages of documents since
converted, when untouched for ``older_than_days`` (default ``OLMOCR_RETENTION_DAYS``, else 30); never
outputs, manifests, or anything a running or unpublished run needs. ``dry_run`` only reports. The same
clean-up runs from the command line: ``olmocr-tasks clean OUTPUT --older-than-days N``.
"""

from __future__ import annotations

from datetime import UTC, datetime

from airflow.sdk import dag

from olmocr_tasks.provider.maintenance import clean_output_task, maintenance_params


@dag(
    dag_id="olmocr_maintenance",
    schedule="@daily",
    start_date=datetime(2024, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    # Deleting is a choice: the DAG does nothing until someone unpauses it.
    is_paused_upon_creation=True,
    params=maintenance_params(),
    tags=["olmocr"],
    doc_md=__doc__,
)
def olmocr_maintenance() -> None:
    clean_output_task.override(task_id="clean_output")()


olmocr_maintenance()
