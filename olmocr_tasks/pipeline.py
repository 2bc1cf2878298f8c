"""Run-level orchestration shared by the CLI and the Airflow DAGs: plan, convert, publish.

A run is: **plan** (discover PDFs, drop those already converted with the same content, model and
prompt, list dead letters), **convert** (one or many batches, each writing a *part* file with its
documents' manifest entries), and **publish** (merge the plan and the parts into the run manifest,
written last). The plan and parts live in the run folder (``olmocr_tasks.runs``) so that every discovered
document reaches the manifest — a batch that never reported is accounted for as failed — and XCom
only ever carries URIs and counts.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

from olmocr_tasks import __version__
from olmocr_tasks.claims import ClaimBook, ClaimHolder
from olmocr_tasks.clock import utc_now
from olmocr_tasks.config import ConversionSettings
from olmocr_tasks.conversion import ConversionEngine
from olmocr_tasks.discovery import MissingSource, iter_pdfs, resolve_explicit
from olmocr_tasks.documents import SourceDocument
from olmocr_tasks.errors import ServerMisconfigured
from olmocr_tasks.gpu_busy import NOTHING_SENT, GpuBusy, total_gpu_busy
from olmocr_tasks.ledger import Ledger, LedgerSnapshot, conversion_key, fingerprint
from olmocr_tasks.manifest import (
    NOT_CONVERTED,
    SHARD_ENTRIES,
    SKIP_RETRY_LATER,
    DocumentEntry,
    Manifest,
    ManifestWriter,
    count_entries,
    manifest_uri,
    write_manifest,
)
from olmocr_tasks.manifest_reader import ManifestReader
from olmocr_tasks.outputs import output_stem
from olmocr_tasks.progress import ProgressCounters, ProgressReporter
from olmocr_tasks.protocol import PROMPT_VERSION
from olmocr_tasks.runs import SINGLE_PLAN, RunFolder, RunPlan
from olmocr_tasks.storage import REQUEST_KINDS, ObjectInfo, Storage
from olmocr_tasks.uri import is_s3, local_path

log = logging.getLogger(__name__)

# The batch key of a run converted in one process as one batch (tests, small runs).
SINGLE_BATCH = "all"
# The CLI converts a run this many documents at a time, each slice a batch of its own in the run
# folder: what it holds (entries, the part, the attempt listing) is one slice's, whatever the run's size.
CLI_BATCH_DOCUMENTS = 2_000


@dataclass(frozen=True)
class RunRequest:
    """What one run should convert and how."""

    input_uri: str
    output_uri: str
    run_id: str
    settings: ConversionSettings = field(default_factory=ConversionSettings)
    documents: tuple[str, ...] | None = None
    modified_after: datetime | None = None
    modified_until: datetime | None = None
    reprocess: bool = False
    max_documents: int | None = None
    max_failed_attempts: int = 3
    # Convert dead letters once more instead of listing them.
    retry_dead_letters: bool = False
    # A reconciliation run (scheduled, manual scope "all", the CLI): it also re-drives the failed
    # versions under its input that discovery did not list. Runs naming ``documents`` never re-drive.
    redrive: bool = True
    # The least time between two runs' attempts at a failing version, measured on the runs' schedule
    # (``run_time``): Airflow uses the DAG's schedule interval, the CLI ``--retry-interval`` (default 0).
    retry_interval: timedelta = timedelta(0)
    # This run's time on its schedule: Airflow's ``run_after`` (a scheduled run's interval end), the
    # CLI's start. Failure markers and cool-down claims record it.
    run_time: datetime = field(default_factory=lambda: datetime.now(UTC))
    # Seconds a document claim lasts without renewal (None: ``default_claim_expiry_s``).
    claim_expiry_s: float | None = None

    @property
    def claim_expiry(self) -> float:
        return self.claim_expiry_s or default_claim_expiry_s(self.settings)

    @property
    def conversion_key(self) -> str:
        return conversion_key(
            self.settings.server.connection.model, PROMPT_VERSION, self.settings.page.target_longest_image_dim
        )

    def run_folder(self, storage: Storage, plan_id: str = SINGLE_PLAN) -> RunFolder:
        return RunFolder(storage, self.output_uri, self.run_id, plan_id)


def default_claim_expiry_s(settings: ConversionSettings) -> float:
    """How long a document claim lasts without renewal: two page-request timeouts (620 s by default).

    A live holder renews every quarter of it, off the event loop, so only a holder that stopped
    running (killed, frozen, cut off from storage) lets it lapse. Two whole request timeouts are the
    bound the client itself uses to call one request hung, comfortably more than a renewal's storage
    retries, and short next to a schedule interval: a dead run's documents are taken over by the next
    run. Airflow's retry of the same batch takes over its earlier attempt's claims at once.
    """
    server = settings.server
    return 2 * (server.timeouts.read_timeout_s + server.timeouts.connect_timeout_s)


def plan_run(request: RunRequest, storage: Storage) -> RunPlan:
    """Discover what this run must convert. Cheap: one listing of the input and one of the state.

    A run that names its documents (``documents``: REST, S3 events) plans exactly those. Any other
    run plans what discovery lists; a version whose last outcome was a failure (``not_converted``
    included: publishing records those) is *re-driven*: planned with ``redriven`` set once its next
    attempt is due (its last failure's run time plus ``retry_interval``), else reported as skipped
    ``retry_later``. A reconciliation run (``redrive``: scheduled runs, a manual scope "all", the CLI)
    also re-drives the due failed versions under its input that discovery did not list, whatever their
    LastModified: a scheduled run's window alone would never see them again. ``retry_dead_letters``
    takes dead letters back for one more try.
    """
    plan = RunPlan(sources=[])
    ledger = Ledger(request.output_uri, storage, request.conversion_key)
    # Reprocessing converts everything discovered: the state listing would be read for nothing.
    snapshot = None if request.reprocess else ledger.snapshot()
    candidates: Iterable[ObjectInfo]
    if request.documents is not None:
        found: list[ObjectInfo] = []
        for item in resolve_explicit(request.documents, storage):
            if isinstance(item, MissingSource):
                plan.unavailable.append(
                    DocumentEntry(source=item.uri, status="failed", error_class="unreadable", error=item.reason)
                )
            else:
                found.append(item)
        candidates = found
    else:
        candidates = iter_pdfs(
            request.input_uri,
            storage,
            modified_after=request.modified_after,
            modified_until=request.modified_until,
        )
    seen: set[str] = set()

    def consider(info: ObjectInfo, discovered: bool = True) -> None:
        seen.add(info.uri)
        redriven = False
        if snapshot is not None:
            status = snapshot.status(info)
            if status == "done":
                plan.already_converted += 1
                return
            if not request.retry_dead_letters and snapshot.is_dead_letter(info, request.max_failed_attempts):
                plan.dead_letters.append(dead_letter_entry(ledger, snapshot, info))
                return
            # A named document is converted because someone named it, failed before or not.
            if status != "new" and request.documents is None:
                retry_from = _retry_from(request, ledger, snapshot, info)
                if retry_from is not None and request.run_time < retry_from:
                    if discovered:
                        plan.left_for_later.append(retry_later_entry(ledger, snapshot, info, retry_from))
                    return
                redriven = True
        plan.sources.append(SourceDocument(info=info, stem=output_stem(info.uri, request.input_uri), redriven=redriven))
        plan.redriven += redriven

    def full() -> bool:
        return request.max_documents is not None and len(plan.sources) >= request.max_documents

    for info in candidates:
        if full():
            break
        consider(info)
    if snapshot is not None and request.redrive and request.documents is None and request.input_uri:
        for info in _redrive_candidates(request, ledger, snapshot, storage, seen):
            if full():
                break
            consider(info, discovered=False)
    return plan


def _retry_from(request: RunRequest, ledger: Ledger, snapshot: LedgerSnapshot, info: ObjectInfo) -> datetime | None:
    """The earliest run time that may try this failed version again (None: any time)."""
    if request.retry_interval <= timedelta(0):
        return None
    last = ledger.latest_failure(snapshot, info)
    return None if last is None or last.run_time is None else last.run_time + request.retry_interval


def retry_later_entry(
    ledger: Ledger, snapshot: LedgerSnapshot, info: ObjectInfo, retry_from: datetime
) -> DocumentEntry:
    """A discovered version that failed recently: skipped until its next attempt is due."""
    last = ledger.latest_failure(snapshot, info)
    return DocumentEntry(
        source=info.uri,
        status="skipped",
        size=info.size,
        skip_reason=SKIP_RETRY_LATER,
        claimed_by=last.run_id if last else None,
        retry_from=retry_from.isoformat(),
        error=f"failed recently ({last.error_class}: {last.error}); tried again from {retry_from.isoformat()}"
        if last
        else None,
    )


def _redrive_candidates(
    request: RunRequest, ledger: Ledger, snapshot: LedgerSnapshot, storage: Storage, seen: set[str]
) -> Iterator[ObjectInfo]:
    """Failed versions under the input that discovery did not list, if the object is still that version.

    Dead letters are left alone (not even listed) unless the run takes them back.
    """
    input_uri, retry_dead_letters = request.input_uri, request.retry_dead_letters
    max_failed_attempts = request.max_failed_attempts
    # Sources discovery already listed are skipped before their markers are read (scope "all" lists all).
    wanted = ledger.failed_sources(
        snapshot, lambda runs: retry_dead_letters or runs < max_failed_attempts, known=list(seen)
    )
    for recorded in wanted:
        if recorded.uri in seen or not _within(recorded.uri, input_uri):
            continue
        retry_from = _retry_from(request, ledger, snapshot, recorded)
        if retry_from is not None and request.run_time < retry_from:
            continue  # not due: a later reconciliation run takes it
        current = storage.stat(recorded.uri)
        # Gone, or replaced by new content: the new version has its own LastModified and history.
        if current is not None and fingerprint(current) == fingerprint(recorded):
            seen.add(recorded.uri)
            yield current


def _within(uri: str, folder: str) -> bool:
    if is_s3(uri) != is_s3(folder):
        return False
    path, base = (uri, folder) if is_s3(uri) else (local_path(uri), local_path(folder))
    base = base.rstrip("/")
    return path == base or path.startswith(base + "/")


def dead_letter_entry(ledger: Ledger, snapshot: LedgerSnapshot, info: ObjectInfo) -> DocumentEntry:
    """A dead letter's manifest line: how often it failed and its last error."""
    last = ledger.last_failure(info)
    reason = f"{last.error_class}: {last.error}" if last else "unknown"
    return DocumentEntry(
        source=info.uri,
        status="failed",
        size=info.size,
        error_class="dead_letter",
        error=f"failed in {snapshot.failures(info)} runs; last error: {reason}",
        failed_attempts=snapshot.failures(info),
    )


def list_dead_letters(
    output_uri: str, storage: Storage, conversion_key: str, max_failed_attempts: int
) -> list[DocumentEntry]:
    """The dead letters of an output location for one conversion key (model, prompt, render size)."""
    ledger = Ledger(output_uri, storage, conversion_key)
    snapshot = ledger.snapshot()
    return [
        dead_letter_entry(ledger, snapshot, info)
        for info in ledger.failed_sources(snapshot, lambda runs: runs >= max_failed_attempts)
    ]


def remember_not_converted(request: RunRequest, storage: Storage, plan: RunPlan, manifest: Manifest) -> int:
    """Record each planned document no batch reported as a failure of this run, so later runs re-drive it.

    Counted like any failure: a document that keeps taking its batch down becomes a dead letter.
    (``publish_run`` does the same while it streams, with ``record_not_converted``.)
    """
    lost = {doc.source for doc in manifest.documents if doc.error_class == NOT_CONVERTED}
    if lost:
        _mark_not_converted(request, storage, [source for source in plan.sources if source.uri in lost])
    return len(lost)


async def convert_sources(
    request: RunRequest,
    storage: Storage,
    sources: Sequence[SourceDocument],
    *,
    progress_stream: TextIO | None = None,
    task_context: dict[str, Any] | None = None,
    check_ready: bool = True,
    on_document: Callable[[DocumentEntry], Awaitable[None]] | None = None,
    claims: ClaimBook | None = None,
    superseded: Callable[[], bool] | None = None,
    progress_counters: ProgressCounters | None = None,
) -> ConvertedSources:
    """Convert documents in this process. Raises ``InfrastructureError`` when the work must be retried.

    With ``claims`` each document is claimed before it is converted (see ``olmocr_tasks.claims``).
    """
    if not sources:
        return ConvertedSources([], NOTHING_SENT)
    ledger = Ledger(request.output_uri, storage, request.conversion_key)
    async with ProgressReporter(len(sources), stream=progress_stream, counters=progress_counters) as progress:
        engine = ConversionEngine(
            request.settings,
            storage,
            request.output_uri,
            run_id=request.run_id,
            ledger=ledger,
            progress=progress,
            reprocess=request.reprocess,
            task_context=task_context,
            on_document=on_document,
            claims=claims,
            superseded=superseded,
            run_time=request.run_time,
            retry_from=request.run_time + request.retry_interval if request.retry_interval > timedelta(0) else None,
        )
        async with engine:
            if check_ready:
                await engine.check_ready()
            entries = await engine.convert_all(sources)
            return ConvertedSources(entries, await engine.finish_gpu_busy())


@dataclass(frozen=True)
class ConvertedSources:
    """What ``convert_sources`` did: an entry per document, and the GPU-busy seconds it cost the server."""

    entries: list[DocumentEntry]
    gpu_busy: GpuBusy


@dataclass(frozen=True)
class BatchResult:
    summary: dict[str, Any]  # small, for XCom
    entries: list[DocumentEntry]  # every document of the batch with its final outcome (for lineage)


def convert_batch(
    request: RunRequest,
    storage: Storage,
    batch_key: str,
    sources: Sequence[SourceDocument],
    *,
    folder: RunFolder | None = None,
    try_number: int | None = None,
    task_context: dict[str, Any] | None = None,
    progress_stream: TextIO | None = None,
    progress_counters: ProgressCounters | None = None,
    check_ready: bool = True,
) -> BatchResult:
    """Convert one batch as attempt ``try_number``; returns its summary (for XCom) and its documents' entries.

    The attempt first carries forward what the batch's earlier attempts converted, so a retried or
    resumed batch reports every document with its real outcome (a document converted by attempt 1
    keeps its pages, tokens and outputs in attempt 2's results) and converts only the rest (what an
    earlier attempt failed included: see ``BatchAttempt.start``). Each
    entry is saved the moment its document finishes, and the whole list in a part at the end: if the
    attempt dies (server outage, worker killed), publishing still reports what it did finish.
    ``try_number`` None means the next one (a process resuming a batch on its own, like the CLI).
    """
    # The batch's own request counter (it also adds to the storage's): its part reports what the batch
    # cost in storage requests, even when other batches share this process's storage.
    storage = storage.counting()
    folder = copy.copy(folder) if folder is not None else request.run_folder(storage)
    folder.storage = storage
    attempt = folder.attempt(batch_key, try_number or folder.next_try(batch_key))
    finished = attempt.start()
    claims = ClaimBook(
        storage,
        Ledger(request.output_uri, storage, request.conversion_key).state,
        ClaimHolder(request.run_id, folder.plan_id, batch_key, attempt.try_number, request.run_time),
        request.claim_expiry,
        # A run naming its documents was asked for exactly these: a cool-down is for re-drive.
        respect_cool_downs=request.documents is None,
    )
    remaining = [source for source in sources if source.uri not in finished]
    if finished:
        log.info(
            "batch %s attempt %d: %d documents finished by earlier attempts, %d to convert",
            batch_key,
            attempt.try_number,
            len(sources) - len(remaining),
            len(remaining),
        )

    saved: set[str] = set()

    async def save_entry(entry: DocumentEntry) -> None:
        await asyncio.to_thread(attempt.write_entry, entry)
        saved.add(entry.source)

    try:
        result = asyncio.run(
            convert_sources(
                request,
                storage,
                remaining,
                task_context=task_context,
                on_document=save_entry,
                progress_stream=progress_stream,
                claims=claims,
                superseded=attempt.superseded,
                progress_counters=progress_counters,
                check_ready=check_ready,
            )
        )
    except ServerMisconfigured as exc:
        # The server refuses this client (a key revoked or rotated, another model): nothing retries
        # that, so the attempt stops here. Its unfinished documents say why in the manifest instead of
        # the generic "its batch did not finish"; they stay ``not_converted`` and later runs retry them.
        for source in remaining:
            if source.uri not in saved:
                attempt.write_entry(
                    not_converted(source, f"the inference server refused this run ({exc}); later runs retry it")
                )
        raise
    by_source = finished | {entry.source: entry for entry in result.entries}
    entries = [by_source[source.uri] for source in sources if source.uri in by_source]
    gpu_busy = attempt.carried_gpu_busy.plus(result.gpu_busy)
    requests = Counter(attempt.carried_storage_requests) + Counter(storage.requests.counts())
    # The part's own PUT, counted ahead: it is the last request of the attempt and carries the counts.
    requests["write"] += 1
    storage_requests = {kind: requests[kind] for kind in REQUEST_KINDS}
    uri = attempt.write_part(entries, gpu_busy, storage_requests)
    summary = count_entries(entries) | {
        "part": uri,
        "batch": batch_key,
        "try_number": attempt.try_number,
        "gpu_busy_seconds": round(gpu_busy.seconds, 3),
        "gpu_busy_measured": gpu_busy.measured,
        "storage_requests": sum(storage_requests.values()),
    }
    return BatchResult(summary, entries)


def convert_time_limit(pages: int, documents: int, settings: ConversionSettings) -> timedelta:
    """How long one convert attempt of a batch may run: the bound Airflow's ``execution_timeout`` enforces.

    The worst case the client allows, not a typical time: every page spends all its attempts at the
    read timeout, one request window of pages after another, each document's renders hit the render
    time limit, and the task rides out one outage and the readiness wait. Beyond it the attempt is
    hung (a stuck renderer, a dead socket nobody times out): Airflow times it out and retries it.
    ``pages`` may be an estimate; documents count as at least one page each.
    """
    server = settings.server
    waves = math.ceil(max(pages, documents, 1) / max(server.concurrency.max_concurrent_requests, 1))
    per_wave = settings.page.max_page_retries * (server.timeouts.read_timeout_s + server.timeouts.connect_timeout_s)
    seconds = (
        server.timeouts.readiness_timeout_s
        + server.retries.outage_window_s
        + server.retries.request_retry_budget_s
        + waves * per_wave
        + documents * settings.limits.render_timeout_s
    )
    return timedelta(seconds=math.ceil(seconds))


def not_converted(source: SourceDocument, reason: str) -> DocumentEntry:
    """The entry of a planned document no attempt converted or failed: a failure of its run, re-driven later."""
    return DocumentEntry(
        source=source.uri, status="failed", size=source.info.size, error_class=NOT_CONVERTED, error=reason
    )


def _manifest_header(
    request: RunRequest, plan: RunPlan, *, gpu_busy: GpuBusy | None = None, finished_at: str | None = None
) -> Manifest:
    """The run's manifest without entries: what it was, how it was configured, when it ran."""
    return Manifest(
        run_id=request.run_id,
        started_at=plan.started_at,
        finished_at=finished_at or utc_now(),
        server=request.settings.server.public_dict(),
        model=request.settings.server.connection.model,
        prompt_version=PROMPT_VERSION,
        package_version=__version__,
        settings=request.settings.public_dict(),
        input_uri=request.input_uri,
        output_uri=request.output_uri,
        already_converted=plan.already_converted,
        gpu_hour_price=request.settings.gpu_hour_price,
        gpu_busy=gpu_busy,
    )


def build_manifest(
    request: RunRequest,
    plan: RunPlan,
    entries_by_source: dict[str, DocumentEntry],
    *,
    gpu_busy: GpuBusy | None = None,
    finished_at: str | None = None,
) -> Manifest:
    """Merge plan and results in memory; a planned document without a result is recorded as failed.

    For small runs and tests: ``publish_run`` does the same while streaming, holding one batch at a time.
    ``gpu_busy`` is what the batches measured (``RunFolder.collect_results``); without it, or when some
    batch did not measure its own, the manifest's cost falls back to the run's wall-clock time.
    """
    documents: list[DocumentEntry] = list(plan.unavailable)
    for source in plan.sources:
        entry = entries_by_source.get(source.uri)
        if entry is None:
            entry = _lost(source)
        entry.redriven = source.redriven
        documents.append(entry)
    documents.extend(plan.left_for_later)
    manifest = _manifest_header(request, plan, gpu_busy=gpu_busy, finished_at=finished_at)
    manifest.documents, manifest.dead_letters = documents, plan.dead_letters
    return manifest


def _lost(source: SourceDocument) -> DocumentEntry:
    return not_converted(source, "its batch did not finish (see the task log); it will be retried by the next run")


def publish_manifest(manifest: Manifest, storage: Storage) -> str:
    """Publish an in-memory manifest: its entries to shards, then its summary (the commit marker)."""
    return write_manifest(manifest, storage)


@dataclass(frozen=True)
class PublishedRun:
    """What ``publish_run`` wrote: the summary (totals, no entries), its URI, and how many planned
    documents no batch reported (recorded as ``not_converted`` failures)."""

    manifest: Manifest
    uri: str
    not_converted: int

    def reader(self, storage: Storage) -> ManifestReader:
        """The published manifest, read back through the one reader (from memory: no extra request)."""
        return ManifestReader(storage, self.uri, self.manifest.to_dict())


def publish_run(
    request: RunRequest,
    storage: Storage,
    folder: RunFolder,
    plan: RunPlan,
    *,
    max_document_error_rate: float | None = None,
    airflow_run: dict[str, Any] | None = None,
    record_not_converted: bool = False,
    shard_entries: int = SHARD_ENTRIES,
) -> PublishedRun:
    """Stream a run's results into its manifest: entries to shards batch by batch, the summary last.

    Holds one batch's report at a time (``RunFolder.iter_reports``) and the set of planned sources;
    counts and metrics are folded as the entries stream (``ManifestWriter``). A planned document no
    batch reported is recorded as failed ``not_converted`` (and, with ``record_not_converted``, as a
    failure of this run in the ledger, so later runs re-drive it). With ``max_document_error_rate``
    the error budget is judged into the summary.
    """
    writer = ManifestWriter(storage, request.output_uri, request.run_id, shard_entries=shard_entries)
    for entry in plan.unavailable:
        writer.add(entry)
    # Planned sources not reported yet, in plan order; what is left at the end was never reported.
    pending = {source.uri: source for source in plan.sources}
    gpu_reports: list[GpuBusy | None] = []
    request_reports: list[dict[str, int] | None] = []
    for report in folder.iter_reports():
        for entry in report.entries:
            source = pending.pop(entry.source, None)
            if source is None:
                continue  # not planned by this plan, or already reported by another batch
            entry.redriven = source.redriven
            writer.add(entry)
        gpu_reports.append(report.gpu_busy)
        request_reports.append(report.storage_requests)
    lost = list(pending.values())
    for source in lost:
        entry = _lost(source)
        entry.redriven = source.redriven
        writer.add(entry)
    for entry in plan.left_for_later:
        writer.add(entry)
    for entry in plan.dead_letters:
        writer.add_dead_letter(entry)
    if lost and record_not_converted:
        _mark_not_converted(request, storage, lost)
    manifest = _manifest_header(request, plan, gpu_busy=total_gpu_busy(gpu_reports))
    manifest.storage_requests = total_storage_requests(request_reports)
    manifest.totals = writer.totals
    if max_document_error_rate is not None:
        manifest.judge_error_budget(max_document_error_rate)
    manifest.airflow_run = airflow_run
    uri = writer.commit(manifest)
    return PublishedRun(manifest, uri, len(lost))


def total_storage_requests(reports: Iterable[dict[str, int] | None]) -> dict[str, Any] | None:
    """A run's storage requests by kind, summed over its batches' reports (None: no batch at all).

    ``complete`` is False when some batch reported none (an attempt that died before its part, a part
    written before requests were counted): the counts are then a lower bound.
    """
    totals: Counter[str] = Counter()
    complete, batches = True, 0
    for report in reports:
        batches += 1
        if report is None:
            complete = False
            continue
        totals.update(report)
    if not batches:
        return None
    return {"by_kind": {kind: totals[kind] for kind in REQUEST_KINDS}, "batches": batches, "complete": complete}


def _mark_not_converted(request: RunRequest, storage: Storage, sources: Iterable[SourceDocument]) -> None:
    ledger = Ledger(request.output_uri, storage, request.conversion_key)
    for source in sources:
        ledger.mark_failed(
            source.info, NOT_CONVERTED, "its batch did not finish", request.run_id, run_time=request.run_time
        )


def run_conversion(
    request: RunRequest,
    storage: Storage,
    *,
    progress_stream: TextIO | None = None,
    batch_documents: int = CLI_BATCH_DOCUMENTS,
) -> tuple[ManifestReader, str]:
    """The whole run in one process (the CLI): plan, convert, publish. Returns the manifest and its URI.

    A run id whose manifest is not published yet (the process stopped: exit 3, a kill) resumes: its
    plan is read back and the next attempt carries forward what earlier attempts finished, so the
    manifest reports the whole run, not only what the last attempt did. The documents are converted
    ``batch_documents`` at a time, each slice a batch of the run folder, so memory stays one slice's.
    """
    folder = request.run_folder(storage)
    plan = None if storage.exists(manifest_uri(request.output_uri, request.run_id)) else folder.read_plan_or_none()
    if plan is None:
        folder.clear_earlier_attempt()
        plan = plan_run(request, storage)
        folder.write_plan(plan)
    else:
        log.info("run %s: resuming its unpublished plan", request.run_id)
    log.info(
        "run %s: %d to convert, %d already converted, %d dead letters",
        request.run_id,
        len(plan.sources),
        plan.already_converted,
        len(plan.dead_letters),
    )
    # Slice by slice, so the process holds one slice's entries; the counters span the whole run.
    counters = ProgressCounters(documents_total=len(plan.sources))
    for index, start in enumerate(range(0, len(plan.sources), batch_documents)):
        convert_batch(
            request,
            storage,
            cli_batch_key(index),
            plan.sources[start : start + batch_documents],
            folder=folder,
            progress_stream=progress_stream,
            progress_counters=counters,
            check_ready=index == 0,  # one readiness wait per run, as before
        )
    published = publish_run(request, storage, folder, plan)
    return published.reader(storage), published.uri


def cli_batch_key(index: int) -> str:
    """The key of the CLI's ``index``-th slice; zero-padded so batch order is slice order."""
    return f"{SINGLE_BATCH}-{index:05d}"
