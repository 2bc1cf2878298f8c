"""The deployment's ``OLMOCR_*`` environment variables: the one module that reads them.

Every other module receives their values from a function here, which reads its variable when called (a
task reads it when it runs; the pool and the retry delay when a DAG file is parsed, since they are
arguments of the task definitions) and raises ``ConfigurationError`` for a value that makes no sense.
Where a layer above owns a setting's default (batching, render niceness, instance costs, retention) the
caller passes it in as ``default``: it is stated once, by its owner, never restated here.

What a conversion run reads here (the claim expiry, the document limits, its batching and render
niceness, whether it may raise its priority) is read once, by the Airflow ``plan`` task, and kept with
the plan (``olmocr_tasks.run.planned``): its later tasks work from that. What every task reads for
itself is the workers' own: the allow-lists, the pools, the conversion DAGs of the competition watch,
the bounds of what it reads back. No Airflow import: the cluster policy reads the pools here, inside the
scheduler.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from datetime import timedelta

from olmocr_tasks.core.config import COLD_START_TIMEOUT_S, DocumentLimits, positive_number
from olmocr_tasks.core.errors import ConfigurationError

# The pool that bounds how many convert tasks hit one vLLM deployment at once, across runs and DAGs.
DEFAULT_POOL = "olmocr_vllm"
# The first wait before a convert retry: about how long a vLLM deployment takes to come back.
DEFAULT_CONVERT_RETRY_DELAY = timedelta(minutes=1)

INPUT_URI = "OLMOCR_INPUT_URI"
OUTPUT_URI = "OLMOCR_OUTPUT_URI"
ALLOWED_INPUTS = "OLMOCR_ALLOWED_INPUTS"
ALLOWED_OUTPUTS = "OLMOCR_ALLOWED_OUTPUTS"
ALLOW_HIGH_PRIORITY = "OLMOCR_ALLOW_HIGH_PRIORITY"
SERVER_READY_TIMEOUT = "OLMOCR_SERVER_READY_TIMEOUT"
MAX_RECORD_BYTES = "OLMOCR_MAX_RECORD_BYTES"
# The manifest reader's bounds (``location.manifest_reader.ReadLimits``), by field.
MANIFEST_READ_LIMITS = {
    "summary_bytes": "OLMOCR_MAX_SUMMARY_BYTES",
    "shard_bytes": "OLMOCR_MAX_SHARD_BYTES",
    "line_bytes": "OLMOCR_MAX_ENTRY_BYTES",
}


# ------------------------------------------------------------------------------ locations


def input_uri() -> str | None:
    """``OLMOCR_INPUT_URI``: the deployment's input, the trigger forms' default (None: unset)."""
    return os.environ.get(INPUT_URI) or None


def output_uri() -> str | None:
    """``OLMOCR_OUTPUT_URI``: the deployment's output, the trigger forms' default (None: unset)."""
    return os.environ.get(OUTPUT_URI) or None


def allowed_locations(environ: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """The workers' allow-lists as written, inputs then outputs (``storage.access``): ``OLMOCR_ALLOWED_INPUTS``
    and ``OLMOCR_ALLOWED_OUTPUTS``, each defaulting to the configured location (``OLMOCR_INPUT_URI``,
    ``OLMOCR_OUTPUT_URI``); None: neither is set. ``environ`` replaces the process's environment."""
    env = os.environ if environ is None else environ
    inputs = env.get(ALLOWED_INPUTS) or env.get(INPUT_URI) or None
    return inputs, env.get(ALLOWED_OUTPUTS) or env.get(OUTPUT_URI) or None


# ---------------------------------------------------------------------------- the tasks


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


def server_ready_timeout_s() -> float:
    """``OLMOCR_SERVER_READY_TIMEOUT``: seconds ``check_server`` waits, deferred in the triggerer, for vLLM
    to serve the model (default ``COLD_START_TIMEOUT_S``, a cold vLLM start)."""
    raw = os.environ.get(SERVER_READY_TIMEOUT) or COLD_START_TIMEOUT_S
    return float(positive_number(SERVER_READY_TIMEOUT, raw, float, unit="a number of seconds"))


def conversion_dags() -> list[str]:
    """``OLMOCR_CONVERSION_DAGS`` (comma-separated): a deployment's own conversion DAGs, which a
    low-priority instance's competition watch counts beside the packaged ones (``provider.competition``)."""
    return [name.strip() for name in os.environ.get("OLMOCR_CONVERSION_DAGS", "").split(",") if name.strip()]


