"""The Airflow side of a conversion run, shared by every DAG: task bodies and the task graph.

Params live in ``provider.params``; connections (vLLM, AWS → storage options) in ``provider.hooks``.

The DAG files only choose a schedule and call ``conversion_flow``::

    check_server ─► plan ─► convert[batch…] ─► publish_manifest ─► enforce_error_budget
                      └───────────────────────────────►┘

* ``check_server`` (``CheckVllmServerOperator``) asks the ``olmocr_vllm`` connection's server whether it
  serves the model; while the server starts it waits in the triggerer (no worker slot), up to
  ``OLMOCR_SERVER_READY_TIMEOUT`` seconds.
* ``plan`` resolves the run's Params and ``dag_run`` (and, in the S3-event DAG, its triggering asset
  events) into a ``RunRequest`` and calls the engine's planning (``olmocr_tasks.run.planning.plan_batches``):
  it discovers what to convert, writes the plan and one small file per batch in the run folder
  (``olmocr_tasks.location.runs``), and returns batch descriptors
  (``{"plan": "p1-3f9c0a2e", "batch": "b00012", "label": "inbox/report.pdf", "documents": 1}``).
* ``convert`` is mapped over the descriptors; each instance converts its batch and writes a part file.
  A plan never maps fewer instances than one, nor than the run's previous pass (a cleared run):
  empty batches fill the gap (see ``olmocr_tasks.run.planning.plan_batches``).
* ``publish_manifest`` (``all_done``, downstream of ``plan`` and ``convert``) merges this pass's plan
  and parts into the run manifest through the engine's one publish path (``olmocr_tasks.run.publishing``,
  the CLI's too), even when some batches failed, judges the run's error budget into it, and emits
  an event on ``OUTPUTS_ASSET`` when it converted anything.
* ``enforce_error_budget`` (``all_done``, the only leaf) fails the run when the published verdict says
  the budget was exceeded (too many documents failed, a batch never reported) or when no manifest was
  published, so a bad run is red.

XCom carries only these descriptors and counts; credentials are resolved inside each task from the
``aws_default`` connection and never leave process memory.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import (
    Asset,
    AssetAlias,
    TriggerRule,
    XComArg,
    conf,
    get_current_context,
    task,
)
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from olmocr_tasks.core.config import ConversionSettings, positive_number
from olmocr_tasks.core.errors import ConfigurationError, ServerMisconfigured
from olmocr_tasks.inference.priority import LOW, RENDER_NICE, VLLM_PRIORITY, run_class
from olmocr_tasks.location.manifest import PAGE_COUNT_KEYS, STATUSES
from olmocr_tasks.location.runs import new_plan_id
from olmocr_tasks.provider import DEFAULT_CONN_ID
from olmocr_tasks.provider.hooks import VllmHook, storage_for
from olmocr_tasks.provider.lineage import report_converted, report_published
from olmocr_tasks.provider.operators import CheckVllmServerOperator
from olmocr_tasks.provider.params import SCOPES
from olmocr_tasks.provider.retries import INFRASTRUCTURE_RETRIES
from olmocr_tasks.run.batching import (
    DEFAULT_BYTES_PER_PAGE,
    DEFAULT_PARALLEL,
    LOW_CLASS_MIN_WAVES,
    BatchingRule,
)
from olmocr_tasks.run.pipeline import convert_batch, convert_time_limit
from olmocr_tasks.run.planning import plan_batches
from olmocr_tasks.run.publishing import publish_run
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.run.s3_events import documents_from_asset_events
from olmocr_tasks.run.settings import RunSettings
from olmocr_tasks.storage.access import check_run_allowed

log = logging.getLogger(__name__)

# The pool bounds how many convert tasks hit one vLLM deployment at once, across runs and DAGs.
POOL = os.environ.get("OLMOCR_POOL", "olmocr_vllm")
# Downstream DAGs schedule on this; each event's extra names the manifest and carries its counts.
OUTPUTS_ASSET = Asset(name="olmocr_outputs")
DEFAULT_CONVERT_RETRY_DELAY = timedelta(minutes=1)
# publish_manifest emits through this alias: a declared Asset outlet gets an event on every success,
# which would wake every downstream DAG each hour even when a run converted nothing.
OUTPUTS_ALIAS = AssetAlias(name="olmocr_outputs_published")

# Run types whose data interval is a real window of time to discover in.
_INTERVAL_RUN_TYPES = frozenset({"scheduled", "backfill"})
# The XCom key under which plan publishes its plan id (for publish_manifest; batches carry it too).
PLAN_ID_XCOM = "plan_id"

# ------------------------------------------------------------------------- resolving a run request


def _value(run_type: Any) -> str:
    return str(getattr(run_type, "value", run_type) or "")


def resolve_window(
    scope: str, run_type: Any, start: datetime | None, end: datetime | None, lookback_intervals: float = 1.0
) -> tuple[datetime | None, datetime | None]:
    """The LastModified window discovery uses: ``(start, end]``, or ``(None, None)`` for everything.

    ``auto`` uses the data interval only for scheduled and backfill runs: manual, REST and asset runs
    either have no interval (``logical_date`` None) or one the user did not choose. A scheduled run's
    window opens ``lookback_intervals`` intervals early: an object listed after its own interval's run
    finished (a late or multipart upload) is still seen by the next run. Only scheduled runs look back:
    any other run lists its interval after the fact, when late uploads are already listed, and backfill
    runs of adjacent intervals run at once, so overlapping windows would convert one PDF twice.
    """
    if scope not in SCOPES:
        raise ConfigurationError(f"scope must be one of {', '.join(SCOPES)}, not {scope!r}")
    has_interval = start is not None and end is not None and end > start
    if scope == "all":
        return None, None
    if scope == "interval" and not has_interval:
        raise ConfigurationError(
            "scope 'interval' needs a data interval, and this run has none "
            "(runs triggered by an asset or by the REST API without a logical date have none)"
        )
    if scope == "auto" and not (_value(run_type) in _INTERVAL_RUN_TYPES and has_interval):
        return None, None
    assert start is not None and end is not None
    if _value(run_type) != "scheduled":
        return start, end
    return start - (end - start) * lookback_intervals, end


def airflow_run_id(context: Mapping[str, Any]) -> str:
    """The manifest's run id: DAG id and run id, so DAGs sharing an output never collide."""
    return f"{context['dag'].dag_id}__{context['dag_run'].run_id}"


