"""The run manifest: one JSON object per run, written last under ``OUTPUT/manifests/<run-id>.json``.

It is the run's commit marker: a reader that sees a manifest can trust every output it names. The
schema is versioned (``schema_version``) and published as ``olmocr_tasks/schemas/manifest.schema.json``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from olmocr_tasks.gpu_busy import GpuBusy
from olmocr_tasks.results import DocumentTotals

# 2: per-document ``redriven``, ``claimed_by`` and ``retry_from``; counts ``redriven``,
# ``redriven_failed``, ``claimed``, ``retry_later``, ``judged`` and ``judged_failed``. Version 1
# manifests still read (the new fields take their defaults).
SCHEMA_VERSION = 2
MANIFESTS_DIR = "manifests"

Status = Literal["converted", "failed", "skipped"]

_RUN_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")
# The error class of a planned document whose batch never reported it.
NOT_CONVERTED = "not_converted"
# Skip reasons of documents a run left for later: another run held its claim, or it failed recently
# and its next attempt is not due yet (``retry_from``).
SKIP_CLAIMED = "claimed"
SKIP_RETRY_LATER = "retry_later"
LEFT_FOR_LATER = frozenset({SKIP_CLAIMED, SKIP_RETRY_LATER})
# What ``metrics.cost.gpu_seconds`` counts: the GPU-busy seconds the batches measured from vLLM's
# /metrics (``gpu_busy``), or the run's wall-clock time when some batch could not measure them.
COST_BASIS_METRICS = "vllm_metrics_busy"
COST_BASIS_WALL_CLOCK = "wall_clock"


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def safe_run_id(run_id: str) -> str:
    """Run ids become object keys: keep them to a portable character set (Airflow's contain ':')."""
    cleaned = _RUN_ID_UNSAFE.sub("_", run_id).strip("._")
    return cleaned[:200] or "run"


def manifest_uri(output_uri: str, run_id: str) -> str:
    return f"{output_uri.rstrip('/')}/{MANIFESTS_DIR}/{safe_run_id(run_id)}.json"


@dataclass
class DocumentEntry:
    """One document's line in the manifest."""

    source: str
    status: Status
    size: int | None = None
    sha256: str | None = None
    error_class: str | None = None
    error: str | None = None
    pages: int = 0
    fallback_pages: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    attempts: int = 0
    seconds: float = 0.0
    outputs: dict[str, str] = field(default_factory=dict)
    # How many runs have tried this source version and failed (dead-letter bookkeeping).
    failed_attempts: int = 0
    skip_reason: str | None = None
    # For a skipped duplicate: the source whose identical bytes were converted (its outputs are reused).
    duplicate_of: str | None = None
    # Per-page latencies (seconds of the accepted attempt) and the attempt each page succeeded on;
    # these feed the run's percentiles and histogram.
    page_latencies_s: list[float] = field(default_factory=list)
    accepted_attempt_histogram: dict[str, int] = field(default_factory=dict)
    server_input_tokens: int = 0
    server_output_tokens: int = 0
    # Second requests sent for this document's pages that outlasted their peers (never page attempts).
    hedged: int = 0
    # Airflow context of the task that converted it (dag/run/task/map index), when run by Airflow.
    task: dict[str, Any] | None = None
    # Planned because its last outcome was a failure (re-drive): judged on its own line, not in the budget.
    redriven: bool = False
    # Skipped because another run held its claim (that run's id), or the run whose failure it cools down from.
    claimed_by: str | None = None
    # Skipped as ``retry_later``: the earliest run time that tries it again (ISO 8601).
    retry_from: str | None = None

    def record_totals(self, totals: DocumentTotals) -> None:
        """Take a converted document's totals (the same object its Dolma record was written from)."""
        self.pages = totals.pages
        self.fallback_pages = totals.fallback_pages
        self.input_tokens = totals.input_tokens
        self.output_tokens = totals.output_tokens
        self.attempts = totals.attempts
        self.server_input_tokens = totals.server_input_tokens
        self.server_output_tokens = totals.server_output_tokens
        self.page_latencies_s = list(totals.page_latencies_s)
        self.accepted_attempt_histogram = dict(totals.accepted_attempt_histogram)
        self.hedged = totals.hedged

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DocumentEntry:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


@dataclass
class Manifest:
    run_id: str
    started_at: str
    finished_at: str
    server: dict[str, Any]
    model: str
    prompt_version: str
    package_version: str
    settings: dict[str, Any]
    input_uri: str
    output_uri: str
    documents: list[DocumentEntry]
    dead_letters: list[DocumentEntry] = field(default_factory=list)
    already_converted: int = 0
    gpu_hour_price: float | None = None
    # The GPU-busy seconds the run's batches measured, summed (None: no batch reported, older manifests).
    gpu_busy: GpuBusy | None = None
    # Set by ``judge_error_budget`` (the Airflow publish task): the budget and whether this run exceeded it.
    error_budget: dict[str, Any] | None = None
    # Set by the Airflow publish task: the DAG run (id, type, data interval) this manifest belongs to.
    airflow_run: dict[str, Any] | None = None
    schema_version: int = SCHEMA_VERSION

    def counts(self) -> dict[str, int]:
        return {
            **count_entries(self.documents),
            "dead_letters": len(self.dead_letters),
            "already_converted": self.already_converted,
        }

    def judge_error_budget(self, max_document_error_rate: float) -> dict[str, Any]:
        """Record (in ``error_budget``) and return whether this run counts as failed, and why.

        The only place the run-level budget is judged: the Airflow enforce task and the OCR runs page
        read the verdict from the manifest instead of judging again.
        """
        self.error_budget = {
            "max_document_error_rate": max_document_error_rate,
            **error_budget_verdict(self.counts(), max_document_error_rate),
        }
        return self.error_budget

    def metrics(self) -> dict[str, Any]:
        counts = self.counts()
        elapsed = max(_seconds_between(self.started_at, self.finished_at), 1e-9)
        latencies = sorted(lat for doc in self.documents for lat in doc.page_latencies_s)
        histogram: dict[str, int] = {}
        for doc in self.documents:
            for attempt, n in doc.accepted_attempt_histogram.items():
                histogram[attempt] = histogram.get(attempt, 0) + n
        pages = counts["pages"]
        metrics: dict[str, Any] = {
            "elapsed_s": round(elapsed, 3),
            "pages_per_second": round(pages / elapsed, 3),
            "fallback_rate": round(counts["fallback_pages"] / pages, 6) if pages else 0.0,
            "latency_p50_s": _percentile(latencies, 50),
            "latency_p95_s": _percentile(latencies, 95),
            "accepted_attempt_histogram": dict(sorted(histogram.items(), key=lambda kv: _attempt_key(kv[0]))),
            "output_tokens_per_page": round(counts["output_tokens"] / pages, 1) if pages else 0.0,
        }
        metrics["cost"] = self._cost_estimate(elapsed, pages)
        return metrics

    def _cost_estimate(self, elapsed: float, pages: int) -> dict[str, Any] | None:
        """GPU cost of the run at the configured hourly price.

        The seconds are the GPU-busy time the batches measured from vLLM's ``/metrics`` (their shares
        of a shared server) when every batch measured its own; otherwise (a server without
        ``/metrics``, polling off, a batch that died before reporting, a manifest from before the
        measurement) the run's wall-clock time, which overstates an idle or shared server.
        """
        if self.gpu_hour_price is None:
            return None
        if self.gpu_busy is not None and self.gpu_busy.measured:
            basis, gpu_seconds = COST_BASIS_METRICS, round(self.gpu_busy.seconds, 3)
        else:
            basis, gpu_seconds = COST_BASIS_WALL_CLOCK, round(elapsed, 3)
        cost = self.gpu_hour_price * gpu_seconds / 3600
        return {
            "basis": basis,
            "gpu_hour_price": self.gpu_hour_price,
            "gpu_seconds": gpu_seconds,
            "estimated_cost": round(cost, 6),
            "cost_per_million_pages": round(cost / pages * 1_000_000, 2) if pages else None,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "run_id": self.run_id,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "package_version": self.package_version,
            "server": self.server,
            "model": self.model,
            "prompt_version": self.prompt_version,
            "input_uri": self.input_uri,
            "output_uri": self.output_uri,
            "settings": self.settings,
            "counts": self.counts(),
            "metrics": self.metrics(),
            "gpu_busy": self.gpu_busy and self.gpu_busy.to_dict(),
            "error_budget": self.error_budget,
            "airflow_run": self.airflow_run,
            "documents": [doc.to_dict() for doc in self.documents],
            "dead_letters": [doc.to_dict() for doc in self.dead_letters],
        }

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=False).encode("utf-8")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        return cls(
            run_id=data["run_id"],
            started_at=data["started_at"],
            finished_at=data["finished_at"],
            server=data.get("server", {}),
            model=data["model"],
            prompt_version=data["prompt_version"],
            package_version=data.get("package_version", ""),
            settings=data.get("settings", {}),
            input_uri=data.get("input_uri", ""),
            output_uri=data.get("output_uri", ""),
            documents=[DocumentEntry.from_dict(doc) for doc in data.get("documents", [])],
            dead_letters=[DocumentEntry.from_dict(doc) for doc in data.get("dead_letters", [])],
            already_converted=data.get("counts", {}).get("already_converted", 0),
            gpu_hour_price=(data.get("metrics", {}).get("cost") or {}).get("gpu_hour_price"),
            gpu_busy=GpuBusy.from_dict(data.get("gpu_busy")),
            error_budget=data.get("error_budget"),
            airflow_run=data.get("airflow_run"),
            schema_version=data.get("schema_version", SCHEMA_VERSION),
        )


