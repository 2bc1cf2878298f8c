"""A run's request from its Airflow context: Params, ``dag_run``, the vLLM connection and the environment.

``build_request`` is ``plan``'s: the run is resolved there once and kept with its plan, and the later
tasks read it back (``olmocr_tasks.run.planned``) instead of resolving it again. Also what else the
context decides about the run: its LastModified window (``resolve_window``), its priority class and
render niceness, its batching rule (Params, the deployment's settings and Airflow's
``max_map_length``), and what its manifest records about the DAG run and the task. Raises
``ConfigurationError`` with a message meant for the person who triggered the run; the task bodies
(``provider.tasks``) turn it into a failed task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import conf

from olmocr_tasks.core import environment
from olmocr_tasks.core.config import ConversionSettings, ServerSettings
from olmocr_tasks.core.errors import ConfigurationError
from olmocr_tasks.inference.priority import HIGH, LOW, RENDER_NICE, VLLM_PRIORITY, run_class
from olmocr_tasks.provider import DEFAULT_CONN_ID
from olmocr_tasks.provider.hooks import VllmHook
from olmocr_tasks.provider.params import DEFAULT_LOOKBACK_INTERVALS, DEFAULT_SCOPE, SCOPES
from olmocr_tasks.run.batching import (
    DEFAULT_BYTES_PER_PAGE,
    DEFAULT_PARALLEL,
    LOW_CLASS_MIN_WAVES,
    UNMEASURED_MAX_PAGES,
    UNMEASURED_MAX_WAVES,
    BatchingRule,
)
from olmocr_tasks.run.instance_costs import DEFAULT_OVERHEAD_FRACTION, InstanceCosts
from olmocr_tasks.run.request import RunRequest, resolve_run
from olmocr_tasks.storage.access import AccessPolicy

# Run types whose data interval is a real window of time to discover in.
_INTERVAL_RUN_TYPES = frozenset({"scheduled", "backfill"})


def _value(run_type: Any) -> str:
    return str(getattr(run_type, "value", run_type) or "")


def resolve_window(
    scope: str,
    run_type: Any,
    start: datetime | None,
    end: datetime | None,
    lookback_intervals: float = DEFAULT_LOOKBACK_INTERVALS,
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
    context: Mapping[str, Any], documents: Sequence[str] | None = None, *, priority_class: str | None = None
) -> RunRequest:
    """This run's ``RunRequest`` from its Params, its ``dag_run``, the vLLM connection and the deployment's
    environment: what ``plan`` resolves once and keeps with the plan (``olmocr_tasks.run.planned``).

    ``documents`` (from the events) wins over the ``documents`` Param; ``priority_class``: the run's, when
    the caller has it already (``run_priority_class``). Raises ``ConfigurationError`` with a message meant
    for the person who triggered the run.
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
    if documents is None:
        if not input_uri:
            raise ConfigurationError("no input: set the input_uri Param (or OLMOCR_INPUT_URI), or list documents")
        after, until = resolve_window(
            params.get("scope", DEFAULT_SCOPE),
            context["dag_run"].run_type,
            context.get("data_interval_start"),
            context.get("data_interval_end"),
            float(params.get("lookback_intervals", DEFAULT_LOOKBACK_INTERVALS)),
        )
    hook = VllmHook(DEFAULT_CONN_ID)
    if priority_class is None:
        priority_class = run_priority_class(context, documents)
    server = hook.server_settings(priority=VLLM_PRIORITY[priority_class])
    if (requested := params.get("max_concurrent_requests")) is not None:
        server = dataclasses.replace(server, max_concurrent_requests=allowed_concurrency(int(requested), server))
    settings = ConversionSettings(
        server=server,
        gpu_hour_price=hook.gpu_hour_price(),
        render_nice=render_nice(priority_class),
        limits=environment.document_limits(),
    )
    return resolve_run(
        params,
        input_uri=input_uri,
        output_uri=output_uri,
        run_id=airflow_run_id(context),
        settings=settings,
        documents=documents,
        modified_after=after,
        modified_until=until,
        # Reconciliation: scheduled runs and runs that list everything (a manual scope "all"). A backfill
        # retries failures inside its own interval only: its runs of adjacent intervals run at once.
        redrive=documents is None and (run_type == "scheduled" or (after is None and until is None)),
        retry_interval=schedule_interval(context),
        run_time=run_time(context),
        claim_expiry_s=environment.claim_expiry_s(),
        # The workers' allow-list: each task checks the run against it (``provider.tasks``).
        access=AccessPolicy.from_env(),
    )


