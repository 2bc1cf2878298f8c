"""The conversion tasks' bodies: glue between Airflow's task context and the engine.

``plan`` resolves the run once from its context (``provider.run_requests``: Params, the vLLM connection,
the deployment's environment) and plans it (``olmocr_tasks.run.planned.plan_in_batches``), which keeps
the resolved run beside the plan. ``convert`` and ``publish_manifest`` open that plan by name
(``olmocr_tasks.run.planned.open_planned_run``) and work from the run as planned: converting one batch
(``convert_planned_batch``) and publishing (``publish_planned_run``, through the CLI's publish path).
What they read for themselves is the vLLM connection's address and key, the workers' allow-list and the
attempt's try number and identity. Storage goes through the ``aws_default`` connection
(``provider.hooks``). A configuration error fails the task at once, with its message. The task
definitions and their graph are ``provider.flow``.

XCom carries only batch descriptors (``{"plan": "p1-3f9c0a2e", "batch": "b00012", "label":
"inbox/report.pdf", "documents": 1}``), the plan id and counts; credentials are resolved inside each
task from the connections and never leave process memory.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import replace
from typing import Any

from airflow.sdk import Asset, AssetAlias
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from olmocr_tasks.core.errors import ConfigurationError, ServerMisconfigured
from olmocr_tasks.core.niceness import nice_process_tree
from olmocr_tasks.provider import DEFAULT_CONN_ID
from olmocr_tasks.provider.competition import CompetitionWatch, other_active_runs, polls_from_a_thread_are_safe
from olmocr_tasks.provider.hooks import VllmHook, run_storage, storage_for
from olmocr_tasks.provider.lineage import report_converted, report_published
from olmocr_tasks.provider.resources import log_peak_memory
from olmocr_tasks.provider.run_requests import (
    airflow_run_id,
    airflow_run_record,
    batching_rule,
    build_request,
    run_priority_class,
    task_identity,
)
from olmocr_tasks.run import instance_costs
from olmocr_tasks.run.instance_costs import InstanceCosts, InstanceTiming
from olmocr_tasks.run.pipeline import SUMMARY_COUNTERS, convert_time_limit
from olmocr_tasks.run.planned import (
    PlannedRun,
    checked_batch_key,
    convert_planned_batch,
    open_planned_run,
    plan_in_batches,
    publish_planned_run,
)
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.run.s3_events import documents_from_asset_events
from olmocr_tasks.storage.access import AccessPolicy
from olmocr_tasks.storage.store import Storage

log = logging.getLogger(__name__)

# Downstream DAGs schedule on this; each event's extra names the manifest and carries its counts.
OUTPUTS_ASSET = Asset(name="olmocr_outputs")
# publish_manifest emits through this alias: a declared Asset outlet gets an event on every success,
# which would wake every downstream DAG each hour even when a run converted nothing.
OUTPUTS_ALIAS = AssetAlias(name="olmocr_outputs_published")
# The XCom key under which plan publishes its plan id (for publish_manifest; batches carry it too).
PLAN_ID_XCOM = "plan_id"
# Where convert's ``pre_execute`` keeps the plan it opened for the task's body (one context per
# attempt): the attempt reads its resolved run once, over one storage.
PLANNED_RUN_KEY = "olmocr_planned_run"


def _fail_on_configuration(exc: ConfigurationError) -> AirflowFailException:
    return AirflowFailException(f"configuration error: {exc}")


def plan_body(context: Mapping[str, Any], event_asset: str | None = None) -> list[dict[str, Any]]:
    """Resolve the run, discover, write the run, the plan and the batches; return one small descriptor per batch.

    With ``event_asset`` the documents are exactly those named by the run's events on that asset.
    """
    documents = event_documents_body(context, event_asset) if event_asset is not None else None
    try:
        priority_class = run_priority_class(context, documents)
        request = build_request(context, documents, priority_class=priority_class)
        # Before any read or write: Params, documents and event keys inside the deployment's allow-list
        # (each document is checked again, resolved, as it is planned and as it is opened).
        request.access.check_run(request.input_uri, request.output_uri, request.documents)
    except ConfigurationError as exc:
        raise _fail_on_configuration(exc) from None
    storage = storage_for([request.input_uri, request.output_uri, *(request.documents or ())])
    # Instances sized by what the last measured run's instances cost (none yet: the request window).
    costs = instance_costs.load(storage, request.conversion_state)
    try:
        rule = batching_rule(context["params"], request, priority_class, costs)
    except ConfigurationError as exc:
        raise _fail_on_configuration(exc) from None
    plan_id, descriptors = plan_in_batches(request, storage, rule, label=f"p{context['ti'].try_number}")
    # Last, once the plan and every batch are written: publish_manifest reads only a complete plan,
    # and only this pass's (a cleared run's plan clears its XCom when it starts again).
    context["ti"].xcom_push(key=PLAN_ID_XCOM, value=plan_id)
    log_peak_memory()
    return descriptors


def planned_run(context: MutableMapping[str, Any], plan_id: Any) -> PlannedRun:
    """The plan ``plan_id`` (as XCom gave it: checked) of this DAG run, its resolved run read back once.

    Located by the ``output_uri`` Param and the run id; what the plan resolved is then the run's, not
    what the Params, the vLLM connection or the environment say now. Read for this task, at use: the
    vLLM connection's address and key, and the workers' allow-list. Kept in ``context``, so convert's
    ``pre_execute`` and body open it once between them.
    """
    kept = context.get(PLANNED_RUN_KEY)
    if isinstance(kept, PlannedRun) and kept.plan_id == plan_id:
        return kept
    output_uri = context["params"].get("output_uri")
    if not output_uri:
        raise ConfigurationError("no output: set the output_uri Param or the OLMOCR_OUTPUT_URI variable")
    run = open_planned_run(
        run_storage(),
        output_uri,
        airflow_run_id(context),
        plan_id,
        server=VllmHook(DEFAULT_CONN_ID).server_access(),
        access=AccessPolicy.from_env(),
    )
    context[PLANNED_RUN_KEY] = run
    return run


def convert_body(context: MutableMapping[str, Any], batch: Mapping[str, Any]) -> dict[str, Any]:
    """Convert one batch; its documents' entries go to a part file, a summary to XCom.

    The batch descriptor comes through XCom and its sources from the run folder: both are checked
    again here, not trusted (a safe plan id and batch key; each source against the allowed inputs
    just before it is opened, an ``outside_allowed`` failure if it is not).
    """
    try:
        batch_key = checked_batch_key(batch.get("batch"))
        run = planned_run(context, batch.get("plan"))
        batch = {**batch, "plan": run.plan_id, "batch": batch_key}
    except ConfigurationError as exc:
        raise _fail_on_configuration(exc) from None
    request, watch = give_way(run.request, lambda: other_active_runs(context))
    try:
        return _convert(context, replace(run, request=request), batch)
    finally:
        if watch is not None:
            watch.stop()
        log_peak_memory()


def _convert(context: Mapping[str, Any], run: PlannedRun, batch: Mapping[str, Any]) -> dict[str, Any]:
    converting_since = time.monotonic()
    try:
        result = convert_planned_batch(
            run,
            batch["batch"],
            try_number=context["ti"].try_number,
            # The batch names the instance a packed document ran in (the map index, in the grid).
            task_context=task_identity(context) | {"batch": batch["batch"]},
        )
    except ServerMisconfigured as exc:
        # A 401/403 (key revoked or rotated mid-run) or a server that stopped serving the model:
        # Airflow retries would fail the same way, so the task fails now, saying why.
        raise AirflowFailException(f"the inference server rejected this task: {exc}") from None
    summary = result.summary
    started = getattr(context["ti"], "start_date", None)
    if started is not None:
        # What publish_manifest measures the run's instances by (``olmocr_tasks.run.instance_costs``).
        summary["timing"] = {
            "started": started.timestamp(),
            "converting_s": round(time.monotonic() - converting_since, 3),
            "ended": time.time(),
        }
    # The documents it read and the objects it wrote, to OpenLineage (when its provider is installed).
    report_converted(result.entries)
    log.info("batch %s (%s): %s", batch["batch"], batch.get("label"), summary)
    emit_metrics(summary)
    return summary


# Whether this process already lowered its priority (``airflow dags test`` runs every task in one).
_gave_way = False


def give_way(request: RunRequest, others: Callable[[], int]) -> tuple[RunRequest, CompetitionWatch | None]:
    """A low-priority convert instance gives way only while others compete: it starts at normal
    priority and, the first time ``others()`` (other active conversion runs) is above zero, niceness
    ``render_nice`` is added to its whole task process and its render workers
    (``provider.competition``), not only the render workers: the instance's own work (requests,
    outputs, ledger) also competes with an urgent run's tasks on a shared worker host. Airflow forks a
    process per task attempt, so the niceness ends with the attempt. Returns the request with nothing
    left for the engine to add, and the started watch (None for other classes); stop it when done."""
    nice = request.settings.render_nice
    if nice <= 0:
        return request, None

    def lower_priority() -> None:
        global _gave_way
        if not _gave_way:
            nice_process_tree(nice)
            _gave_way = True

    watch = CompetitionWatch(others, lower_priority, repeat=polls_from_a_thread_are_safe()).start()
    return replace(request, settings=replace(request.settings, render_nice=0)), watch


def limit_convert_time(context: MutableMapping[str, Any]) -> None:
    """``pre_execute`` of convert: this instance's ``execution_timeout`` from its batch and the timeouts.

    A mapped task has one static timeout for all its instances; a one-page batch and a 3,000-page one
    need different bounds, so each instance sets its own before it runs (``convert_time_limit``), from
    the settings its run was planned with (read here once: the body works from the same).
    """
    task = context["task"]
    batch = task.op_kwargs["batch"]
    try:
        settings = planned_run(context, batch.get("plan")).request.settings
    except ConfigurationError:
        return  # convert_body reports it
    task.execution_timeout = convert_time_limit(int(batch.get("pages") or 0), int(batch["documents"]), settings)
    log.info("time limit of this attempt: %s (%s estimated pages)", task.execution_timeout, batch.get("pages"))


def emit_metrics(summary: Mapping[str, Any]) -> None:
    """Counters through Airflow's own metrics (StatsD / OpenTelemetry when configured, else no-ops)."""
    from airflow.sdk.observability.stats import Stats

    for key in SUMMARY_COUNTERS:
        if summary.get(key):
            Stats.incr(f"olmocr.{key}", int(summary[key]))