def build_request(
    context: Mapping[str, Any], documents: Sequence[str] | None = None, *, planning: bool = False
) -> RunRequest:
    """This run's ``RunRequest`` from its Params, its ``dag_run`` and the vLLM connection.

    ``documents`` (from the events) wins over the ``documents`` Param. What to discover (the input
    and the LastModified window) is checked only when ``planning``: later tasks work from the plan.
    Raises ``ConfigurationError`` with a message meant for the person who triggered the run.
    """
    params = context["params"]
    output_uri = params.get("output_uri")
    if not output_uri:
        raise ConfigurationError("no output: set the output_uri Param or the OLMOCR_OUTPUT_URI variable")
    if documents is None:
        documents = params.get("documents")
    input_uri = params.get("input_uri") or ""
    after, until = (None, None)
    run_type = _value(context["dag_run"].run_type)
    if planning and documents is None:
        if not input_uri:
            raise ConfigurationError("no input: set the input_uri Param (or OLMOCR_INPUT_URI), or list documents")
        after, until = resolve_window(
            params.get("scope", "auto"),
            context["dag_run"].run_type,
            context.get("data_interval_start"),
            context.get("data_interval_end"),
            float(params.get("lookback_intervals", 1)),
        )
    hook = VllmHook(DEFAULT_CONN_ID)
    priority_class = run_priority_class(context, documents)
    settings = ConversionSettings(
        server=hook.server_settings(
            max_concurrent_requests=params.get("max_concurrent_requests"), priority=VLLM_PRIORITY[priority_class]
        ),
        max_page_error_rate=float(params.get("max_page_error_rate", ConversionSettings.max_page_error_rate)),
        gpu_hour_price=hook.gpu_hour_price(),
        render_nice=render_nice(priority_class),
    )
    return RunRequest(
        input_uri=input_uri,
        output_uri=output_uri,
        run_id=airflow_run_id(context),
        settings=settings,
        documents=tuple(documents) if documents is not None else None,
        modified_after=after,
        modified_until=until,
        reprocess=bool(params.get("reprocess", False)),
        max_documents=params.get("max_documents"),
        run_settings=run_settings(params),
        retry_dead_letters=bool(params.get("retry_dead_letters", False)),
        # Reconciliation: scheduled runs and runs that list everything (a manual scope "all"). A backfill
        # retries failures inside its own interval only: its runs of adjacent intervals run at once.
        redrive=documents is None and (run_type == "scheduled" or (after is None and until is None)),
        retry_interval=schedule_interval(context),
        run_time=run_time(context),
        claim_expiry_s=_claim_expiry_setting(),
    )


