"""Whether a low-priority convert instance has company: other conversion runs active in Airflow.

A low-priority run (a backfill, ``scope=all``) should give way when other runs need the host and run
like any other when it is alone: niceness costs a run that has the machine to itself its share against
Airflow's own components on a small worker host. So a low-priority convert instance starts at normal
priority, and ``CompetitionWatch`` asks Airflow every few seconds (through the Task SDK, like any task's
read of run state: no database access from the task) whether another run of a conversion DAG is queued
or running (every 2 s); the first time one is, the whole task process and its render workers are niced
(``core.niceness``) for the rest of the attempt. Niceness cannot be given back without privilege, and
an instance is short enough that it need not be: the next instance starts at normal priority again.

Which DAGs convert: this task's own, ``olmocr_ingest`` and ``olmocr_s3_events``, and any DAG id listed
in ``OLMOCR_CONVERSION_DAGS`` (comma-separated; a deployment's own DAGs built with ``conversion_flow``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from olmocr_tasks.core import environment

log = logging.getLogger(__name__)

# The packaged conversion DAGs (dags/); a deployment's own are named by OLMOCR_CONVERSION_DAGS.
PACKAGED_CONVERSION_DAGS = ("olmocr_ingest", "olmocr_s3_events")
# Seconds between two questions to Airflow: one query per conversion DAG, answered from indexed rows.
# An urgent one-page run lasts seconds, so the backfill beside it has to notice within a few.
DEFAULT_POLL_S = 2.0
ACTIVE_RUN_STATES = ["queued", "running"]


def conversion_dags(own_dag_id: str) -> list[str]:
    return list(dict.fromkeys([own_dag_id, *PACKAGED_CONVERSION_DAGS, *environment.conversion_dags()]))


def other_active_runs(context: Mapping[str, Any]) -> int:
    """Runs of the conversion DAGs, other than this task's own, that are queued or running now."""
    ti = context["ti"]
    total = sum(ti.get_dr_count(dag_id=dag_id, states=ACTIVE_RUN_STATES) for dag_id in conversion_dags(ti.dag_id))
    # This task's own run is running: it is not company.
    return max(total - 1, 0)


def polls_from_a_thread_are_safe() -> bool:
    """Whether this task's channel to Airflow may be used from a second thread: the supervisor's socket
    channel serialises its callers; ``airflow dags test``'s in-process channel swaps a global while it
    answers and shares one response queue, so there the watch asks once, on the calling thread."""
    from airflow.sdk.execution_time import task_runner
    from airflow.sdk.execution_time.comms import CommsDecoder

    return isinstance(getattr(task_runner, "SUPERVISOR_COMMS", None), CommsDecoder)


class CompetitionWatch:
    """Calls ``others()`` at ``start()`` on the calling thread, then (``repeat``) every ``poll_s``
    seconds on a daemon thread, and ``give_way()`` once, the first time it answers more than zero;
    ``stop()`` ends it. A failing question is logged and asked again at the next poll: not knowing
    whether others wait never fails a conversion."""

    def __init__(
        self,
        others: Callable[[], int],
        give_way: Callable[[], None],
        *,
        poll_s: float = DEFAULT_POLL_S,
        repeat: bool = True,
    ) -> None:
        self._others = others
        self._give_way = give_way
        self._poll_s = poll_s
        self._repeat = repeat
        self._stopped = threading.Event()
        self.gave_way = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="olmocr-competition-watch", daemon=True)

    def start(self) -> CompetitionWatch:
        if not self._poll() and self._repeat:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    def __enter__(self) -> CompetitionWatch:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _poll(self) -> bool:
        """Ask once; give way and return True when others are active."""
        try:
            others = self._others()
        except Exception as exc:  # any failure to ask is only a missed poll
            log.warning("could not ask Airflow for other active runs: %s", exc)
            return False
        if others <= 0:
            return False
        log.info("%d other conversion run(s) active: this low-priority instance gives way", others)
        self._give_way()
        self.gave_way.set()
        return True

    def _watch(self) -> None:
        while not self._stopped.wait(self._poll_s):
            if self._poll():
                return
