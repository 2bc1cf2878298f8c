"""What the routes share, as FastAPI dependencies: the configured manifest store, the JSON API's run
lookup (503 while no location is configured, 404 for an unknown run, 403 for a run of a DAG the user
may not read, 422 for an unreadable manifest), and the paths links start from.

``create_app`` keeps the app's settings in ``app.state``: ``location`` (a ``ConfiguredLocation``)
and ``airflow_ui_base``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from olmocr_tasks.public import ManifestReader

from .access import RunAccess, RunAccessDep, dag_of, forbidden
from .configured import ConfiguredLocation, not_configured_message
from .store import ManifestFile, ManifestReadError, ManifestStore


def mount_path(request: Request) -> str:
    """Where this app is mounted (``/olmocr`` inside Airflow, empty when served on its own)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


MountPath = Annotated[str, Depends(mount_path)]


def airflow_base(request: Request) -> str:
    """The Airflow UI root for task links: the mount point's parent unless configured."""
    configured: str | None = request.app.state.airflow_ui_base
    if configured is not None:
        return configured.rstrip("/")
    return mount_path(request).rsplit("/", 1)[0]


AirflowBase = Annotated[str, Depends(airflow_base)]


def configured_store(request: Request) -> ManifestStore | None:
    """The configured output location's store; None while no location is configured."""
    location: ConfiguredLocation = request.app.state.location
    return location.store()


ConfiguredStore = Annotated[ManifestStore | None, Depends(configured_store)]


@dataclass(frozen=True)
class ApiRun:
    """A run the JSON API serves: its manifest file and the reader of its summary."""

    manifest: ManifestFile
    reader: ManifestReader


class RunLookup:
    """The JSON API's store and its runs, raising the API's error when one is not there.

    They raise when a route asks, not while FastAPI resolves the route's dependencies: FastAPI checks
    a route's own parameters after its dependencies, so a request with a bad parameter still gets
    its 422 rather than a 503 or 404.
    """

    def __init__(self, store: ManifestStore | None, access: RunAccess) -> None:
        self._store = store
        self.access = access

    def store(self) -> ManifestStore:
        if self._store is None:
            raise HTTPException(503, detail=not_configured_message())
        return self._store

    def run(self, run_key: str) -> ApiRun:
        store = self.store()
        manifest = store.find(run_key)
        if manifest is None:
            raise HTTPException(404, detail="No such run")
        try:
            reader = store.reader(manifest)
        except ManifestReadError as exc:
            # Whose run it is cannot be read: only those who may see runs of no DAG learn why.
            if not self.access.may_read(None):
                raise forbidden() from exc
            raise unreadable_manifest(exc) from exc
        if not self.access.may_read(dag_of(reader.summary)):
            raise forbidden()
        return ApiRun(manifest, reader)


def run_lookup(store: ConfiguredStore, access: RunAccessDep) -> RunLookup:
    return RunLookup(store, access)


ApiRuns = Annotated[RunLookup, Depends(run_lookup)]


def unreadable_manifest(exc: Exception) -> HTTPException:
    """The JSON API's answer when a run's manifest cannot be read."""
    return HTTPException(422, detail=f"Unreadable manifest: {exc}")
