"""Airflow cluster policy: convert instances of high-priority runs go first for a pool slot.

A mapped task has one static ``priority_weight`` and one pool for every run, so the class of a run
(``olmocr_tasks.inference.priority``) can only reach the scheduler through a cluster policy, which sees each task
instance with its DAG run as the scheduler creates it. For the convert instances of a run this sets:

* ``priority_weight`` by class (high 100, normal 10, low 1): when a slot of the ``olmocr_vllm`` pool
  frees, the scheduler queues the highest weight first, so a one-page REST or event run does not wait
  behind the hundreds of queued instances of a backfill, only for the first slot to free;
* for high-priority runs, when ``OLMOCR_HIGH_PRIORITY_POOL`` names a pool: that pool instead, a share
  of the server reserved for them, so they do not even wait for a low-priority instance to finish.

It is registered with Airflow through the ``airflow.policy`` entry point of this package (pluggy: every
Airflow component loads it when the package is installed, no settings file to copy). A deployment that
cannot use entry points (the package on ``PYTHONPATH`` only) enables it in ``airflow_local_settings.py``
(on ``$AIRFLOW_HOME/config``, or the plugins folder as ``plugins/airflow_local_settings.py`` does)::

    from olmocr_tasks.provider.policy import task_instance_mutation_hook  # noqa: F401

Both at once is harmless: the hook sets the same values twice. Without either every run has convert's
static weight and pool (the behaviour before classes). It touches only the ``convert`` task of the
conversion DAGs (``OLMOCR_POLICY_DAGS``, default ``olmocr_ingest,olmocr_s3_events``: another DAG's task
named ``convert`` is someone else's), and only while its pool is ours. The hook runs inside the
scheduler's transaction: it reads only the ``dag_run`` it is given, never the database.
"""

from __future__ import annotations

import os
from typing import Any

from airflow.policies import hookimpl

from olmocr_tasks.core.errors import ConfigurationError
from olmocr_tasks.inference.priority import AIRFLOW_WEIGHT, HIGH, run_class

CONVERT_TASK_ID = "convert"
# The DAGs built by provider.flow.conversion_flow in this repository's dags/.
DEFAULT_POLICY_DAGS = ("olmocr_ingest", "olmocr_s3_events")


def convert_placement(ti: Any, dag_run: Any) -> tuple[int, str] | None:
    """The ``(priority_weight, pool)`` a convert instance of ``dag_run`` gets, or None to leave it."""
    if dag_run is None or ti.task_id != CONVERT_TASK_ID or ti.pool not in (_pool(), _high_priority_pool()):
        return None
    if getattr(ti, "dag_id", None) not in policy_dags():
        return None
    try:
        priority_class = run_class(str(getattr(dag_run.run_type, "value", dag_run.run_type)), dag_run.conf or {})
    except ConfigurationError:
        return None  # plan fails such a run with the message; the scheduler must not
    pool = _pool()
    if priority_class == HIGH and _high_priority_pool():
        pool = _high_priority_pool()
    return AIRFLOW_WEIGHT[priority_class], pool


@hookimpl
def task_instance_mutation_hook(task_instance: Any, dag_run: Any = None) -> None:
    """Airflow's cluster policy hook: place convert instances by their run's priority class."""
    placement = convert_placement(task_instance, dag_run)
    if placement is None:
        return
    task_instance.priority_weight, task_instance.pool = placement


def policy_dags() -> frozenset[str]:
    """The DAG ids whose ``convert`` instances the policy places (``OLMOCR_POLICY_DAGS``, comma-separated).

    An environment setting rather than a DAG attribute: the scheduler sees a serialized DAG, and a DAG
    of one's own built with ``conversion_flow`` is added here by name."""
    value = os.environ.get("OLMOCR_POLICY_DAGS")
    names = value.split(",") if value else DEFAULT_POLICY_DAGS
    return frozenset(name.strip() for name in names if name.strip())


def _pool() -> str:
    # The convert tasks' own setting, imported when first needed: every Airflow component loads this
    # policy, and only the scheduler's hook calls need the engine modules behind the setting.
    from olmocr_tasks.provider.environment import convert_pool

    return convert_pool()


def _high_priority_pool() -> str | None:
    return os.environ.get("OLMOCR_HIGH_PRIORITY_POOL") or None