def count_entries(documents: Iterable[DocumentEntry]) -> dict[str, int]:
    """The totals of a set of entries: a run's (``Manifest.counts``) or one batch's (its XCom summary).

    Pages and accepted tokens count converted documents only (what the outputs hold); server tokens,
    attempts and hedged requests count every document (what the server spent).
    """
    counts = dict.fromkeys(
        ("documents", "converted", "failed", "skipped", "pages", "fallback_pages", "input_tokens", "output_tokens"), 0
    )
    counts |= dict.fromkeys(("server_input_tokens", "server_output_tokens", "attempts", "hedged", NOT_CONVERTED), 0)
    counts |= dict.fromkeys(
        ("redriven", "redriven_failed", SKIP_CLAIMED, SKIP_RETRY_LATER, "judged", "judged_failed"), 0
    )
    for doc in documents:
        counts["documents"] += 1
        counts[doc.status] += 1
        if doc.status == "converted":
            counts["pages"] += doc.pages
            counts["fallback_pages"] += doc.fallback_pages
            counts["input_tokens"] += doc.input_tokens
            counts["output_tokens"] += doc.output_tokens
        counts["server_input_tokens"] += doc.server_input_tokens
        counts["server_output_tokens"] += doc.server_output_tokens
        counts["attempts"] += doc.attempts
        counts["hedged"] += doc.hedged
        counts[NOT_CONVERTED] += doc.error_class == NOT_CONVERTED
        left_for_later = doc.status == "skipped" and doc.skip_reason in LEFT_FOR_LATER
        if left_for_later:
            counts[doc.skip_reason or ""] += 1
        if doc.redriven:
            counts["redriven"] += 1
            counts["redriven_failed"] += doc.status == "failed"
        elif not left_for_later:
            # What the error budget judges: the run's own documents that it really tried.
            counts["judged"] += 1
            counts["judged_failed"] += doc.status == "failed"
    return counts


