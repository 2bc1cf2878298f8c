"""Convert many documents in one process while keeping the inference server full.

One ``ConversionEngine`` per process owns the render pool, the HTTP client, the page converter and
the spool, and wires the pieces of a document's conversion together:

* ``admission``: documents are admitted while fewer pages are waiting than twice the in-flight
  window, so pages of many small documents interleave and a single large document never holds the
  others back; documents sit on local disk (``spool``), not in memory, until they are done;
* ``claim_guard``: each document is claimed (when the run uses claims) for as long as it converts;
* ``document_job``: the document itself, localise → pages → outputs → ledger (``document_records``).

Each document ends as a ``DocumentEntry``: ``converted`` (outputs written), ``skipped`` (identical
content already converted with the same model and prompt) or ``failed`` with a typed error class.
Infrastructure errors (server unavailable, storage down) abort the whole call instead: nothing is
recorded for documents that did not finish, so a retry converts them, sending only the pages that
were not saved as they completed (``page_store``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from olmocr_tasks.core.config import ConversionSettings
from olmocr_tasks.core.errors import InfrastructureError
from olmocr_tasks.core.gpu_busy import GpuBusy
from olmocr_tasks.inference.client_factory import build_client
from olmocr_tasks.location.documents import SourceDocument
from olmocr_tasks.location.manifest import DocumentEntry
from olmocr_tasks.page.ladder import PageConverter
from olmocr_tasks.page.protocol import RequestBodyBuilder
from olmocr_tasks.page.render_pool import RenderPool
from olmocr_tasks.run.admission import Admission, AdmittedDocument
from olmocr_tasks.run.claim_guard import ClaimGuard, ClaimRules
from olmocr_tasks.run.document_job import DocumentJob, JobTools, RunScope
from olmocr_tasks.run.document_records import DocumentRecords
from olmocr_tasks.run.progress import ProgressReporter
from olmocr_tasks.run.spool import Spool


@dataclass(frozen=True)
class Reporting:
    """Who hears how the conversion goes."""

    progress: ProgressReporter | None = None
    # Called as each document finishes, so a caller can persist entries before the whole batch ends.
    on_document: Callable[[DocumentEntry], Awaitable[None]] | None = None


class ConversionEngine:
    """Converts documents with olmOCR's protocol; use as an async context manager.

    ``claims`` None: documents are converted unclaimed (``olmocr_tasks.location.claims``).
    """

    def __init__(
        self,
        settings: ConversionSettings,
        scope: RunScope,
        *,
        claims: ClaimRules | None = None,
        reporting: Reporting | None = None,
    ) -> None:
        self.settings = settings
        self._scope = scope
        self._claims = claims
        self._reporting = reporting or Reporting()
        self._client = build_client(settings.server)
        self._renderer = RenderPool(
            workers=settings.render_workers,
            png_compress_level=settings.page.png_compress_level,
            limits=settings.limits,
            nice=settings.render_nice,
        )
        self._spool = Spool(scope.storage, scope.access)
        self._tools = JobTools(
            settings=settings,
            scope=scope,
            pages=PageConverter(
                self._client,
                self._renderer,
                RequestBodyBuilder(settings.server.connection.model, settings.page.max_tokens),
                settings.page,
            ),
            renderer=self._renderer,
            spool=self._spool,
            records=DocumentRecords(scope.ledger, scope.run_id, run_time=scope.run_time, reprocess=scope.reprocess),
            progress=self._reporting.progress,
            secrets=(settings.server.connection.api_key, *scope.storage.known_secrets()),
        )

    async def __aenter__(self) -> ConversionEngine:
        self._spool.open()
        await self._client.__aenter__()
        await self._renderer.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            await self._renderer.__aexit__(*exc_info)
        finally:
            await self._client.__aexit__(*exc_info)
            self._spool.close()

    async def check_ready(self) -> list[str]:
        return await self._client.check_ready()

    async def finish_gpu_busy(self) -> GpuBusy:
        """The GPU-busy seconds this engine's requests cost the server; call once converting is done."""
        return await self._client.finish_gpu_busy()

    async def convert_all(self, sources: Sequence[SourceDocument]) -> list[DocumentEntry]:
        """Convert every source; entries come back in the order of ``sources``."""
        window = self.settings.server.concurrency.max_concurrent_requests
        admission = Admission(high_water_pages=2 * window, max_open_documents=self.settings.max_open_documents)
        entries: list[DocumentEntry | None] = [None] * len(sources)
        reporting = self._reporting

        async def run(index: int, source: SourceDocument, admitted: AdmittedDocument) -> None:
            entry = await self._convert_one(source, admitted)
            entries[index] = entry
            if reporting.on_document is not None:
                await reporting.on_document(entry)
            if reporting.progress:
                reporting.progress.document_done(entry)

        try:
            async with asyncio.TaskGroup() as group:
                for index, source in enumerate(sources):
                    admitted = await admission.enter()
                    group.create_task(run(index, source, admitted))
        except* InfrastructureError as failures:
            raise failures.exceptions[0] from None
        return [entry for entry in entries if entry is not None]

    async def _convert_one(self, source: SourceDocument, admitted: AdmittedDocument) -> DocumentEntry:
        """Claim the document (when claims are in use), convert it, give the claim back."""
        try:
            async with ClaimGuard(self._claims, source, self._scope.run_id) as guard:
                if guard.blocked is not None:
                    return guard.left_for_later(self._scope.task_context)
                entry = await DocumentJob(self._tools, source, admitted, guard).run()
                guard.finished(entry)
                return entry
        finally:
            # A started job has left already (before its claim is given back); a document blocked by
            # another run's claim, or whose claim could not be acquired, leaves here.
            await admitted.leave()
