"""``CheckVllmServerOperator``: is vLLM up and serving the model? Waits in the triggerer, not a worker slot.

A TaskFlow task cannot defer, so the readiness check is an operator. ``execute`` probes every replica
once: ready returns the served models (the task's XCom, which ``plan`` checks the model against), a
server that answers wrongly (API key, URL, model, TLS trust) fails the task at once, and a server that
is not up yet defers to ``VllmReadyTrigger`` until it is, or until the deadline:
``OLMOCR_SERVER_READY_TIMEOUT`` seconds (read when the task runs; default ``COLD_START_TIMEOUT_S``, 1800,
a cold vLLM start).
At the deadline the task raises ``ServerNotReady``, which its retry policy retries.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from olmocr_tasks.core import environment
from olmocr_tasks.core.config import positive_number
from olmocr_tasks.core.errors import ConfigurationError
from olmocr_tasks.provider import DEFAULT_CONN_ID
from olmocr_tasks.provider.hooks import VllmHook
from olmocr_tasks.provider.retries import INFRASTRUCTURE_RETRIES
from olmocr_tasks.provider.triggers import (
    DEFAULT_POLL_INTERVAL_S,
    VllmReadyTrigger,
    models_from_event,
    probe_once,
    readiness_payload,
)


def ready_timeout_s(value: float | None = None) -> float:
    """The deferral's deadline in seconds: ``value``, else ``OLMOCR_SERVER_READY_TIMEOUT``, else a cold start's."""
    if value is None:
        return environment.server_ready_timeout_s()
    return float(positive_number("ready_timeout_s", value, float, unit="a number of seconds"))


class CheckVllmServerOperator(BaseOperator):
    """Returns the models the ``conn_id`` server lists once every replica serves the configured one."""

    ui_color = "#e8f4fd"

    def __init__(
        self,
        *,
        conn_id: str = DEFAULT_CONN_ID,
        ready_timeout_s: float | None = None,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        **kwargs: Any,
    ) -> None:
        # A deadline that passes is retried once more (a slow first download); anything else fails.
        kwargs.setdefault("retries", 1)
        kwargs.setdefault("retry_delay", timedelta(seconds=30))
        kwargs.setdefault("retry_policy", INFRASTRUCTURE_RETRIES)
        super().__init__(**kwargs)
        self.conn_id = conn_id
        self.ready_timeout_s = ready_timeout_s
        self.poll_interval_s = poll_interval_s

    def execute(self, context: Mapping[str, Any]) -> list[str]:
        try:
            settings = VllmHook(self.conn_id).server_settings()
            timeout_s = ready_timeout_s(self.ready_timeout_s)
        except ConfigurationError as exc:
            raise AirflowFailException(f"connection {self.conn_id!r}: {exc}") from None
        payload = readiness_payload(asyncio.run(probe_once(settings)), final=False)
        if payload is not None:
            return self._served(models_from_event(payload, self.conn_id))
        self.log.info("vLLM is not up yet: waiting in the triggerer for up to %.0f s", timeout_s)
        self.defer(
            trigger=VllmReadyTrigger(self.conn_id, timeout_s=timeout_s, poll_interval_s=self.poll_interval_s),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Mapping[str, Any], event: dict[str, Any]) -> list[str]:
        return self._served(models_from_event(event, self.conn_id))

    def _served(self, models: list[str]) -> list[str]:
        self.log.info("vLLM (connection %r) serves %s", self.conn_id, ", ".join(models))
        return models
