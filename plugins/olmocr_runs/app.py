"""The "OCR runs" pages: a FastAPI app the Airflow api-server mounts through the plugin.

It reads run manifests (``OUTPUT/manifests/*.json``) and the outputs those manifests name below the
output location (a document's markdown and Dolma record), nothing else. The output location comes
from ``create_app(output_uri=...)``, else the ``OLMOCR_OUTPUT_URI`` environment variable, else the
Airflow Variable ``olmocr_output_uri`` (looked up per request, so changing it needs no restart).
All pages render on the server and work without JavaScript; every value from a manifest is
escaped by Jinja2's autoescaping, and charts escape their own labels.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.exceptions import HTTPException as StarletteHTTPException

from olmocr_tasks.core.errors import StorageError, UnreadableSourceError
from olmocr_tasks.core.redaction import redact_fields, redact_url
from olmocr_tasks.location.manifest_reader import ManifestFormatError, ManifestReader
from olmocr_tasks.storage.access import AccessPolicy, LocationNotAllowedError
from olmocr_tasks.storage.store import Storage

from . import charts
from .paging import PAGE_SIZE, STATES, page_of_documents, search_runs
from .runs import (
    OUTPUT_KINDS,
    STATUS_LABELS,
    RunDetail,
    RunSummary,
    build_detail,
    output_of,
    parse_time,
)
from .store import ManifestReadError, ManifestStore

log = logging.getLogger(__name__)

ENV_VAR = "OLMOCR_OUTPUT_URI"
AIRFLOW_VARIABLE = "olmocr_output_uri"
# A Variable lookup is a database query; the list page may be reloaded often.
_VARIABLE_TTL_S = 30.0
MAX_PER_PAGE = 500
# Documents listed per page of a search across runs; the next page continues where it stopped.
MAX_MATCHES = 100
# Entries of the documents API per request.
MAX_API_DOCUMENTS = 1000
_READ_ERRORS = (StorageError, UnreadableSourceError, ManifestFormatError, ValueError, KeyError)
# Shown for figures a manifest does not have (an en dash, written as an escape for ruff's RUF001).
_BLANK = "\u2013"

_templates = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)


def _fmt_int(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else _BLANK


def _fmt_float(value: Any, digits: int = 2) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return _BLANK
    return f"{value:,.{digits}f}"


def _fmt_pct(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _BLANK
    return f"{value * 100:.2f}%"


def _fmt_time(value: Any) -> str:
    """ISO stamps shown to the second, in UTC."""
    stamp = parse_time(value)
    if stamp is None:
        return _BLANK if not value else str(value)
    return stamp.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


_templates.filters.update(n=_fmt_int, dec=_fmt_float, pct=_fmt_pct, time=_fmt_time)
_templates.globals["status_labels"] = STATUS_LABELS


def _airflow_variable() -> str | None:
    """The Airflow Variable, when running inside Airflow; None anywhere else or on any error."""
    try:
        # In the api-server the Task SDK reads Variables from the metadata database; elsewhere it
        # falls back to AIRFLOW_VAR_* environment variables and configured secrets backends.
        from airflow.sdk import Variable
    except Exception:
        return None
    try:
        value = Variable.get(AIRFLOW_VARIABLE, default=None)
    except Exception as exc:  # e.g. no reachable metadata database: treat as not configured
        log.debug("Airflow Variable %s unavailable: %s", AIRFLOW_VARIABLE, exc)
        return None
    return str(value) if value else None


class _Location:
    """Resolves the output URI and keeps one store (with its summary cache) per URI."""

    def __init__(self, explicit: str | None, storage_for: Callable[[str], Storage] | None = None) -> None:
        self._explicit = explicit
        self._storage_for = storage_for
        self._lock = threading.Lock()
        self._variable: tuple[float, str | None] = (-math.inf, None)
        self._store: ManifestStore | None = None

    def uri(self) -> str | None:
        if self._explicit:
            return self._explicit
        if os.environ.get(ENV_VAR):
            return os.environ[ENV_VAR]
        checked_at, value = self._variable
        if time.monotonic() - checked_at > _VARIABLE_TTL_S:
            value = _airflow_variable()
            self._variable = (time.monotonic(), value)
        return value

    def store(self) -> ManifestStore | None:
        uri = self.uri()
        if not uri:
            return None
        with self._lock:
            if self._store is None or self._store.output_uri != uri:
                storage = self._storage_for(uri) if self._storage_for is not None else None
                self._store = ManifestStore(uri, storage)
            return self._store


def _base_path(request: Request) -> str:
    """Where this app is mounted (``/olmocr`` inside Airflow, empty when served on its own)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def _airflow_base(request: Request, configured: str | None) -> str:
    """The Airflow UI root for task links: the mount point's parent unless configured."""
    if configured is not None:
        return configured.rstrip("/")
    return _base_path(request).rsplit("/", 1)[0]