def run_settings(params: Mapping[str, Any]) -> RunSettings:
    """The run's error budget and dead-letter threshold from its Params (defaults: ``RunSettings``)."""
    return RunSettings(
        max_document_error_rate=float(params.get("max_document_error_rate", RunSettings.max_document_error_rate)),
        max_failed_attempts=int(params.get("max_failed_attempts", RunSettings.max_failed_attempts)),
    )


def run_priority_class(context: Mapping[str, Any], documents: Sequence[str] | None = None) -> str:
    """This run's priority class (``olmocr_tasks.inference.priority``); ``documents`` as given to build_request."""
    params = context["params"]
    if documents is None:
        documents = params.get("documents")
    return run_class(_value(context["dag_run"].run_type), params, names_documents=documents is not None)


def render_nice(priority_class: str) -> int:
    """Niceness added to the render workers of a run of ``priority_class`` (``OLMOCR_LOW_PRIORITY_NICE``)."""
    if priority_class != LOW:
        return RENDER_NICE[priority_class]
    value = _env_int("OLMOCR_LOW_PRIORITY_NICE", RENDER_NICE[LOW])
    if not 0 <= value <= 19:
        raise ConfigurationError(f"OLMOCR_LOW_PRIORITY_NICE must be within 0..19, not {value}")
    return value


def schedule_interval(context: Mapping[str, Any]) -> timedelta:
    """The DAG's schedule interval, which spaces two runs' attempts at a failing document.

    A scheduled or backfill run's own data interval; otherwise the interval the DAG's timetable would
    give a run now (a manual run of ``olmocr_ingest``); zero for DAGs without one (asset-triggered).
    """
    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    if start is not None and end is not None and end > start:
        return end - start
    expression = getattr(getattr(context.get("dag"), "timetable", None), "expression", None)
    if isinstance(expression, timedelta):
        return expression
    if not isinstance(expression, str):
        return timedelta(0)
    from croniter import croniter  # Airflow's own cron library

    try:
        tick = croniter(expression, datetime.now(UTC)).get_prev(datetime)
        return croniter(expression, tick).get_next(datetime) - tick
    except (ValueError, KeyError):
        return timedelta(0)


def run_time(context: Mapping[str, Any]) -> datetime:
    """The run's time on its schedule: ``run_after`` (a scheduled run's interval end; a manual run's trigger)."""
    run = context["dag_run"]
    moment = getattr(run, "run_after", None) or context.get("data_interval_end") or getattr(run, "start_date", None)
    return moment or datetime.now(UTC)


def _claim_expiry_setting() -> float | None:
    """``OLMOCR_CLAIM_EXPIRY`` (seconds a document claim lasts without renewal); None: derived."""
    value = os.environ.get("OLMOCR_CLAIM_EXPIRY")
    if not value:
        return None
    return float(positive_number("OLMOCR_CLAIM_EXPIRY", value, unit="a number of seconds"))


def airflow_run_record(context: Mapping[str, Any]) -> dict[str, Any]:
    """What the manifest records about its DAG run: how it was triggered and the interval it covers."""
    run = context["dag_run"]

    def stamp(value: Any) -> str | None:
        return value.isoformat() if value is not None else None

    return {
        "dag_id": run.dag_id,
        "run_id": run.run_id,
        "run_type": _value(run.run_type),
        "logical_date": stamp(getattr(run, "logical_date", None)),
        "data_interval_start": stamp(context.get("data_interval_start")),
        "data_interval_end": stamp(context.get("data_interval_end")),
        "triggering_user_name": getattr(run, "triggering_user_name", None),
    }


def task_identity(context: Mapping[str, Any]) -> dict[str, Any]:
    """What a manifest entry records about the task that converted it (links the UI to the log)."""
    ti = context["ti"]
    return {
        "dag_id": ti.dag_id,
        "run_id": ti.run_id,
        "task_id": ti.task_id,
        "map_index": ti.map_index,
        "try_number": ti.try_number,
    }


def _fail_on_configuration(exc: ConfigurationError) -> AirflowFailException:
    return AirflowFailException(f"configuration error: {exc}")


# ------------------------------------------------------------------------------------ task bodies


def max_map_length() -> int:
    """Airflow's ``[core] max_map_length``: the most instances one mapped task may expand to."""
    return conf.getint("core", "max_map_length", fallback=1024)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be a whole number, not {raw!r}") from None