def publish_body(context: MutableMapping[str, Any]) -> dict[str, Any]:
    """Write the run manifest from the plan and every part; emit the outputs asset event."""
    plan_id = context["ti"].xcom_pull(task_ids="plan", key=PLAN_ID_XCOM)
    if plan_id is None:
        raise AirflowSkipException("the plan task did not succeed: there is nothing to publish")
    try:
        run = planned_run(context, plan_id)
    except ConfigurationError as exc:
        raise _fail_on_configuration(exc) from None
    # Documents whose batch never reported are failures of this run: later runs re-drive them. The
    # error budget is judged once, there; the verdict travels in the manifest (and in this task's XCom).
    published = publish_planned_run(run, airflow_run=airflow_run_record(context))
    report_published(published.uri)
    summary = published.summary()
    if summary["converted"]:
        context["outlet_events"][OUTPUTS_ALIAS].add(OUTPUTS_ASSET, extra=summary)
    else:
        log.info("nothing was converted: no event on %s", OUTPUTS_ASSET.name)
    log.info("published %s: %s", published.uri, published.manifest.counts())
    measure_instances(context, run.request, run.storage)
    log_peak_memory()
    return summary


def measure_instances(context: Mapping[str, Any], request: RunRequest, storage: Storage) -> InstanceCosts | None:
    """Measure this run's convert instances from their XCom summaries and keep the result for the next
    plan (``olmocr_tasks.run.instance_costs``); a run whose instances converted nothing keeps the last."""
    pulled = context["ti"].xcom_pull(task_ids="convert")
    summaries = [pulled] if isinstance(pulled, Mapping) else list(pulled or ())
    timings = [
        InstanceTiming(
            float(timing["started"]), float(timing["ended"]), float(timing["converting_s"]), int(item.get("pages", 0))
        )
        for item in summaries
        if isinstance(item, Mapping) and isinstance(timing := item.get("timing"), Mapping)
    ]
    costs = instance_costs.measure(timings)
    if costs is not None:
        instance_costs.save(storage, request.conversion_state, costs)
        log.info(
            "convert instances: %d, at most %d at once, %.2f s fixed cost each, %.2f pages/s converting each",
            costs.instances,
            costs.concurrency,
            costs.fixed_cost_s,
            costs.pages_per_s,
        )
    return costs


def enforce_error_budget_body(context: Mapping[str, Any]) -> None:
    summary = context["ti"].xcom_pull(task_ids="publish_manifest")
    if summary is None:
        raise AirflowFailException("no manifest was published for this run: see the failed task upstream")
    verdict = summary["error_budget"]
    if verdict["exceeded"]:
        raise AirflowFailException("; ".join(verdict["problems"]) + f" — manifest: {summary['manifest']}")
    log.info(
        "within budget: %d converted, %d failed, %d skipped (manifest %s)",
        summary["converted"],
        summary["failed"],
        summary["skipped"],
        summary["manifest"],
    )


def event_documents_body(context: Mapping[str, Any], asset_name: str | None = None) -> list[str]:
    """The PDFs named by this run's triggering events of ``asset_name`` (of every asset when None)."""
    events = context.get("triggering_asset_events") or {}
    groups = [events[asset] for asset in events if asset_name is None or getattr(asset, "name", None) == asset_name]
    parsed = documents_from_asset_events(event.extra for group in groups for event in group)
    for reason in parsed.ignored:
        log.info("ignored: %s", reason)
    log.info("%d PDFs from %d messages in %d events", len(parsed.uris), parsed.messages, sum(map(len, groups)))
    return parsed.uris
