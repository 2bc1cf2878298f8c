"""The run manifest: a small summary per run, written last under ``OUTPUT/manifests/<run-id>.json``.

The summary (counts, metrics, error budget, cost) stays bounded whatever the run's size; the
per-document entries go to gzip-compressed JSON Lines *shards* under
``OUTPUT/manifests/<run-id>/<publish-id>/`` (``documents-00000.jsonl.gz``, ``dead-letters-00000.jsonl.gz``),
which the summary names under ``entries``. ``ManifestWriter`` writes the shards first and the summary
last, so the summary stays the run's commit marker: a reader that sees it can trust every output and
every shard it names. Each publish writes under a fresh publish id, so republishing a run never
rewrites a shard an earlier summary names. Read manifests through ``olmocr_tasks.location.manifest_reader``
(old single-file manifests, entries inline, read the same way). The schema is versioned
(``schema_version``) and published as ``olmocr_tasks/schemas/manifest.schema.json``.
"""

from __future__ import annotations

import dataclasses
import gzip
import heapq
import io
import json
import secrets
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from olmocr_tasks.core.gpu_busy import GpuBusy
from olmocr_tasks.core.redaction import redact
from olmocr_tasks.location.layout import OutputLocation, shard_path, shards_folder
from olmocr_tasks.location.manifest_overview import OverviewFolder
from olmocr_tasks.page.results import DocumentTotals
from olmocr_tasks.storage.store import Storage

# 2: per-document ``redriven``, ``claimed_by`` and ``retry_from``; counts ``redriven``,
# ``redriven_failed``, ``claimed``, ``retry_later``, ``judged`` and ``judged_failed``.
# 3: entries in shards named by ``entries`` (no inline ``documents``/``dead_letters``), ``error_classes``.
# Versions 1 and 2 still read (the new fields take their defaults).
SCHEMA_VERSION = 3
# Entries per shard: a shard of one-page documents is about 1.5 MB compressed, and a run of a million
# documents names 100 shards (about 10 KB of the summary).
SHARD_ENTRIES = 10_000
DOCUMENTS_KIND = "documents"
DEAD_LETTERS_KIND = "dead_letters"
# The file names of each kind's shards (``layout.shard_path``).
_SHARD_NAMES = {DOCUMENTS_KIND: "documents", DEAD_LETTERS_KIND: "dead-letters"}
# Page latencies sorted at a time, in place, for the percentiles (a chunk's Python floats cost about 2 MB).
_SORT_CHUNK = 65_536

Status = Literal["converted", "failed", "skipped"]

# The error class of a planned document whose batch never reported it.
NOT_CONVERTED = "not_converted"
# Skip reasons of documents a run left for later: another run held its claim, or it failed recently
# and its next attempt is not due yet (``retry_from``).
SKIP_CLAIMED = "claimed"
SKIP_RETRY_LATER = "retry_later"
LEFT_FOR_LATER = frozenset({SKIP_CLAIMED, SKIP_RETRY_LATER})
# The keys of a summary's ``counts``, in the order it writes them; every reader of counts uses these.
# Folded from the entries (``RunTotals``): statuses, pages and tokens of converted documents, what the
# server spent, and how the error budget and re-drive saw them.
STATUSES: tuple[Status, ...] = ("converted", "failed", "skipped")
PAGE_COUNT_KEYS = ("pages", "fallback_pages")
ENTRY_COUNT_KEYS = (
    "documents",
    *STATUSES,
    *PAGE_COUNT_KEYS,
    "input_tokens",
    "output_tokens",
    "server_input_tokens",
    "server_output_tokens",
    "attempts",
    "hedged",
    NOT_CONVERTED,
    "redriven",
    "redriven_failed",
    SKIP_CLAIMED,
    SKIP_RETRY_LATER,
    "judged",
    "judged_failed",
)
# Counted by the plan, outside the entries: dead letters, and documents earlier runs converted.
PLAN_COUNT_KEYS = ("dead_letters", "already_converted")
COUNT_KEYS = ENTRY_COUNT_KEYS + PLAN_COUNT_KEYS
# How a run's documents ended, the counts a report about a run leads with.
OUTCOME_COUNT_KEYS = ("documents", *STATUSES, NOT_CONVERTED, "dead_letters")
# What ``metrics.cost.gpu_seconds`` counts: the GPU-busy seconds the batches measured from vLLM's
# /metrics (``gpu_busy``), or the run's wall-clock time when some batch could not measure them.
COST_BASIS_METRICS = "vllm_metrics_busy"
COST_BASIS_WALL_CLOCK = "wall_clock"


