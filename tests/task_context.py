"""The task context Airflow hands the conversion tasks, built by hand: task bodies called in-process.

``context`` holds the parts of Airflow's context the glue in ``olmocr_tasks.provider.tasks`` reads;
``RunTasks`` calls plan, convert and publish of one DAG run in order in this process, as a worker
would, with the run type, data interval and triggering asset events stated explicitly. These are
task-logic tests: the scheduler, backfills and the triggerer really creating such runs are tested in
``tests/deployment/``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from types import SimpleNamespace
from typing import Any

from airflow.sdk import Asset

from olmocr_tasks.provider import params as dag_params
from olmocr_tasks.provider import tasks

LOGICAL_DATE = "2026-03-01T10:00:00+00:00"


def context(
    params: dict[str, Any],
    *,
    run_type: str = "manual",
    interval: tuple[datetime | None, datetime | None] = (None, None),
    dag_id: str = "olmocr_ingest",
    **extra: Any,
) -> dict[str, Any]:
    """The parts of Airflow's task context the glue reads; the run id follows the interval's start."""
    defaults = {p: param.value for p, param in dag_params.ingest_params().items()}
    stamp = interval[0].isoformat() if interval[0] is not None else LOGICAL_DATE
    return {
        "params": {**defaults, **params},
        "dag": SimpleNamespace(dag_id=dag_id),
        "dag_run": SimpleNamespace(dag_id=dag_id, run_id=f"{run_type}__{stamp}", run_type=run_type),
        "data_interval_start": interval[0],
        "data_interval_end": interval[1],
        **extra,
    }


def asset_events(asset_name: str, extras: Sequence[Mapping[str, Any]]) -> dict[Asset, list[SimpleNamespace]]:
    """``triggering_asset_events`` of a run that consumed one event per ``extra`` on ``asset_name``."""
    return {Asset(name=asset_name): [SimpleNamespace(extra=dict(extra)) for extra in extras]}


class Outlets(dict):
    """``outlet_events``: what publish_manifest announced, per alias."""

    def __missing__(self, key: Any) -> SimpleNamespace:
        added: list[tuple[Any, dict[str, Any]]] = []
        self[key] = SimpleNamespace(added=added, add=lambda asset, extra=None: added.append((asset, extra)))
        return self[key]


class RunTasks:
    """The task bodies of one DAG run called in order in this process, as the worker calls them.

    ``event_asset`` plans as the S3-event DAG does: exactly the PDFs its ``triggering_asset_events``
    on that asset name.
    """

    def __init__(
        self,
        params: dict[str, Any],
        run_type: str = "manual",
        interval: tuple[datetime | None, datetime | None] = (None, None),
        *,
        dag_id: str = "olmocr_ingest",
        event_asset: str | None = None,
        events: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        self.params, self.run_type, self.interval = params, run_type, interval
        self.dag_id, self.event_asset = dag_id, event_asset
        self.triggering = asset_events(event_asset, events) if event_asset is not None else {}
        self.xcom: dict[tuple[str, str], Any] = {}
        self.outlets = Outlets()

    def ctx(self, task_id: str, try_number: int = 1, map_index: int = -1) -> dict[str, Any]:
        ctx = context(
            self.params,
            run_type=self.run_type,
            interval=self.interval,
            dag_id=self.dag_id,
            outlet_events=self.outlets,
            triggering_asset_events=self.triggering,
        )
        ctx["ti"] = SimpleNamespace(
            dag_id=self.dag_id,
            run_id=ctx["dag_run"].run_id,
            task_id=task_id,
            map_index=map_index,
            try_number=try_number,
            xcom_push=lambda key, value: self.xcom.__setitem__((task_id, key), value),
            xcom_pull=lambda task_ids, key="return_value": self.xcom.get((task_ids, key)),
        )
        return ctx

    def plan(self) -> list[dict[str, Any]]:
        self.xcom["plan", "return_value"] = tasks.plan_body(self.ctx("plan"), self.event_asset)
        return self.xcom["plan", "return_value"]

    def convert_all(self) -> list[dict[str, Any]]:
        """Every mapped convert instance of the plan, in map-index order."""
        batches = self.xcom["plan", "return_value"]
        return [tasks.convert_body(self.ctx("convert", map_index=index), batch) for index, batch in enumerate(batches)]

    def publish(self) -> dict[str, Any]:
        self.xcom["publish_manifest", "return_value"] = tasks.publish_body(self.ctx("publish_manifest"))
        return self.xcom["publish_manifest", "return_value"]
