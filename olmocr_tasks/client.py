"""Async client for one or more OpenAI-compatible vLLM replicas, shared by every page of a process.

What it adds over a bare HTTP client, each in answer to a failure seen with olmOCR's own client:

* explicit connect/read/write timeouts (olmOCR had none, so one stalled request hung a work item);
* retries of transport errors, timeouts, 429 and 5xx with jittered exponential backoff honouring
  ``Retry-After``, bounded per call, expressed with tenacity;
* an outage circuit breaker: when no request succeeds for ``outage_window_s`` while requests keep
  failing, every pending and future call raises ``ServerUnavailable`` so the task aborts and Airflow
  retries it later. An outage is never turned into failed page attempts (olmOCR either waited ~2.8 h
  per page or killed the process);
* least-outstanding-requests balancing over replicas, with a cool-off for replicas that stop
  answering;
* an in-flight window sized from vLLM's ``/metrics`` (see ``backpressure``), so several runs sharing a
  server keep its queue short instead of overflowing it (olmOCR issue #317).

The API key only ever travels in the ``Authorization`` header; exception texts and stats are redacted.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import email.utils
import json
import logging
import math
import random
import ssl
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_delay, wait_fixed

from olmocr_tasks.backpressure import AdaptiveLimiter, AimdController
from olmocr_tasks.config import ServerSettings
from olmocr_tasks.errors import (
    ConfigurationError,
    OlmocrTasksError,
    ServerMisconfigured,
    ServerNotReady,
    ServerUnavailable,
)
from olmocr_tasks.redaction import redact_text, redact_url
from olmocr_tasks.vllm_metrics import MetricsFormatError, QueueSample, parse_vllm_queue

log = logging.getLogger(__name__)

# A replica that stops accepting connections is skipped for this long (doubling per repeat) while
# its requests go to the others; long enough to stop paying connect errors, short enough to notice
# a restarted replica within a page or two.
COOLOFF_INITIAL_S = 5.0
COOLOFF_MAX_S = 30.0
# Connections beyond the request window: readiness and /metrics polls must never queue behind pages.
_CONNECTION_HEADROOM = 4
# uvicorn (vLLM's HTTP server) closes idle keep-alive connections after 5 s; expiring ours sooner
# avoids reusing a connection the server is closing, which fails the request mid-flight.
_KEEPALIVE_EXPIRY_S = 3.0
_ERROR_SNIPPET_CHARS = 300
_METRICS_TIMEOUT_S = 5.0

_slot_owner: contextvars.ContextVar[object | None] = contextvars.ContextVar("olmocr_slot_owner", default=None)


class AttemptFailed(OlmocrTasksError):
    """One failed page attempt: the page logic moves on to its next attempt (or the fallback page)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ReplicaStats:
    url: str
    requests: int
    successes: int
    failures: int
    outstanding: int
    cooling_off: bool
    running: float | None
    waiting: float | None


@dataclass(frozen=True)
class ClientStats:
    """A snapshot for logs, manifests and tests; no secret ever appears here."""

    requests: int
    retries: int
    outcomes: dict[str, int]
    in_flight: int
    slots_in_use: int
    window: int
    window_mode: str
    breaker_open: bool
    replicas: tuple[ReplicaStats, ...]