def manifest_uri(output_uri: str, run_id: str) -> str:
    """Where the summary of ``run_id``'s manifest is (or will be) under ``output_uri``."""
    return OutputLocation(output_uri).manifest(run_id)


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
        # Field by field with shallow copies of the containers (the values are plain JSON values):
        # a tenth of ``dataclasses.asdict``'s time, which counts when a publish writes a million entries.
        data = {name: getattr(self, name) for name in _ENTRY_FIELDS}
        for name, value in data.items():
            if isinstance(value, list):
                data[name] = list(value)
            elif isinstance(value, dict):
                data[name] = dict(value)
        if self.error:
            # Whatever wrote it (the engine redacts the texts it makes; a ledger record of an older
            # version may not have), an error text is stored and shown without secrets.
            data["error"] = redact(self.error)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DocumentEntry:
        return cls(**{key: value for key, value in data.items() if key in _ENTRY_FIELD_SET})


_ENTRY_FIELDS = tuple(field.name for field in dataclasses.fields(DocumentEntry))
_ENTRY_FIELD_SET = frozenset(_ENTRY_FIELDS)


class RunTotals:
    """What a manifest's counts and metrics are made of, folded one entry at a time.

    Writers add entries as they stream them to shards and never keep the entries themselves: only the
    counts, each converted page's latency (8 bytes in an array, for exact percentiles) and the small
    histograms. A summary read back carries its stored percentiles instead of the latencies.
    """

    def __init__(self) -> None:
        self.counts = _empty_counts()
        self.latencies = array("d")
        self.histogram: Counter[str] = Counter()
        self.error_classes: Counter[str] = Counter()
        # Read back from a summary: (p50, p95) as written, since its latencies are not stored.
        self.stored_percentiles: tuple[float | None, float | None] | None = None

    @classmethod
    def of(cls, documents: Iterable[DocumentEntry]) -> RunTotals:
        totals = cls()
        for doc in documents:
            totals.add(doc)
        return totals

    @classmethod
    def from_summary(cls, data: dict[str, Any]) -> RunTotals:
        """The totals a schema 3 summary recorded (its entries are in shards, not needed here)."""
        totals = cls()
        stored = data.get("counts") or {}
        totals.counts.update({key: value for key, value in stored.items() if key in totals.counts})
        metrics = data.get("metrics") or {}
        totals.histogram.update(metrics.get("accepted_attempt_histogram") or {})
        totals.error_classes.update(data.get("error_classes") or {})
        totals.stored_percentiles = (metrics.get("latency_p50_s"), metrics.get("latency_p95_s"))
        return totals

    def add(self, doc: DocumentEntry) -> None:
        """Fold one entry. Pages and accepted tokens count converted documents only (what the outputs
        hold); server tokens, attempts and hedged requests count every document (what the server spent)."""
        counts = self.counts
        counts["documents"] += 1
        counts[doc.status] += 1
        if doc.status == "converted":
            counts["pages"] += doc.pages
            counts["fallback_pages"] += doc.fallback_pages
            counts["input_tokens"] += doc.input_tokens
            counts["output_tokens"] += doc.output_tokens
        elif doc.status == "failed":
            self.error_classes[doc.error_class or "unknown"] += 1
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
        self.latencies.extend(doc.page_latencies_s)
        self.histogram.update(doc.accepted_attempt_histogram)

    def percentiles(self) -> tuple[float | None, float | None]:
        if self.stored_percentiles is not None:
            return self.stored_percentiles
        p50, p95 = exact_percentiles(self.latencies, (50, 95))
        return p50, p95

    def sorted_error_classes(self) -> dict[str, int]:
        """Failed documents per error class, most frequent first (the failure report's order)."""
        return dict(sorted(self.error_classes.items(), key=lambda item: (-item[1], item[0])))