def error_budget_verdict(counts: dict[str, int], max_document_error_rate: float) -> dict[str, Any]:
    """``{"exceeded": bool, "problems": [why, ...]}`` for a run's counts (see ``Manifest.counts``)."""
    problems = []
    if counts.get(NOT_CONVERTED):
        problems.append(
            f"{counts[NOT_CONVERTED]} documents were in convert tasks that failed "
            "(see those task logs; the next run retries them)"
        )
    if "judged" in counts:
        attempted, failed = counts["judged"], counts["judged_failed"]
    else:  # schema 1 counts: every document was judged
        attempted = counts.get("converted", 0) + counts.get("failed", 0) + counts.get("skipped", 0)
        failed = counts.get("failed", 0)
    if attempted and failed / attempted > max_document_error_rate:
        problems.append(
            f"{failed} of {attempted} documents failed ({failed / attempted:.1%}), "
            f"over the budget of {max_document_error_rate:.1%}"
        )
    verdict: dict[str, Any] = {"exceeded": bool(problems), "problems": problems}
    if counts.get("redriven"):
        # Re-driven documents are judged on their own line: earlier failures tried again never turn a
        # run red (the dead-letter policy bounds them); they are reported here instead.
        verdict["redriven"] = {"documents": counts["redriven"], "failed": counts.get("redriven_failed", 0)}
    return verdict


def _attempt_key(attempt: str) -> int:
    return int(attempt) if attempt.isdigit() else 1_000_000


def _percentile(sorted_values: list[float], percentile: int) -> float | None:
    if not sorted_values:
        return None
    if len(sorted_values) == 1:
        return round(sorted_values[0], 4)
    cut_points = statistics.quantiles(sorted_values, n=100, method="inclusive")
    return round(cut_points[percentile - 1], 4)


def _seconds_between(start: str, end: str) -> float:
    def parse(stamp: str) -> datetime:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))

    return (parse(end) - parse(start)).total_seconds()
