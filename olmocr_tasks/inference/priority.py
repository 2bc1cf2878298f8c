"""Priority classes of runs, and how a class reaches vLLM's scheduler and Airflow's pool.

Scheduled ingestion, event-triggered runs, REST ``documents`` runs and large backfills share one vLLM
deployment. Without classes, a backfill of thousands of pages fills the server's queue and a fresh
event-triggered document waits behind all of it. Each run therefore gets a class:

* ``high``: runs that name their documents (S3 events, a REST or manual run with ``documents``),
  someone is waiting for them;
* ``normal``: scheduled runs and runs over one interval;
* ``low``: backfills and discovery runs over everything (manual ``scope=all``, or ``auto`` outside a
  scheduled or backfill run).

A run's Param ``priority_class`` overrides the choice. The class is carried:

* to vLLM, as the request field ``priority`` (lower is served first from its waiting queue), only when
  the connection says the deployment runs ``--scheduling-policy priority`` (extra
  ``scheduling_policy``): under its default ``fcfs`` vLLM (0.32, ``tests/vllm``'s contract) accepts the
  field and ignores it, so with ``fcfs`` it is never sent and request bodies stay byte-identical to olmOCR's;
* to Airflow, as the convert instances' ``priority_weight`` and pool (``provider.policy``);
* to the host: a low-priority run's convert instances run niced (``RENDER_NICE``), in Airflow only
  once another conversion run is active (``provider.competition``: the whole task process and its
  render workers); alone it runs like any other, and its plan cuts it like any other run.

Pure: no Airflow, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from olmocr_tasks.core.errors import ConfigurationError

HIGH, NORMAL, LOW = "high", "normal", "low"
CLASSES = (HIGH, NORMAL, LOW)
# The ``priority_class`` a run gets unless it names one: decided by ``run_class`` from how it was started.
AUTO = "auto"
# vLLM's value per class: lower is scheduled first; 0 is what a request without the field gets, so
# other clients of a shared deployment rank with scheduled runs.
VLLM_PRIORITY = {HIGH: -10, NORMAL: 0, LOW: 10}
# Airflow's priority_weight per class: higher is queued first for a pool slot.
AIRFLOW_WEIGHT = {HIGH: 100, NORMAL: 10, LOW: 1}
# Added to the niceness of a run's render workers: a low-priority run renders with what CPU is left
# when the host (an Airflow worker, often also running the components) has other work. Rendering is
# most of a conversion's CPU; OLMOCR_LOW_PRIORITY_NICE overrides the low value (0 switches it off).
RENDER_NICE = {HIGH: 0, NORMAL: 0, LOW: 10}
SCHEDULING_POLICIES = ("fcfs", "priority")


def run_class(run_type: str, params: Mapping[str, Any], *, names_documents: bool = False) -> str:
    """The class of a run of ``run_type`` (Airflow's: scheduled, backfill, manual, asset_triggered)
    with these Params (``priority_class``, ``documents``, ``scope``)."""
    chosen = params.get("priority_class") or AUTO
    if chosen != AUTO:
        return check_class(chosen)
    if names_documents or run_type == "asset_triggered" or params.get("documents"):
        return HIGH
    if run_type == "backfill":
        return LOW
    if run_type == "scheduled":
        return NORMAL
    # Manual and REST runs without documents: an interval is a bounded job, the rest is everything.
    return NORMAL if params.get("scope") == "interval" else LOW


def check_class(value: Any) -> str:
    if value not in CLASSES:
        raise ConfigurationError(f"priority class must be one of {', '.join(CLASSES)} or {AUTO}, not {value!r}")
    return str(value)


def check_scheduling_policy(value: Any) -> str:
    text = str(value).strip().lower()
    if text not in SCHEDULING_POLICIES:
        raise ConfigurationError(
            f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)} (vLLM's --scheduling-policy), "
            f"not {value!r}"
        )
    return text


def with_priority(body: bytes, priority: int) -> bytes:
    """A JSON object body with ``"priority": N`` as its last key, as ``json.dumps`` would write it."""
    stripped = body.rstrip()
    if not stripped.endswith(b"}"):
        raise ValueError("a request body must be a JSON object")
    inner = stripped[:-1].rstrip()
    separator = b"" if inner.endswith(b"{") else b", "
    return inner + separator + b'"priority": ' + str(int(priority)).encode() + b"}"