@dataclass
class Manifest:
    """A run's summary. Built from inline ``documents`` (small runs, tests) or from the ``totals`` a
    ``ManifestWriter`` folded while it streamed the entries to shards (``entries`` then names them)."""

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
    documents: list[DocumentEntry] = field(default_factory=list)
    dead_letters: list[DocumentEntry] = field(default_factory=list)
    already_converted: int = 0
    gpu_hour_price: float | None = None
    # The GPU-busy seconds the run's batches measured, summed (None: no batch reported, older manifests).
    gpu_busy: GpuBusy | None = None
    # Set by ``judge_error_budget`` when the run is published: the budget and whether this run exceeded it.
    error_budget: dict[str, Any] | None = None
    # Set by the Airflow publish task: the DAG run (id, type, data interval) this manifest belongs to.
    airflow_run: dict[str, Any] | None = None
    schema_version: int = SCHEMA_VERSION
    # Folded by a ``ManifestWriter`` (or read back from a summary); None: fold ``documents``.
    totals: RunTotals | None = None
    dead_letter_count: int | None = None
    # The shards holding the entries (set by ``ManifestWriter.commit``); None: inline entries.
    entries: dict[str, Any] | None = None
    # What the runs page shows besides the counts (``olmocr_tasks.location.manifest_overview``), set by the writer.
    overview: dict[str, Any] | None = None
    # The storage requests the run's batches reported (``pipeline.total_storage_requests``): by kind,
    # how many batches, whether all of them reported. None: no batch, or a manifest from before.
    storage_requests: dict[str, Any] | None = None

    def _totals(self) -> RunTotals:
        return self.totals if self.totals is not None else RunTotals.of(self.documents)

    def counts(self) -> dict[str, int]:
        dead_letters = self.dead_letter_count if self.dead_letter_count is not None else len(self.dead_letters)
        return {**self._totals().counts, "dead_letters": dead_letters, "already_converted": self.already_converted}

    def judge_error_budget(self, max_document_error_rate: float) -> dict[str, Any]:
        """Record (in ``error_budget``) and return whether this run counts as failed, and why.

        The only place the run-level budget is judged (``olmocr_tasks.run.publishing``, for the CLI and the
        Airflow tasks): the Airflow enforce task, the CLI's exit code and the OCR runs page read the
        verdict from the manifest instead of judging again.
        """
        self.error_budget = {
            "max_document_error_rate": max_document_error_rate,
            **error_budget_verdict(self.counts(), max_document_error_rate),
        }
        return self.error_budget

    def metrics(self) -> dict[str, Any]:
        counts = self.counts()
        totals = self._totals()
        elapsed = max(_seconds_between(self.started_at, self.finished_at), 1e-9)
        p50, p95 = totals.percentiles()
        pages = counts["pages"]
        metrics: dict[str, Any] = {
            "elapsed_s": round(elapsed, 3),
            "pages_per_second": round(pages / elapsed, 3),
            "fallback_rate": round(counts["fallback_pages"] / pages, 6) if pages else 0.0,
            "latency_p50_s": p50,
            "latency_p95_s": p95,
            "accepted_attempt_histogram": dict(sorted(totals.histogram.items(), key=lambda kv: _attempt_key(kv[0]))),
            "output_tokens_per_page": round(counts["output_tokens"] / pages, 1) if pages else 0.0,
        }
        metrics["cost"] = self._cost_estimate(elapsed, pages)
        if self.storage_requests is not None:
            metrics["storage_requests"] = _storage_request_metrics(self.storage_requests, counts["converted"])
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
        """The summary; with inline entries (``entries`` None: never written through a writer) also
        ``documents`` and ``dead_letters``, the shape schema 1 and 2 manifests had."""
        data: dict[str, Any] = {
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
            "error_classes": self._totals().sorted_error_classes(),
            "gpu_busy": self.gpu_busy and self.gpu_busy.to_dict(),
            "error_budget": self.error_budget,
            "airflow_run": self.airflow_run,
        }
        if self.overview is not None:
            data["overview"] = self.overview
        if self.entries is not None:
            data["entries"] = self.entries
        else:
            data["documents"] = [doc.to_dict() for doc in self.documents]
            data["dead_letters"] = [doc.to_dict() for doc in self.dead_letters]
        return data

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=False).encode("utf-8")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        """A manifest from its JSON: inline entries (schema 1, 2) are kept; a sharded summary keeps its
        stored totals (read its entries with ``olmocr_tasks.location.manifest_reader``)."""
        sharded = "entries" in data and "documents" not in data
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
            totals=RunTotals.from_summary(data) if sharded else None,
            dead_letter_count=data.get("counts", {}).get("dead_letters", 0) if sharded else None,
            entries=data.get("entries") if sharded else None,
            overview=data.get("overview") if isinstance(data.get("overview"), dict) else None,
            storage_requests=_stored_storage_requests(data.get("metrics", {}).get("storage_requests")),
        )


