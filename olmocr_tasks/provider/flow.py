"""The task graph every conversion DAG shares: a DAG file chooses a schedule and calls ``conversion_flow``::

    check_server ──────────┐
    plan ───────────────► convert[batch…] ─► publish_manifest ─► enforce_error_budget
      └──────────────────────────────────────►┘

* ``check_server`` (``CheckVllmServerOperator``) asks the ``olmocr_vllm`` connection's server whether it
  serves the model; while the server starts it waits in the triggerer (no worker slot), up to
  ``OLMOCR_SERVER_READY_TIMEOUT`` seconds. It runs beside ``plan``, which needs no server: convert
  waits for both, so a run does not pay a task's start-up and a scheduler hop in sequence before its
  first conversion. Each convert instance checks again that the server lists the connection's model
  before it sends a page (a server swapped since, or a CPU engine under another name, fails it:
  the model is part of the idempotency key, and output of another model must not be filed under it).
* ``plan`` resolves the run's Params, ``dag_run`` (and, in the S3-event DAG, its triggering asset
  events), the vLLM connection and the deployment's environment into a ``RunRequest``, once, and calls
  the engine's planning (``olmocr_tasks.run.planned.plan_in_batches``): it writes the resolved run (no
  secret), discovers what to convert, writes the plan and one small file per batch in the run folder
  (``olmocr_tasks.location.run_folders``), and returns batch descriptors
  (``{"plan": "p1-3f9c0a2e", "batch": "b00012", "label": "inbox/report.pdf", "documents": 1}``).
* ``convert`` is mapped over the descriptors; each instance reads the resolved run back, converts its
  batch with the settings the run was planned with and writes a part file.
  A plan never maps fewer instances than one, nor than the run's previous pass (a cleared run):
  empty batches fill the gap (see ``olmocr_tasks.run.planning.plan_batches``).
* ``publish_manifest`` (``all_done``, downstream of ``plan`` and ``convert``) merges this pass's plan
  and parts into the run manifest through the engine's one publish path (``olmocr_tasks.run.publishing``,
  the CLI's too), even when some batches failed, judges the run's error budget into it, and emits
  an event on ``OUTPUTS_ASSET`` when it converted anything.
* ``enforce_error_budget`` (``all_done``, the only leaf) fails the run when the published verdict says
  the budget was exceeded (too many documents failed, a batch never reported) or when no manifest was
  published, so a bad run is red.

Here are the task definitions (retries, pool, trigger rules, outlets) and their order; what each task
does is its body in ``provider.tasks``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import TriggerRule, XComArg, get_current_context, task

from olmocr_tasks.core.environment import convert_pool, convert_retry_delay
from olmocr_tasks.provider.operators import CheckVllmServerOperator
from olmocr_tasks.provider.retries import INFRASTRUCTURE_RETRIES
from olmocr_tasks.provider.tasks import (
    OUTPUTS_ALIAS,
    convert_body,
    enforce_error_budget_body,
    limit_convert_time,
    plan_body,
    publish_body,
)

# The pool bounds how many convert tasks hit one vLLM deployment at once, across runs and DAGs.
POOL = convert_pool()


@task(
    retries=2,
    retry_delay=timedelta(seconds=30),
    retry_exponential_backoff=2.0,
    retry_policy=INFRASTRUCTURE_RETRIES,
)
def plan(event_asset: str | None = None) -> list[dict[str, Any]]:
    """Discover the PDFs to convert (or read them from the triggering events) and pack them into batches."""
    return plan_body(get_current_context(), event_asset)


@task(
    pool=POOL,
    retries=3,
    retry_delay=convert_retry_delay(),
    retry_exponential_backoff=2.0,
    max_retry_delay=timedelta(minutes=30),
    retry_policy=INFRASTRUCTURE_RETRIES,
    map_index_template="{{ batch_label }}",
    pre_execute=limit_convert_time,
    # One XCom row per instance: inferred from the dict return, Airflow would also push each of the
    # summary's ~27 keys as a row of its own (3,782 rows for 139 instances), which nothing reads.
    multiple_outputs=False,
)
def convert(batch: dict[str, Any]) -> dict[str, Any]:
    """Convert one batch of documents (usually one document)."""
    context = get_current_context()
    context["batch_label"] = batch["label"]  # type: ignore[typeddict-unknown-key]
    return convert_body(context, batch)


@task(
    trigger_rule=TriggerRule.ALL_DONE,
    outlets=[OUTPUTS_ALIAS],
    retries=2,
    retry_delay=timedelta(seconds=30),
    retry_policy=INFRASTRUCTURE_RETRIES,
    multiple_outputs=False,
)
def publish_manifest_task() -> dict[str, Any]:
    """Write the run manifest, even when some conversions failed."""
    return publish_body(get_current_context())


@task(trigger_rule=TriggerRule.ALL_DONE)
def enforce_error_budget() -> None:
    """Fail the run when its documents failed beyond the budget or its manifest is missing."""
    enforce_error_budget_body(get_current_context())


def conversion_flow(event_asset: str | None = None) -> XComArg:
    """Lay out the shared task graph in the current DAG; returns the final task's output.

    ``event_asset``: convert exactly the PDFs named by the run's events on this asset (the S3-event
    DAG); None lets the run's Params decide. The events are read inside ``plan`` rather than handed
    over through XCom, because a burst of uploads can name thousands of objects.
    """
    server = CheckVllmServerOperator(task_id="check_server")
    batches = plan(event_asset=event_asset)
    converted = convert.expand(batch=batches)
    published = publish_manifest_task.override(task_id="publish_manifest")()
    budget = enforce_error_budget()
    # Beside plan, not before it: convert waits for both, and checks the model itself.
    server >> converted
    # publish also waits for plan itself: with only convert upstream, a cleared run whose convert
    # had mapped to nothing published the previous pass's plan before plan ran again.
    batches >> published
    converted >> published >> budget
    return budget