def _page(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    body = _templates.get_template(template).render(base=_base_path(request), **context)
    return HTMLResponse(body, status_code=status_code)


def _not_configured_message() -> str:
    return (
        f"No output location is configured. Set the environment variable {ENV_VAR} or the Airflow "
        f"Variable {AIRFLOW_VARIABLE} to the conversion output URI (a folder or s3://bucket/prefix)."
    )


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


def create_app(
    output_uri: str | None = None,
    *,
    airflow_ui_base: str | None = None,
    dependencies: Sequence[Any] | None = None,
    storage_for: Callable[[str], Storage] | None = None,
) -> FastAPI:
    """Build the app. ``output_uri`` overrides the environment and the Airflow Variable.

    ``airflow_ui_base`` is the Airflow UI root for task-log links; by default the parent of the
    path the app is mounted at (so ``/olmocr`` links to ``/dags/...``). ``dependencies`` run before
    every route: the plugin passes Airflow's authentication check there, because apps mounted by
    plugins are not protected by the api-server otherwise. ``storage_for`` gives the ``Storage`` that
    reads an output URI (the plugin's reads S3 through the ``aws_default`` connection, as the tasks
    do); by default the environment's AWS settings.
    """
    app = FastAPI(
        dependencies=list(dependencies or []),
        title="OCR runs",
        description="Run manifests of olmOCR conversions",
        docs_url=None,
        redoc_url=None,
        openapi_url="/api/openapi.json",
    )
    location = _Location(output_uri, storage_for)
    app.state.location = location

    @app.exception_handler(StarletteHTTPException)
    def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        path = request.scope.get("path", "")
        if "/api/" in path or exc.status_code != 404:
            return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)
        return _page(request, "not_found.html", status_code=404, what="page")

    @app.get("/", response_class=HTMLResponse, name="runs_page")
    def runs_page(
        request: Request,
        page: int = Query(1, ge=1),
        per_page: int = Query(50, ge=1, le=MAX_PER_PAGE),
        q: str = Query("", max_length=500, description="part of a source name, searched across every run"),
        from_run: str = Query("", max_length=300, description="a search's continuation: the run it resumes in"),
        start: int = Query(0, ge=0, alias="from", description="a search's continuation: the position in that run"),
    ) -> HTMLResponse:
        store = location.store()
        query = q.strip()
        if store is None:
            return _page(
                request,
                "runs.html",
                runs=[],
                notes=[],
                error=_not_configured_message(),
                location=None,
                page=1,
                pages=1,
                per_page=per_page,
                total=0,
                query=query,
                search=None,
                airflow_base=_airflow_base(request, airflow_ui_base),
            )
        listing = store.listing()
        search = None
        if query:
            # Bounded: a page of matches or SCAN_BUDGET entries per request, newest run first.
            def reader_of(run: RunSummary) -> ManifestReader | None:
                try:
                    return store.reader(listing.files[run.key])
                except ManifestReadError:
                    return None

            try:
                search = search_runs(
                    listing.runs, reader_of, query, from_run=from_run or None, start=start, max_hits=MAX_MATCHES
                )
            except _READ_ERRORS as exc:
                listing.notes.append(
                    f"The search stopped at an unreadable manifest shard ({type(exc).__name__}: {exc})."
                )
        total = len(listing.runs)
        pages = max(1, math.ceil(total / per_page))
        page = min(page, pages)
        window = listing.runs[(page - 1) * per_page : page * per_page]
        return _page(
            request,
            "runs.html",
            status_code=502 if listing.error else 200,
            runs=window,
            notes=listing.notes,
            error=listing.error,
            location=redact_url(store.display_dir),
            page=page,
            pages=pages,
            per_page=per_page,
            total=total,
            query=query,
            search=search,
            airflow_base=_airflow_base(request, airflow_ui_base),
        )

    @app.get("/runs/{run_key}", response_class=HTMLResponse, name="run_page")
    def run_page(
        request: Request,
        run_key: str,
        page: int = Query(1, ge=1, description="page of the documents table"),
        state: str = Query("", description="only documents of this status: converted, failed or skipped"),
        q: str = Query("", max_length=500, description="only documents whose source contains this"),
        start: int = Query(0, ge=0, alias="from", description="a name search's continuation: the position"),
    ) -> HTMLResponse:
        store = location.store()
        if store is None:
            return _page(
                request,
                "not_found.html",
                status_code=404,
                what="run",
                run_key=run_key,
                message=_not_configured_message(),
            )
        manifest = store.find(run_key)
        if manifest is None:
            return _page(request, "not_found.html", status_code=404, what="run", run_key=run_key)
        try:
            # The summary (with the charts' overview), and the shard(s) of the one page shown.
            reader = store.reader(manifest)
            overview = store.overview(manifest, reader)
            documents = page_of_documents(reader, page=page, state=state, query=q.strip(), start=start)
        except (ManifestReadError, *_READ_ERRORS) as exc:
            return _page(
                request,
                "not_found.html",
                status_code=422,
                what="manifest",
                run_key=run_key,
                message=f"The manifest of this run could not be read ({exc}).",
            )
        detail = build_detail(manifest.key, reader.summary, overview, _airflow_base(request, airflow_ui_base))
        return _page(
            request,
            "run.html",
            airflow_base=_airflow_base(request, airflow_ui_base),
            run=detail,
            documents=documents,
            states=STATES,
            page_size=PAGE_SIZE,
            charts=_charts(detail),
            server_json=json.dumps(detail.server, indent=1, sort_keys=True, default=str),
            settings_json=json.dumps(detail.settings, indent=1, sort_keys=True, default=str),
        )

    @app.get("/runs/{run_key}/documents/{index}/{kind}", name="document_output")
    def document_output(run_key: str, index: int, kind: str) -> Response:
        """A document's markdown or Dolma record, as plain text.

        Found through the manifest (never a path from the request) and served only from below the
        configured output location, so a manifest cannot be used to read anything else.
        """
        store = location.store()
        if store is None:
            return PlainTextResponse(_not_configured_message(), status_code=503)
        manifest = store.find(run_key) if kind in OUTPUT_KINDS else None
        if manifest is None:
            return PlainTextResponse("No such run or output", status_code=404)
        try:
            # Only the shard holding this entry is read, not the whole run.
            uri = output_of(store.document(manifest, index), kind)
        except ManifestReadError as exc:
            return PlainTextResponse(f"Unreadable manifest: {exc}", status_code=422)
        if uri is None:
            return PlainTextResponse("This document has no such output", status_code=404)
        try:
            AccessPolicy(inputs=None, outputs=(store.output_uri,)).check_output(uri)
        except LocationNotAllowedError:
            return PlainTextResponse("This output is not under the output location", status_code=403)
        try:
            body = store.storage.read_bytes(uri)
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

    @app.get("/api/runs", name="api_runs")
    def api_runs(
        limit: int = Query(100, ge=1, le=MAX_PER_PAGE * 10),
        offset: int = Query(0, ge=0),
    ) -> JSONResponse:
        store = location.store()
        if store is None:
            return JSONResponse({"detail": _not_configured_message()}, status_code=503)
        listing = store.listing()
        body = {
            "manifests": redact_url(store.display_dir),
            "total": len(listing.runs),
            "offset": offset,
            "limit": limit,
            "runs": [run.to_dict() for run in listing.runs[offset : offset + limit]],
            "notes": listing.notes,
            "error": listing.error,
        }
        return JSONResponse(body, status_code=502 if listing.error else 200)

    def _find_run(run_key: str) -> tuple[Any, Any] | JSONResponse:
        """The store and the run's manifest for the JSON API, or the error response saying why not."""
        store = location.store()
        if store is None:
            return JSONResponse({"detail": _not_configured_message()}, status_code=503)
        manifest = store.find(run_key)
        if manifest is None:
            return JSONResponse({"detail": "No such run"}, status_code=404)
        return store, manifest

    def _documents_api(request: Request, manifest: Any) -> str:
        return f"{_base_path(request)}/api/runs/{quote(manifest.key, safe='')}/documents"

    @app.get("/api/runs/{run_key}", name="api_run")
    def api_run(request: Request, run_key: str) -> JSONResponse:
        """The run's summary as stored (counts, metrics, verdict, overview, shard list), without its
        entries: those are paged by ``/api/runs/<key>/documents`` (``documents_api``)."""
        found = _find_run(run_key)
        if isinstance(found, JSONResponse):
            return found
        store, manifest = found
        try:
            reader = store.reader(manifest)
        except ManifestReadError as exc:
            return JSONResponse({"detail": f"Unreadable manifest: {exc}"}, status_code=422)
        data = reader.summary
        # Writers keep secrets out already; scrubbing again costs nothing and covers older writers.
        body = {**data, **{k: redact_fields(data[k]) for k in ("server", "settings") if k in data}}
        body["documents_api"] = _documents_api(request, manifest)
        body["document_count"] = reader.document_count()
        body["dead_letter_count"] = reader.document_count("dead_letters")
        return JSONResponse(body)

    @app.get("/api/runs/{run_key}/documents", name="api_run_documents")
    def api_run_documents(
        request: Request,
        run_key: str,
        offset: int = Query(0, ge=0),
        limit: int = Query(100, ge=1, le=MAX_API_DOCUMENTS),
        kind: str = Query("documents", pattern="^(documents|dead_letters)$"),
    ) -> JSONResponse:
        """Entries ``offset`` to ``offset + limit`` of the run's documents (or dead letters), as written,
        reading only the shards that hold them; ``next`` is the following page's URL (null at the end)."""
        found = _find_run(run_key)
        if isinstance(found, JSONResponse):
            return found
        store, manifest = found
        try:
            reader = store.reader(manifest)
            total = reader.document_count(kind)
            entries = reader.page(offset, limit, kind)
        except (ManifestReadError, *_READ_ERRORS) as exc:
            return JSONResponse({"detail": f"Unreadable manifest: {exc}"}, status_code=422)
        after = offset + len(entries)
        path = _documents_api(request, manifest)
        return JSONResponse(
            {
                "run_id": reader.summary.get("run_id"),
                "kind": kind,
                "total": total,
                "offset": offset,
                "limit": limit,
                kind: entries,
                "next": f"{path}?kind={kind}&offset={after}&limit={limit}" if after < total else None,
            }
        )

    return app
