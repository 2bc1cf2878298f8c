"""A run's documents a page at a time, and the search by source name, each reading a bounded part of a run.

A run's entries are in shards of 10,000 (``olmocr_tasks.location.manifest``), so:

* a page of the whole list reads the one or two shards holding it (``ManifestReader.page``);
* a page of one state (failed, converted, skipped) finds its shards through the per-shard status
  counts the summary keeps, and reads only those (exact totals and page numbers);
* a search by part of a source name cannot know where its matches are: it scans from a position,
  shard by shard, and stops after a page of matches or after ``SCAN_BUDGET`` entries, saying how
  far it got; the next page continues from there. Lines without the text are never parsed, and a
  shard is streamed: one entry in memory at a time, never the shard's list.

Old manifests with their entries inline are already in memory and are filtered whole.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from olmocr_tasks.public import ManifestReader

from .runs import DocumentRow, RunSummary, document_row

PAGE_SIZE = 100
# Entries one request may scan for a name: ten shards, about 0.3 s of decompressing and matching.
SCAN_BUDGET = 100_000
STATES = ("converted", "failed", "skipped")


@dataclass
class DocumentPage:
    """One page of a run's documents as the table shows it."""

    rows: list[DocumentRow]
    documents: int  # documents in the run
    state: str = ""
    query: str = ""
    page: int = 1
    # Matching documents in the whole run, when known without scanning (no name filter).
    total: int | None = None
    # A name search: the positions scanned by this request, and where the next one starts (None: done).
    scanned_from: int = 0
    scanned_to: int = 0
    next_from: int | None = None
    shards_read: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def pages(self) -> int:
        return max(1, math.ceil((self.total or 0) / PAGE_SIZE))

    @property
    def scanning(self) -> bool:
        return self.total is None


def _matches(entry: dict[str, Any], state: str, needle: str) -> bool:
    if state and entry.get("status") != state:
        return False
    return not needle or needle in str(entry.get("source") or "").casefold()


def _safe_prefilter(query: str) -> str | None:
    """The text to look for in a raw JSON line: only where JSON writes the name's characters as they are."""
    if not query or any(ch in query for ch in '"\\') or any(ord(ch) < 0x20 for ch in query):
        return None
    return query


def page_of_documents(
    reader: ManifestReader, *, page: int = 1, state: str = "", query: str = "", start: int = 0
) -> DocumentPage:
    """Page ``page`` of the documents (state filter only), or a name search's page from position ``start``."""
    state = state if state in STATES else ""
    documents = reader.document_count()
    result = DocumentPage(rows=[], documents=documents, state=state, query=query, page=max(page, 1))
    if not reader.sharded:
        entries = list(reader.iter_documents())
        matches = [
            (i, e) for i, e in enumerate(entries) if isinstance(e, dict) and _matches(e, state, query.casefold())
        ]
        if query:
            # Old manifests are in memory: the "scan" reaches a page of matches or the end at once.
            hits = [(i, e) for i, e in matches if i >= start][:PAGE_SIZE]
            more = len(hits) == PAGE_SIZE and hits[-1][0] + 1 < documents
            result.scanned_from, result.scanned_to = start, hits[-1][0] + 1 if more else documents
            result.next_from = hits[-1][0] + 1 if more else None
            result.rows = [document_row(i, e) for i, e in hits]
            return result
        result.total = len(matches)
        result.page = min(result.page, result.pages)
        offset = (result.page - 1) * PAGE_SIZE
        result.rows = [document_row(i, e) for i, e in matches[offset : offset + PAGE_SIZE]]
        return result

    table = reader.shard_table()
    if query or (state and any(shard["statuses"] is None for shard in table)):
        return _scan(reader, table, result, start)
    if not state:
        result.total = documents
        # A page past the end (an old link, a hand-edited URL) shows the last one.
        result.page = min(result.page, result.pages)
        offset = (result.page - 1) * PAGE_SIZE
        entries = reader.page(offset, PAGE_SIZE)
        result.rows = [document_row(offset + i, e) for i, e in enumerate(entries) if isinstance(e, dict)]
        result.shards_read = sum(
            1 for s in table if s["start"] < offset + PAGE_SIZE and s["start"] + s["entries"] > offset
        )
        return result
    # A state: the per-shard counts say which shards hold matches offset .. offset + PAGE_SIZE.
    result.total = sum(int(shard["statuses"].get(state, 0)) for shard in table)
    result.page = min(result.page, result.pages)
    offset = (result.page - 1) * PAGE_SIZE
    seen = 0
    for shard in table:
        here = int(shard["statuses"].get(state, 0))
        if seen + here <= offset or not here:
            seen += here
            continue
        result.shards_read += 1
        # Only lines holding the quoted state are parsed; the status is still checked on each.
        for number, entry in reader.read_shard(shard["uri"], f'"{state}"'):
            if entry.get("status") != state:
                continue
            if seen >= offset:
                result.rows.append(document_row(shard["start"] + number, entry))
            seen += 1
            if len(result.rows) >= PAGE_SIZE:
                return result
    return result


