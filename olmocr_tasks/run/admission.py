"""Which documents may start converting: the high-water window of pages waiting for a request slot.

A document is admitted while fewer pages are waiting than the high-water mark (twice the in-flight
request window, see ``ConversionEngine``) and fewer documents than ``max_open_documents`` are open,
so pages of many small documents interleave and a single large document never holds the others
back. One document is always admitted when none is open, whatever its size.

Each admitted document gets an ``AdmittedDocument`` that keeps its own count of waiting pages, so a
document that stops part-way (a failed page, the error-rate guard, a lost claim) gives back exactly
the pages it still held: the window never stays narrowed by documents that are over.
"""

from __future__ import annotations

import asyncio


class Admission:
    """Admits documents while the queue of pages waiting for a request slot is short."""

    def __init__(self, high_water_pages: int, max_open_documents: int) -> None:
        self._high_water = high_water_pages
        self._max_open = max_open_documents
        self._open = 0
        self._pending_pages = 0
        self._changed = asyncio.Condition()

    async def enter(self) -> AdmittedDocument:
        """Wait until one more document may open; it counts as one pending page until its count is known."""
        async with self._changed:
            await self._changed.wait_for(
                lambda: self._open == 0 or (self._open < self._max_open and self._pending_pages < self._high_water)
            )
            self._open += 1
            self._pending_pages += 1  # the document's first page, before its count is known
        return AdmittedDocument(self)

    async def _adjust(self, pages: int, closing: bool = False) -> None:
        async with self._changed:
            self._pending_pages += pages
            if closing:
                self._open -= 1
            if pages < 0 or closing:
                self._changed.notify_all()


class AdmittedDocument:
    """One open document's share of the admission: the pages it still has waiting."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._waiting = 1
        self._open = True

    async def pages_known(self, pages: int) -> None:
        """The document has ``pages`` pages: all of them wait (the first was counted on entry)."""
        await self._admission._adjust(pages - self._waiting)
        self._waiting = pages

    async def page_done(self) -> None:
        self._waiting -= 1
        await self._admission._adjust(-1)

    async def leave(self) -> None:
        """The document is over: it is no longer open, and its unfinished pages no longer wait. Idempotent."""
        if not self._open:
            return
        self._open = False
        unfinished, self._waiting = self._waiting, 0
        await self._admission._adjust(-unfinished, closing=True)
