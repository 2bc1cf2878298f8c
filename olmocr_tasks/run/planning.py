"""Planning a run, for the CLI and the Airflow ``plan`` task alike: what to convert, in which batches.

``iter_plan`` discovers what a run must convert (dropping what is converted already, listing dead
letters, re-driving earlier failures that are due), source by source. Both planners write it to the
run folder as it goes, a slice at a time, so no process holds every source of the run, and write the
plan, the record publishing works from, last:
the CLI's ``stream_plan`` writes each slice as a batch; the Airflow ``plan`` task's ``plan_batches``
packs the slices into batches by estimated pages (one object each) and returns one small descriptor
per batch, what Airflow maps ``convert`` over.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

from olmocr_tasks.core.errors import OutsideAllowedError
from olmocr_tasks.core.formats import format_of_name
from olmocr_tasks.location.documents import SourceDocument
from olmocr_tasks.location.ledger import Ledger, LedgerSnapshot, fingerprint, source_id
from olmocr_tasks.location.manifest import SKIP_RETRY_LATER, DocumentEntry
from olmocr_tasks.location.outputs import output_stem
from olmocr_tasks.location.run_folders import RunFolder, RunPlan
from olmocr_tasks.run.batching import BatchingRule, Packing
from olmocr_tasks.run.discovery import MissingSource, iter_documents, resolve_explicit
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.storage.access import LocationNotAllowedError
from olmocr_tasks.storage.store import ObjectInfo, Storage
from olmocr_tasks.storage.uri import is_s3, local_path

log = logging.getLogger(__name__)

# Long enough to recognise a document in the grid; 1000 batch descriptors stay around 100 KB.
_LABEL_CHARS = 80
# The Airflow plan writes discovery's sources to the run folder this many at a time (about 0.4 MB each).
PLAN_SLICE_DOCUMENTS = 2_000
# Batch writes in flight while the Airflow plan packs: S3's latency, not bandwidth, bounds them.
_BATCH_WRITERS = 8


# A run naming at most this many documents looks each one's state up (one small listing each) instead
# of listing the whole state, which costs a request per 1,000 markers: ~100 over 100,000 documents.
NAMED_LOOKUPS_MAX = 100


def iter_plan(request: RunRequest, storage: Storage, plan: RunPlan) -> Iterator[SourceDocument]:
    """Discover what this run must convert, yielding each source as discovery reaches it.

    Cheap: one listing of the input and one of the state. What is not converted (dead letters, what is
    left for later, unavailable documents) and the counts go into ``plan`` as they are found; the
    sources are the caller's to keep or to stream on (``plan.planned`` counts them).

    A run that names its documents (``documents``: REST, S3 events) plans exactly those. Any other
    run plans what discovery lists; a version whose last outcome was a failure (``not_converted``
    included: publishing records those) is *re-driven*: planned with ``redriven`` set once its next
    attempt is due (its last failure's run time plus ``retry_interval``), else reported as skipped
    ``retry_later``. A reconciliation run (``redrive``: scheduled runs, a manual scope "all", the CLI)
    also re-drives the due failed versions under its input that discovery did not list, whatever their
    LastModified: a scheduled run's window alone would never see them again. ``retry_dead_letters``
    takes dead letters back for one more try. A document that lies outside the run's allowed inputs once
    resolved (a symbolic link leading out) is not planned: it is reported failed, ``outside_allowed``.
    """
    ledger = Ledger(request.output_uri, storage, request.conversion_key)
    candidates: Iterable[ObjectInfo]
    named_sources: list[str] | None = None
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
        if len(found) <= NAMED_LOOKUPS_MAX:
            named_sources = [source_id(info.uri) for info in found]
    else:
        candidates = iter_documents(
            request.input_uri,
            storage,
            formats=request.settings.formats,
            modified_after=request.modified_after,
            modified_until=request.modified_until,
        )
    # Reprocessing converts everything discovered: the state would be read for nothing.
    snapshot = None if request.reprocess else ledger.snapshot(named_sources)
    redrive = snapshot is not None and request.redrive and request.documents is None and bool(request.input_uri)
    # The re-drive pass skips the failed sources discovery listed. Only those are remembered, not every
    # listed URI: what is held grows with the failures in the snapshot, not with the run.
    failed_ids = snapshot.failed_source_ids() if redrive and snapshot is not None else set()
    seen: set[str] = set()
    max_failed_attempts = request.run_settings.max_failed_attempts

    def consider(info: ObjectInfo, discovered: bool = True) -> SourceDocument | None:
        if failed_ids and discovered and source_id(info.uri) in failed_ids:
            seen.add(info.uri)
        if (refused := outside_allowed(request, info)) is not None:
            plan.unavailable.append(refused)
            return None
        redriven = False
        if snapshot is not None:
            status = snapshot.status(info)
            if status == "done":
                plan.already_converted += 1
                return None
            if not request.retry_dead_letters and snapshot.is_dead_letter(info, max_failed_attempts):
                plan.dead_letters.append(dead_letter_entry(ledger, snapshot, info))
                return None
            # A named document is converted because someone named it, failed before or not.
            if status != "new" and request.documents is None:
                retry_from = _retry_from(request, ledger, snapshot, info)
                if retry_from is not None and request.run_time < retry_from:
                    if discovered:
                        plan.left_for_later.append(retry_later_entry(ledger, snapshot, info, retry_from))
                    return None
                redriven = True
        plan.planned += 1
        plan.redriven += redriven
        return SourceDocument(info=info, stem=output_stem(info.uri, request.input_uri), redriven=redriven)

    def full() -> bool:
        return request.max_documents is not None and plan.planned >= request.max_documents

    for info in candidates:
        if full():
            return
        if (source := consider(info)) is not None:
            yield source
    if redrive and snapshot is not None:
        for info in _redrive_candidates(request, ledger, snapshot, storage, seen):
            if full():
                return
            if (source := consider(info, discovered=False)) is not None:
                yield source


def outside_allowed(request: RunRequest, info: ObjectInfo) -> DocumentEntry | None:
    """The failed entry of a document the run may not read (``request.access``, resolved), else None."""
    try:
        request.access.check_input(info.uri)
    except LocationNotAllowedError as exc:
        return DocumentEntry(
            source=info.uri,
            status="failed",
            size=info.size,
            error_class=OutsideAllowedError.error_class,
            error=str(exc),
        )
    return None


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

    ``seen``: the failed sources discovery listed (at least those). Dead letters are left alone (not
    even listed) unless the run takes them back.
    """
    input_uri, retry_dead_letters = request.input_uri, request.retry_dead_letters
    max_failed_attempts = request.run_settings.max_failed_attempts
    # Sources discovery already listed are skipped before their markers are read (scope "all" lists all).
    wanted = ledger.failed_sources(
        snapshot, lambda runs: retry_dead_letters or runs < max_failed_attempts, known=list(seen)
    )
    for recorded in wanted:
        if recorded.uri in seen or not _within(recorded.uri, input_uri):
            continue
        named = format_of_name(recorded.uri)
        if named is not None and named not in request.settings.formats:
            continue  # a format this run leaves alone: a run that converts it re-drives it
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


def stream_plan(
    request: RunRequest,
    storage: Storage,
    folder: RunFolder,
    batch_documents: int,
    batch_key: Callable[[int], str],
) -> RunPlan:
    """Plan the run afresh into ``folder``, ``batch_documents`` sources to a batch, as discovery finds them.

    The process holds one batch of sources at a time: each full batch is written to the run folder
    (key ``batch_key(index)``) and dropped. The plan itself (counts, what is not converted, the batch
    keys) is written last: a plan without it never finished and is planned again from scratch.
    """
    before = storage.requests.counts()
    folder.clear_earlier_attempt()
    plan = RunPlan(sources=[])
    plan.batch_keys = _write_slices(iter_plan(request, storage, plan), batch_documents, batch_key, folder.write_batch)
    # Planning's own requests (the listings grow with the input and the location's history), for the
    # manifest's count of what the whole run asked of storage.
    plan.storage_requests = storage.requests.since(before)
    folder.write_plan(plan)
    return plan


def _write_slices(
    sources: Iterable[SourceDocument],
    documents: int,
    key: Callable[[int], str],
    write: Callable[[str, list[SourceDocument]], None],
) -> list[str]:
    """Write ``sources`` ``documents`` at a time (``write(key(index), slice)``), holding one slice; their keys."""
    keys: list[str] = []
    chunk: list[SourceDocument] = []

    def flush() -> None:
        keys.append(key(len(keys)))
        write(keys[-1], chunk)
        chunk.clear()

    for source in sources:
        chunk.append(source)
        if len(chunk) >= documents:
            flush()
    if chunk:
        flush()
    return keys


def plan_batches(
    request: RunRequest,
    storage: Storage,
    folder: RunFolder,
    rule: BatchingRule,
    *,
    slice_documents: int = PLAN_SLICE_DOCUMENTS,
) -> list[dict[str, Any]]:
    """Plan the run into ``folder`` packed into batches; returns one small descriptor per batch.

    Each batch's sources go to an object of their own, so a convert task reads only its own, not the
    whole plan. A descriptor: ``{"plan": "p1-3f9c0a2e", "batch": "b00012", "label": "inbox/report.pdf",
    "documents": 1, "pages": 3}`` (pages estimated from sizes, for the convert attempt's time limit).

    Streamed, so the task's memory follows a slice and a batch, not the run: discovery's sources go
    to the run folder ``slice_documents`` at a time while their estimated pages are summed; the
    packing that fits ``rule.max_batches`` is found by counting its packs over the slices read back,
    then the slices are read once more and each pack is written as it is cut. The slices are removed
    and the plan, written last (the commit marker), keeps only its batches' keys. The run itself, as
    resolved (``RunRequest.to_dict``: no secret), is written first: the plan's later steps read it back.
    """
    before = storage.requests.counts()
    earlier_batches = folder.earlier_batch_count()
    folder.clear_earlier_attempt()
    # What the plan's later steps work from instead of resolving the run again (``run.planned``): written
    # before the plan, the commit marker, so every plan there is has its run.
    folder.write_resolved_run(request.to_dict())
    plan = RunPlan(sources=[])
    total_pages = 0

    def paged(sources: Iterable[SourceDocument]) -> Iterator[SourceDocument]:
        nonlocal total_pages
        for source in sources:
            total_pages += rule.estimated_pages(source)
            yield source

    slice_keys = _write_slices(
        paged(iter_plan(request, storage, plan)), slice_documents, _slice_key, folder.write_slice
    )

    def planned() -> Iterator[SourceDocument]:
        for key in slice_keys:
            yield from folder.read_slice(key)

    packing = Packing.fitted(planned, rule, total_pages)
    descriptors: dict[int, dict[str, Any]] = {}
    with ThreadPoolExecutor(max_workers=_BATCH_WRITERS) as pool:
        writing: deque[Future[None]] = deque()

        def write(position: int, batch: list[SourceDocument]) -> None:
            descriptors[position] = {
                "plan": folder.plan_id,
                "batch": f"b{position:05d}",
                "label": batch_label(batch, request.input_uri),
                "documents": len(batch),
                "pages": sum(rule.estimated_pages(source) for source in batch),
            }
            # A few writes in flight (S3 latency), each holding its batch's bytes, not its documents.
            if len(writing) >= _BATCH_WRITERS:
                writing.popleft().result()
            writing.append(pool.submit(folder.batch_write(descriptors[position]["batch"], batch)))

        for position, batch in packing.packs(planned(), rule):
            write(position, batch)
        packed = len(descriptors)
        # Padded with empty batches (no-op convert instances, an empty part file each) to at least one and
        # to the previous pass's count: Airflow 3.3 does not map a cleared run's ``convert`` beyond the
        # previous pass's length, so a shorter pass would strand a later, longer one's batches.
        for position in range(packed, max(1, earlier_batches)):
            write(position, [])
        for done in writing:
            done.result()
    batches = [descriptors[position] for position in range(len(descriptors))]
    folder.remove_slices(slice_keys)
    plan.batch_keys = [descriptor["batch"] for descriptor in batches]
    plan.storage_requests = storage.requests.since(before)
    folder.write_plan(plan)
    log_plan(request, plan, packed)
    if packed < plan.planned:
        log.info("packed %d documents into %d batches (%s)", plan.planned, packed, rule)
    return batches


def _slice_key(index: int) -> str:
    return f"s{index:05d}"


def log_plan(request: RunRequest, plan: RunPlan, batches: int) -> None:
    """One line saying what the run will do: its window, what it converts, and what it leaves alone."""
    window = (
        f"modified in ({request.modified_after.isoformat()}, {request.modified_until.isoformat()}]"
        if request.modified_after and request.modified_until
        else "explicit list"
        if request.documents is not None
        else "any time"
    )
    log.info(
        "run %s (%s): %d to convert (%d re-driven) in %d batches, %d already converted, %d dead letters, "
        "%d unavailable",
        request.run_id,
        window,
        plan.planned,
        plan.redriven,
        batches,
        plan.already_converted,
        len(plan.dead_letters),
        len(plan.unavailable),
    )


def batch_label(sources: Sequence[SourceDocument], input_uri: str) -> str:
    """A human label for a batch, shown as the mapped instance's name in the grid."""

    def name(source: SourceDocument) -> str:
        uri = source.uri
        base = input_uri.rstrip("/")
        if base and uri.startswith(base + "/"):
            return uri[len(base) + 1 :]
        return uri.split("://", 1)[-1].split("/", 1)[-1] if is_s3(uri) else uri.rsplit("/", 1)[-1]

    if not sources:
        return "nothing to convert"
    if len(sources) == 1:
        label = name(sources[0])
    else:
        first, last = (name(source).rsplit("/", 1)[-1] for source in (sources[0], sources[-1]))
        label = f"{len(sources)} documents: {first} … {last}"
    return label if len(label) <= _LABEL_CHARS else "…" + label[-(_LABEL_CHARS - 1) :]
