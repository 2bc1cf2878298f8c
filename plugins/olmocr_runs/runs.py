"""Turn a manifest's JSON into what the pages show, tolerating older, newer or partial manifests.

Manifests are read as plain dicts against ``olmocr_tasks/schemas/manifest.schema.json``: ``counts``,
``metrics`` and the ``error_budget`` verdict are shown as the run wrote them and never recomputed
here, so the page and the Airflow run can never disagree. Unknown fields are ignored and missing
ones shown as blanks, so a schema change never takes the pages down.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from olmocr_tasks.public import COUNT_KEYS, redact

METRIC_KEYS = (
    "elapsed_s",
    "pages_per_second",
    "fallback_rate",
    "latency_p50_s",
    "latency_p95_s",
    "accepted_attempt_histogram",
    "output_tokens_per_page",
    "cost",
)

STATUS_LABELS = {
    "all_converted": "all converted",
    "some_failed": "some failed",
    "failed_budget": "failed budget",
    "empty": "nothing to convert",
}
_EPOCH = datetime.min.replace(tzinfo=UTC)
OUTPUT_KINDS = ("markdown", "dolma")


def parse_time(stamp: Any) -> datetime | None:
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        parsed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _int(value: Any) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    return 0


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def counts_of(data: dict[str, Any]) -> dict[str, int]:
    """The manifest's ``counts`` as written; a count an older manifest lacks reads as 0."""
    stored = data.get("counts") if isinstance(data.get("counts"), dict) else {}
    return {key: _int(stored.get(key)) for key in COUNT_KEYS}


