"""Convert many documents in one process while keeping the inference server full.

One ``ConversionEngine`` per process owns the render pool, the HTTP client and the page converter.
Documents are admitted while fewer pages are waiting than twice the in-flight window, so pages of
many small documents interleave and a single large document never holds the others back; documents
sit on local disk (not in memory) until they are done.

Each document ends as a ``DocumentEntry``: ``converted`` (outputs written), ``skipped`` (identical
content already converted with the same model and prompt) or ``failed`` with a typed error class.
Infrastructure errors (server unavailable, storage down) abort the whole call instead: nothing is
recorded for documents that did not finish, so a retry converts them, sending only the pages that
were not saved as they completed (``page_store``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

from olmocr_tasks import __version__
from olmocr_tasks.core.config import ConversionSettings
from olmocr_tasks.core.errors import (
    CorruptPdfError,
    DocumentError,
    ErrorRateExceededError,
    InfrastructureError,
    OutsideAllowedError,
    RenderError,
    StorageError,
    TooLargeError,
    UnreadableSourceError,
)
from olmocr_tasks.core.formats import check_format, read_head
from olmocr_tasks.core.gpu_busy import GpuBusy
from olmocr_tasks.core.redaction import redact
from olmocr_tasks.inference.client_factory import build_client
from olmocr_tasks.location.claims import Blocked, Claim, ClaimBook
from olmocr_tasks.location.documents import SourceDocument
from olmocr_tasks.location.ledger import Ledger
from olmocr_tasks.location.manifest import SKIP_CLAIMED, SKIP_RETRY_LATER, DocumentEntry
from olmocr_tasks.location.outputs import write_document_outputs
from olmocr_tasks.location.page_store import PageStore
from olmocr_tasks.page.ladder import PageConverter
from olmocr_tasks.page.protocol import PROMPT_VERSION, RequestBodyBuilder
from olmocr_tasks.page.render_pool import RenderPool
from olmocr_tasks.page.results import DocumentResult, DocumentTotals, PageResult
from olmocr_tasks.run.progress import ProgressReporter
from olmocr_tasks.storage.access import AccessPolicy, LocationNotAllowedError
from olmocr_tasks.storage.store import Storage
from olmocr_tasks.storage.uri import is_s3

log = logging.getLogger(__name__)

_HASH_CHUNK = 1024 * 1024


class _Admission:
    """Admits documents while the queue of pages waiting for a request slot is short."""

    def __init__(self, high_water_pages: int, max_open_documents: int) -> None:
        self._high_water = high_water_pages
        self._max_open = max_open_documents
        self._open = 0
        self._pending_pages = 0
        self._changed = asyncio.Condition()

    async def enter(self) -> None:
        async with self._changed:
            await self._changed.wait_for(
                lambda: self._open == 0 or (self._open < self._max_open and self._pending_pages < self._high_water)
            )
            self._open += 1
            self._pending_pages += 1  # the document's first page, before its count is known

    async def pages_known(self, pages: int) -> None:
        async with self._changed:
            self._pending_pages += pages - 1

    async def page_done(self) -> None:
        async with self._changed:
            self._pending_pages -= 1
            self._changed.notify_all()

    async def leave(self, unfinished_pages: int) -> None:
        async with self._changed:
            self._open -= 1
            self._pending_pages -= unfinished_pages
            self._changed.notify_all()


class ConversionEngine:
    """Converts documents with olmOCR's protocol; use as an async context manager."""

    def __init__(
        self,
        settings: ConversionSettings,
        storage: Storage,
        output_uri: str,
        *,
        run_id: str,
        ledger: Ledger | None = None,
        progress: ProgressReporter | None = None,
        reprocess: bool = False,
        task_context: dict[str, Any] | None = None,
        on_document: Callable[[DocumentEntry], Awaitable[None]] | None = None,
        claims: ClaimBook | None = None,
        run_time: datetime | None = None,
        retry_from: datetime | None = None,
        superseded: Callable[[], bool] | None = None,
        access: AccessPolicy | None = None,
    ) -> None:
        self.settings = settings
        # Checked for each document just before it is opened (``_localise``); None: anywhere.
        self._access = access or AccessPolicy.anywhere()
        # Removed from every error text a document's entry records (``_error_text``).
        self._secrets = [settings.server.connection.api_key, *storage.known_secrets()]
        # Whether a later attempt of this batch has started (attempt fencing, checked with the claim).
        self._superseded = superseded
        # Each document is claimed before converting (``olmocr_tasks.location.claims``); None: no claims.
        self._claims = claims
        # The run's time on its schedule, recorded with failures; a failed document's claim stays as a
        # cool-down until ``retry_from`` (None: released at once).
        self._run_time = run_time
        self._retry_from = retry_from
        # Called as each document finishes, so a caller can persist entries before the whole batch ends.
        self._on_document = on_document
        self._storage = storage
        self._output_uri = output_uri
        self._run_id = run_id
        self._ledger = ledger
        # Accepted pages are saved beside the ledger's state as they complete, so a document whose
        # process dies resumes with its missing pages only.
        self._page_store = PageStore(ledger.storage, ledger.state) if ledger is not None else None
        self._progress = progress
        self._reprocess = reprocess
        self._task_context = task_context
        self._client = build_client(settings.server)
        self._renderer = RenderPool(
            workers=settings.render_workers,
            png_compress_level=settings.page.png_compress_level,
            limits=settings.limits,
            nice=settings.render_nice,
        )
        self._pages = PageConverter(
            self._client,
            self._renderer,
            RequestBodyBuilder(settings.server.connection.model, settings.page.max_tokens),
            settings.page,
        )
        self._spool_dir: str | None = None
        self._content_in_progress: dict[str, asyncio.Future[tuple[dict[str, str], str]]] = {}

    async def __aenter__(self) -> ConversionEngine:
        self._spool_dir = tempfile.mkdtemp(prefix="olmocr-tasks-")
        await self._client.__aenter__()
        await self._renderer.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            await self._renderer.__aexit__(*exc_info)
        finally:
            await self._client.__aexit__(*exc_info)
            if self._spool_dir:
                shutil.rmtree(self._spool_dir, ignore_errors=True)

    async def check_ready(self) -> list[str]:
        return await self._client.check_ready()

    async def finish_gpu_busy(self) -> GpuBusy:
        """The GPU-busy seconds this engine's requests cost the server; call once converting is done."""
        return await self._client.finish_gpu_busy()

    async def convert_all(self, sources: Sequence[SourceDocument]) -> list[DocumentEntry]:
        """Convert every source; entries come back in the order of ``sources``."""
        window = self.settings.server.concurrency.max_concurrent_requests
        admission = _Admission(high_water_pages=2 * window, max_open_documents=self.settings.max_open_documents)
        entries: list[DocumentEntry | None] = [None] * len(sources)

        async def run(index: int, source: SourceDocument) -> None:
            entry = await self._convert_one(source, admission)
            entries[index] = entry
            if self._on_document is not None:
                await self._on_document(entry)
            if self._progress:
                self._progress.document_done(entry)

        try:
            async with asyncio.TaskGroup() as group:
                for index, source in enumerate(sources):
                    await admission.enter()
                    group.create_task(run(index, source))
        except* InfrastructureError as failures:
            raise failures.exceptions[0] from None
        return [entry for entry in entries if entry is not None]

    async def _convert_one(self, source: SourceDocument, admission: _Admission) -> DocumentEntry:
        """Claim the document (when claims are in use), convert it, release the claim."""
        if self._claims is None:
            return await self._convert_held(source, admission, None)
        try:
            outcome = await asyncio.to_thread(self._claims.acquire, source.info)
        except BaseException:
            await admission.leave(1)
            raise
        if isinstance(outcome, Blocked):
            await admission.leave(1)
            return self._left_for_later(source, outcome)
        claim = outcome
        renewing = asyncio.create_task(self._keep_claimed(source, claim))
        entry: DocumentEntry | None = None
        try:
            entry = await self._convert_held(source, admission, claim)
            return entry
        finally:
            renewing.cancel()
            # A recorded failure leaves a cool-down when the run spaces its retries; anything else
            # (converted, skipped, an outage or cancellation before an outcome) gives the claim back.
            failed = entry is not None and entry.status == "failed"
            retry_from = self._retry_from if failed else None
            try:
                await asyncio.shield(asyncio.to_thread(claim.release, retry_from))
            except Exception as exc:
                # It expires on its own; until then other runs skip the document.
                log.warning("could not release the claim of %s: %s", source.uri, exc)

    def _left_for_later(self, source: SourceDocument, blocked: Blocked) -> DocumentEntry:
        """The entry of a document another run holds (or failed recently): skipped, nothing recorded."""
        record = blocked.record
        entry = DocumentEntry(
            source=source.uri,
            status="skipped",
            size=source.info.size,
            claimed_by=record.run_id,
            task=self._task_context,
        )
        if blocked.cooling_down and record.retry_from is not None:
            entry.skip_reason, entry.retry_from = SKIP_RETRY_LATER, record.retry_from.isoformat()
        else:
            entry.skip_reason = SKIP_CLAIMED
        log.info("%s: %s by run %s, left for later", source.uri, entry.skip_reason, record.run_id)
        return entry

    async def _keep_claimed(self, source: SourceDocument, claim: Claim) -> None:
        """Renew the claim while the document converts (long documents outlast one expiry)."""
        assert self._claims is not None
        while True:
            await asyncio.sleep(self._claims.renew_every_s)
            try:
                held = await asyncio.to_thread(claim.renew)
            except Exception as exc:
                log.warning("could not renew the claim of %s: %s", source.uri, exc)
                continue
            if not held:
                lost_to = claim.lost_to.run_id if claim.lost_to else "another run"
                log.warning(
                    "%s: claim taken over by run %s; its outcome will not be recorded here", source.uri, lost_to
                )
                return

    async def _check_claim(self, claim: Claim | None) -> None:
        """Fence before writing anything: raise ``_ClaimLost`` when this attempt may no longer record.

        Either another run (or a later attempt) took the document's claim over, or a later attempt of
        this batch has started: it carried forward what this one had finished and converts the rest.
        """
        if claim is None:
            return
        if self._superseded is not None and await asyncio.to_thread(self._superseded):
            raise _ClaimLost(self._run_id)
        if not await asyncio.to_thread(claim.still_held):
            raise _ClaimLost(claim.lost_to.run_id if claim.lost_to else "unknown")

    async def _convert_held(self, source: SourceDocument, admission: _Admission, held: Claim | None) -> DocumentEntry:
        started = time.monotonic()
        unfinished = 1
        local_path: str | None = None
        entry = DocumentEntry(source=source.uri, status="failed", size=source.info.size, task=self._task_context)
        try:
            limit = self.settings.limits.max_bytes
            if source.info.size is not None and source.info.size > limit:
                raise TooLargeError(f"{source.info.size} bytes is over the limit of {limit} bytes")
            local_path = await self._localise(source)
            entry.size, entry.sha256 = await asyncio.to_thread(_size_and_sha256, local_path)
            if entry.size > limit:
                raise TooLargeError(f"{entry.size} bytes is over the limit of {limit} bytes")
            # Before the content is looked up: a file that is not what its name says fails as such even
            # when its bytes were converted before under a name that fits them.
            head = await asyncio.to_thread(read_head, local_path)
            document_format = check_format(head, source.uri, self.settings.formats)

            duplicate, claim = await self._claim_content(entry.sha256)
            if duplicate is not None:
                entry.outputs, converted_from = duplicate
                entry.status = "skipped"
                if converted_from == source.uri:
                    # Its own earlier conversion, whose run died after the content record and before
                    # the done marker: not a duplicate of anything, just already converted.
                    entry.skip_reason = "already_converted"
                else:
                    entry.skip_reason, entry.duplicate_of = "duplicate_content", converted_from
                await self._check_claim(held)
                await self._remember_done(source, entry)
                await self._discard_saved_pages(entry.sha256)
                return entry
            assert claim is not None
            try:
                result = await self._convert_pages(source, local_path, entry, admission, document_format)
                unfinished = 0
                result.seconds = round(time.monotonic() - started, 3)
                await self._check_claim(held)
                entry.outputs = await asyncio.to_thread(
                    write_document_outputs,
                    result,
                    output_uri=self._output_uri,
                    stem=source.stem,
                    storage=self._storage,
                    write_markdown=self.settings.write_markdown,
                    model=self.settings.server.connection.model,
                    prompt_version=PROMPT_VERSION,
                    package_version=__version__,
                )
                claim.set_result((entry.outputs, source.uri))
            finally:
                if not claim.done():
                    claim.cancel()
                self._content_in_progress.pop(entry.sha256, None)
            entry.status = "converted"
            await self._remember_done(source, entry)
            await self._discard_saved_pages(entry.sha256)
        except DocumentError as exc:
            entry.error_class, entry.error = exc.error_class, self._error_text(str(exc) or exc.__class__.__name__)
            await self._record_failure(source, entry, held)
        except _ClaimLost as lost:
            self._lost_claim(entry, lost)
        except InfrastructureError:
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # A bug or an unforeseen library error must not take the other documents down with it.
            log.error("unexpected error converting %s:\n%s", source.uri, self._error_text(traceback.format_exc()))
            entry.error_class, entry.error = "internal_error", self._error_text(f"{exc.__class__.__name__}: {exc}")
            await self._record_failure(source, entry, held)
        finally:
            entry.seconds = round(time.monotonic() - started, 3)
            await admission.leave(unfinished)
            if local_path is not None:
                await self._renderer.release(local_path)
                if local_path.startswith(self._spool_dir or "\0"):
                    await asyncio.to_thread(_remove_quietly, local_path)
        return entry

    async def _convert_pages(
        self, source: SourceDocument, path: str, entry: DocumentEntry, admission: _Admission, document_format: str
    ) -> DocumentResult:
        try:
            info = await self._renderer.inspect(path)
        except RenderError as exc:
            # The pool has already replaced the worker; a PDF that kills or hangs PDFium while merely
            # being opened is broken as far as we can tell, and retrying would only repeat the crash.
            raise CorruptPdfError(f"the renderer could not open it ({exc.reason})") from None
        await admission.pages_known(info.page_count)
        if self._progress:
            self._progress.document_started(source.uri, info.page_count)
        saved = await self._saved_pages(source, entry.sha256 or "", info.page_count)

        fallbacks = 0
        rate = self.settings.max_page_error_rate
        # An image page has no text layer: its fallback page is empty, and the error-rate rule is the same.
        fell_back = "fell back to the text layer" if document_format == "pdf" else "failed (an image has no text layer)"

        async def page(index: int) -> PageResult:
            nonlocal fallbacks
            result = saved.get(index + 1)
            if result is None:
                result = await self._pages.convert(path, index)
                if not result.is_fallback and info.page_count > 1:
                    await self._save_page(entry.sha256 or "", result)
            await admission.page_done()
            if self._progress:
                self._progress.page_done(result)
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

    def _error_text(self, text: str) -> str:
        """An error as a manifest records it: raw exception texts may carry keys, signed URLs, headers."""
        return redact(text, self._secrets)

    async def _localise(self, source: SourceDocument) -> str:
        """The document as a local file: a local one by its real path, an S3 object in the spool.

        Checked against the run's allowed inputs first, resolved (``OutsideAllowedError``): a local
        name whose file lies outside (a symbolic link), or a URI a tampered batch file holds, is
        never opened. The path opened is the one the check resolved, parsed by ``local_path`` (the
        check's own parser: a ``file://`` URI is percent-decoded for both).
        """
        try:
            path = self._access.check_input(source.uri)
        except LocationNotAllowedError as exc:
            raise OutsideAllowedError(str(exc)) from None
        except ValueError as exc:
            raise UnreadableSourceError(f"{source.uri} is not a location this worker can read: {exc}") from None
        if not is_s3(source.uri):
            if not os.path.isfile(path):
                raise UnreadableSourceError(f"{source.uri} does not exist or is not a file")
            return path
        assert self._spool_dir is not None
        fd, path = tempfile.mkstemp(suffix=".pdf", dir=self._spool_dir)
        os.close(fd)
        await asyncio.to_thread(self._storage.download, source.uri, path)
        return path

    async def _claim_content(
        self, sha256: str
    ) -> tuple[tuple[dict[str, str], str] | None, asyncio.Future[tuple[dict[str, str], str]] | None]:
        """Either an earlier (or concurrent) conversion of the same bytes, or a claim to convert them.

        The claim is registered before anything is awaited, so identical files in one run are
        converted once even when they are admitted together; the holder resolves it with its outputs
        (or cancels it on failure, and a waiting copy then converts on its own).
        """
        while (in_progress := self._content_in_progress.get(sha256)) is not None:
            try:
                return await asyncio.shield(in_progress), None
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                await asyncio.sleep(0)  # the holder removes its cancelled claim in its own cleanup
        claim: asyncio.Future[tuple[dict[str, str], str]] = asyncio.get_running_loop().create_future()
        self._content_in_progress[sha256] = claim
        if self._reprocess or self._ledger is None:
            return None, claim
        try:
            record = await asyncio.to_thread(self._ledger.find_content, sha256)
        except BaseException:
            claim.cancel()
            self._content_in_progress.pop(sha256, None)
            raise
        if record is None:
            return None, claim
        found = (dict(record.outputs), record.source)
        claim.set_result(found)
        self._content_in_progress.pop(sha256, None)
        return found, None

    async def _remember_done(self, source: SourceDocument, entry: DocumentEntry) -> None:
        if self._ledger is not None:
            await asyncio.to_thread(
                functools.partial(
                    self._ledger.mark_done,
                    source.info,
                    entry.sha256 or "",
                    entry.outputs,
                    self._run_id,
                    duplicate_of=entry.duplicate_of,
                )
            )

    async def _saved_pages(self, source: SourceDocument, sha256: str, page_count: int) -> dict[int, PageResult]:
        if self._page_store is None or page_count < 2:
            return {}
        saved = await asyncio.to_thread(self._page_store.load, sha256, page_count)
        if saved:
            log.info("%s: resuming with %d of %d pages saved by an earlier attempt", source.uri, len(saved), page_count)
        return saved

    async def _save_page(self, sha256: str, page: PageResult) -> None:
        if self._page_store is None:
            return
        try:
            await asyncio.to_thread(self._page_store.save, sha256, page)
        except StorageError as exc:
            # Saving only spares a rerun some pages; this run's outputs do not depend on it.
            log.warning("could not save page %d for resuming: %s", page.page_number, exc)

    async def _discard_saved_pages(self, sha256: str | None) -> None:
        # The outputs are committed: the document will never resume from these pages again.
        if self._page_store is not None and sha256:
            try:
                await asyncio.to_thread(self._page_store.discard, sha256)
            except StorageError as exc:
                log.warning("could not remove the saved pages of %s: %s", sha256, exc)

    async def _record_failure(self, source: SourceDocument, entry: DocumentEntry, claim: Claim | None) -> None:
        try:
            await self._check_claim(claim)
        except _ClaimLost as lost:
            self._lost_claim(entry, lost)
            return
        await self._remember_failure(source, entry)

    @staticmethod
    def _lost_claim(entry: DocumentEntry, lost: _ClaimLost) -> None:
        # Another run took the document over while this one was frozen or cut off: its outcome stands.
        what = f"{entry.error_class}: {entry.error}" if entry.error_class else "converted"
        entry.status, entry.skip_reason, entry.claimed_by = "skipped", SKIP_CLAIMED, lost.run_id
        entry.error_class, entry.outputs = None, {}
        entry.error = f"run {lost.run_id} took its claim over; this run's outcome ({what}) was not recorded"

    async def _remember_failure(self, source: SourceDocument, entry: DocumentEntry) -> None:
        if self._ledger is not None:
            entry.failed_attempts = await asyncio.to_thread(
                functools.partial(
                    self._ledger.mark_failed,
                    source.info,
                    entry.error_class or "",
                    entry.error or "",
                    self._run_id,
                    run_time=self._run_time,
                )
            )


class _ClaimLost(Exception):
    """This run's claim on a document was taken over: nothing of its outcome may be recorded."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id


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


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