def policy_dags(default: tuple[str, ...]) -> frozenset[str]:
    """``OLMOCR_POLICY_DAGS`` (comma-separated): the DAG ids whose convert instances the cluster policy
    places (``provider.policy``); ``default`` when unset."""
    value = os.environ.get("OLMOCR_POLICY_DAGS")
    names = value.split(",") if value else default
    return frozenset(name.strip() for name in names if name.strip())


def retention_days(default: float) -> float:
    """``OLMOCR_RETENTION_DAYS``: the maintenance DAG's default age of what it removes."""
    return float(os.environ.get("OLMOCR_RETENTION_DAYS") or default)


def lookback_intervals(default: float) -> float:
    """``OLMOCR_LOOKBACK_INTERVALS``: how many intervals early a scheduled run's window opens (the
    trigger form's default)."""
    return float(os.environ.get("OLMOCR_LOOKBACK_INTERVALS") or default)


# ------------------------------------------------------------------ what a run is planned with


def claim_expiry_s() -> float | None:
    """``OLMOCR_CLAIM_EXPIRY`` (seconds a document claim lasts without renewal); None: derived."""
    value = os.environ.get("OLMOCR_CLAIM_EXPIRY")
    if not value:
        return None
    return float(positive_number("OLMOCR_CLAIM_EXPIRY", value, unit="a number of seconds"))


def batch_pages() -> int:
    """``OLMOCR_BATCH_PAGES``: pages per convert instance; 0 (unset): the request window of one task."""
    return _env_int("OLMOCR_BATCH_PAGES", 0)


def instance_overhead(default: float) -> float:
    """``OLMOCR_INSTANCE_OVERHEAD``: the most of a convert slot's time an instance's fixed cost may take
    (between 0 and 1); sizes instances from the last measured run's costs."""
    raw = os.environ.get("OLMOCR_INSTANCE_OVERHEAD")
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:
        raise ConfigurationError(f"OLMOCR_INSTANCE_OVERHEAD must be a fraction between 0 and 1, not {raw!r}")
    return value


def convert_slots(default: int) -> int:
    """``OLMOCR_CONVERT_SLOTS``: convert instances that run at once (the pool's slots)."""
    return _env_int("OLMOCR_CONVERT_SLOTS", default)


def bytes_per_page(default: int) -> int:
    """``OLMOCR_BYTES_PER_PAGE``: the page estimate from listed file sizes."""
    return _env_int("OLMOCR_BYTES_PER_PAGE", default)


def low_class_waves(default: int) -> int:
    """``OLMOCR_LOW_CLASS_WAVES``: the fewest waves a low-priority run is cut into."""
    return _env_int("OLMOCR_LOW_CLASS_WAVES", default)


def low_priority_nice(default: int) -> int:
    """``OLMOCR_LOW_PRIORITY_NICE``: niceness added to a low-priority run's render workers (0..19)."""
    value = _env_int("OLMOCR_LOW_PRIORITY_NICE", default)
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


def allow_high_priority() -> bool:
    """``OLMOCR_ALLOW_HIGH_PRIORITY``: whether whoever triggers a run may ask for more than a run's share
    of the vLLM deployment: ``priority_class`` high, or ``max_concurrent_requests`` above the vLLM
    connection's (default false: such a run fails at plan, saying so)."""
    raw = os.environ.get(ALLOW_HIGH_PRIORITY, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ConfigurationError(f"{ALLOW_HIGH_PRIORITY} must be true or false, not {raw!r}")


# ----------------------------------------------------------------------- reading state back


def max_record_bytes(default: int) -> int:
    """``OLMOCR_MAX_RECORD_BYTES``: the most bytes a state record read back may hold (``location.records``)."""
    value = os.environ.get(MAX_RECORD_BYTES)
    if not value:
        return default
    return int(positive_number(MAX_RECORD_BYTES, value, int, unit="a number of bytes"))


def manifest_read_limits() -> dict[str, int]:
    """The manifest reader's bounds that are set, by ``ReadLimits`` field (bytes; ``ConfigurationError``
    if not a positive whole number): ``OLMOCR_MAX_SUMMARY_BYTES``, ``OLMOCR_MAX_SHARD_BYTES``
    (compressed and decompressed), ``OLMOCR_MAX_ENTRY_BYTES`` (one entry's line)."""
    return {
        field: positive_number(name, os.environ[name], int, unit="a number of bytes")
        for field, name in MANIFEST_READ_LIMITS.items()
        if os.environ.get(name)
    }


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be a whole number, not {raw!r}") from None
