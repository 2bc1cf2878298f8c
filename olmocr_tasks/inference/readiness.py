"""Is an OpenAI-compatible server up and serving our model? One ``GET {base}/models``, judged.

Shared by everything that waits for or checks on vLLM: the client's readiness check and outage
probes, the ``serve-vllm`` launcher and the Airflow trigger. The probe itself never raises for what
the server answered; it returns a ``ProbeResult`` that says one of:

* ``ready``: the server lists the configured model;
* ``starting``: no usable answer yet (refused, timed out, 5xx), which waiting may fix;
* ``misconfigured``: the server answered, but waiting will not help (key, URL, model, TLS trust).

Each caller decides what to do with the verdict (fail at once, keep polling, declare an outage).
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_result, stop_after_delay, wait_fixed

from olmocr_tasks.core.redaction import redact_text, redact_url

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
        return redact_text(f"{type(exc).__name__}: {text}", self._secrets)[:_ERROR_SNIPPET_CHARS]


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


def certificate_rejected(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ssl.SSLCertVerificationError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False
