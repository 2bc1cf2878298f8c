"""The HTML pages: the list of runs (with the search across runs), a run's page, and a document's
outputs as plain text.

All pages render on the server and work without JavaScript; every value from a manifest is escaped
by Jinja2's autoescaping, and charts escape their own labels.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response
from markupsafe import Markup

from olmocr_tasks.public import (
    AccessPolicy,
    LocationNotAllowedError,
    ManifestReader,
    ReadLimitExceeded,
    StorageError,
    UnreadableSourceError,
    positive_number,
    redact_url,
)

from . import charts
from .access import RunAccess, RunAccessDep, dag_of, readable
from .configured import not_configured_message
from .dependencies import AirflowBase, ConfiguredStore
from .paging import PAGE_SIZE, STATES, SearchResult, page_of_documents, search_runs
from .runs import OUTPUT_KINDS, RunDetail, RunSummary, build_detail, output_of
from .store import READ_ERRORS, Listing, ManifestReadError, ManifestStore
from .templating import render

log = logging.getLogger(__name__)

MAX_PER_PAGE = 500
# Documents listed per page of a search across runs; the next page continues where it stopped.
MAX_MATCHES = 100
_NOT_YOURS = "You are not allowed to read the runs of this DAG"
# What drawing a run page from a summary of an unexpected shape raises.
_SHAPE_ERRORS = (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError)
# A document's text is served whole; past this it is left to be read from storage.
MAX_OUTPUT_BYTES_SETTING = "OLMOCR_MAX_OUTPUT_BYTES"
DEFAULT_MAX_OUTPUT_BYTES = 256 * 1024 * 1024


def max_output_bytes() -> int:
    """``OLMOCR_MAX_OUTPUT_BYTES``: the largest markdown or Dolma record the page serves (default 256 MiB)."""
    value = os.environ.get(MAX_OUTPUT_BYTES_SETTING)
    if not value:
        return DEFAULT_MAX_OUTPUT_BYTES
    return int(positive_number(MAX_OUTPUT_BYTES_SETTING, value, int, unit="a number of bytes"))


router = APIRouter()


@router.get("/", response_class=HTMLResponse, name="runs_page")
def runs_page(
    request: Request,
    store: ConfiguredStore,
    airflow_base: AirflowBase,
    access: RunAccessDep,
    page: int = Query(1, ge=1),
    per_page: int = Query(50, ge=1, le=MAX_PER_PAGE),
    q: str = Query("", max_length=500, description="part of a source name, searched across every run"),
    from_run: str = Query("", max_length=300, description="a search's continuation: the run it resumes in"),
    start: int = Query(0, ge=0, alias="from", description="a search's continuation: the position in that run"),
) -> HTMLResponse:
    query = q.strip()
    if store is None:
        # Nothing failed: the page says what to configure.
        listing, location, search, status_code = Listing(error=not_configured_message()), None, None, 200
    else:
        listing = readable(store.listing(), access)
        location = redact_url(store.display_dir)
        search = _search(store, listing, query, from_run, start) if query else None
        status_code = 502 if listing.error else 200
    total = len(listing.runs)
    pages = max(1, math.ceil(total / per_page))
    page = min(page, pages)
    return render(
        request,
        "runs.html",
        status_code=status_code,
        runs=listing.runs[(page - 1) * per_page : page * per_page],
        notes=listing.notes,
        error=listing.error,
        location=location,
        page=page,
        pages=pages,
        per_page=per_page,
        total=total,
        query=query,
        search=search,
        airflow_base=airflow_base,
    )


def _search(store: ManifestStore, listing: Listing, query: str, from_run: str, start: int) -> SearchResult | None:
    """Bounded: a page of matches or SCAN_BUDGET entries per request, newest run first. A shard that
    cannot be read ends the search with a note on the listing."""

    def reader_of(run: RunSummary) -> ManifestReader | None:
        try:
            return store.reader(listing.files[run.key])
        except ManifestReadError:
            return None

    try:
        return search_runs(listing.runs, reader_of, query, from_run=from_run or None, start=start, max_hits=MAX_MATCHES)
    except READ_ERRORS as exc:
        listing.notes.append(f"The search stopped at an unreadable manifest shard ({type(exc).__name__}: {exc}).")
        return None


@router.get("/runs/{run_key}", response_class=HTMLResponse, name="run_page")
def run_page(
    request: Request,
    run_key: str,
    store: ConfiguredStore,
    airflow_base: AirflowBase,
    access: RunAccessDep,
    page: int = Query(1, ge=1, description="page of the documents table"),
    state: str = Query("", description="only documents of this status: converted, failed or skipped"),
    q: str = Query("", max_length=500, description="only documents whose source contains this"),
    start: int = Query(0, ge=0, alias="from", description="a name search's continuation: the position"),
) -> HTMLResponse:
    if store is None:
        return render(
            request,
            "not_found.html",
            status_code=404,
            what="run",
            run_key=run_key,
            message=not_configured_message(),
        )
    manifest = store.find(run_key)
    if manifest is None:
        return render(request, "not_found.html", status_code=404, what="run", run_key=run_key)
    try:
        reader = store.reader(manifest)
    except ManifestReadError as exc:
        return _unreadable_or_forbidden(request, run_key, access, exc)
    if not access.may_read(dag_of(reader.summary)):
        return _forbidden(request, run_key)
    try:
        # The summary (with the charts' overview), and the shard(s) of the one page shown.
        overview = store.overview(manifest, reader)
        documents = page_of_documents(reader, page=page, state=state, query=q.strip(), start=start)
    except (ManifestReadError, *READ_ERRORS) as exc:
        return _unreadable(request, run_key, exc)
    try:
        detail = build_detail(manifest.key, reader.summary, overview, airflow_base)
        drawn = _charts(detail)
    except _SHAPE_ERRORS as exc:
        # The reader checks the summary's types; a shape it lets through that the page cannot draw is
        # still this run's problem, not the server's (logged whole, as it may be a bug of the page).
        log.exception("run %s: the page cannot be drawn from its summary", manifest.key)
        return _unreadable(request, run_key, exc)
    return render(
        request,
        "run.html",
        airflow_base=airflow_base,
        run=detail,
        documents=documents,
        states=STATES,
        page_size=PAGE_SIZE,
        charts=drawn,
        server_json=json.dumps(detail.server, indent=1, sort_keys=True, default=str),
        settings_json=json.dumps(detail.settings, indent=1, sort_keys=True, default=str),
    )


def _forbidden(request: Request, run_key: str) -> HTMLResponse:
    message = f"{_NOT_YOURS}."
    return render(request, "not_found.html", status_code=403, what="forbidden", run_key=run_key, message=message)


def _unreadable(request: Request, run_key: str, exc: Exception) -> HTMLResponse:
    message = f"The manifest of this run could not be read ({exc})."
    return render(request, "not_found.html", status_code=422, what="manifest", run_key=run_key, message=message)


def _unreadable_or_forbidden(request: Request, run_key: str, access: RunAccess, exc: Exception) -> HTMLResponse:
    """A summary that cannot be read names no DAG: only those who may see runs of no DAG learn why."""
    if not access.may_read(None):
        return _forbidden(request, run_key)
    return _unreadable(request, run_key, exc)


def _charts(detail: RunDetail) -> list[dict[str, Any]]:
    """Each chart's SVG (escaped by the chart code itself, hence Markup) and its caption."""
    return [
        {
            "svg": Markup(
                charts.line_chart(
                    "Pages converted over time",
                    detail.progress,
                    x_label="seconds since the run started",
                    y_label="pages (cumulative)",
                    empty_message="No converted pages",
                    whole_y=True,
                )
            ),
            "caption": detail.progress_note,
        },
        {
            "svg": Markup(
                charts.bar_chart(
                    "Page latency distribution",
                    detail.latency_bins,
                    x_label="seconds per page (accepted attempt), bin lower edge",
                    y_label="pages",
                    empty_message="No page latencies recorded",
                )
            ),
            "caption": f"{detail.latency_count:,} page latencies from the documents of this run.",
        },
        {
            "svg": Markup(
                charts.bar_chart(
                    "Failures by error class",
                    detail.failures_by_class,
                    x_label="error class",
                    y_label="documents",
                    empty_message="No failures",
                )
            ),
            "caption": "Failed documents and dead letters, each source version counted once.",
        },
        {
            "svg": Markup(
                charts.bar_chart(
                    "Accepted attempt per page",
                    [(f"#{attempt}", n) for attempt, n in detail.attempt_histogram],
                    x_label="attempt on which the page was accepted",
                    y_label="pages",
                    empty_message="No attempt data",
                )
            ),
            "caption": "Pages accepted on the first try, and how many needed retries.",
        },
    ]