def run_priority_class(context: Mapping[str, Any], documents: Sequence[str] | None = None) -> str:
    """This run's priority class (``olmocr_tasks.inference.priority``); ``documents`` as given to build_request.

    A run that asks for ``high`` itself is refused unless the deployment lets runs do so
    (``OLMOCR_ALLOW_HIGH_PRIORITY``): ``auto`` still gives high to runs that name their documents.
    """
    params = context["params"]
    if documents is None:
        documents = params.get("documents")
    chosen = run_class(_value(context["dag_run"].run_type), params, names_documents=documents is not None)
    if params.get("priority_class") == HIGH and not environment.allow_high_priority():
        raise ConfigurationError(
            "priority_class 'high' is refused: this deployment does not let a run raise its own priority "
            f"(set {environment.ALLOW_HIGH_PRIORITY}=true on the workers to allow it; with 'auto', a run "
            "naming its documents is high already)"
        )
    return chosen


def allowed_concurrency(requested: int, connection: ServerSettings) -> int:
    """A run's ``max_concurrent_requests``: refused above the vLLM connection's own unless the deployment
    allows it (``OLMOCR_ALLOW_HIGH_PRIORITY``); below it, a run may always ask for less."""
    limit = connection.concurrency.max_concurrent_requests
    if requested > limit and not environment.allow_high_priority():
        raise ConfigurationError(
            f"max_concurrent_requests {requested} is refused: it is above the vLLM connection's {limit} "
            f"(leave it empty for the connection's, or set {environment.ALLOW_HIGH_PRIORITY}=true on the workers)"
        )
    return requested


def render_nice(priority_class: str) -> int:
    """Niceness added to the render workers of a run of ``priority_class`` (``OLMOCR_LOW_PRIORITY_NICE``)."""
    if priority_class != LOW:
        return RENDER_NICE[priority_class]
    return environment.low_priority_nice(RENDER_NICE[LOW])


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


def max_map_length() -> int:
    """Airflow's ``[core] max_map_length``: the most instances one mapped task may expand to."""
    return conf.getint("core", "max_map_length", fallback=1024)


def batching_rule(
    params: Mapping[str, Any],
    request: RunRequest,
    priority_class: str | None = None,
    costs: InstanceCosts | None = None,
) -> BatchingRule:
    """How this run's documents are packed into convert instances (``olmocr_tasks.run.batching``).

    ``batch_pages`` (Param, default ``OLMOCR_BATCH_PAGES``); otherwise, from ``costs`` (what the last
    measured run's instances cost, ``olmocr_tasks.run.instance_costs``), the pages an instance needs
    for its fixed cost to stay under ``OLMOCR_INSTANCE_OVERHEAD`` (default 0.05) of its slot's time;
    without a measurement, the request window of a convert task, in at most ``UNMEASURED_MAX_WAVES``
    waves of at most ``UNMEASURED_MAX_PAGES`` pages each. ``OLMOCR_CONVERT_SLOTS``: convert
    instances that run at once (the pool's slots, at most workers times worker concurrency);
    ``OLMOCR_BYTES_PER_PAGE``: the page estimate from listed sizes. ``OLMOCR_LOW_CLASS_WAVES`` cuts a
    low-priority run into more waves of shorter instances (default 1: none), unless the run names its
    own ``batch_pages``: a size the user chose for this run is kept as given.
    """
    named_size = params.get("batch_pages")
    min_pages = named_size or environment.batch_pages()
    # Sized by the window alone (nothing measured yet): at most UNMEASURED_MAX_WAVES waves.
    unmeasured = not min_pages and costs is None
    max_waves, max_pages = (UNMEASURED_MAX_WAVES, UNMEASURED_MAX_PAGES) if unmeasured else (None, None)
    if not min_pages and costs is not None:
        min_pages = costs.min_pages(environment.instance_overhead(DEFAULT_OVERHEAD_FRACTION))
    short_waves = priority_class == LOW and not named_size
    try:
        return BatchingRule(
            min_pages=int(min_pages or request.settings.server.concurrency.max_concurrent_requests),
            parallel=environment.convert_slots(DEFAULT_PARALLEL),
            max_batches=max_map_length(),
            bytes_per_page=environment.bytes_per_page(DEFAULT_BYTES_PER_PAGE),
            min_waves=environment.low_class_waves(LOW_CLASS_MIN_WAVES) if short_waves else 1,
            max_waves=max_waves,
            max_pages=max_pages,
        )
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
