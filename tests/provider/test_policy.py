"""The cluster policy's look at the reserved high-priority pool, against a real Airflow metadata DB.

``provider.policy`` routes a high-priority convert instance to ``olmocr_vllm_high`` only while that pool
exists with slots, read through the session the scheduler's ``dag_run`` is attached to; the placement
rules themselves are tested in ``tests/inference/test_priority.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, delete, insert
from sqlalchemy.orm import Session

from olmocr_tasks.provider import policy
from olmocr_testkit.airflow_env import AirflowEnv

POOL, RESERVED = "olmocr_vllm", "olmocr_vllm_high"


@pytest.fixture
def session(airflow_home: AirflowEnv) -> Iterator[Session]:
    """A session on the tests' migrated SQLite metadata DB; everything it did is rolled back."""
    engine = create_engine(f"sqlite:///{airflow_home.home / 'airflow.db'}")
    with Session(engine) as opened:
        yield opened
        opened.rollback()
    engine.dispose()


def _set_pool(session: Session, slots: int | None, name: str = RESERVED) -> None:
    """Create, change or (None) drop a pool's row, as an admin would, in this transaction.

    Without flushing the pending run: what the scheduler is creating stays pending throughout."""
    from airflow.models.pool import Pool

    with session.no_autoflush:
        session.execute(delete(Pool).where(Pool.pool == name))
        if slots is not None:
            session.execute(insert(Pool).values(pool=name, slots=slots, description=name, include_deferred=False))


def _pending_run(session: Session) -> object:
    from airflow.models.dagrun import DagRun
    from airflow.utils.types import DagRunType

    run = DagRun(dag_id="olmocr_ingest", run_id="manual__policy", run_type=DagRunType.MANUAL, conf={})
    session.add(run)
    return run


def test_reserved_pool_is_read_through_the_runs_session_and_rechecked_after_the_interval(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(policy, "_pool_checks", {})
    clock = [1000.0]
    run = _pending_run(session)

    def slots() -> float:
        return policy.SessionPools(run, now=lambda: clock[0]).reserved_slots(RESERVED)

    assert slots() == 0  # no such pool: no reserve
    _set_pool(session, 2)
    assert slots() == 0  # what was read holds for the interval...
    clock[0] += policy.POOL_CHECK_INTERVAL_S
    assert slots() == 2  # ...then the pool is read again
    for value, expected in ((0, 0), (-1, math.inf), (None, 0)):  # 0: no reserve; -1 is Airflow's unlimited
        _set_pool(session, value)
        clock[0] += policy.POOL_CHECK_INTERVAL_S
        assert slots() == expected, value
    assert run in session.new  # the scheduler's pending rows were never flushed by the reads


def test_the_hook_uses_the_reserve_only_while_the_convert_pool_is_full(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    monkeypatch.setattr(policy, "_pool_checks", {})
    monkeypatch.delenv("OLMOCR_HIGH_PRIORITY_POOL", raising=False)
    _set_pool(session, 1)
    run = _pending_run(session)
    run.conf = {"documents": ["s3://in/a.pdf"]}

    def placed() -> str:
        ti = SimpleNamespace(dag_id="olmocr_ingest", task_id="convert", pool=POOL, priority_weight=1, map_index=0)
        policy.task_instance_mutation_hook(ti, run)
        return str(ti.pool)

    _set_pool(session, 2, name=POOL)
    assert placed() == POOL  # the convert pool has free slots (nothing runs): take one
    _hold_slot(session, "running")
    assert placed() == POOL  # one of its two slots is still free
    _hold_slot(session, "queued")  # Airflow counts queued instances against a pool's slots too
    assert placed() == RESERVED
    assert run in session.new


def _hold_slot(session: Session, state: str) -> None:
    """Another run's convert instance holding one slot of the convert pool, as the scheduler records it."""
    from airflow.models.taskinstance import TaskInstance

    with session.no_autoflush:
        session.execute(
            insert(TaskInstance).values(
                dag_id="olmocr_ingest", task_id="convert", run_id=f"other__{state}", map_index=0,
                pool=POOL, pool_slots=1, state=state,
            )
        )  # fmt: skip
