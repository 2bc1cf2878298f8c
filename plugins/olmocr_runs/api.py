"""The JSON API: the list of runs, a run's summary, and a run's documents (or dead letters) a page at
a time. Errors are ``{"detail": ...}`` with their status (``create_app``'s error handler)."""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse

from olmocr_tasks.public import redact, redact_url

from .access import readable
from .dependencies import ApiRuns, MountPath, unreadable_manifest
from .pages import MAX_PER_PAGE
from .store import READ_ERRORS, ManifestFile

# Summary fields passed through ``redact`` before they are served (the rest are counts and names).
_REDACTED_SUMMARY_KEYS = ("server", "settings", "input_uri", "output_uri", "overview")

# Entries of the documents API per request.
MAX_API_DOCUMENTS = 1000

router = APIRouter(prefix="/api")


@router.get("/runs", name="api_runs")
def api_runs(
    lookup: ApiRuns,
    limit: int = Query(100, ge=1, le=MAX_PER_PAGE * 10),
    offset: int = Query(0, ge=0),
) -> JSONResponse:
    store = lookup.store()
    listing = readable(store.listing(), lookup.access)
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


def _documents_api(mount_path: str, manifest: ManifestFile) -> str:
    return f"{mount_path}/api/runs/{quote(manifest.key, safe='')}/documents"


@router.get("/runs/{run_key}", name="api_run")
def api_run(run_key: str, lookup: ApiRuns, mount_path: MountPath) -> JSONResponse:
    """The run's summary as stored (counts, metrics, verdict, overview, shard list), without its
    entries: those are paged by ``/api/runs/<key>/documents`` (``documents_api``)."""
    run = lookup.run(run_key)
    data = run.reader.summary
    # Writers keep secrets out already; scrubbing again costs nothing and covers older writers.
    body = {**data, **{k: redact(data[k]) for k in _REDACTED_SUMMARY_KEYS if k in data}}
    body["documents_api"] = _documents_api(mount_path, run.manifest)
    body["document_count"] = run.reader.document_count()
    body["dead_letter_count"] = run.reader.document_count("dead_letters")
    return JSONResponse(body)


def _with_redacted_error(entry: object) -> object:
    """An entry as served: its error text through ``redact`` (manifests of older writers kept it raw)."""
    if isinstance(entry, dict) and isinstance(entry.get("error"), str):
        return {**entry, "error": redact(entry["error"])}
    return entry


@router.get("/runs/{run_key}/documents", name="api_run_documents")
def api_run_documents(
    run_key: str,
    lookup: ApiRuns,
    mount_path: MountPath,
    offset: int = Query(0, ge=0),
    limit: int = Query(100, ge=1, le=MAX_API_DOCUMENTS),
    kind: str = Query("documents", pattern="^(documents|dead_letters)$"),
) -> JSONResponse:
    """Entries ``offset`` to ``offset + limit`` of the run's documents (or dead letters), as written,
    reading only the shards that hold them; ``next`` is the following page's URL (null at the end)."""
    run = lookup.run(run_key)
    try:
        total = run.reader.document_count(kind)
        entries = run.reader.page(offset, limit, kind)
    except READ_ERRORS as exc:
        raise unreadable_manifest(exc) from exc
    after = offset + len(entries)
    path = _documents_api(mount_path, run.manifest)
    return JSONResponse(
        {
            "run_id": run.reader.summary.get("run_id"),
            "kind": kind,
            "total": total,
            "offset": offset,
            "limit": limit,
            kind: [_with_redacted_error(entry) for entry in entries],
            "next": f"{path}?kind={kind}&offset={after}&limit={limit}" if after < total else None,
        }
    )
