"""Which output location the pages read, and the one manifest store kept for it.

The location comes from ``create_app(output_uri=...)``, else the ``OLMOCR_OUTPUT_URI`` environment
variable, else the Airflow Variable ``olmocr_output_uri`` (looked up per request, so changing it
needs no restart).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable

from olmocr_tasks.public import Storage

from .store import ManifestStore

log = logging.getLogger(__name__)

ENV_VAR = "OLMOCR_OUTPUT_URI"
AIRFLOW_VARIABLE = "olmocr_output_uri"
# A Variable lookup is a database query; the list page may be reloaded often.
_VARIABLE_TTL_S = 30.0


def not_configured_message() -> str:
    return (
        f"No output location is configured. Set the environment variable {ENV_VAR} or the Airflow "
        f"Variable {AIRFLOW_VARIABLE} to the conversion output URI (a folder or s3://bucket/prefix)."
    )


def _airflow_variable() -> str | None:
    """The Airflow Variable, when running inside Airflow; None anywhere else or on any error."""
    try:
        # In the api-server the Task SDK reads Variables from the metadata database; elsewhere it
        # falls back to AIRFLOW_VAR_* environment variables and configured secrets backends.
        from airflow.sdk import Variable
    except Exception:
        return None
    try:
        value = Variable.get(AIRFLOW_VARIABLE, default=None)
    except Exception as exc:  # e.g. no reachable metadata database: treat as not configured
        log.debug("Airflow Variable %s unavailable: %s", AIRFLOW_VARIABLE, exc)
        return None
    return str(value) if value else None


class ConfiguredLocation:
    """Resolves the output URI and keeps one store (with its summary cache) per URI."""

    def __init__(self, explicit: str | None, storage_for: Callable[[str], Storage] | None = None) -> None:
        self._explicit = explicit
        self._storage_for = storage_for
        self._lock = threading.Lock()
        self._variable: tuple[float, str | None] = (-math.inf, None)
        self._store: ManifestStore | None = None

    def uri(self) -> str | None:
        if self._explicit:
            return self._explicit
        if os.environ.get(ENV_VAR):
            return os.environ[ENV_VAR]
        checked_at, value = self._variable
        if time.monotonic() - checked_at > _VARIABLE_TTL_S:
            value = _airflow_variable()
            self._variable = (time.monotonic(), value)
        return value

    def store(self) -> ManifestStore | None:
        uri = self.uri()
        if not uri:
            return None
        with self._lock:
            if self._store is None or self._store.output_uri != uri:
                storage = self._storage_for(uri) if self._storage_for is not None else None
                self._store = ManifestStore(uri, storage)
            return self._store