def batching_rule(params: Mapping[str, Any], request: RunRequest, priority_class: str | None = None) -> BatchingRule:
    """How this run's documents are packed into convert instances (``olmocr_tasks.run.batching``).

    ``batch_pages`` (Param, default ``OLMOCR_BATCH_PAGES``, else the request window of a convert task);
    ``OLMOCR_CONVERT_SLOTS``: convert instances that run at once (the pool's slots, at most workers times
    worker concurrency); ``OLMOCR_BYTES_PER_PAGE``: the page estimate from listed sizes. A low-priority
    run is cut into at least ``OLMOCR_LOW_CLASS_WAVES`` waves (default ``LOW_CLASS_MIN_WAVES``) of short
    instances, so that it never holds the pool's slots for long (README "Priority classes"), unless the
    run names its own ``batch_pages``: a size the user chose for this run is kept as given.
    """
    named_size = params.get("batch_pages")
    min_pages = named_size or _env_int("OLMOCR_BATCH_PAGES", 0)
    short_waves = priority_class == LOW and not named_size
    try:
        return BatchingRule(
            min_pages=int(min_pages or request.settings.server.concurrency.max_concurrent_requests),
            parallel=_env_int("OLMOCR_CONVERT_SLOTS", DEFAULT_PARALLEL),
            max_batches=max_map_length(),
            bytes_per_page=_env_int("OLMOCR_BYTES_PER_PAGE", DEFAULT_BYTES_PER_PAGE),
            min_waves=_env_int("OLMOCR_LOW_CLASS_WAVES", LOW_CLASS_MIN_WAVES) if short_waves else 1,
        )
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


def plan_body(context: Mapping[str, Any], event_asset: str | None = None) -> list[dict[str, Any]]:
    """Discover, write the plan and the batches; return one small descriptor per batch.

    With ``event_asset`` the documents are exactly those named by the run's events on that asset.
    """
    documents = event_documents_body(context, event_asset) if event_asset is not None else None
    try:
        request = build_request(context, documents, planning=True)
        # Before any read or write: Params, documents and event keys inside the deployment's allow-list.
        check_run_allowed(request.input_uri, request.output_uri, request.documents)
        rule = batching_rule(context["params"], request, run_priority_class(context, documents))
    except ConfigurationError as exc:
        raise _fail_on_configuration(exc) from None
    served = context["ti"].xcom_pull(task_ids="check_server")
    if served is not None and request.settings.server.connection.model not in served:
        # The idempotency key must name the model that really answers: a server swapped since
        # check_server (or a CPU engine under the GPU model's name) would file its output under it.
        raise AirflowFailException(
            f"the server reports {', '.join(served)}, "
            f"not the connection's model {request.settings.server.connection.model}"
        )
    storage = storage_for([request.input_uri, request.output_uri, *(request.documents or ())])
    # A fresh plan id per planning: a cleared and re-run DAG run plans again, and nothing a task of the
    # earlier plan still writes can reach this plan's manifest.
    folder = request.run_folder(storage, new_plan_id(f"p{context['ti'].try_number}"))
    descriptors = plan_batches(request, storage, folder, rule)
    # Last, once the plan and every batch are written: publish_manifest reads only a complete plan,
    # and only this pass's (a cleared run's plan clears its XCom when it starts again).
    context["ti"].xcom_push(key=PLAN_ID_XCOM, value=folder.plan_id)
    return descriptors


def convert_body(context: Mapping[str, Any], batch: Mapping[str, Any]) -> dict[str, Any]:
    """Convert one batch; its documents' entries go to a part file, a summary to XCom."""
    try:
        request = build_request(context)
    except ConfigurationError as exc:
        raise _fail_on_configuration(exc) from None
    sources = request.run_folder(storage_for([request.output_uri]), batch["plan"]).read_batch(batch["batch"])
    storage = storage_for([request.input_uri, request.output_uri, *(source.uri for source in sources)])
    try:
        result = convert_batch(
            request,
            storage,
            batch["batch"],
            sources,
            folder=request.run_folder(storage, batch["plan"]),
            try_number=context["ti"].try_number,
            # The batch names the instance a packed document ran in (the map index, in the grid).
            task_context=task_identity(context) | {"batch": batch["batch"]},
        )
    except ServerMisconfigured as exc:
        # A 401/403 (key revoked or rotated mid-run) or a server that stopped serving the model:
        # Airflow retries would fail the same way, so the task fails now, saying why.
        raise AirflowFailException(f"the inference server rejected this task: {exc}") from None
    summary = result.summary
    # The documents it read and the objects it wrote, to OpenLineage (when its provider is installed).
    report_converted(result.entries)
    log.info("batch %s (%s): %s", batch["batch"], batch.get("label"), summary)
    emit_metrics(summary)
    return summary