def metrics_of(data: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``metrics`` as written; a metric it lacks is None (shown as a blank)."""
    stored = data.get("metrics") if isinstance(data.get("metrics"), dict) else {}
    return {key: stored.get(key) for key in METRIC_KEYS}


def run_status(data: dict[str, Any], counts: dict[str, int]) -> str:
    """all_converted / some_failed / failed_budget / empty.

    Over budget only when the manifest's ``error_budget`` verdict says so: the publish task judges
    the budget once (``Manifest.judge_error_budget``, for CLI and Airflow runs alike) and writes it
    there; manifests published before the CLI judged it have none.
    """
    budget = data.get("error_budget")
    if isinstance(budget, dict) and budget.get("exceeded") is True:
        return "failed_budget"
    if counts["failed"] or counts["dead_letters"]:
        return "some_failed"
    if not counts["documents"]:
        return "empty"
    return "all_converted"


@dataclass
class RunSummary:
    """One row of the runs list."""

    key: str
    run_id: str
    started_at: str
    finished_at: str
    status: str
    counts: dict[str, int]
    pages_per_second: float | None
    fallback_rate: float | None
    estimated_cost: float | None
    model: str
    trigger: str = ""
    # The DAG that made the run (empty for a CLI run): who may see it is decided by it (``access``).
    dag_id: str = ""
    sort_key: tuple[datetime, str] = field(repr=False, default=(_EPOCH, ""))

    @property
    def status_label(self) -> str:
        return STATUS_LABELS.get(self.status, self.status)

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "sort_key"}
        data["counts"] = dict(self.counts)
        data["status_label"] = self.status_label
        return data


def summarize(key: str, data: dict[str, Any]) -> RunSummary:
    counts = counts_of(data)
    metrics = metrics_of(data)
    cost = metrics.get("cost") if isinstance(metrics.get("cost"), dict) else {}
    finished = _text(data.get("finished_at"))
    trigger = trigger_of(data)
    return RunSummary(
        key=key,
        run_id=_text(data.get("run_id")) or key,
        started_at=_text(data.get("started_at")),
        finished_at=finished,
        status=run_status(data, counts),
        counts=counts,
        pages_per_second=_float(metrics.get("pages_per_second")),
        fallback_rate=_float(metrics.get("fallback_rate")),
        estimated_cost=_float(cost.get("estimated_cost")),
        model=_text(data.get("model")),
        trigger=trigger.label,
        dag_id=trigger.dag_id,
        # Runs without a readable finish time sort after all others.
        sort_key=(parse_time(finished) or _EPOCH, key),
    )


def task_log_href(task: Any, airflow_base: str = "") -> str | None:
    """The Airflow 3 UI page of the task instance (its logs), or None without a full task identity."""
    if not isinstance(task, dict):
        return None
    parts = [task.get("dag_id"), task.get("run_id"), task.get("task_id")]
    if not all(isinstance(part, str) and part for part in parts):
        return None
    dag_id, run_id, task_id = (quote(part, safe="") for part in parts)
    href = f"{airflow_base.rstrip('/')}/dags/{dag_id}/runs/{run_id}/tasks/{task_id}"
    map_index = task.get("map_index")
    if isinstance(map_index, int) and not isinstance(map_index, bool) and map_index >= 0:
        href += f"/mapped/{map_index}"
    try_number = task.get("try_number")
    if isinstance(try_number, int) and not isinstance(try_number, bool) and try_number > 0:
        href += f"?try_number={try_number}"
    return href


@dataclass
class ProblemRow:
    """A failed document or a dead letter, as listed on the run page."""

    kind: str
    source: str
    error_class: str
    error: str
    attempts: int
    failed_attempts: int
    log_href: str | None


@dataclass(frozen=True)
class DocumentRow:
    """One document of a run, as the run page and the search list it."""

    index: int  # position in the manifest's ``documents``: how output links find it again
    source: str
    status: str
    pages: int
    fallback_pages: int
    input_tokens: int
    output_tokens: int
    error_class: str
    error: str
    skip_reason: str
    outputs: tuple[str, ...]  # which outputs it has ("markdown", "dolma")
    task: dict[str, Any] | None
    # Schema 2: planned as a re-drive of an earlier failure; the run holding its claim (skipped
    # "claimed") or whose failure it cools down from (skipped "retry_later", until ``retry_from``).
    redriven: bool = False
    claimed_by: str = ""
    retry_from: str = ""

    @property
    def skip_note(self) -> str:
        """Why a skipped document was left alone, in words (empty for other documents)."""
        if self.skip_reason == "claimed":
            return f"claimed by run {self.claimed_by or 'unknown'}: that run converts it"
        if self.skip_reason == "retry_later":
            return f"failed recently; tried again from {self.retry_from or 'the next interval'}"
        return self.skip_reason.replace("_", " ")

    @property
    def name(self) -> str:
        return self.source.rstrip("/").rsplit("/", 1)[-1]

    def log_href(self, airflow_base: str = "") -> str | None:
        return task_log_href(self.task, airflow_base)


def document_row(index: int, doc: dict[str, Any]) -> DocumentRow:
    """The row of the entry at position ``index`` of the manifest's documents."""
    outputs = doc.get("outputs") if isinstance(doc.get("outputs"), dict) else {}
    return DocumentRow(
        index=index,
        source=_text(doc.get("source")),
        status=_text(doc.get("status")),
        pages=_int(doc.get("pages")),
        fallback_pages=_int(doc.get("fallback_pages")),
        input_tokens=_int(doc.get("input_tokens")),
        output_tokens=_int(doc.get("output_tokens")),
        error_class=_text(doc.get("error_class")),
        error=redact(_text(doc.get("error"))),
        skip_reason=_text(doc.get("skip_reason")),
        outputs=tuple(kind for kind in OUTPUT_KINDS if isinstance(outputs.get(kind), str)),
        task=doc.get("task") if isinstance(doc.get("task"), dict) else None,
        redriven=doc.get("redriven") is True,
        claimed_by=_text(doc.get("claimed_by")),
        retry_from=_text(doc.get("retry_from")),
    )


def output_of(document: dict[str, Any] | None, kind: str) -> str | None:
    """The URI the manifest gives for one document's output, or None."""
    if kind not in OUTPUT_KINDS or not isinstance(document, dict):
        return None
    outputs = document.get("outputs")
    uri = outputs.get(kind) if isinstance(outputs, dict) else None
    return uri if isinstance(uri, str) and uri else None


TRIGGER_LABELS = {
    "scheduled": "scheduled",
    "backfill": "backfill",
    "manual": "manual (UI or REST API)",
    "asset_triggered": "event",
    "asset_materialization": "asset materialisation",
    "operator_triggered": "triggered by another DAG",
}


@dataclass(frozen=True)
class Trigger:
    """How the run was started and which data interval it covered (from the manifest's ``airflow_run``)."""

    label: str
    dag_id: str
    run_id: str
    interval_start: str
    interval_end: str
    user: str


def trigger_of(data: dict[str, Any]) -> Trigger:
    run = data.get("airflow_run")
    if not isinstance(run, dict):
        return Trigger("command line", "", "", "", "", "")
    run_type = _text(run.get("run_type"))
    return Trigger(
        label=TRIGGER_LABELS.get(run_type, run_type or "unknown"),
        dag_id=_text(run.get("dag_id")),
        run_id=_text(run.get("run_id")),
        interval_start=_text(run.get("data_interval_start")),
        interval_end=_text(run.get("data_interval_end")),
        user=_text(run.get("triggering_user_name")),
    )


@dataclass
class RunDetail:
    summary: RunSummary
    metrics: dict[str, Any]
    cost: dict[str, Any] | None
    model: str
    prompt_version: str
    package_version: str
    schema_version: str
    server: dict[str, Any]
    settings: dict[str, Any]
    input_uri: str
    output_uri: str
    # The first failed documents and dead letters (the summary keeps a few), with their totals.
    failed: list[ProblemRow]
    failed_total: int
    dead_letters: list[ProblemRow]
    dead_letters_total: int
    progress: list[tuple[float, float]]
    progress_note: str
    latency_bins: list[tuple[str, int]]
    latency_count: int
    failures_by_class: list[tuple[str, int]]
    attempt_histogram: list[tuple[str, int]]
    # The published verdict: why the run counts as failed (empty within budget or in older CLI manifests).
    budget_problems: list[str] = field(default_factory=list)
    trigger: Trigger | None = None


def _problem(kind: str, entry: Any, airflow_base: str) -> ProblemRow:
    entry = entry if isinstance(entry, dict) else {}
    return ProblemRow(
        kind=kind,
        source=_text(entry.get("source")),
        error_class=_text(entry.get("error_class")),
        error=redact(_text(entry.get("error"))),
        attempts=_int(entry.get("attempts")),
        failed_attempts=_int(entry.get("failed_attempts")),
        log_href=task_log_href(entry.get("task"), airflow_base),
    )


def progress_points(progress: Any, elapsed_s: float | None) -> tuple[list[tuple[float, float]], str]:
    """Cumulative converted pages against seconds since the run started, and how they were derived.

    Documents carry no start or finish time, only how long each took, and many run concurrently.
    So the documents are taken in manifest order and each is placed on the run's wall clock in
    proportion to the share of all conversion seconds spent up to and including it: the curve's end
    points are exact, its shape an estimate. The summary's overview holds the points as
    [documents so far, conversion seconds so far, converted pages so far], thinned at publish.
    """
    progress = progress if isinstance(progress, dict) else {}
    points = [p for p in progress.get("points") or [] if isinstance(p, list) and len(p) == 3]
    if not points:
        return [], "No document was converted in this run."
    documents = max(_int(progress.get("documents")), 1)
    busy = _float(progress.get("busy_s")) or 0.0
    wall = elapsed_s if elapsed_s and elapsed_s > 0 else busy
    curve = [(0.0, 0.0)]
    for done, spent, pages in points:
        # Without any timing at all, spread the documents evenly over the run.
        fraction = (_float(spent) or 0.0) / busy if busy else _int(done) / documents
        curve.append((round(wall * fraction, 3), float(_int(pages))))
    return curve, (
        "Estimated: documents are placed on the run's wall clock in manifest order, in proportion "
        "to their conversion seconds. The final total is exact."
    )


def build_detail(key: str, data: dict[str, Any], overview: dict[str, Any], airflow_base: str = "") -> RunDetail:
    """The run page from the summary ``data`` and its ``overview`` (no entries needed)."""
    summary = summarize(key, data)
    metrics = metrics_of(data)
    histogram = metrics.get("accepted_attempt_histogram")
    attempts = (
        sorted(
            ((str(attempt), _int(n)) for attempt, n in histogram.items()),
            key=lambda item: (not item[0].isdigit(), int(item[0]) if item[0].isdigit() else 0, item[0]),
        )
        if isinstance(histogram, dict)
        else []
    )
    progress, progress_note = progress_points(overview.get("progress"), _float(metrics.get("elapsed_s")))
    classes = overview.get("failure_classes") if isinstance(overview.get("failure_classes"), dict) else {}
    failed = overview.get("failed") if isinstance(overview.get("failed"), dict) else {}
    dead = overview.get("dead_letters") if isinstance(overview.get("dead_letters"), dict) else {}
    bins = overview.get("latency_histogram") if isinstance(overview.get("latency_histogram"), list) else []
    cost = metrics.get("cost") if isinstance(metrics.get("cost"), dict) else None
    server = data.get("server")
    settings = data.get("settings")
    budget = data.get("error_budget") if isinstance(data.get("error_budget"), dict) else {}
    budget_problems = budget.get("problems") if isinstance(budget.get("problems"), list) else []
    return RunDetail(
        summary=summary,
        metrics=metrics,
        cost=cost,
        model=_text(data.get("model")),
        prompt_version=_text(data.get("prompt_version")),
        package_version=_text(data.get("package_version")),
        schema_version=_text(data.get("schema_version")),
        server=redact(server) if isinstance(server, dict) else {},
        settings=redact(settings) if isinstance(settings, dict) else {},
        input_uri=redact(_text(data.get("input_uri"))),
        output_uri=redact(_text(data.get("output_uri"))),
        failed=[_problem("failed", entry, airflow_base) for entry in failed.get("first") or []],
        failed_total=_int(failed.get("total")),
        dead_letters=[_problem("dead letter", entry, airflow_base) for entry in dead.get("first") or []],
        dead_letters_total=_int(dead.get("total")),
        progress=progress,
        progress_note=progress_note,
        latency_bins=[(_text(b[0]), _int(b[1])) for b in bins if isinstance(b, list) and len(b) == 2],
        latency_count=_int(overview.get("latency_count")),
        failures_by_class=sorted(((str(k), _int(v)) for k, v in classes.items()), key=lambda item: (-item[1], item[0])),
        attempt_histogram=attempts,
        budget_problems=[_text(problem) for problem in budget_problems] if budget.get("exceeded") is True else [],
        trigger=trigger_of(data),
    )
