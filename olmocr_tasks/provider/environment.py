"""The deployment's ``OLMOCR_*`` settings the conversion tasks read from the environment, with their defaults.

Each function reads its variable when called (a task reads it when it runs; ``convert_pool`` and
``convert_retry_delay`` when the DAG file is parsed, since they are arguments of the task
definitions) and raises ``ConfigurationError`` for a value that makes no sense. Where the engine owns
a default (batching, render niceness) it is read from the engine, not restated. No Airflow import: the
cluster policy (``provider.policy``) reads the pool here, inside the scheduler.

The trigger form's defaults (``OLMOCR_INPUT_URI``, ``OLMOCR_OUTPUT_URI``, ``OLMOCR_LOOKBACK_INTERVALS``)
are ``provider.params``'; ``OLMOCR_SERVER_READY_TIMEOUT`` is ``provider.operators``'.
"""

from __future__ import annotations

import math
import os
from datetime import timedelta

from olmocr_tasks.core.config import DocumentLimits, positive_number
from olmocr_tasks.core.errors import ConfigurationError
from olmocr_tasks.inference.priority import LOW, RENDER_NICE
from olmocr_tasks.run.batching import DEFAULT_BYTES_PER_PAGE, DEFAULT_PARALLEL, LOW_CLASS_MIN_WAVES
from olmocr_tasks.run.instance_costs import DEFAULT_OVERHEAD_FRACTION

# The pool that bounds how many convert tasks hit one vLLM deployment at once, across runs and DAGs.
DEFAULT_POOL = "olmocr_vllm"
# The first wait before a convert retry: about how long a vLLM deployment takes to come back.
DEFAULT_CONVERT_RETRY_DELAY = timedelta(minutes=1)


def convert_pool() -> str:
    """``OLMOCR_POOL``: the Airflow pool convert instances run in (default ``olmocr_vllm``)."""
    return os.environ.get("OLMOCR_POOL", DEFAULT_POOL)


def high_priority_pool() -> str:
    """``OLMOCR_HIGH_PRIORITY_POOL``: the pool reserved for high-priority convert instances (default: the
    convert pool's name with ``_high``, ``olmocr_vllm_high``). The cluster policy uses it only while it
    exists with slots and the convert pool has none free (``provider.policy``)."""
    return os.environ.get("OLMOCR_HIGH_PRIORITY_POOL") or f"{convert_pool()}_high"


def convert_retry_delay() -> timedelta:
    """The first wait before Airflow retries a convert instance (``OLMOCR_CONVERT_RETRY_DELAY``, seconds).

    Convert is retried for infrastructure reasons only (a server outage, a lost worker), so the right
    first wait is about how long the deployment's vLLM takes to come back: a pod that reloads the
    model takes minutes, a shared server behind a load balancer seconds. It doubles per retry.
    """
    value = os.environ.get("OLMOCR_CONVERT_RETRY_DELAY")
    if not value:
        return DEFAULT_CONVERT_RETRY_DELAY
    return timedelta(seconds=positive_number("OLMOCR_CONVERT_RETRY_DELAY", value, unit="a number of seconds"))


def claim_expiry_s() -> float | None:
    """``OLMOCR_CLAIM_EXPIRY`` (seconds a document claim lasts without renewal); None: derived."""
    value = os.environ.get("OLMOCR_CLAIM_EXPIRY")
    if not value:
        return None
    return float(positive_number("OLMOCR_CLAIM_EXPIRY", value, unit="a number of seconds"))


def batch_pages() -> int:
    """``OLMOCR_BATCH_PAGES``: pages per convert instance; 0 (unset): the request window of one task."""
    return _env_int("OLMOCR_BATCH_PAGES", 0)


def instance_overhead() -> float:
    """``OLMOCR_INSTANCE_OVERHEAD``: the most of a convert slot's time an instance's fixed cost may take
    (between 0 and 1, default 0.05); sizes instances from the last measured run's costs."""
    raw = os.environ.get("OLMOCR_INSTANCE_OVERHEAD")
    if not raw:
        return DEFAULT_OVERHEAD_FRACTION
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:
        raise ConfigurationError(f"OLMOCR_INSTANCE_OVERHEAD must be a fraction between 0 and 1, not {raw!r}")
    return value


def convert_slots() -> int:
    """``OLMOCR_CONVERT_SLOTS``: convert instances that run at once (the pool's slots)."""
    return _env_int("OLMOCR_CONVERT_SLOTS", DEFAULT_PARALLEL)


def bytes_per_page() -> int:
    """``OLMOCR_BYTES_PER_PAGE``: the page estimate from listed file sizes."""
    return _env_int("OLMOCR_BYTES_PER_PAGE", DEFAULT_BYTES_PER_PAGE)


def low_class_waves() -> int:
    """``OLMOCR_LOW_CLASS_WAVES``: the fewest waves a low-priority run is cut into."""
    return _env_int("OLMOCR_LOW_CLASS_WAVES", LOW_CLASS_MIN_WAVES)


def low_priority_nice() -> int:
    """``OLMOCR_LOW_PRIORITY_NICE``: niceness added to a low-priority run's render workers (0..19)."""
    value = _env_int("OLMOCR_LOW_PRIORITY_NICE", RENDER_NICE[LOW])
    if not 0 <= value <= 19:
        raise ConfigurationError(f"OLMOCR_LOW_PRIORITY_NICE must be within 0..19, not {value}")
    return value


def document_limits() -> DocumentLimits:
    """``OLMOCR_MAX_DOCUMENT_PAGES`` and ``OLMOCR_RENDER_MEMORY_BYTES``: the page cap (a document over it
    fails ``too_many_pages`` before any rendering) and the address space of one render worker (a page
    that needs more fails its document ``too_large``); the other limits keep their defaults."""
    return DocumentLimits(
        max_pages=positive_number(
            "OLMOCR_MAX_DOCUMENT_PAGES", _env_int("OLMOCR_MAX_DOCUMENT_PAGES", DocumentLimits.max_pages), int
        ),
        render_memory_bytes=positive_number(
            "OLMOCR_RENDER_MEMORY_BYTES",
            _env_int("OLMOCR_RENDER_MEMORY_BYTES", DocumentLimits.render_memory_bytes),
            int,
        ),
    )


ALLOW_HIGH_PRIORITY_ENV = "OLMOCR_ALLOW_HIGH_PRIORITY"


def allow_high_priority() -> bool:
    """``OLMOCR_ALLOW_HIGH_PRIORITY``: whether whoever triggers a run may ask for more than a run's share
    of the vLLM deployment: ``priority_class`` high, or ``max_concurrent_requests`` above the vLLM
    connection's (default false: such a run fails at plan, saying so)."""
    raw = os.environ.get(ALLOW_HIGH_PRIORITY_ENV, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ConfigurationError(f"{ALLOW_HIGH_PRIORITY_ENV} must be true or false, not {raw!r}")


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be a whole number, not {raw!r}") from None
