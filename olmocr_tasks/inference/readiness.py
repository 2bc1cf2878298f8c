"""Is an OpenAI-compatible server up and serving our model? One ``GET {base}/models``, judged.

Shared by everything that waits for or checks on vLLM: the client's readiness check and outage
probes, the ``serve-vllm`` launcher and the Airflow trigger. The probe itself never raises for what
the server answered; it returns a ``ProbeResult`` that says one of:

* ``ready``: the server lists the configured model;
* ``starting``: no usable answer yet (refused, timed out, 5xx), which waiting may fix;
* ``misconfigured``: the server answered, but waiting will not help (key, URL, model, TLS trust).

Each caller decides what to do with the verdict (fail at once, keep polling, declare an outage).
``check_ready`` is the client's decision over all its replicas before a run: configuration errors fail
at once, one ready replica is enough to start.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_result, stop_after_delay, wait_fixed

from olmocr_tasks.core.config import TimeoutSettings
from olmocr_tasks.core.errors import ServerMisconfigured, ServerNotReady
from olmocr_tasks.core.redaction import redact, redact_url

log = logging.getLogger(__name__)

ProbeState = Literal["ready", "starting", "misconfigured"]
# Why a probe says "misconfigured": a launcher still starting its server treats some of these as
# transient, a client talking to a running server does not.
MisconfiguredReason = Literal["", "auth", "url", "not_a_model_list", "model_missing", "tls"]

_ERROR_SNIPPET_CHARS = 300


@dataclass(frozen=True)
class ProbeResult:
    state: ProbeState
    detail: str
    models: tuple[str, ...] = ()
    reason: MisconfiguredReason = ""
    status: int | None = None

    @property
    def ready(self) -> bool:
        return self.state == "ready"


class ModelsProbe:
    """Asks one server's ``/models`` whether it serves ``model``; messages carry no secret."""

    def __init__(
        self, base_url: str, model: str, *, api_key: str | None = None, secrets: Iterable[str | None] = ()
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.display = redact_url(self.base_url)
        self.url = self.base_url + "/models"
        self.model = model
        self._api_key = api_key
        self._secrets = [api_key, *secrets]
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def probe(self, http: httpx.AsyncClient, timeout: httpx.Timeout | float) -> ProbeResult:
        try:
            response = await http.get(self.url, headers=self.headers, timeout=timeout)
        except (httpx.HTTPError, OSError) as exc:
            return self.judge_error(exc)
        return self.judge_response(response)

    def probe_sync(self, http: httpx.Client, timeout: httpx.Timeout | float) -> ProbeResult:
        try:
            response = http.get(self.url, headers=self.headers, timeout=timeout)
        except (httpx.HTTPError, OSError) as exc:
            return self.judge_error(exc)
        return self.judge_response(response)

    def judge_error(self, exc: BaseException) -> ProbeResult:
        if certificate_rejected(exc):
            # Waiting will not make an untrusted certificate trusted: say so now, and what to do.
            return ProbeResult(
                "misconfigured",
                f"{self.display}: TLS certificate verification failed ({self.describe(exc)}); "
                "trust the server's CA (e.g. SSL_CERT_FILE) or, on a trusted network only, turn "
                "verification off (--insecure, or verify_tls false in the connection)",
                reason="tls",
            )
        return ProbeResult("starting", self.describe(exc))

    def judge_response(self, response: httpx.Response) -> ProbeResult:
        url = redact_url(self.url)
        status = response.status_code
        if status in (401, 403):
            return ProbeResult(
                "misconfigured",
                f"{url} answered HTTP {status}: the API key is missing or wrong "
                f"({'a key is' if self._api_key else 'no key is'} configured)",
                reason="auth",
                status=status,
            )
        if status == 404:
            return ProbeResult(
                "misconfigured",
                f"{url} answered HTTP 404: is the base URL the OpenAI API root (usually ending in /v1)?",
                reason="url",
                status=status,
            )
        if status != 200:
            return ProbeResult("starting", f"HTTP {status}", status=status)
        try:
            payload = response.json()
            listed = tuple(str(entry["id"]) for entry in payload["data"] if isinstance(entry, dict))
        except (ValueError, KeyError, TypeError):
            return ProbeResult(
                "misconfigured",
                f"{url} answered HTTP 200 but not an OpenAI model list",
                reason="not_a_model_list",
                status=status,
            )
        if self.model not in listed:
            served = ", ".join(listed) if listed else "no model"
            return ProbeResult(
                "misconfigured",
                f"{self.display} serves {served}; configured model is {self.model}",
                models=listed,
                reason="model_missing",
                status=status,
            )
        return ProbeResult("ready", f"{self.display} serves {self.model}", models=listed, status=status)

    def describe(self, exc: BaseException) -> str:
        text = str(exc) or repr(exc)
        return redact(f"{type(exc).__name__}: {text}", self._secrets)[:_ERROR_SNIPPET_CHARS]


async def wait_ready(
    probe: ModelsProbe,
    http: httpx.AsyncClient,
    *,
    timeout_s: float,
    interval_s: float,
    request_timeout: httpx.Timeout | float,
) -> ProbeResult:
    """Probe every ``interval_s`` while the server is starting, for at most ``timeout_s``.

    Returns the first ``ready`` or ``misconfigured`` verdict at once, else the last ``starting`` one.
    """

    def last_result(state: RetryCallState) -> ProbeResult:
        assert state.outcome is not None
        return state.outcome.result()

    retrying = AsyncRetrying(
        stop=stop_after_delay(timeout_s),
        wait=wait_fixed(interval_s),
        retry=retry_if_result(lambda result: result.state == "starting"),
        retry_error_callback=last_result,
    )
    return await retrying(probe.probe, http, request_timeout)


@dataclass(frozen=True)
class Readiness:
    """The replicas' verdict after the readiness wait: the models they list (first seen first) and
    each replica still not ready, by its probe, with why."""

    models: list[str]
    not_ready: dict[ModelsProbe, str]


async def check_ready(probes: Sequence[ModelsProbe], http: httpx.AsyncClient, timeouts: TimeoutSettings) -> Readiness:
    """Wait until every replica lists the configured model, for at most ``readiness_timeout_s``.

    Wrong credentials and a missing model are configuration errors and fail at once
    (``ServerMisconfigured``). A replica still unreachable at the timeout fails the check
    (``ServerNotReady``) only if no replica is ready; otherwise it is reported in ``not_ready`` and
    the caller carries on with the others.
    """
    tasks = {asyncio.ensure_future(_wait_one(probe, http, timeouts)): probe for probe in probes}
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            # A configuration error on any replica fails the check now, not at the timeout.
            if task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    outcomes = {probe: task.result() for task, probe in tasks.items()}
    not_ready = {probe: outcome for probe, outcome in outcomes.items() if isinstance(outcome, str)}
    models: list[str] = []
    for probe in probes:
        listed = outcomes.get(probe)
        if isinstance(listed, list):
            models.extend(m for m in listed if m not in models)
    if len(not_ready) == len(probes):
        raise ServerNotReady("; ".join(not_ready.values()))
    for message in not_ready.values():
        log.warning("replica not ready, continuing with the others: %s", message)
    return Readiness(models, not_ready)


async def _wait_one(probe: ModelsProbe, http: httpx.AsyncClient, timeouts: TimeoutSettings) -> list[str] | str:
    timeout = timeouts.readiness_timeout_s
    result = await wait_ready(
        probe,
        http,
        timeout_s=timeout,
        interval_s=min(1.0, max(0.05, timeout / 20)),
        request_timeout=_probe_timeout(timeouts),
    )
    if result.state == "misconfigured":
        raise ServerMisconfigured(result.detail)
    if result.state == "ready":
        return list(result.models)
    return f"{probe.display}: not ready after {timeout:g} s: {result.detail}"


def _probe_timeout(timeouts: TimeoutSettings) -> httpx.Timeout:
    # A live server answers /models at once, so a read timeout sized for pages is no reason to wait long.
    return httpx.Timeout(
        connect=timeouts.connect_timeout_s,
        read=min(timeouts.read_timeout_s, 30.0),
        write=timeouts.write_timeout_s,
        pool=None,
    )


def certificate_rejected(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ssl.SSLCertVerificationError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False