def limit_convert_time(context: Mapping[str, Any]) -> None:
    """``pre_execute`` of convert: this instance's ``execution_timeout`` from its batch and the timeouts.

    A mapped task has one static timeout for all its instances; a one-page batch and a 3,000-page one
    need different bounds, so each instance sets its own before it runs (``convert_time_limit``).
    """
    task = context["task"]
    batch = task.op_kwargs["batch"]
    try:
        settings = build_request(context).settings
    except ConfigurationError:
        return  # convert_body reports it
    task.execution_timeout = convert_time_limit(int(batch.get("pages") or 0), int(batch["documents"]), settings)
    log.info("time limit of this attempt: %s (%s estimated pages)", task.execution_timeout, batch.get("pages"))


def emit_metrics(summary: Mapping[str, Any]) -> None:
    """Counters through Airflow's own metrics (StatsD / OpenTelemetry when configured, else no-ops)."""
    from airflow.sdk.observability.stats import Stats

    for key in (*PAGE_COUNT_KEYS, *STATUSES):
        if summary.get(key):
            Stats.incr(f"olmocr.{key}", int(summary[key]))


def publish_body(context: Mapping[str, Any]) -> dict[str, Any]:
    """Write the run manifest from the plan and every part; emit the outputs asset event."""
    plan_id = context["ti"].xcom_pull(task_ids="plan", key=PLAN_ID_XCOM)
    if plan_id is None:
        raise AirflowSkipException("the plan task did not succeed: there is nothing to publish")
    try:
        request = build_request(context)
    except ConfigurationError as exc:
        raise _fail_on_configuration(exc) from None
    storage = storage_for([request.input_uri, request.output_uri])
    folder = request.run_folder(storage, plan_id)
    # Documents whose batch never reported are failures of this run: later runs re-drive them. The
    # error budget is judged once, there; the verdict travels in the manifest (and in this task's XCom).
    published = publish_run(request, storage, folder, folder.read_plan(), airflow_run=airflow_run_record(context))
    report_published(published.uri)
    summary = published.summary()
    if summary["converted"]:
        context["outlet_events"][OUTPUTS_ALIAS].add(OUTPUTS_ASSET, extra=summary)
    else:
        log.info("nothing was converted: no event on %s", OUTPUTS_ASSET.name)
    log.info("published %s: %s", published.uri, published.manifest.counts())
    return summary


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


# ------------------------------------------------------------------------------------ the tasks


@task(
    retries=2,
    retry_delay=timedelta(seconds=30),
    retry_exponential_backoff=2.0,
    retry_policy=INFRASTRUCTURE_RETRIES,
)
def plan(event_asset: str | None = None) -> list[dict[str, Any]]:
    """Discover the PDFs to convert (or read them from the triggering events) and pack them into batches."""
    return plan_body(get_current_context(), event_asset)


def convert_retry_delay() -> timedelta:
    """The first wait before Airflow retries a convert instance (``OLMOCR_CONVERT_RETRY_DELAY``, seconds).

    Convert is retried for infrastructure reasons only (a server outage, a lost worker), so the right
    first wait is about how long the deployment's vLLM takes to come back: a pod that reloads the
    model takes minutes, a shared server behind a load balancer seconds. It doubles per retry.
    """
    value = os.environ.get("OLMOCR_CONVERT_RETRY_DELAY")
    if not value:
        return DEFAULT_CONVERT_RETRY_DELAY
    return timedelta(seconds=positive_number("OLMOCR_CONVERT_RETRY_DELAY", value, unit="a number of seconds"))


@task(
    pool=POOL,
    retries=3,
    retry_delay=convert_retry_delay(),
    retry_exponential_backoff=2.0,
    max_retry_delay=timedelta(minutes=30),
    retry_policy=INFRASTRUCTURE_RETRIES,
    map_index_template="{{ batch_label }}",
    pre_execute=limit_convert_time,
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
    server >> batches
    # publish also waits for plan itself: with only convert upstream, a cleared run whose convert
    # had mapped to nothing published the previous pass's plan before plan ran again.
    batches >> published
    converted >> published >> budget
    return budget
