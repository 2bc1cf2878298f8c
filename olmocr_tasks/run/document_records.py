"""What the output location's state keeps of a document's content while a run converts it.

The ledger's done and failed markers (``olmocr_tasks.location.ledger``), the same content converted
before (the ledger) or being converted now (this run: identical files are converted once), and the
accepted pages saved as they complete (``olmocr_tasks.location.page_store``), so a document whose
process dies resumes with its missing pages only. Without a ledger nothing is recorded or saved.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime

from olmocr_tasks.core.errors import StorageError
from olmocr_tasks.location.documents import SourceDocument
from olmocr_tasks.location.ledger import Ledger
from olmocr_tasks.location.manifest import DocumentEntry
from olmocr_tasks.location.page_store import PageStore
from olmocr_tasks.page.results import PageResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Converted:
    """A conversion of some content: its outputs, the source it was converted from and the run that did."""

    outputs: dict[str, str]
    source: str
    run_id: str


class DocumentRecords:
    """The ledger and the saved pages of one run's documents (one per engine)."""

    def __init__(
        self, ledger: Ledger | None, run_id: str, *, run_time: datetime | None = None, reprocess: bool = False
    ) -> None:
        self._ledger = ledger
        self._run_id = run_id
        # The run's time on its schedule, recorded with failures.
        self._run_time = run_time
        # Convert even what the ledger says was converted with the same content, model and prompt.
        self._reprocess = reprocess
        self._page_store = PageStore(ledger.storage, ledger.state) if ledger is not None else None
        self._content_in_progress: dict[str, asyncio.Future[Converted]] = {}

    async def claim_content(self, sha256: str) -> tuple[Converted | None, asyncio.Future[Converted] | None]:
        """Either an earlier (or concurrent) conversion of the same bytes, or a claim to convert them.

        The claim is registered before anything is awaited, so identical files in one run are
        converted once even when they are admitted together; the holder resolves it with its outputs
        (or cancels it on failure, and a waiting copy then converts on its own), then gives it back
        with ``content_settled``.
        """
        while (in_progress := self._content_in_progress.get(sha256)) is not None:
            try:
                return await asyncio.shield(in_progress), None
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                await asyncio.sleep(0)  # the holder removes its cancelled claim in its own cleanup
        claim: asyncio.Future[Converted] = asyncio.get_running_loop().create_future()
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
        found = Converted(dict(record.outputs), record.source, record.run_id)
        claim.set_result(found)
        self._content_in_progress.pop(sha256, None)
        return found, None

    def content_settled(self, sha256: str, claim: asyncio.Future[Converted]) -> None:
        """Give back a claim from ``claim_content``: resolved with outputs, or cancelled when it failed."""
        if not claim.done():
            claim.cancel()
        self._content_in_progress.pop(sha256, None)

    async def remember_done(self, source: SourceDocument, entry: DocumentEntry) -> None:
        if self._ledger is not None:
            await asyncio.to_thread(
                self._ledger.mark_done,
                source.info,
                entry.sha256 or "",
                entry.outputs,
                self._run_id,
                duplicate_of=entry.duplicate_of,
            )

    async def remember_failure(self, source: SourceDocument, entry: DocumentEntry) -> None:
        if self._ledger is not None:
            entry.failed_attempts = await asyncio.to_thread(
                self._ledger.mark_failed,
                source.info,
                entry.error_class or "",
                entry.error or "",
                self._run_id,
                run_time=self._run_time,
            )

    async def saved_pages(self, source: SourceDocument, sha256: str, page_count: int) -> dict[int, PageResult]:
        if self._page_store is None or page_count < 2:
            return {}
        saved = await asyncio.to_thread(self._page_store.load, sha256, page_count)
        if saved:
            log.info("%s: resuming with %d of %d pages saved by an earlier attempt", source.uri, len(saved), page_count)
        return saved

    async def save_page(self, sha256: str, page: PageResult) -> None:
        if self._page_store is None:
            return
        try:
            await asyncio.to_thread(self._page_store.save, sha256, page)
        except StorageError as exc:
            # Saving only spares a rerun some pages; this run's outputs do not depend on it.
            log.warning("could not save page %d for resuming: %s", page.page_number, exc)

    async def discard_saved_pages(self, sha256: str | None) -> None:
        # The outputs are committed: the document will never resume from these pages again.
        if self._page_store is not None and sha256:
            try:
                await asyncio.to_thread(self._page_store.discard, sha256)
            except StorageError as exc:
                log.warning("could not remove the saved pages of %s: %s", sha256, exc)
