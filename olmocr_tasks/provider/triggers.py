"""``VllmReadyTrigger``: wait in the triggerer, not in a worker slot, until vLLM serves the model.

A cold vLLM start (download, load, compile, warm-up) takes up to half an hour. ``check_server`` defers
to this trigger instead of holding a worker slot while it retries: the trigger polls every replica's
``/v1/models`` with the same probe the client uses (``olmocr_tasks.inference.readiness``) until each lists the
configured model, or until an absolute deadline (kept across triggerer restarts). A server that
answers wrongly (API key, URL, model, TLS trust) fails at once: waiting will not fix it.

The trigger carries only the connection id and the deadline; the API key is read from the
connection inside the triggerer and never serialized into the trigger's row.

Events (``TriggerEvent.payload``): ``{"status": "ready", "models": [...], "not_ready": [...]}``,
``{"status": "misconfigured", "message": ...}`` or ``{"status": "timeout", "message": ...}``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx
from airflow.triggers.base import BaseTrigger, TriggerEvent

from olmocr_tasks.core.config import COLD_START_TIMEOUT_S, ServerSettings
from olmocr_tasks.core.errors import ConfigurationError, ServerNotReady
from olmocr_tasks.inference.readiness import ModelsProbe, ProbeResult
from olmocr_tasks.provider import DEFAULT_CONN_ID

DEFAULT_POLL_INTERVAL_S = 10.0
_PROBE_TIMEOUT_S = 10.0


class VllmReadyTrigger(BaseTrigger):
    """Fires once every replica of ``conn_id`` lists its model (or at the deadline, if at least one
    does), at once if a replica answers wrongly, or with ``timeout`` when none is ready in time."""

    def __init__(
        self,
        conn_id: str = DEFAULT_CONN_ID,
        *,
        deadline: float | None = None,
        timeout_s: float = COLD_START_TIMEOUT_S,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
    ) -> None:
        super().__init__()
        self.conn_id = conn_id
        # Absolute (epoch seconds), so a trigger re-created after a triggerer restart keeps its deadline.
        self.deadline = deadline if deadline is not None else time.time() + timeout_s
        self.poll_interval_s = poll_interval_s
        # Probe rounds so far (this process only; for logs and tests).
        self.polls = 0

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"conn_id": self.conn_id, "deadline": self.deadline, "poll_interval_s": self.poll_interval_s},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            settings = await self._settings()
        except ConfigurationError as exc:
            yield TriggerEvent({"status": "misconfigured", "message": f"connection {self.conn_id!r}: {exc}"})
            return
        async with httpx.AsyncClient(verify=settings.connection.verify_tls, follow_redirects=False) as http:
            while True:
                results = await probe_replicas(settings, http)
                self.polls += 1
                payload = readiness_payload(results, final=time.time() >= self.deadline)
                if payload is not None:
                    yield TriggerEvent(payload)
                    return
                self.log.info("vLLM not ready yet: %s", "; ".join(r.detail for r in results if not r.ready))
                await asyncio.sleep(max(0.0, min(self.poll_interval_s, self.deadline - time.time())))

    async def _settings(self) -> ServerSettings:
        # Imported here: the hook module pulls in the client, which the triggerer needs only now.
        from airflow.providers.common.compat.connection import get_async_connection

        from olmocr_tasks.provider.hooks import settings_from_connection

        return settings_from_connection(await get_async_connection(self.conn_id))


async def probe_replicas(settings: ServerSettings, http: httpx.AsyncClient) -> list[ProbeResult]:
    """One readiness probe of every replica, at once (``olmocr_tasks.inference.readiness``)."""
    secrets = [urlsplit(url).password for url in settings.connection.base_urls]
    probes = [
        ModelsProbe(url, settings.connection.model, api_key=settings.connection.api_key, secrets=secrets)
        for url in settings.connection.base_urls
    ]
    timeout = httpx.Timeout(min(_PROBE_TIMEOUT_S, settings.timeouts.connect_timeout_s + _PROBE_TIMEOUT_S))
    return list(await asyncio.gather(*(probe.probe(http, timeout) for probe in probes)))


async def probe_once(settings: ServerSettings) -> list[ProbeResult]:
    """``probe_replicas`` with a client of its own: the check a task makes before it defers."""
    async with httpx.AsyncClient(verify=settings.connection.verify_tls, follow_redirects=False) as http:
        return await probe_replicas(settings, http)


def readiness_payload(results: list[ProbeResult], *, final: bool) -> dict[str, Any] | None:
    """The event a round of probes fires (see the module docstring), or None to keep waiting.

    Every replica ready fires ``ready``; at the ``final`` round (the deadline) one ready replica is
    enough, and none is a ``timeout``. A replica that answers wrongly fires ``misconfigured`` at once.
    """
    wrong = [result.detail for result in results if result.state == "misconfigured"]
    if wrong:
        return {"status": "misconfigured", "message": "; ".join(wrong)}
    ready = [result for result in results if result.ready]
    waiting = [result.detail for result in results if not result.ready]
    if ready and (not waiting or final):
        models = list(dict.fromkeys(model for result in ready for model in result.models))
        return {"status": "ready", "models": models, "not_ready": waiting}
    if final:
        return {"status": "timeout", "message": "vLLM not ready by the deadline: " + "; ".join(waiting)}
    return None


def models_from_event(event: dict[str, Any], conn_id: str = DEFAULT_CONN_ID) -> list[str]:
    """What a deferred ``check_server`` does when the trigger fires: return the served models, fail
    the task for good on a misconfiguration, or raise ``ServerNotReady`` (retryable) at the deadline."""
    from airflow.sdk.exceptions import AirflowFailException

    status = event.get("status")
    if status == "ready":
        return [str(model) for model in event.get("models", [])]
    message = str(event.get("message", ""))
    if status == "misconfigured":
        raise AirflowFailException(f"vLLM (connection {conn_id!r}) cannot be used: {message}")
    raise ServerNotReady(f"vLLM (connection {conn_id!r}) is not ready: {message or status}")