class _Retryable(Exception):
    """An attempt failed in a way another attempt may fix (server side or network)."""

    def __init__(self, kind: str, message: str, replica: _Replica, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.replica = replica
        self.retry_after = retry_after


class _NotReadyYet(Exception):
    """Readiness probe failed in a way that may resolve itself (server still starting)."""


class _Replica:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.display = redact_url(self.base_url)
        self.completions_url = self.base_url + "/chat/completions"
        self.models_url = self.base_url + "/models"
        self.metrics_url = metrics_url_for(self.base_url)
        self.outstanding = 0
        self.requests = 0
        self.successes = 0
        self.failures = 0
        self.consecutive_failures = 0
        self.cooloffs = 0
        self.cool_until = -math.inf
        self.picks = 0
        self.sample: QueueSample | None = None
        self.metrics_absent = False

    def cooling(self, now: float) -> bool:
        return self.cool_until > now


def metrics_url_for(base_url: str) -> str:
    """vLLM serves ``/metrics`` at the root while the API lives under ``/v1``; keep any proxy prefix."""
    parts = urlsplit(base_url.rstrip("/"))
    path = parts.path
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return urlunsplit((parts.scheme, parts.netloc, path + "/metrics", "", ""))


class _CallState:
    """Bookkeeping of one ``complete()`` call across its attempts."""

    __slots__ = ("backoff_rounds", "failed_replicas", "last_attempt_started", "started")

    def __init__(self, started: float) -> None:
        self.started = started
        self.last_attempt_started = started
        self.failed_replicas: set[_Replica] = set()
        self.backoff_rounds = 0


class _OutageBreaker:
    """Decides when failures amount to an outage.

    The outage clock starts at the first failure after the last success (at the start of that failed
    attempt, so a request that hung for its whole read timeout counts the time it hung). It runs only
    while some call keeps retrying: if every failing call ends without anyone succeeding (for instance
    cancelled), there is no more evidence and the clock stops. Any success stops it too.
    """

    def __init__(self, window_s: float, clock: Callable[[], float]) -> None:
        self.window_s = window_s
        self._clock = clock
        self.last_success_at: float | None = None
        self.failing_since: float | None = None
        self.last_error: str = ""
        self.open_message: str | None = None
        self._failing_calls: set[_CallState] = set()
        self._opened: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._warned = False
        # Transient 5xx happen; only a failing streak this old is worth a warning.
        self._warn_after_s = min(5.0, window_s / 10)

    @property
    def is_open(self) -> bool:
        return self.open_message is not None

    def opened(self) -> asyncio.Future[None]:
        if self._opened is None:
            self._opened = asyncio.get_running_loop().create_future()
            if self.is_open:
                self._opened.set_result(None)
        return self._opened

    def healthy_since(self, moment: float) -> bool:
        """Did some request succeed at or after ``moment``?"""
        return self.last_success_at is not None and self.last_success_at >= moment

    def success(self, now: float) -> None:
        self.last_success_at = now
        if self.failing_since is not None:
            if self._warned:
                log.warning(
                    "inference server recovered: requests succeed again after %.1f s of failures",
                    now - self.failing_since,
                )
            self._stop_clock()
        self._failing_calls.clear()

    def failure(self, call: _CallState, started: float, now: float, error: str) -> None:
        if self.is_open:
            return
        self.last_error = error
        self._failing_calls.add(call)
        if self.failing_since is None:
            since = started
            if self.last_success_at is not None:
                since = max(since, self.last_success_at)
            self.failing_since = since
        self._evaluate()

    def call_finished(self, call: _CallState) -> None:
        self._failing_calls.discard(call)
        if not self._failing_calls and self.failing_since is not None and not self.is_open:
            self._stop_clock()

    def _stop_clock(self) -> None:
        self.failing_since = None
        self._warned = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _evaluate(self) -> None:
        if self.failing_since is None or self.is_open:
            return
        elapsed = self._clock() - self.failing_since
        if not self._warned and elapsed >= self._warn_after_s:
            self._warned = True
            log.warning(
                "inference server failing for %.1f s (last error: %s); aborting if nothing succeeds "
                "within the %.0f s outage window",
                elapsed,
                self.last_error,
                self.window_s,
            )
        if elapsed >= self.window_s:
            self._open(elapsed)
            return
        # Backoff sleeps and hung requests produce no events: a timer makes the decision on time.
        next_check = self.window_s if self._warned else min(self._warn_after_s, self.window_s)
        if self._timer is not None:
            self._timer.cancel()
        with contextlib.suppress(RuntimeError):
            self._timer = asyncio.get_running_loop().call_later(max(0.0, next_check - elapsed) + 0.001, self._evaluate)

    def _open(self, elapsed: float) -> None:
        self.open_message = (
            f"inference server unavailable: no request succeeded for {elapsed:.1f} s "
            f"(outage window {self.window_s:g} s); last error: {self.last_error}"
        )
        log.error("%s; aborting pending requests", self.open_message)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._opened is not None and not self._opened.done():
            self._opened.set_result(None)


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


class InferenceClient:
    """Talks to the inference replicas for every document a process converts.

    Use as ``async with InferenceClient(settings) as client``; page workers take ``client.slot()``
    before rendering a page and call ``complete()`` inside it, so rendering is bounded by the same
    window as requests and memory stays flat.
    """

    def __init__(self, settings: ServerSettings, *, clock: Callable[[], float] = time.monotonic) -> None:
        if not settings.base_urls:
            raise ConfigurationError("ServerSettings.base_urls is empty")
        for url in settings.base_urls:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigurationError(f"inference server URL must be http(s)://host[:port]/path: {redact_url(url)}")
        self._settings = settings
        self._clock = clock
        self._replicas = [_Replica(url) for url in settings.base_urls]
        self._secrets: list[str | None] = [settings.api_key]
        for url in settings.base_urls:
            self._secrets.append(urlsplit(url).password)
        headers = {"Content-Type": "application/json"}
        if settings.api_key:
            headers["Authorization"] = f"Bearer {settings.api_key}"
        self._headers = headers
        connections = settings.max_concurrent_requests + len(self._replicas) + _CONNECTION_HEADROOM
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(
                connect=settings.connect_timeout_s,
                read=settings.read_timeout_s,
                write=settings.write_timeout_s,
                # Our own slot bounds concurrency; waiting for a pooled connection is not a failure.
                pool=None,
            ),
            limits=httpx.Limits(
                max_connections=connections,
                max_keepalive_connections=connections,
                keepalive_expiry=_KEEPALIVE_EXPIRY_S,
            ),
            verify=settings.verify_tls,
            http1=True,
            http2=False,
            follow_redirects=False,
        )
        _install_httpx_filter()
        ceiling = max(1, settings.max_concurrent_requests)
        self._controller = AimdController(floor=settings.min_concurrent_requests, ceiling=ceiling)
        self._adaptive = settings.adaptive_concurrency
        self._limiter = AdaptiveLimiter(self._controller.window if self._adaptive else ceiling)
        self._breaker = _OutageBreaker(settings.outage_window_s, clock)
        self._poller: asyncio.Task[None] | None = None
        self._closed = False
        self._requests = 0
        self._retries = 0
        self._outcomes: Counter[str] = Counter()

    # -- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> InferenceClient:
        self._ensure_started()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        await self._http.aclose()

    def _ensure_started(self) -> None:
        if self._closed:
            raise RuntimeError("InferenceClient is closed")
        if self._adaptive and self._poller is None:
            self._poller = asyncio.get_running_loop().create_task(self._poll_metrics(), name="olmocr-metrics-poller")
            self._poller.add_done_callback(self._poller_done)

    # -- readiness -------------------------------------------------------------------------------

    async def check_ready(self) -> list[str]:
        """Wait until every replica lists the configured model; return the models listed.

        Wrong credentials and a missing model are configuration errors and fail at once. A replica
        still unreachable at ``readiness_timeout_s`` fails the check only if no replica is ready;
        otherwise it starts in cool-off and is retried later like any failing replica.
        """
        tasks = {asyncio.ensure_future(self._wait_ready(replica)): replica for replica in self._replicas}
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
        outcomes = {replica: task.result() for task, replica in tasks.items()}
        unreachable = {r: o for r, o in outcomes.items() if isinstance(o, str)}
        models: list[str] = []
        for replica in self._replicas:
            listed = outcomes.get(replica)
            if isinstance(listed, list):
                models.extend(m for m in listed if m not in models)
        if len(unreachable) == len(self._replicas):
            raise ServerNotReady("; ".join(unreachable.values()))
        now = self._clock()
        for replica, message in unreachable.items():
            log.warning("replica not ready, continuing with the others: %s", message)
            replica.cool_until = now + COOLOFF_INITIAL_S
        return models

    async def _wait_ready(self, replica: _Replica) -> list[str] | str:
        timeout = self._settings.readiness_timeout_s
        retrying = AsyncRetrying(
            stop=stop_after_delay(timeout),
            wait=wait_fixed(min(1.0, max(0.05, timeout / 20))),
            retry=retry_if_exception_type(_NotReadyYet),
            reraise=True,
        )
        try:
            return await retrying(self._probe_models, replica)
        except _NotReadyYet as exc:
            return f"{replica.display}: not ready after {timeout:g} s: {exc}"

    async def _probe_models(self, replica: _Replica) -> list[str]:
        settings = self._settings
        try:
            response = await self._http.get(
                replica.models_url,
                headers=self._headers_without_body(),
                timeout=httpx.Timeout(
                    connect=settings.connect_timeout_s,
                    read=min(settings.read_timeout_s, 30.0),
                    write=settings.write_timeout_s,
                    pool=None,
                ),
            )
        except (httpx.HTTPError, OSError) as exc:
            if _certificate_rejected(exc):
                # Waiting will not make an untrusted certificate trusted: say so now, and what to do.
                raise ServerMisconfigured(
                    f"{replica.display}: TLS certificate verification failed ({self._describe_exception(exc)}); "
                    "trust the server's CA (e.g. SSL_CERT_FILE) or, on a trusted network only, turn "
                    "verification off (--insecure, or verify_tls false in the connection)"
                ) from None
            raise _NotReadyYet(self._describe_exception(exc)) from None
        url = redact_url(replica.models_url)
        status = response.status_code
        if status in (401, 403):
            raise ServerMisconfigured(
                f"{url} answered HTTP {status}: the API key is missing or wrong "
                f"({'a key is' if settings.api_key else 'no key is'} configured)"
            )
        if status == 404:
            raise ServerMisconfigured(
                f"{url} answered HTTP 404: is the base URL the OpenAI API root (usually ending in /v1)?"
            )
        if status != 200:
            raise _NotReadyYet(f"HTTP {status}")
        try:
            payload = response.json()
            listed = [str(entry["id"]) for entry in payload["data"] if isinstance(entry, dict)]
        except (ValueError, KeyError, TypeError):
            raise ServerMisconfigured(f"{url} answered HTTP 200 but not an OpenAI model list") from None
        if settings.model not in listed:
            served = ", ".join(listed) if listed else "no model"
            raise ServerMisconfigured(f"{replica.display} serves {served}; configured model is {settings.model}")
        return listed

    # -- requests --------------------------------------------------------------------------------

    def slot(self) -> AbstractAsyncContextManager[None]:
        """One place in the in-flight window; hold it while rendering a page and requesting it."""
        return self._slot()

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        self._ensure_started()
        self._raise_if_open()
        await self._limiter.acquire()
        if self._breaker.is_open:
            # The breaker opened while we queued: do not let the caller render a page for nothing.
            self._limiter.release()
            self._raise_if_open()
        token = _slot_owner.set(self)
        try:
            yield
        finally:
            _slot_owner.reset(token)
            self._limiter.release()

    async def complete(self, body: bytes) -> dict[str, Any]:
        """POST a prebuilt chat-completion body; return the decoded JSON of the 200 answer.

        Raises ``AttemptFailed`` for a failure of this page attempt, ``ServerNotReady`` for bad
        credentials and ``ServerUnavailable`` once the outage breaker is open.
        """
        self._ensure_started()
        self._raise_if_open()
        if _slot_owner.get() is self:
            return await self._complete_or_abort(body)
        async with self.slot():
            return await self._complete_or_abort(body)

    def _raise_if_open(self) -> None:
        if self._breaker.open_message is not None:
            raise ServerUnavailable(self._breaker.open_message)

    async def _complete_or_abort(self, body: bytes) -> dict[str, Any]:
        # The retry loop runs as its own task so an opening breaker can cut short a backoff sleep or
        # a hung request at once instead of letting every caller wait out its budget.
        work = asyncio.ensure_future(self._complete_with_retries(body))
        try:
            await asyncio.wait({work, self._breaker.opened()}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            work.cancel()
            work.add_done_callback(_consume_outcome)
            raise
        if work.done():
            return work.result()
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        self._outcomes["unavailable"] += 1
        raise ServerUnavailable(self._breaker.open_message or "inference server unavailable")

    async def _complete_with_retries(self, body: bytes) -> dict[str, Any]:
        call = _CallState(self._clock())
        retrying = AsyncRetrying(
            stop=lambda state: self._should_stop(state, call),
            wait=lambda state: self._backoff(state, call),
            retry=retry_if_exception_type(_Retryable),
            before_sleep=self._count_retry,
            reraise=True,
        )
        try:
            return await retrying(self._attempt, body, call)
        except _Retryable as exc:
            if self._breaker.is_open:
                raise ServerUnavailable(self._breaker.open_message or "") from None
            self._outcomes["budget_exhausted"] += 1
            raise AttemptFailed(
                f"transport: {exc.message} (retry budget of {self._settings.request_retry_budget_s:g} s spent)"
            ) from None
        finally:
            self._breaker.call_finished(call)

    def _should_stop(self, state: RetryCallState, call: _CallState) -> bool:
        if self._breaker.is_open:
            return True
        spent = self._clock() - call.started + state.upcoming_sleep
        if spent < self._settings.request_retry_budget_s:
            return False
        # Give up on this page only if the server demonstrably works (something succeeded since our
        # last attempt started); otherwise this may be an outage, which the breaker must decide.
        return self._breaker.healthy_since(call.last_attempt_started)

    def _backoff(self, state: RetryCallState, call: _CallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        if self._pick_candidates(call.failed_replicas, self._clock(), strict=True):
            # Another replica has not failed this call yet: try it now, the failure was local.
            return 0.0
        call.failed_replicas.clear()
        call.backoff_rounds += 1
        settings = self._settings
        ceiling = min(settings.backoff_max_s, settings.backoff_initial_s * 2 ** min(call.backoff_rounds - 1, 32))
        delay = ceiling / 2 + random.uniform(0, ceiling / 2)
        if isinstance(exc, _Retryable) and exc.retry_after is not None:
            delay = max(delay, min(exc.retry_after, settings.backoff_max_s))
        return delay

    def _count_retry(self, state: RetryCallState) -> None:
        self._retries += 1
        exc = state.outcome.exception() if state.outcome is not None else None
        log.debug("retrying in %.2f s after %s", state.upcoming_sleep, exc)

    def _pick_candidates(self, avoid: set[_Replica], now: float, *, strict: bool = False) -> list[_Replica]:
        ready = [r for r in self._replicas if not r.cooling(now)]
        fresh = [r for r in ready if r not in avoid]
        if strict:
            return fresh
        if fresh:
            return fresh
        if ready:
            return ready
        # Every replica is cooling off: keep probing the one that comes back first.
        return [min(self._replicas, key=lambda r: r.cool_until)]

    def _pick_replica(self, avoid: set[_Replica]) -> _Replica:
        candidates = self._pick_candidates(avoid, self._clock())
        chosen = min(candidates, key=lambda r: (r.outstanding, r.consecutive_failures, r.picks))
        chosen.picks += 1
        return chosen

    async def _attempt(self, body: bytes, call: _CallState) -> dict[str, Any]:
        replica = self._pick_replica(call.failed_replicas)
        started = self._clock()
        call.last_attempt_started = started
        replica.outstanding += 1
        replica.requests += 1
        self._requests += 1
        try:
            response = await self._http.post(replica.completions_url, content=body, headers=self._headers)
        except httpx.ConnectTimeout as exc:
            raise self._failed(call, replica, started, "connect", exc) from None
        except httpx.TimeoutException as exc:
            raise self._failed(call, replica, started, "timeout", exc) from None
        except httpx.ConnectError as exc:
            raise self._failed(call, replica, started, "connect", exc) from None
        except (httpx.TransportError, OSError) as exc:
            # Resets, dropped connections, protocol garbage and local EMFILE all look alike to a page.
            raise self._failed(call, replica, started, "transport", exc) from None
        except httpx.HTTPError as exc:
            # The server answered, but the body could not be decoded (e.g. a broken gzip stream).
            self._outcomes["bad_body"] += 1
            raise AttemptFailed(f"unreadable answer: {self._describe_exception(exc)}") from None
        finally:
            replica.outstanding -= 1
        return self._handle_response(call, replica, started, response)

    def _handle_response(
        self, call: _CallState, replica: _Replica, started: float, response: httpx.Response
    ) -> dict[str, Any]:
        status = response.status_code
        if status == 429 or status >= 500:
            kind = "http_429" if status == 429 else "http_5xx"
            message = f"HTTP {status} from {replica.display}{self._snippet(response)}"
            failure = _Retryable(kind, message, replica, _retry_after(response))
            self._record_failure(call, replica, started, failure)
            raise failure
        now = self._clock()
        # Whatever else it answered, the server is up: that is progress as far as outages go.
        self._breaker.success(now)
        replica.consecutive_failures = 0
        replica.cooloffs = 0
        replica.cool_until = -math.inf
        if status in (401, 403):
            self._outcomes["auth"] += 1
            raise ServerMisconfigured(
                f"{replica.display} answered HTTP {status} to a completion request: the API key is missing or wrong"
            )
        if status != 200:
            self._outcomes["http_4xx"] += 1
            raise AttemptFailed(f"HTTP {status}{self._snippet(response)}")
        try:
            payload = json.loads(response.content)
        except ValueError:
            self._outcomes["bad_json"] += 1
            raise AttemptFailed("HTTP 200 with a body that is not JSON") from None
        if not isinstance(payload, dict):
            self._outcomes["bad_json"] += 1
            raise AttemptFailed("HTTP 200 with a JSON body that is not an object")
        replica.successes += 1
        self._outcomes["ok"] += 1
        return payload

    def _failed(self, call: _CallState, replica: _Replica, started: float, kind: str, exc: BaseException) -> _Retryable:
        failure = _Retryable(kind, f"{self._describe_exception(exc)} ({replica.display})", replica)
        self._record_failure(call, replica, started, failure)
        return failure

    def _record_failure(self, call: _CallState, replica: _Replica, started: float, failure: _Retryable) -> None:
        now = self._clock()
        self._outcomes[failure.kind] += 1
        replica.failures += 1
        replica.consecutive_failures += 1
        call.failed_replicas.add(replica)
        # A refused connection proves the replica is down; one dropped or slow request does not
        # (a keep-alive race, one poison page), so those need a repeat before the replica is benched.
        network = failure.kind in ("connect", "timeout", "transport")
        if network and (failure.kind == "connect" or replica.consecutive_failures >= 2):
            replica.cool_until = now + min(COOLOFF_MAX_S, COOLOFF_INITIAL_S * 2**replica.cooloffs)
            replica.cooloffs += 1
        self._breaker.failure(call, started, now, failure.message)
        log.debug("request to %s failed: %s", replica.display, failure.message)

    def _describe_exception(self, exc: BaseException) -> str:
        text = str(exc) or repr(exc)
        return redact_text(f"{type(exc).__name__}: {text}", self._secrets)[:_ERROR_SNIPPET_CHARS]

    def _snippet(self, response: httpx.Response) -> str:
        text = response.text.strip().replace("\n", " ")
        if not text:
            return ""
        return ": " + redact_text(text, self._secrets)[:_ERROR_SNIPPET_CHARS]

    def _headers_without_body(self) -> dict[str, str]:
        return {key: value for key, value in self._headers.items() if key != "Content-Type"}

    # -- adaptive window -------------------------------------------------------------------------

    async def _poll_metrics(self) -> None:
        interval = self._settings.metrics_poll_interval_s
        while not self._breaker.is_open:
            results = await asyncio.gather(*(self._fetch_metrics(replica) for replica in self._replicas))
            if all(replica.metrics_absent for replica in self._replicas):
                self._use_fixed_window("the inference server exposes no vLLM queue metrics")
                return
            samples = [sample for sample in results if sample is not None]
            demand = self._limiter.in_use + self._limiter.waiting
            before = self._controller.window
            window = self._controller.update(samples, demand)
            if window != before:
                log.debug("in-flight window %d -> %d (%s)", before, window, samples)
                self._limiter.set_limit(window)
            await asyncio.sleep(interval)

    def _use_fixed_window(self, why: str) -> None:
        self._adaptive = False
        self._limiter.set_limit(self._controller.ceiling)
        log.info("%s; using a fixed window of %d requests", why, self._controller.ceiling)

    def _poller_done(self, task: asyncio.Task[None]) -> None:
        # A bug in the poller must not freeze the window at whatever size it had.
        if not task.cancelled() and task.exception() is not None:
            log.warning("adaptive concurrency stopped: %s", self._describe_exception(task.exception()))
            self._use_fixed_window("adaptive concurrency failed")

    async def _fetch_metrics(self, replica: _Replica) -> QueueSample | None:
        try:
            response = await self._http.get(
                replica.metrics_url,
                headers=self._headers_without_body(),
                timeout=httpx.Timeout(_METRICS_TIMEOUT_S, pool=None),
            )
        except (httpx.HTTPError, OSError):
            # The replica may be restarting; the request path deals with that, the window holds.
            return None
        if response.status_code in (404, 405, 501):
            replica.metrics_absent = True
            return None
        if response.status_code != 200:
            return None
        try:
            sample = parse_vllm_queue(response.text)
        except MetricsFormatError:
            replica.metrics_absent = True
            return None
        replica.metrics_absent = False
        replica.sample = sample
        return sample

    # -- stats -----------------------------------------------------------------------------------

    def stats(self) -> ClientStats:
        now = self._clock()
        return ClientStats(
            requests=self._requests,
            retries=self._retries,
            outcomes=dict(self._outcomes),
            in_flight=sum(replica.outstanding for replica in self._replicas),
            slots_in_use=self._limiter.in_use,
            window=self._limiter.limit,
            window_mode="adaptive" if self._adaptive else "fixed",
            breaker_open=self._breaker.is_open,
            replicas=tuple(
                ReplicaStats(
                    url=replica.display,
                    requests=replica.requests,
                    successes=replica.successes,
                    failures=replica.failures,
                    outstanding=replica.outstanding,
                    cooling_off=replica.cooling(now),
                    running=replica.sample.running if replica.sample else None,
                    waiting=replica.sample.waiting if replica.sample else None,
                )
                for replica in self._replicas
            ),
        )


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or HTTP date), if present and sane."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


def _certificate_rejected(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ssl.SSLCertVerificationError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _consume_outcome(task: asyncio.Future[Any]) -> None:
    # A cancelled caller abandons its retry task; fetch its outcome so asyncio does not warn about it.
    if not task.cancelled():
        task.exception()