@router.get("/runs/{run_key}/documents/{index}/{kind}", name="document_output")
def document_output(run_key: str, index: int, kind: str, store: ConfiguredStore, access: RunAccessDep) -> Response:
    """A document's markdown or Dolma record, as plain text.

    Found through the manifest (never a path from the request) and served only from below the
    configured output location, so a manifest cannot be used to read anything else.
    """
    if store is None:
        return PlainTextResponse(not_configured_message(), status_code=503)
    manifest = store.find(run_key) if kind in OUTPUT_KINDS else None
    if manifest is None:
        return PlainTextResponse("No such run or output", status_code=404)
    try:
        reader = store.reader(manifest)
    except ManifestReadError as exc:
        if not access.may_read(None):
            return PlainTextResponse(_NOT_YOURS, status_code=403)
        return PlainTextResponse(f"Unreadable manifest: {exc}", status_code=422)
    if not access.may_read(dag_of(reader.summary)):
        return PlainTextResponse(_NOT_YOURS, status_code=403)
    try:
        # Only the shard holding this entry is read, not the whole run.
        uri = output_of(store.document(manifest, index, reader), kind)
    except ManifestReadError as exc:
        return PlainTextResponse(f"Unreadable manifest: {exc}", status_code=422)
    if uri is None:
        return PlainTextResponse("This document has no such output", status_code=404)
    try:
        AccessPolicy(inputs=None, outputs=(store.output_uri,)).check_output(uri)
    except LocationNotAllowedError:
        return PlainTextResponse("This output is not under the output location", status_code=403)
    limit = max_output_bytes()
    try:
        with store.storage.open_read(uri, max_bytes=limit) as stream:
            body = stream.read()
    except ReadLimitExceeded:
        message = f"This output is larger than {limit:,} bytes ({MAX_OUTPUT_BYTES_SETTING}): read it from storage"
        return PlainTextResponse(message, status_code=413)
    except (StorageError, UnreadableSourceError) as exc:
        return PlainTextResponse(f"The output could not be read: {exc}", status_code=404)
    name = uri.rsplit("/", 1)[-1]
    return Response(
        body,
        media_type="text/plain; charset=utf-8",
        # Shown as text in the browser, never interpreted as a page of this site.
        headers={
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "default-src 'none'; sandbox",
            "Content-Disposition": f"inline; filename*=UTF-8''{quote(name, safe='')}",
        },
    )
