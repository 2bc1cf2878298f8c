"""Builds an ``InferenceClient`` from ``ServerSettings``: its HTTP clients and the policies it is made of.

``client`` runs the requests; this module decides what it runs them with: the replicas (each with its
readiness probe and ``/metrics`` address), a connection pool for pages and a small one for probes and
``/metrics`` polls, the in-flight window, the outage breaker and its watch, the hedger, the
``/metrics`` poller of an adaptive window, the GPU-busy meter and the request sender with its retries.

``transport`` replaces the HTTP transport of every request (pages, probes, ``/metrics``), e.g. an
``httpx.MockTransport``; its own connection pool and TLS settings then apply instead of the ones built
here. ``clock`` is what budgets and the outage window are measured with and ``sleep`` what retry
backoffs wait with; tests inject their own to observe them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import httpx

from olmocr_tasks.core.config import ServerSettings
from olmocr_tasks.core.errors import ConfigurationError
from olmocr_tasks.core.redaction import redact_url
from olmocr_tasks.inference.backpressure import InFlightWindow, MetricsPoller, metrics_url_for
from olmocr_tasks.inference.client import PROBE_TIMEOUT_S, InferenceClient
from olmocr_tasks.inference.error_text import ErrorText
from olmocr_tasks.inference.gpu_busy import GpuBusyMeter
from olmocr_tasks.inference.hedger import Hedger, QueueView, hedge_cap
from olmocr_tasks.inference.hedging_policy import HedgePolicy
from olmocr_tasks.inference.outage_policy import OutageBreaker
from olmocr_tasks.inference.outage_watch import OutageWatch
from olmocr_tasks.inference.priority import check_scheduling_policy
from olmocr_tasks.inference.readiness import ModelsProbe
from olmocr_tasks.inference.replicas import Replica, ReplicaSet
from olmocr_tasks.inference.request_sender import RequestSender, Sleep

# Connections beyond the request window: readiness and /metrics polls must never queue behind pages.
_CONNECTION_HEADROOM = 4
# uvicorn (vLLM's HTTP server) closes idle keep-alive connections after 5 s; expiring ours sooner
# avoids reusing a connection the server is closing, which fails the request mid-flight.
_KEEPALIVE_EXPIRY_S = 3.0


def build_client(
    settings: ServerSettings,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Sleep = asyncio.sleep,
    transport: httpx.AsyncBaseTransport | None = None,
) -> InferenceClient:
    """A client of the replicas ``settings`` names; ``ConfigurationError`` for a URL that is not
    ``http(s)://host[:port]/path`` or an unknown scheduling policy. Use as ``async with build_client(...)``."""
    connection, concurrency = settings.connection, settings.concurrency
    _check_urls(connection.base_urls)
    check_scheduling_policy(concurrency.scheduling_policy)
    secrets: list[str | None] = [connection.api_key, *(urlsplit(url).password for url in connection.base_urls)]
    errors = ErrorText(secrets)
    replicas = ReplicaSet(
        Replica(
            url, ModelsProbe(url, connection.model, api_key=connection.api_key, secrets=secrets), metrics_url_for(url)
        )
        for url in connection.base_urls
    )
    headers = {"Authorization": f"Bearer {connection.api_key}"} if connection.api_key else {}
    control_http, pages_http = _http_clients(settings, len(replicas), transport)
    _install_httpx_filter()
    window = InFlightWindow(
        floor=concurrency.min_concurrent_requests,
        ceiling=concurrency.max_concurrent_requests,
        adaptive=concurrency.adaptive_concurrency,
        served_first=concurrency.scheduling_policy == "priority" and concurrency.priority < 0,
    )
    breaker = OutageBreaker(settings.retries.outage_window_s, clock)
    outage = OutageWatch(breaker, lambda: _probe_replicas(replicas, control_http, settings), errors.exception)
    hedger = Hedger(
        HedgePolicy(settings.hedging, settings.timeouts.read_timeout_s),
        QueueView(replicas, window, clock),
        clock,
        recheck_s=concurrency.metrics_poll_interval_s,
    )
    gpu_busy = GpuBusyMeter()
    # The poller runs from the client's first use (it needs the running event loop) until it closes.
    poller = (
        MetricsPoller(
            control_http,
            list(replicas),
            window,
            interval_s=concurrency.metrics_poll_interval_s,
            headers=headers,
            keep_going=lambda: not breaker.is_open,
            meter=gpu_busy,
            clock=clock,
            describe=errors.exception,
        )
        if window.adaptive
        else None
    )
    sender = RequestSender(
        pages_http,
        {"Content-Type": "application/json", **headers},
        replicas,
        outage,
        retries=settings.retries,
        hedge_policy=hedger.policy,
        gpu_busy=gpu_busy,
        errors=errors,
        clock=clock,
        sleep=sleep,
        # httpx's own transport reports when a request's body has been written (the trace extension);
        # an injected one may not, and then hedging judges a request from when it was sent.
        traces_delivery=transport is None,
    )
    return InferenceClient(
        settings,
        replicas=replicas,
        control_http=control_http,
        headers=headers,
        window=window,
        outage=outage,
        hedger=hedger,
        poller=poller,
        gpu_busy=gpu_busy,
        sender=sender,
        clock=clock,
    )


