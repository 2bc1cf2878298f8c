"""One document's claim while it converts (``olmocr_tasks.location.claims``), as an async context manager.

Entering acquires the claim (or finds the document ``blocked`` by another run or a cool-down); while
the body runs the claim is renewed in the background every ``ClaimBook.renew_every_s`` (a quarter of
its expiry), since long documents outlast one expiry; ``fence`` is awaited before anything is
written and raises ``ClaimLost`` once this attempt may no longer record; leaving releases the claim,
or leaves it as a cool-down when the document's outcome was a recorded failure and the run spaces
its retries. A late writer records nothing: the run that took the claim over owns the outcome.

Without claims (``rules`` None) the guard holds nothing: it never blocks, fences or releases.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from olmocr_tasks.location.claims import Blocked, Claim, ClaimBook
from olmocr_tasks.location.documents import SourceDocument
from olmocr_tasks.location.manifest import SKIP_CLAIMED, SKIP_RETRY_LATER, DocumentEntry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClaimRules:
    """How a run claims its documents."""

    book: ClaimBook
    # Whether a later attempt of this batch has started (attempt fencing, checked with the claim).
    superseded: Callable[[], bool] | None = None
    # A failed document's claim stays as a cool-down until then (None: released at once).
    retry_from: datetime | None = None


class ClaimLost(Exception):
    """This run's claim on a document was taken over: nothing of its outcome may be recorded."""

    def __init__(self, run_id: str) -> None:
        super().__init__(run_id)
        self.run_id = run_id

    def mark_skipped(self, entry: DocumentEntry) -> None:
        """Turn ``entry`` into what this run reports: skipped, its outcome standing with the new holder."""
        # Another run took the document over while this one was frozen or cut off: its outcome stands.
        what = f"{entry.error_class}: {entry.error}" if entry.error_class else "converted"
        entry.status, entry.skip_reason, entry.claimed_by = "skipped", SKIP_CLAIMED, self.run_id
        entry.error_class, entry.outputs = None, {}
        entry.error = f"run {self.run_id} took its claim over; this run's outcome ({what}) was not recorded"


class ClaimGuard:
    """Holds one document's claim for the body of ``async with``; see the module's docstring."""

    def __init__(self, rules: ClaimRules | None, source: SourceDocument, run_id: str) -> None:
        self._rules = rules
        self._source = source
        self._run_id = run_id
        # Set on entering when another run holds the document (or failed it recently): convert nothing.
        self.blocked: Blocked | None = None
        self._claim: Claim | None = None
        self._renewing: asyncio.Task[None] | None = None
        self._failed = False

    async def __aenter__(self) -> ClaimGuard:
        if self._rules is None:
            return self
        outcome = await asyncio.to_thread(self._rules.book.acquire, self._source.info)
        if isinstance(outcome, Blocked):
            self.blocked = outcome
            return self
        self._claim = outcome
        self._renewing = asyncio.create_task(self._keep_claimed(outcome))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._rules is None or self._claim is None:
            return
        assert self._renewing is not None
        # Let go of the task: a cancelled task keeps its CancelledError, whose traceback holds the frame
        # that holds this guard; the cycle would keep the document alive until the garbage collector runs.
        renewing, self._renewing = self._renewing, None
        renewing.cancel()
        # A recorded failure leaves a cool-down when the run spaces its retries; anything else
        # (converted, skipped, an outage or cancellation before an outcome) gives the claim back.
        retry_from = self._rules.retry_from if self._failed else None
        try:
            await asyncio.shield(asyncio.to_thread(self._claim.release, retry_from))
        except Exception as exc:
            # It expires on its own; until then other runs skip the document.
            log.warning("could not release the claim of %s: %s", self._source.uri, exc)

    def finished(self, entry: DocumentEntry) -> None:
        """The document's outcome, which decides how the claim is given back on leaving."""
        self._failed = entry.status == "failed"

    async def fence(self) -> None:
        """Fence before writing anything: raise ``ClaimLost`` when this attempt may no longer record.

        Either another run (or a later attempt) took the document's claim over, or a later attempt of
        this batch has started: it carried forward what this one had finished and converts the rest.
        """
        claim = self._claim
        if self._rules is None or claim is None:
            return
        superseded = self._rules.superseded
        if superseded is not None and await asyncio.to_thread(superseded):
            raise ClaimLost(self._run_id)
        if not await asyncio.to_thread(claim.still_held):
            raise ClaimLost(claim.lost_to.run_id if claim.lost_to else "unknown")

    def left_for_later(self, task_context: dict[str, Any] | None) -> DocumentEntry:
        """The entry of a ``blocked`` document: skipped, nothing recorded."""
        assert self.blocked is not None
        source, blocked = self._source, self.blocked
        record = blocked.record
        entry = DocumentEntry(
            source=source.uri,
            status="skipped",
            size=source.info.size,
            claimed_by=record.run_id,
            task=task_context,
        )
        if blocked.cooling_down and record.retry_from is not None:
            entry.skip_reason, entry.retry_from = SKIP_RETRY_LATER, record.retry_from.isoformat()
        else:
            entry.skip_reason = SKIP_CLAIMED
        log.info("%s: %s by run %s, left for later", source.uri, entry.skip_reason, record.run_id)
        return entry

    async def _keep_claimed(self, claim: Claim) -> None:
        """Renew the claim while the document converts (long documents outlast one expiry)."""
        assert self._rules is not None
        while True:
            await asyncio.sleep(self._rules.book.renew_every_s)
            try:
                held = await asyncio.to_thread(claim.renew)
            except Exception as exc:
                log.warning("could not renew the claim of %s: %s", self._source.uri, exc)
                continue
            if not held:
                lost_to = claim.lost_to.run_id if claim.lost_to else "another run"
                log.warning(
                    "%s: claim taken over by run %s; its outcome will not be recorded here", self._source.uri, lost_to
                )
                return