def _storage_request_metrics(recorded: dict[str, Any], converted: int) -> dict[str, Any]:
    """``metrics.storage_requests``: the batches' requests by kind, their total, and both per converted
    document (what a document's state costs; None when nothing was converted)."""
    by_kind = {kind: int(count) for kind, count in recorded["by_kind"].items()}
    total = sum(by_kind.values())
    per_document = None
    if converted:
        per_document = {kind: round(count / converted, 3) for kind, count in by_kind.items()}
        per_document["total"] = round(total / converted, 3)
    metrics: dict[str, Any] = {
        "by_kind": by_kind,
        "total": total,
        "batches": recorded["batches"],
        "complete": recorded["complete"],
        "converted_documents": converted,
        "per_converted_document": per_document,
    }
    # The run's other steps: planning (its listings grow with the input and the location's history)
    # and publishing; with the batches', what the whole run asked of storage.
    run_total = total
    for step in ("planning", "publishing"):
        counts = recorded.get(step)
        if counts is not None:
            metrics[step] = {"by_kind": dict(counts), "total": sum(counts.values())}
            run_total += metrics[step]["total"]
    metrics["run_total"] = run_total
    return metrics


def _stored_storage_requests(data: Any) -> dict[str, Any] | None:
    """What ``_storage_request_metrics`` was made from, read back from a summary (None: not recorded)."""
    if not isinstance(data, dict) or not isinstance(data.get("by_kind"), dict):
        return None
    stored = {"by_kind": data["by_kind"], "batches": data.get("batches", 0), "complete": data.get("complete") is True}
    for step in ("planning", "publishing"):
        if isinstance(data.get(step), dict) and isinstance(data[step].get("by_kind"), dict):
            stored[step] = data[step]["by_kind"]
    return stored


def _empty_counts() -> dict[str, int]:
    return dict.fromkeys(ENTRY_COUNT_KEYS, 0)


def error_class_counts(documents: Iterable[DocumentEntry]) -> dict[str, int]:
    """Failed documents per error class, most frequent first, by the rule a run's totals fold them."""
    return RunTotals.of(documents).sorted_error_classes()


def count_entries(documents: Iterable[DocumentEntry]) -> dict[str, int]:
    """The totals of a set of entries: a run's (``Manifest.counts``) or one batch's (its XCom summary)."""
    return RunTotals.of(documents).counts


class _ShardStream:
    """One kind of entry (documents or dead letters) going to numbered shards, one open at a time.

    Lines are compressed as they come, so an open shard costs its compressed bytes only.
    """

    def __init__(self, writer: ManifestWriter, kind: str) -> None:
        self.writer = writer
        self.kind = kind
        self.shards: list[dict[str, Any]] = []
        self.count = 0
        self._buffer: io.BytesIO | None = None
        self._gzip: gzip.GzipFile | None = None
        self._open_entries = 0
        # Entries of the open shard per status: the runs page finds the shard holding the n-th
        # failed document without reading the others.
        self._statuses: Counter[str] = Counter()

    def add(self, entry: dict[str, Any]) -> None:
        if self._gzip is None:
            self._buffer = io.BytesIO()
            # mtime 0: the same entries make the same bytes.
            self._gzip = gzip.GzipFile(fileobj=self._buffer, mode="wb", mtime=0)
        self._gzip.write(json.dumps(entry, ensure_ascii=False).encode("utf-8") + b"\n")
        self._statuses[str(entry.get("status"))] += 1
        self._open_entries += 1
        self.count += 1
        if self._open_entries >= self.writer.shard_entries:
            self.flush()

    def flush(self) -> None:
        if self._gzip is None or self._buffer is None:
            return
        self._gzip.close()
        data = self._buffer.getvalue()
        name = shard_path(self.writer.publish_id, _SHARD_NAMES[self.kind], len(self.shards))
        self.writer.storage.write_bytes_atomic(self.writer.shards_uri + name, data, content_type="application/gzip")
        statuses = dict(sorted(self._statuses.items()))
        self.shards.append({"path": name, "entries": self._open_entries, "bytes": len(data), "statuses": statuses})
        self._buffer, self._gzip, self._open_entries = None, None, 0
        self._statuses = Counter()


