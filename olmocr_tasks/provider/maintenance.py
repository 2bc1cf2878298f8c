"""The ``olmocr_maintenance`` DAG's Params and its one task: retention on a schedule.

The work itself is ``olmocr_tasks.location.retention``; this module gives it Params and a task.

Removes ``_runs/<run>/`` folders of published runs and state that no longer serves a pending document,
older than ``older_than_days``; never outputs, manifests or anything a running or unpublished run needs.
The output location must be inside the deployment's allow-list (``OLMOCR_ALLOWED_OUTPUTS``), as for
conversion runs. Its XCom is the report's counts only (folder names stay in the task log).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from airflow.sdk import Param, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException

from olmocr_tasks.core import environment
from olmocr_tasks.core.errors import ConfigurationError
from olmocr_tasks.location.retention import clean_output
from olmocr_tasks.provider.hooks import storage_for
from olmocr_tasks.provider.retries import INFRASTRUCTURE_RETRIES
from olmocr_tasks.storage.access import AccessPolicy

log = logging.getLogger(__name__)

DEFAULT_RETENTION_DAYS = 30


def maintenance_params() -> dict[str, Param]:
    """The maintenance DAG's form; ``OLMOCR_OUTPUT_URI`` and ``OLMOCR_RETENTION_DAYS`` set the defaults."""
    return {
        "output_uri": Param(
            environment.output_uri(),
            type=["null", "string"],
            title="Output",
            description="The output location to clean: s3://bucket/prefix/ or a local folder.",
        ),
        "older_than_days": Param(
            environment.retention_days(DEFAULT_RETENTION_DAYS),
            type="number",
            minimum=0,
            title="Older than (days)",
            description="Remove only what has not changed for this many days.",
        ),
        "dry_run": Param(
            False,
            type="boolean",
            title="Dry run",
            description="Report what would be removed (in the task log), remove nothing.",
        ),
    }


def clean_output_body(params: Mapping[str, Any]) -> dict[str, Any]:
    output_uri = params.get("output_uri")
    try:
        if not output_uri:
            raise ConfigurationError("no output: set the output_uri Param or the OLMOCR_OUTPUT_URI variable")
        AccessPolicy.from_env().check_output(output_uri)
    except ConfigurationError as exc:
        raise AirflowFailException(f"configuration error: {exc}") from None
    dry_run = bool(params.get("dry_run", False))
    report = clean_output(
        output_uri,
        storage_for([output_uri]),
        older_than=timedelta(days=float(params["older_than_days"])),
        dry_run=dry_run,
    )
    verb = "would remove" if dry_run else "removed"
    for folder in report.removed_runs:
        log.info("%s %s", verb, folder)
    for folder, reason in report.kept_runs.items():
        log.info("kept %s: %s", folder, reason)
    return {
        "removed_runs": len(report.removed_runs),
        "kept_runs": len(report.kept_runs),
        "failure_markers": report.failure_markers,
        "page_records": report.page_records,
        "objects": report.objects,
        "dry_run": dry_run,
    }


@task(retries=2, retry_delay=timedelta(minutes=5), retry_policy=INFRASTRUCTURE_RETRIES)
def clean_output_task() -> dict[str, Any]:
    """Remove finished run folders and obsolete state from the output location; returns the counts."""
    return clean_output_body(get_current_context()["params"])
