"""Which documents may start converting: the high-water window of pages waiting for a request slot.

A document is admitted while fewer pages are waiting than the high-water mark (twice the in-flight
request window, see ``ConversionEngine``) and fewer documents than ``max_open_documents`` are open,
so pages of many small documents interleave and a single large document never holds the others
back. One document is always admitted when none is open, whatever its size.
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

    async def enter(self) -> None:
        """Wait until one more document may open; it counts as one pending page until its count is known."""
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
        """The document is over: it is no longer open, and ``unfinished_pages`` no longer wait."""
        async with self._changed:
            self._open -= 1
            self._pending_pages -= unfinished_pages
            self._changed.notify_all()