class ManifestWriter:
    """Streams a run's entries to shards and writes its summary last (the commit marker).

    ``add`` and ``add_dead_letter`` fold each entry into ``totals`` and append it to the open shard,
    which is written once it holds ``shard_entries`` entries; nothing keeps the entries themselves.
    ``commit`` writes what is left, then the summary naming every shard. A writer that dies before
    ``commit`` leaves shards no summary names: readers never see them, and ``olmocr_tasks.location.retention``
    removes them once they are older than its retention period.
    """

    def __init__(self, storage: Storage, output_uri: str, run_id: str, *, shard_entries: int = SHARD_ENTRIES) -> None:
        if shard_entries < 1:
            raise ValueError("a shard holds at least one entry")
        self.storage = storage
        self.shard_entries = shard_entries
        self.summary_uri = manifest_uri(output_uri, run_id)
        self.shards_uri = shards_folder(self.summary_uri)
        # A fresh folder per publish: republishing a run (a retried or cleared publish task) never
        # rewrites a shard that the summary already published names.
        self.publish_id = datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)
        self.totals = RunTotals()
        self._documents = _ShardStream(self, DOCUMENTS_KIND)
        self._dead_letters = _ShardStream(self, DEAD_LETTERS_KIND)
        self.overview = OverviewFolder()

    def add(self, entry: DocumentEntry) -> None:
        data = entry.to_dict()
        self.totals.add(entry)
        # The latencies are kept once, by the totals (for the percentiles).
        self.overview.add(data, latencies=False)
        self._documents.add(data)

    def add_dead_letter(self, entry: DocumentEntry) -> None:
        data = entry.to_dict()
        self.overview.add_dead_letter(data)
        self._dead_letters.add(data)

    def commit(self, manifest: Manifest, *, publishing_since: dict[str, int] | None = None) -> str:
        """Write the remaining shards, then ``manifest``'s summary with these totals; returns its URI.

        ``publishing_since``: the storage's request counts when publishing began; the requests since
        then (the summary's own write excepted) go into the summary's storage request count.
        """
        for stream in (self._documents, self._dead_letters):
            stream.flush()
        if publishing_since is not None and manifest.storage_requests is not None:
            manifest.storage_requests["publishing"] = self.storage.requests.since(publishing_since)
        manifest.totals = self.totals
        manifest.overview = self.overview.finish(self.totals.latencies)
        manifest.dead_letter_count = self._dead_letters.count
        manifest.entries = {
            stream.kind: {"count": stream.count, "shards": stream.shards}
            for stream in (self._documents, self._dead_letters)
        }
        self.storage.write_bytes_atomic(self.summary_uri, manifest.to_json(), content_type="application/json")
        return self.summary_uri


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


def exact_percentiles(values: array[float], percentiles: Sequence[int]) -> list[float | None]:
    """``percentiles`` of ``values`` exactly as ``statistics.quantiles(values, n=100, method="inclusive")``
    cuts them, rounded to 4 places (None without values).

    Sorts ``values`` in place ``_SORT_CHUNK`` at a time (a run's latencies mean nothing in their order)
    and merges the chunks: a run's percentiles cost no copy of its 8-byte array and no list of Python
    floats (about 40 bytes a value), only one chunk's.
    """
    count = len(values)
    if count < 2:
        return [round(values[0], 4) if count else None for _ in percentiles]
    # quantiles' cut at p: data[j] and data[j + 1] weighted by delta, (j, delta) = divmod(p * (count - 1), 100).
    cuts = [divmod(percentile * (count - 1), 100) for percentile in percentiles]
    wanted = {index for j, _ in cuts for index in (j, j + 1)}
    starts = range(0, count, _SORT_CHUNK)
    for start in starts:
        values[start : start + _SORT_CHUNK] = array("d", sorted(values[start : start + _SORT_CHUNK]))
    runs = [(values[index] for index in range(start, min(start + _SORT_CHUNK, count))) for start in starts]
    found: dict[int, float] = {}
    for index, value in enumerate(heapq.merge(*runs)):
        if index in wanted:
            found[index] = value
            if len(found) == len(wanted):
                break
    return [round((found[j] * (100 - delta) + found[j + 1] * delta) / 100, 4) for j, delta in cuts]


def _seconds_between(start: str, end: str) -> float:
    def parse(stamp: str) -> datetime:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))

    return (parse(end) - parse(start)).total_seconds()
