"""Run-level orchestration shared by the CLI and the Airflow DAGs: plan, convert, publish.

A run is: **plan** (``olmocr_tasks.run.planning``: discover PDFs, drop those already converted with the
same content, model and prompt, list dead letters), **convert** (here: one or many batches, each
writing a *part* file with its documents' manifest entries), and **publish**
(``olmocr_tasks.run.publishing``: merge the plan and the parts into the run manifest, written last, with
the error budget's verdict). The plan and parts live in the run folder (``olmocr_tasks.location.run_folders``) so
that every discovered document reaches the manifest — a batch that never reported is accounted for
as failed — and XCom only ever carries URIs and counts. ``run_conversion`` is the whole run in one
process (the CLI); the Airflow tasks call the same steps one task at a time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TextIO

from olmocr_tasks.core.config import ConversionSettings, ServerSettings
from olmocr_tasks.core.errors import ServerMisconfigured
from olmocr_tasks.core.gpu_busy import NOTHING_SENT, GpuBusy
from olmocr_tasks.inference.client_factory import build_client
from olmocr_tasks.location.claims import ClaimBook, ClaimHolder
from olmocr_tasks.location.documents import SourceDocument
from olmocr_tasks.location.ledger import Ledger
from olmocr_tasks.location.manifest import PAGE_COUNT_KEYS, STATUSES, DocumentEntry, count_entries, manifest_uri
from olmocr_tasks.location.manifest_reader import ManifestReader
from olmocr_tasks.location.run_folders import SINGLE_PLAN, RunFolder, RunPlan
from olmocr_tasks.run.claim_guard import ClaimRules
from olmocr_tasks.run.conversion import ConversionEngine, Reporting
from olmocr_tasks.run.document_job import RunScope
from olmocr_tasks.run.planning import log_plan, stream_plan
from olmocr_tasks.run.progress import ProgressCounters, ProgressReporter
from olmocr_tasks.run.publishing import not_converted, publish_run
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.storage.store import REQUEST_KINDS, Storage

log = logging.getLogger(__name__)

# The batch key of a run converted in one process as one batch (tests, small runs).
SINGLE_BATCH = "all"
# The CLI converts a run this many documents at a time, each slice a batch of its own in the run
# folder: what it holds (entries, the part, the attempt listing) is one slice's, whatever the run's size.
CLI_BATCH_DOCUMENTS = 2_000
# The counts a batch's summary carries (``count_entries``): pages by kind and documents by status.
SUMMARY_COUNTERS = (*PAGE_COUNT_KEYS, *STATUSES)


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
    ledger: Ledger | None = None,
) -> ConvertedSources:
    """Convert documents in this process. Raises ``InfrastructureError`` when the work must be retried.

    With ``claims`` each document is claimed before it is converted (see ``olmocr_tasks.location.claims``).
    ``ledger``: the run's ledger on ``storage``, when the caller has it open already.
    """
    if not sources:
        return ConvertedSources([], NOTHING_SENT)
    ledger = ledger or Ledger(request.output_uri, storage, request.conversion_key)
    async with ProgressReporter(len(sources), stream=progress_stream, counters=progress_counters) as progress:
        scope = RunScope(
            run_id=request.run_id,
            storage=storage,
            output_uri=request.output_uri,
            ledger=ledger,
            run_time=request.run_time,
            reprocess=request.reprocess,
            access=request.access,
            task_context=task_context,
        )
        rules = None
        if claims is not None:
            retry_from = request.run_time + request.retry_interval if request.retry_interval > timedelta(0) else None
            rules = ClaimRules(claims, superseded=superseded, retry_from=retry_from)
        engine = ConversionEngine(
            request.settings, scope, claims=rules, reporting=Reporting(progress=progress, on_document=on_document)
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
    plan_id: str = SINGLE_PLAN,
    try_number: int | None = None,
    task_context: dict[str, Any] | None = None,
    progress_stream: TextIO | None = None,
    progress_counters: ProgressCounters | None = None,
    check_ready: bool = True,
) -> BatchResult:
    """``convert_batch_in`` the run folder of ``plan_id``, counting the batch's storage requests on their own.

    Its own request counter (it also adds to the storage's): its part reports what the batch cost in
    storage requests, even when other batches share this process's storage (the CLI's slices).
    """
    return convert_batch_in(
        request,
        request.run_folder(storage.counting(), plan_id),
        batch_key,
        sources,
        try_number=try_number,
        task_context=task_context,
        progress_stream=progress_stream,
        progress_counters=progress_counters,
        check_ready=check_ready,
    )


def convert_batch_in(
    request: RunRequest,
    folder: RunFolder,
    batch_key: str,
    sources: Sequence[SourceDocument],
    *,
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
    ``try_number`` None means the next one (a process resuming a batch on its own, like the CLI). The
    batch's work goes through ``folder.storage``, and its part reports what that storage's counter
    counted: the batch's own (``convert_batch``, ``run.planned.convert_planned_batch``).
    """
    storage = folder.storage
    attempt = folder.attempt(batch_key, try_number or folder.next_try(batch_key))
    finished = attempt.start()
    ledger = Ledger(request.output_uri, storage, request.conversion_key)
    claims = ClaimBook(
        storage,
        ledger.state,
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
                ledger=ledger,
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


def run_conversion(
    request: RunRequest,
    storage: Storage,
    *,
    progress_stream: TextIO | None = None,
    batch_documents: int = CLI_BATCH_DOCUMENTS,
) -> tuple[ManifestReader, str]:
    """The whole run in one process (the CLI): check the server, plan, convert, publish.

    Returns the published manifest and its URI; its ``error_budget`` holds the run's verdict. A run id
    whose manifest is not published yet (the process stopped: exit 3, a kill) resumes: its plan is read
    back and the next attempt carries forward what earlier attempts finished, so the manifest reports
    the whole run, not only what the last attempt did. The documents are converted ``batch_documents``
    at a time, each slice a batch of the run folder written as planning finds its documents
    (``stream_plan``), so memory stays one slice's whatever the run's size.

    A server that refuses the run part-way (a key revoked or rotated, the model gone) is not waited
    for: what the run reached is published, its other documents as ``not_converted``, and the refusal
    is raised. An outage or a storage failure is raised without publishing, so the run resumes.
    """
    # Before anything is planned, as Airflow's check_server: a server that refuses this client from
    # the start fails the run here, and no manifest lists its documents as not converted.
    check_server(request.settings.server)
    folder = request.run_folder(storage)
    plan = None if storage.exists(manifest_uri(request.output_uri, request.run_id)) else folder.read_plan_or_none()
    if plan is None:
        plan = stream_plan(request, storage, folder, batch_documents, cli_batch_key)
    else:
        log.info("run %s: resuming its unpublished plan", request.run_id)
    log_plan(request, plan, len(plan.batch_keys) or math.ceil(len(plan.sources) / batch_documents))
    # Slice by slice, so the process holds one slice's sources and entries; the counters span the run.
    counters = ProgressCounters(documents_total=plan.planned)
    try:
        for index, (key, sources) in enumerate(_cli_slices(plan, folder, batch_documents)):
            convert_batch(
                request,
                storage,
                key,
                sources,
                plan_id=folder.plan_id,
                progress_stream=progress_stream,
                progress_counters=counters,
                check_ready=index == 0,  # one readiness wait per conversion, as before
            )
    except ServerMisconfigured:
        published = publish_run(request, storage, folder, plan)
        log.error("the server refused run %s part-way; published %s", request.run_id, published.uri)
        raise
    published = publish_run(request, storage, folder, plan)
    return published.reader(storage), published.uri


def _cli_slices(plan: RunPlan, folder: RunFolder, batch_documents: int) -> Iterator[tuple[str, list[SourceDocument]]]:
    """The CLI's slices, in order: a streamed plan's batches read back one at a time, or the slices of
    a plan held whole (one written before plans were streamed), under the same keys."""
    if plan.streamed:
        for key in plan.batch_keys:
            yield key, folder.read_batch(key)
        return
    for index, start in enumerate(range(0, len(plan.sources), batch_documents)):
        yield cli_batch_key(index), plan.sources[start : start + batch_documents]


def check_server(server: ServerSettings) -> list[str]:
    """Wait up to ``readiness_timeout_s`` until every replica serves the model; return the models listed.

    The one synchronous readiness check: the CLI's before it plans, the vLLM connection's "Test" button
    and ``VllmHook.check_ready``. Raises ``ServerNotReady`` (``ServerMisconfigured`` for a refused key
    or a missing model).
    """

    async def check() -> list[str]:
        # Metrics polling is for conversions; a readiness probe does not need it running.
        async with build_client(dataclasses.replace(server, adaptive_concurrency=False)) as client:
            return await client.check_ready()

    return asyncio.run(check())


def cli_batch_key(index: int) -> str:
    """The key of the CLI's ``index``-th slice; zero-padded so batch order is slice order."""
    return f"{SINGLE_BATCH}-{index:05d}"
