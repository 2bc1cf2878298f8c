"""Who may read which run: each route asks a ``RunAccess`` before it lists, shows or serves a run.

A run belongs to the DAG that made it (its manifest's ``airflow_run.dag_id``); a run with none (the
command line, or a manifest whose DAG cannot be read) belongs to no DAG. The app itself knows no
users: whoever builds it says who may read what (``access``), and an app built without saying refuses
every run. Inside Airflow the plugin passes
``create_app(access=...)`` a FastAPI dependency that answers from the configured auth manager
(``olmocr_runs_plugin``), so the pages show a user exactly the runs of the DAGs Airflow lets them read.
"""

from __future__ import annotations

from typing import Annotated, Any, Protocol

from fastapi import Depends, HTTPException

from .runs import trigger_of
from .store import Listing


class RunAccess(Protocol):
    """The signed-in user's access to runs, asked once per DAG and request."""

    def may_read(self, dag_id: str | None) -> bool:
        """Whether the user may see runs of ``dag_id`` (None: a run of no DAG, such as a CLI run)."""
        ...


class Unrestricted:
    """Every run: for an app whose every user may read everything (tests, a single-user tool)."""

    def may_read(self, dag_id: str | None) -> bool:
        return True


def every_run() -> RunAccess:
    """``create_app(access=every_run)``: every user sees every run. Must be asked for by name."""
    return Unrestricted()


def run_access() -> RunAccess:
    """The routes' dependency, overridden by ``create_app(access=...)``; never reached unless an app was
    built without saying who may read what, and then it refuses (security fails closed)."""
    raise HTTPException(403, detail="This app was built without an access rule: no run is readable")


RunAccessDep = Annotated[RunAccess, Depends(run_access)]


def dag_of(summary: dict[str, Any] | None) -> str | None:
    """The DAG a run belongs to, from its summary; None for a CLI run or a summary that names none."""
    if summary is None:
        return None
    return trigger_of(summary).dag_id or None


def forbidden() -> HTTPException:
    """What a user gets for a run of a DAG they may not read."""
    return HTTPException(403, detail="You are not allowed to read the runs of this DAG")


def readable(listing: Listing, access: RunAccess) -> Listing:
    """The runs of ``listing`` the user may see. The notes about manifests that could not be read name
    no DAG, so they are shown only to those who may see runs of no DAG."""
    runs = [run for run in listing.runs if access.may_read(run.dag_id or None)]
    notes = listing.notes if access.may_read(None) else []
    return Listing(runs=runs, notes=notes, error=listing.error, files={run.key: listing.files[run.key] for run in runs})
