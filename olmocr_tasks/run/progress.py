"""Progress reporting: one line when a document starts, periodic summaries, one line at the end.

Never a line per HTTP request at INFO. On a terminal a single self-updating status line is drawn on
stderr instead of the periodic log lines.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TextIO

from olmocr_tasks.location.manifest import DocumentEntry
from olmocr_tasks.page.results import PageResult

log = logging.getLogger("olmocr_tasks.run.progress")


@dataclass
class ProgressCounters:
    documents_total: int = 0
    documents_done: int = 0
    documents_failed: int = 0
    pages_total: int = 0
    pages_done: int = 0
    fallback_pages: int = 0
    retries: int = 0
    started_at: float = field(default_factory=time.monotonic)

    def pages_per_second(self) -> float:
        elapsed = time.monotonic() - self.started_at
        return self.pages_done / elapsed if elapsed > 0 else 0.0


class ProgressReporter:
    """Collects counters from the engine and reports them every ``interval_s`` seconds."""

    def __init__(
        self,
        documents_total: int,
        *,
        interval_s: float = 10.0,
        stream: TextIO | None = None,
        counters: ProgressCounters | None = None,
    ) -> None:
        # ``counters`` shared by several reporters (the CLI converts a big run batch after batch): the
        # line counts the whole run, its rate from the run's start, and the bar ends once, at the end.
        self._shared = counters is not None
        self.counters = counters or ProgressCounters(documents_total=documents_total)
        self._interval_s = interval_s
        self._stream = stream
        self._task: asyncio.Task[None] | None = None

    @property
    def _draws_bar(self) -> bool:
        return self._stream is not None and self._stream.isatty()

    def document_started(self, source: str, pages: int) -> None:
        self.counters.pages_total += pages
        if not self._draws_bar:
            log.info("converting %s (%d pages)", source, pages)

    def page_done(self, page: PageResult) -> None:
        self.counters.pages_done += 1
        self.counters.retries += max(0, page.attempts - 1)
        if page.is_fallback:
            self.counters.fallback_pages += 1

    def document_done(self, entry: DocumentEntry) -> None:
        self.counters.documents_done += 1
        if entry.status == "failed":
            self.counters.documents_failed += 1
            if not self._draws_bar:
                log.warning("failed %s: %s: %s", entry.source, entry.error_class, entry.error)

    def line(self) -> str:
        c = self.counters
        return (
            f"documents {c.documents_done}/{c.documents_total} ({c.documents_failed} failed), "
            f"pages {c.pages_done}/{c.pages_total}, {c.pages_per_second():.2f} pages/s, "
            f"retries {c.retries}, fallbacks {c.fallback_pages}"
        )

    async def __aenter__(self) -> ProgressReporter:
        if not self._shared:
            self.counters.started_at = time.monotonic()
        self._task = asyncio.create_task(self._report_periodically())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        done = self.counters.documents_done >= self.counters.documents_total
        if self._draws_bar and self._stream is not None:
            self._stream.write("\r" + self.line() + ("\n" if done else ""))
            self._stream.flush()
        if done or not self._shared:
            log.info("finished: %s", self.line())

    async def _report_periodically(self) -> None:
        interval = 0.5 if self._draws_bar else self._interval_s
        while True:
            await asyncio.sleep(interval)
            if self._draws_bar and self._stream is not None:
                self._stream.write("\r" + self.line())
                self._stream.flush()
            else:
                log.info("progress: %s", self.line())