def _scan(reader: ManifestReader, table: list[dict[str, Any]], result: DocumentPage, start: int) -> DocumentPage:
    """A name (and state) search from position ``start``: a page of matches or ``SCAN_BUDGET`` entries."""
    needle = result.query.casefold()
    prefilter = _safe_prefilter(result.query)
    start = min(max(start, 0), result.documents)
    result.scanned_from = result.scanned_to = start
    scanned = 0
    for shard in table:
        end = shard["start"] + shard["entries"]
        if end <= start:
            continue
        if scanned >= SCAN_BUDGET:
            result.next_from = max(shard["start"], start)
            return result
        statuses = shard["statuses"]
        # A shard without a document of the wanted state is skipped unread.
        if not (result.state and statuses is not None and not statuses.get(result.state)):
            result.shards_read += 1
            for number, entry in reader.read_shard(shard["uri"], prefilter):
                position = shard["start"] + number
                if position < start or not _matches(entry, result.state, needle):
                    continue
                result.rows.append(document_row(position, entry))
                if len(result.rows) >= PAGE_SIZE:
                    result.scanned_to = position + 1
                    result.next_from = position + 1 if position + 1 < result.documents else None
                    return result
        scanned += end - max(shard["start"], start)
        result.scanned_to = end
    return result


@dataclass
class SearchResult:
    """One request's worth of the search across runs (newest run first)."""

    hits: list[tuple[RunSummary, DocumentRow]]
    runs: int  # runs listed
    # Documents scanned by this request, and where the next request continues (None: searched them all).
    scanned: int = 0
    shards_read: int = 0
    next_run: str | None = None
    next_from: int = 0
    runs_done: int = 0  # runs before the continuation point (searched by this request or earlier ones)


def _chunks(
    reader: ManifestReader,
) -> Iterator[tuple[int, int, Callable[[str | None], Iterator[tuple[int, dict[str, Any]]]]]]:
    """(first position, end position, loader) per shard, each loader streaming its shard's entries;
    an inline manifest is one chunk, already in memory."""
    if not reader.sharded:
        entries = [e for e in reader.iter_documents()]
        yield 0, len(entries), lambda _prefilter: ((i, e) for i, e in enumerate(entries) if isinstance(e, dict))
        return
    for shard in reader.shard_table():
        uri, first = shard["uri"], shard["start"]
        yield (
            first,
            first + shard["entries"],
            lambda prefilter, uri=uri, first=first: (
                (first + number, entry) for number, entry in reader.read_shard(uri, prefilter)
            ),
        )


def search_runs(
    runs: list[RunSummary],
    open_reader: Callable[[RunSummary], ManifestReader | None],
    query: str,
    *,
    from_run: str | None = None,
    start: int = 0,
    max_hits: int = PAGE_SIZE,
    budget: int = SCAN_BUDGET,
) -> SearchResult:
    """Documents whose source contains ``query`` (any case), newest run first, from run ``from_run``
    at position ``start``: stops after ``max_hits`` matches or once ``budget`` entries were scanned."""
    needle = query.casefold()
    prefilter = _safe_prefilter(query)
    result = SearchResult(hits=[], runs=len(runs))
    keys = [run.key for run in runs]
    first = keys.index(from_run) if from_run in keys else 0
    if from_run not in keys:
        start = 0
    for number, run in enumerate(runs[first:], start=first):
        result.runs_done = number
        reader = open_reader(run)
        if reader is None:
            start = 0
            continue
        for chunk_start, chunk_end, load in _chunks(reader):
            if chunk_end <= start:
                continue
            if result.scanned >= budget:
                result.next_run, result.next_from = run.key, max(chunk_start, start)
                return result
            result.shards_read += reader.sharded
            for position, entry in load(prefilter):
                if position < start or not _matches(entry, "", needle):
                    continue
                result.hits.append((run, document_row(position, entry)))
                if len(result.hits) >= max_hits:
                    result.scanned += position + 1 - max(chunk_start, start)
                    result.next_run, result.next_from = run.key, position + 1
                    return result
            result.scanned += chunk_end - max(chunk_start, start)
        start = 0
    result.runs_done = len(runs)
    return result