def _check_urls(base_urls: Sequence[str]) -> None:
    if not base_urls:
        raise ConfigurationError("ServerSettings.base_urls is empty")
    for url in base_urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(f"inference server URL must be http(s)://host[:port]/path: {redact_url(url)}")


def _http_clients(
    settings: ServerSettings, replicas: int, transport: httpx.AsyncBaseTransport | None
) -> tuple[httpx.AsyncClient, httpx.AsyncClient]:
    """The control client (probes, ``/metrics``) and the pages' client."""
    connection, timeouts, concurrency = settings.connection, settings.timeouts, settings.concurrency
    # Hedges go beyond the window (at most a quarter of it at once, see hedger.hedge_cap).
    connections = concurrency.max_concurrent_requests + hedge_cap(concurrency.max_concurrent_requests)
    connections += replicas + _CONNECTION_HEADROOM
    # Probes and /metrics polls have their own small pool: they must never wait behind pages
    # (hung requests included) for a connection.
    control = httpx.AsyncClient(
        limits=httpx.Limits(max_connections=2 * replicas + _CONNECTION_HEADROOM),
        verify=connection.verify_tls,
        follow_redirects=False,
        transport=transport,
    )
    pages = httpx.AsyncClient(
        timeout=httpx.Timeout(
            connect=timeouts.connect_timeout_s,
            read=timeouts.read_timeout_s,
            write=timeouts.write_timeout_s,
            # Our own slot bounds concurrency; waiting for a pooled connection is not a failure.
            pool=None,
        ),
        limits=httpx.Limits(
            max_connections=connections,
            max_keepalive_connections=connections,
            keepalive_expiry=_KEEPALIVE_EXPIRY_S,
        ),
        verify=connection.verify_tls,
        http1=True,
        http2=False,
        follow_redirects=False,
        transport=transport,
    )
    return control, pages


async def _probe_replicas(replicas: ReplicaSet, http: httpx.AsyncClient, settings: ServerSettings) -> str | None:
    """The outage watch's probe: is the server up although requests fail? Any replica listing the model
    says it is (None); otherwise, why none does."""
    timeout = httpx.Timeout(min(PROBE_TIMEOUT_S, max(0.05, settings.retries.outage_window_s / 4)))
    results = await asyncio.gather(*(r.probe.probe(http, timeout) for r in replicas))
    if any(result.ready for result in results):
        return None
    return "; ".join(f"{r.display}: {res.detail}" for r, res in zip(replicas, results, strict=True))


class _QuietRequestLines(logging.Filter):
    """httpx logs every request at INFO; with thousands of pages that drowns Airflow task logs.

    The lines stay available when the ``httpx`` logger is explicitly set to DEBUG.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("HTTP Request:"):
            return True
        return logging.getLogger("httpx").getEffectiveLevel() <= logging.DEBUG


def _install_httpx_filter() -> None:
    httpx_logger = logging.getLogger("httpx")
    if not any(isinstance(existing, _QuietRequestLines) for existing in httpx_logger.filters):
        httpx_logger.addFilter(_QuietRequestLines())
