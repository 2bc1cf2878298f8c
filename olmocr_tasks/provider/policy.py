"""Airflow cluster policy: convert instances of high-priority runs go first for a pool slot.

A mapped task has one static ``priority_weight`` and one pool for every run, so the class of a run
(``olmocr_tasks.inference.priority``) can only reach the scheduler through a cluster policy, which sees each task
instance with its DAG run as the scheduler creates it. For the convert instances of a run this sets:

* ``priority_weight`` by class (high 100, normal 10, low 1): when a slot of the ``olmocr_vllm`` pool
  frees, the scheduler queues the highest weight first, so a one-page REST or event run does not wait
  behind the hundreds of queued instances of a backfill, only for the first slot to free;
* for a high-priority instance created while every slot of the convert pool is held: the pool reserved
  for high-priority runs (``olmocr_vllm_high``, 1 slot in the set-ups of this repository;
  ``OLMOCR_HIGH_PRIORITY_POOL`` renames it) while it exists with slots, so it waits for no low-priority
  instance to end. With a free slot in the convert pool it takes that one and the reserve stays for
  the next; without the reserved pool (not created, or 0 slots) it waits in the convert pool, first in
  its queue.

It is registered with Airflow through the ``airflow.policy`` entry point of this package (pluggy: every
Airflow component loads it when the package is installed, no settings file to copy). A deployment that
cannot use entry points (the package on ``PYTHONPATH`` only) enables it in ``airflow_local_settings.py``
(on ``$AIRFLOW_HOME/config``, or the plugins folder as ``plugins/airflow_local_settings.py`` does)::

    from olmocr_tasks.provider.policy import task_instance_mutation_hook  # noqa: F401

Both at once is harmless: the hook sets the same values twice. Without either every run has convert's
static weight and pool (the behaviour before classes). It touches only the ``convert`` task of the
conversion DAGs (``OLMOCR_POLICY_DAGS``, default ``olmocr_ingest,olmocr_s3_events``: another DAG's task
named ``convert`` is someone else's), and only while its pool is ours. The hook runs inside the
scheduler's transaction: it reads the ``dag_run`` it is given and, for high-priority instances only,
the pools through that run's own session (no second connection, no flush of what the scheduler is
creating): the reserved pool's slots at most once per ``POOL_CHECK_INTERVAL_S`` per process, and the
convert pool's free slots.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, Protocol

from airflow.policies import hookimpl

from olmocr_tasks.core import environment
from olmocr_tasks.core.errors import ConfigurationError
from olmocr_tasks.inference.priority import AIRFLOW_WEIGHT, HIGH, run_class

CONVERT_TASK_ID = "convert"
# The DAGs built by provider.flow.conversion_flow in this repository's dags/.
DEFAULT_POLICY_DAGS = ("olmocr_ingest", "olmocr_s3_events")


class PoolView(Protocol):
    """What the policy asks of the deployment's pools when it places a high-priority instance."""

    def reserved_slots(self, name: str) -> float:
        """Slots of pool ``name`` (0 when it does not exist, infinite for Airflow's unlimited -1)."""

    def has_free_slot(self, name: str) -> bool:
        """Whether pool ``name`` has a slot no running or queued instance holds, now."""


def convert_placement(ti: Any, dag_run: Any, pools: PoolView) -> tuple[int, str] | None:
    """The ``(priority_weight, pool)`` a convert instance of ``dag_run`` gets, or None to leave it.

    A high-priority instance takes a free slot of the shared pool when there is one (the reserve stays
    for the next), else the reserved pool while it exists with slots; otherwise it waits in the shared
    pool, first in its queue. Only a run's first instances, as many as the reserve has slots, go to the
    reserve: a big high-priority run (a burst of uploads) queues the rest first in the shared pool,
    where they take each slot a backfill instance frees, rather than all waiting for the reserve."""
    shared, reserved = _pool(), _high_priority_pool()
    if dag_run is None or ti.task_id != CONVERT_TASK_ID or ti.pool not in (shared, reserved):
        return None
    if getattr(ti, "dag_id", None) not in policy_dags():
        return None
    try:
        priority_class = run_class(str(getattr(dag_run.run_type, "value", dag_run.run_type)), dag_run.conf or {})
    except ConfigurationError:
        return None  # plan fails such a run with the message; the scheduler must not
    pool = shared
    if (
        priority_class == HIGH
        and getattr(ti, "map_index", -1) < pools.reserved_slots(reserved)
        and not pools.has_free_slot(shared)
    ):
        pool = reserved
    return AIRFLOW_WEIGHT[priority_class], pool


@hookimpl
def task_instance_mutation_hook(task_instance: Any, dag_run: Any = None) -> None:
    """Airflow's cluster policy hook: place convert instances by their run's priority class."""
    placement = convert_placement(task_instance, dag_run, SessionPools(dag_run))
    if placement is None:
        return
    task_instance.priority_weight, task_instance.pool = placement


# How long a process trusts what it read of the reserved pool's slots: a pool created or removed
# takes effect within this, and a run expanding into many instances reads the pool row once.
POOL_CHECK_INTERVAL_S = 30.0
_pool_checks: dict[str, tuple[float, float]] = {}


class SessionPools:
    """The pools as the session ``dag_run`` is attached to sees them (the scheduler's own transaction:
    no second connection, and reads never flush the instances it is creating). A run attached to no
    session answers "no reserve": a reserved pool that cannot be seen must never strand an instance."""

    def __init__(self, dag_run: Any, now: Callable[[], float] = time.monotonic) -> None:
        self._dag_run = dag_run
        self._now = now

    def reserved_slots(self, name: str) -> float:
        checked = _pool_checks.get(name)
        if checked is not None and self._now() - checked[0] < POOL_CHECK_INTERVAL_S:
            return checked[1]
        session = self._session()
        if session is None:
            return 0
        with session.no_autoflush:
            pool = _pool_row(session, name)
        slots = 0.0 if pool is None else math.inf if pool.slots == -1 else max(0.0, float(pool.slots))
        _pool_checks[name] = (self._now(), slots)
        return slots

    def has_free_slot(self, name: str) -> bool:
        session = self._session()
        if session is None:
            return False
        with session.no_autoflush:
            pool = _pool_row(session, name)
            return pool is not None and pool.open_slots(session=session) > 0

    def _session(self) -> Any:
        from sqlalchemy.orm import object_session
        from sqlalchemy.orm.exc import UnmappedInstanceError

        try:
            return object_session(self._dag_run)
        except UnmappedInstanceError:
            return None


def _pool_row(session: Any, name: str) -> Any:
    # A failed read is not swallowed: in PostgreSQL it aborts the scheduler's transaction, which the
    # scheduler then rolls back and retries as a whole.
    from airflow.models.pool import Pool
    from sqlalchemy import select

    return session.scalar(select(Pool).where(Pool.pool == name))


def policy_dags() -> frozenset[str]:
    """The DAG ids whose ``convert`` instances the policy places (``OLMOCR_POLICY_DAGS``, comma-separated).

    An environment setting rather than a DAG attribute: the scheduler sees a serialized DAG, and a DAG
    of one's own built with ``conversion_flow`` is added here by name."""
    return environment.policy_dags(DEFAULT_POLICY_DAGS)


def _pool() -> str:
    return environment.convert_pool()


def _high_priority_pool() -> str:
    return environment.high_priority_pool()
