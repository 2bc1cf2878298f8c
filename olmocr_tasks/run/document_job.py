"""One document's conversion: localise → pages → outputs → ledger, within its claim and its admission.

The document ends as a ``DocumentEntry``: ``converted`` (outputs written), ``skipped`` (identical
content already converted with the same model and prompt, or its claim taken over by another run)
or ``failed`` with a typed error class. Infrastructure errors (server unavailable, storage down)
propagate: nothing is recorded for the document, so a retry converts it, sending only the pages
that were saved as they completed (``DocumentRecords``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from olmocr_tasks import __version__
from olmocr_tasks.core.config import ConversionSettings
from olmocr_tasks.core.errors import (
    CorruptPdfError,
    DocumentError,
    ErrorRateExceededError,
    InfrastructureError,
    RenderError,
    TooLargeError,
)
from olmocr_tasks.core.formats import check_format, read_head
from olmocr_tasks.core.redaction import redact
from olmocr_tasks.location.documents import SourceDocument
from olmocr_tasks.location.ledger import Ledger
from olmocr_tasks.location.manifest import DocumentEntry
from olmocr_tasks.location.outputs import recorded_totals, write_document_outputs
from olmocr_tasks.page.ladder import PageConverter
from olmocr_tasks.page.protocol import PROMPT_VERSION
from olmocr_tasks.page.render_pool import RenderPool
from olmocr_tasks.page.results import DocumentResult, DocumentTotals, PageResult
from olmocr_tasks.run.admission import AdmittedDocument
from olmocr_tasks.run.claim_guard import ClaimGuard, ClaimLost
from olmocr_tasks.run.document_records import Converted, DocumentRecords
from olmocr_tasks.run.progress import ProgressReporter
from olmocr_tasks.run.spool import Spool
from olmocr_tasks.storage.access import AccessPolicy
from olmocr_tasks.storage.store import Storage

log = logging.getLogger(__name__)

_HASH_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class RunScope:
    """The run documents are converted for, and where their outputs and records go."""

    run_id: str
    storage: Storage
    output_uri: str
    ledger: Ledger | None = None
    # The run's time on its schedule, recorded with failures.
    run_time: datetime | None = None
    reprocess: bool = False
    # Checked for each document just before it is opened (``Spool.localise``).
    access: AccessPolicy = field(default_factory=AccessPolicy.anywhere)
    # Recorded in every entry (the Airflow task that converted it).
    task_context: dict[str, Any] | None = None


@dataclass(frozen=True)
class JobTools:
    """What every document's job shares: the engine's converters, spool and records."""

    settings: ConversionSettings
    scope: RunScope
    pages: PageConverter
    renderer: RenderPool
    spool: Spool
    records: DocumentRecords
    progress: ProgressReporter | None
    # Removed from every error text an entry records (``_error_text``).
    secrets: tuple[str | None, ...]


class DocumentJob:
    """Converts one document; ``run`` once."""

    def __init__(self, tools: JobTools, source: SourceDocument, admitted: AdmittedDocument, guard: ClaimGuard) -> None:
        self._tools = tools
        self._source = source
        self._admitted = admitted
        self._guard = guard
        self._entry = DocumentEntry(
            source=source.uri, status="failed", size=source.info.size, task=tools.scope.task_context
        )
        self._local_path: str | None = None
        # Whether saved pages of this document may exist (an earlier attempt's, found on starting, or
        # this one's): only then is there anything to discard once its outputs are committed.
        self._pages_saved = False

    async def run(self) -> DocumentEntry:
        entry, source = self._entry, self._source
        started = time.monotonic()
        try:
            await self._convert(started)
        except DocumentError as exc:
            entry.error_class, entry.error = exc.error_class, self._error_text(str(exc) or exc.__class__.__name__)
            await self._record_failure()
        except ClaimLost as lost:
            lost.mark_skipped(entry)
        except InfrastructureError:
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # A bug or an unforeseen library error must not take the other documents down with it.
            log.error("unexpected error converting %s:\n%s", source.uri, self._error_text(traceback.format_exc()))
            entry.error_class, entry.error = "internal_error", self._error_text(f"{exc.__class__.__name__}: {exc}")
            await self._record_failure()
        finally:
            entry.seconds = round(time.monotonic() - started, 3)
            await self._admitted.leave()
            if self._local_path is not None:
                await self._tools.renderer.release(self._local_path)
                await self._tools.spool.discard(self._local_path)
        return entry

    async def _convert(self, started: float) -> None:
        tools, source, entry = self._tools, self._source, self._entry
        limit = tools.settings.limits.max_bytes
        if source.info.size is not None and source.info.size > limit:
            raise TooLargeError(f"{source.info.size} bytes is over the limit of {limit} bytes")
        local_path = self._local_path = await tools.spool.localise(source)
        entry.size, entry.sha256 = await asyncio.to_thread(_size_and_sha256, local_path)
        if entry.size > limit:
            raise TooLargeError(f"{entry.size} bytes is over the limit of {limit} bytes")
        # Before the content is looked up: a file that is not what its name says fails as such even
        # when its bytes were converted before under a name that fits them.
        head = await asyncio.to_thread(read_head, local_path)
        document_format = check_format(head, source.uri, tools.settings.formats)

        duplicate, claim = await tools.records.claim_content(entry.sha256)
        if duplicate is not None:
            await self._skip_converted(duplicate)
            return
        assert claim is not None
        try:
            result = await self._convert_pages(local_path, document_format)
            result.seconds = round(time.monotonic() - started, 3)
            await self._guard.fence()
            entry.outputs = await asyncio.to_thread(
                write_document_outputs,
                result,
                output_uri=tools.scope.output_uri,
                stem=source.stem,
                storage=tools.scope.storage,
                write_markdown=tools.settings.write_markdown,
                model=tools.settings.server.connection.model,
                prompt_version=PROMPT_VERSION,
                package_version=__version__,
            )
            claim.set_result(Converted(entry.outputs, source.uri, tools.scope.run_id))
        finally:
            tools.records.content_settled(entry.sha256, claim)
        entry.status = "converted"
        await tools.records.remember_done(source, entry)
        if self._pages_saved:
            await tools.records.discard_saved_pages(entry.sha256)

    async def _skip_converted(self, duplicate: Converted) -> None:
        """Record the document as converted already: by an earlier run, or as a copy of other bytes.

        Converted by an earlier attempt of this very run (one that died after recording the conversion
        and before saving its entry), it is this run's conversion: ``converted``, with the totals its
        Dolma record holds, and no page is sent again.
        """
        entry, source = self._entry, self._source
        entry.outputs = duplicate.outputs
        if duplicate.source != source.uri:
            entry.status, entry.skip_reason, entry.duplicate_of = "skipped", "duplicate_content", duplicate.source
        elif (totals := await self._converted_by_this_run(duplicate)) is not None:
            log.info("%s: converted by an earlier attempt of this run; its outputs stand", source.uri)
            entry.status = "converted"
            entry.record_totals(totals)
        else:
            # Its own earlier conversion, whose run died after the content record and before
            # the done marker: not a duplicate of anything, just already converted.
            entry.status, entry.skip_reason = "skipped", "already_converted"
        await self._guard.fence()
        await self._tools.records.remember_done(source, entry)
        await self._tools.records.discard_saved_pages(entry.sha256)

    async def _converted_by_this_run(self, duplicate: Converted) -> DocumentTotals | None:
        """The totals of ``duplicate`` when an earlier attempt of this run made it and its Dolma record says them."""
        dolma = duplicate.outputs.get("dolma")
        if duplicate.run_id != self._tools.scope.run_id or dolma is None:
            return None
        return await asyncio.to_thread(recorded_totals, self._tools.scope.storage, dolma)

    async def _convert_pages(self, path: str, document_format: str) -> DocumentResult:
        tools, source, entry, admitted = self._tools, self._source, self._entry, self._admitted
        try:
            info = await tools.renderer.inspect(path)
        except RenderError as exc:
            # The pool has already replaced the worker; a PDF that kills or hangs PDFium while merely
            # being opened is broken as far as we can tell, and retrying would only repeat the crash.
            raise CorruptPdfError(f"the renderer could not open it ({exc.reason})") from None
        await admitted.pages_known(info.page_count)
        if tools.progress:
            tools.progress.document_started(source.uri, info.page_count)
        saved = await tools.records.saved_pages(source, entry.sha256 or "", info.page_count)
        self._pages_saved = bool(saved)

        fallbacks = 0
        rate = tools.settings.max_page_error_rate
        # An image page has no text layer: its fallback page is empty, and the error-rate rule is the same.
        fell_back = "fell back to the text layer" if document_format == "pdf" else "failed (an image has no text layer)"

        async def page(index: int) -> PageResult:
            nonlocal fallbacks
            result = saved.get(index + 1)
            if result is None:
                result = await tools.pages.convert(path, index)
                if not result.is_fallback and info.page_count > 1:
                    self._pages_saved = True
                    await tools.records.save_page(entry.sha256 or "", result)
            await admitted.page_done()
            if tools.progress:
                tools.progress.page_done(result)
            if result.is_fallback:
                fallbacks += 1
                # Once the error-rate guard is bound to fail the document, converting its other pages
                # only burns server time, and a PDF of pages that each hang the renderer until the render
                # time limit would hold a render worker for hours: fail it now (same class, same rule).
                if fallbacks / info.page_count > rate:
                    raise ErrorRateExceededError(
                        f"{fallbacks} of {info.page_count} pages {fell_back} (limit {rate:g}); "
                        f"stopped at page {result.page_number}: {result.fallback_reason}"
                    )
            return result

        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(page(index)) for index in range(info.page_count)]
        except BaseExceptionGroup as failures:
            # An outage outranks the document's own failure: it must abort the work, not blame the PDF.
            if (outage := failures.subgroup(InfrastructureError)) is not None:
                raise _first_leaf(outage) from None
            if (document := failures.subgroup(DocumentError)) is not None:
                finished = [
                    task.result() for task in tasks if task.done() and not task.cancelled() and not task.exception()
                ]
                entry.pages, entry.fallback_pages = info.page_count, fallbacks
                entry.attempts = DocumentTotals.of(finished).attempts
                raise _first_leaf(document) from None
            raise
        pages = [task.result() for task in tasks]
        result = DocumentResult(source=source.uri, size=entry.size or 0, sha256=entry.sha256 or "", pages=pages)
        entry.record_totals(result.totals)
        return result

    async def _record_failure(self) -> None:
        try:
            await self._guard.fence()
        except ClaimLost as lost:
            lost.mark_skipped(self._entry)
            return
        await self._tools.records.remember_failure(self._source, self._entry)

    def _error_text(self, text: str) -> str:
        """An error as a manifest records it: raw exception texts may carry keys, signed URLs, headers."""
        return redact(text, self._tools.secrets)


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first


def _size_and_sha256(path: str) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()
