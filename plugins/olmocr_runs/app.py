"""The "OCR runs" app: a FastAPI app the Airflow api-server mounts through the plugin.

It reads run manifests (``OUTPUT/manifests/*.json``) and the outputs those manifests name below the
output location (a document's markdown and Dolma record), nothing else. The output location comes
from ``create_app(output_uri=...)``, else the environment, else the Airflow Variable
(``configured``). The HTML pages are in ``pages``, the JSON API in ``api``; what their routes share
(the store, the run lookup) are FastAPI dependencies in ``dependencies``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from olmocr_tasks.public import Storage

from . import api, pages
from .access import RunAccess, run_access
from .configured import ConfiguredLocation
from .templating import render


def create_app(
    output_uri: str | None = None,
    *,
    airflow_ui_base: str | None = None,
    dependencies: Sequence[Any] | None = None,
    storage_for: Callable[[str], Storage] | None = None,
    access: Callable[..., RunAccess],
) -> FastAPI:
    """Build the app. ``output_uri`` overrides the environment and the Airflow Variable.

    ``airflow_ui_base`` is the Airflow UI root for task-log links; by default the parent of the
    path the app is mounted at (so ``/olmocr`` links to ``/dags/...``). ``dependencies`` run before
    every route: the plugin passes Airflow's authentication check there, because apps mounted by
    plugins are not protected by the api-server otherwise. ``storage_for`` gives the ``Storage`` that
    reads an output URI (the plugin's reads S3 through the ``aws_default`` connection, as the tasks
    do); by default the environment's AWS settings. ``access`` is a FastAPI dependency giving the
    requesting user's ``RunAccess`` (which runs they may see), required: ``access.every_run`` lets every
    user see every run.
    """
    app = FastAPI(
        dependencies=list(dependencies or []),
        title="OCR runs",
        description="Run manifests of olmOCR conversions",
        docs_url=None,
        redoc_url=None,
        # Served by a route of our own below: FastAPI's own OpenAPI route skips the app's dependencies,
        # so it would answer without sign-in.
        openapi_url=None,
    )
    app.dependency_overrides[run_access] = access
    app.state.location = ConfiguredLocation(output_uri, storage_for)
    app.state.airflow_ui_base = airflow_ui_base
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.include_router(pages.router)
    app.include_router(api.router)

    @app.get("/api/openapi.json", include_in_schema=False, name="openapi")
    def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    return app


def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    """The API's errors as JSON; a page that does not exist as the HTML not-found page."""
    path = request.scope.get("path", "")
    if "/api/" in path or exc.status_code != 404:
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code)
    return render(request, "not_found.html", status_code=404, what="page")
