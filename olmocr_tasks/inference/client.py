"""Async client for one or more OpenAI-compatible vLLM replicas, shared by every page of a process.

What it adds over a bare HTTP client, each in answer to a failure seen with olmOCR's own client:

* explicit connect/read/write timeouts (olmOCR had none, so one stalled request hung a work item);
* retries of transport errors, timeouts, 429 and 5xx with jittered exponential backoff honouring
  ``Retry-After``, bounded per call, expressed with tenacity;
* an outage circuit breaker (``outage``, kept on time by ``outage_watch``): when no request succeeds
  for ``outage_window_s`` while requests keep failing and the server fails its readiness probes too,
  every pending and future call raises ``ServerUnavailable`` so the task aborts and Airflow retries it
  later. An outage is never turned into failed page attempts (olmOCR either waited ~2.8 h per page or
  killed the process), and requests that hang on a healthy server are not an outage;
* hedged requests (``hedging`` decides, ``hedger`` sends): a request outstanding far longer than
  answered requests usually take gets a second request for the same body when the server has room;
  the first answer wins;
* least-outstanding-requests balancing over replicas, with a cool-off for replicas that stop
  answering (``replicas``);
* an in-flight window sized from vLLM's ``/metrics`` (``backpressure``), so several runs sharing a
  server keep its queue short instead of overflowing it (olmOCR issue #317);
* the GPU-busy seconds this client's requests cost, from the same ``/metrics`` polls (``gpu_busy``);
* a readiness check of every replica before a run (``readiness`` judges it, unready replicas start
  in cool-off);
* the run's priority class as vLLM's ``priority`` field when the deployment schedules by priority
  (``priority``);
* olmOCR's guided decoding, in the field the servers' vLLM version reads (``guided``), when asked.

This module keeps the HTTP exchange and the retry loop (its bookkeeping and backoff live in
``request_retries``); each other policy lives in its own module. The HTTP transport can be injected
(``transport``): unit tests answer with ``httpx.MockTransport``.
The API key only ever travels in the ``Authorization`` header; exception texts and stats are redacted.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from olmocr_tasks.core.config import ServerSettings
from olmocr_tasks.core.errors import (
    AttemptFailed,
    ConfigurationError,
    ServerMisconfigured,
    ServerUnavailable,
)
from olmocr_tasks.core.gpu_busy import GpuBusy
from olmocr_tasks.core.redaction import redact, redact_url
from olmocr_tasks.inference.backpressure import InFlightWindow, MetricsPoller, metrics_url_for
from olmocr_tasks.inference.gpu_busy import GpuBusyMeter
from olmocr_tasks.inference.guided import server_field, with_guided_decoding
from olmocr_tasks.inference.hedger import Hedger, QueueView, hedge_cap
from olmocr_tasks.inference.hedging import HedgePolicy
from olmocr_tasks.inference.outage import OutageBreaker
from olmocr_tasks.inference.outage_watch import OutageWatch
from olmocr_tasks.inference.priority import check_scheduling_policy, with_priority
from olmocr_tasks.inference.readiness import ModelsProbe, check_ready
from olmocr_tasks.inference.replicas import COOLOFF_INITIAL_S, Replica, ReplicaSet, ReplicaStats
from olmocr_tasks.inference.request_retries import CallState, Retryable, backoff_delay, retry_after_seconds
from olmocr_tasks.page.protocol import usage_tokens

log = logging.getLogger(__name__)

# Connections beyond the request window: readiness and /metrics polls must never queue behind pages.
_CONNECTION_HEADROOM = 4
# uvicorn (vLLM's HTTP server) closes idle keep-alive connections after 5 s; expiring ours sooner
# avoids reusing a connection the server is closing, which fails the request mid-flight.
_KEEPALIVE_EXPIRY_S = 3.0
_ERROR_SNIPPET_CHARS = 300
# Outage probes ask a question a live server answers at once, whatever its queue.
_PROBE_TIMEOUT_S = 10.0

_slot_owner: contextvars.ContextVar[object | None] = contextvars.ContextVar("olmocr_slot_owner", default=None)

Sleep = Callable[[float], Awaitable[None]]


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
    # Second requests sent for slow requests (never page attempts), and outage probes by verdict.
    hedged: int = 0
    probes_ok: int = 0
    probes_failed: int = 0


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

    ``clock`` is what budgets and the outage window are measured with and ``sleep`` what retry
    backoffs wait with; tests inject their own to observe them. ``transport`` replaces the HTTP
    transport of every request (pages, probes, ``/metrics``), e.g. an ``httpx.MockTransport``; its
    own connection pool and TLS settings then apply instead of the ones built here.
    """

    def __init__(
        self,
        settings: ServerSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        connection, timeouts, concurrency = settings.connection, settings.timeouts, settings.concurrency
        if not connection.base_urls:
            raise ConfigurationError("ServerSettings.base_urls is empty")
        for url in connection.base_urls:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigurationError(f"inference server URL must be http(s)://host[:port]/path: {redact_url(url)}")
        check_scheduling_policy(concurrency.scheduling_policy)
        self._settings = settings
        self._clock = clock
        self._sleep = sleep
        self._secrets: list[str | None] = [connection.api_key]
        for url in connection.base_urls:
            self._secrets.append(urlsplit(url).password)
        self._replicas = ReplicaSet(
            Replica(
                url,
                ModelsProbe(url, connection.model, api_key=connection.api_key, secrets=self._secrets),
                metrics_url_for(url),
            )
            for url in connection.base_urls
        )
        headers = {"Content-Type": "application/json"}
        if connection.api_key:
            headers["Authorization"] = f"Bearer {connection.api_key}"
        self._headers = headers
        # Hedges go beyond the window (at most a quarter of it at once, see hedger.hedge_cap).
        connections = concurrency.max_concurrent_requests + hedge_cap(concurrency.max_concurrent_requests)
        connections += len(self._replicas) + _CONNECTION_HEADROOM
        # Probes and /metrics polls have their own small pool: they must never wait behind pages
        # (hung requests included) for a connection.
        self._control_http = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=2 * len(self._replicas) + _CONNECTION_HEADROOM),
            verify=connection.verify_tls,
            follow_redirects=False,
            transport=transport,
        )
        self._http = httpx.AsyncClient(
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
        # httpx's own transport reports when a request's body has been written (the trace extension);
        # an injected one may not, and then hedging judges a request from when it was sent.
        self._traces_delivery = transport is None
        _install_httpx_filter()
        self._window = InFlightWindow(
            floor=concurrency.min_concurrent_requests,
            ceiling=concurrency.max_concurrent_requests,
            adaptive=concurrency.adaptive_concurrency,
            served_first=concurrency.scheduling_policy == "priority" and concurrency.priority < 0,
        )
        self._limiter = self._window.limiter
        self._breaker = OutageBreaker(settings.retries.outage_window_s, clock)
        self._outage = OutageWatch(self._breaker, self._probe_server, self._describe_exception)
        self._hedger = Hedger(
            HedgePolicy(settings.hedging, timeouts.read_timeout_s),
            QueueView(self._replicas, self._window, clock),
            clock,
            recheck_s=concurrency.metrics_poll_interval_s,
        )
        self._poller: MetricsPoller | None = None
        self._gpu_busy = GpuBusyMeter()
        # The field guided decoding travels in, chosen from the replicas' vLLM version before the first page.
        self._guided_field: str | None = None
        self._guided_lock = asyncio.Lock()
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
        await self._outage.aclose()
        if self._poller is not None:
            await self._poller.stop()
        await self._http.aclose()
        await self._control_http.aclose()

    def _ensure_started(self) -> None:
        if self._closed:
            raise RuntimeError("InferenceClient is closed")
        if self._window.adaptive and self._poller is None:
            self._poller = MetricsPoller(
                self._control_http,
                list(self._replicas),
                self._window,
                interval_s=self._settings.concurrency.metrics_poll_interval_s,
                headers=self._headers_without_body(),
                keep_going=lambda: not self._breaker.is_open,
                meter=self._gpu_busy,
                clock=self._clock,
                describe=self._describe_exception,
            )
            self._poller.start()

    async def finish_gpu_busy(self) -> GpuBusy:
        """Stop measuring and return the GPU-busy seconds charged to this client's requests (``gpu_busy``).

        Call it once the work is done: one last reading of every replica's ``/metrics`` closes the span
        after the last answer, so the servers' token counters include every token this client counted.
        Unmeasured when the metrics were never polled (adaptive concurrency off, no ``/metrics``).
        """
        if self._poller is not None and await self._poller.stop() and not self._breaker.is_open:
            await self._poller.read_all()
        self._gpu_busy.stop()
        return self._gpu_busy.result()

    # -- readiness -------------------------------------------------------------------------------

    async def check_ready(self) -> list[str]:
        """Wait until every replica lists the configured model; return the models listed.

        The verdict is ``readiness.check_ready``'s; a replica still unreachable when others are ready
        starts in cool-off and is retried later like any failing replica.
        """
        replicas = list(self._replicas)
        readiness = await check_ready([r.probe for r in replicas], self._control_http, self._settings.timeouts)
        now = self._clock()
        for replica in replicas:
            if replica.probe in readiness.not_ready:
                replica.cool_off(now, COOLOFF_INITIAL_S)
        await self._guided_decoding_field([r for r in replicas if r.probe not in readiness.not_ready])
        return readiness.models

    async def _guided_decoding_field(self, replicas: list[Replica] | None = None) -> str | None:
        """The request field guided decoding is sent in (None when it is off), asked of the replicas once.

        Replicas of different vLLM generations would each need another field: a configuration error.
        """
        if not self._settings.connection.guided_decoding:
            return None
        async with self._guided_lock:
            if self._guided_field is None:
                timeout = httpx.Timeout(_PROBE_TIMEOUT_S)
                asked = replicas if replicas else list(self._replicas)
                fields = {
                    replica.display: await server_field(
                        self._control_http, replica.base_url, replica.display, self._headers_without_body(), timeout
                    )
                    for replica in asked
                }
                if len(set(fields.values())) > 1:
                    raise ServerMisconfigured(
                        "guided decoding is on, but the replicas run vLLM releases that read it from different "
                        f"fields ({', '.join(f'{name}: {field}' for name, field in fields.items())})"
                    )
                self._guided_field = next(iter(fields.values()))
            return self._guided_field

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

    async def complete(self, body: bytes, *, on_hedge: Callable[[], None] | None = None) -> dict[str, Any]:
        """POST a prebuilt chat-completion body; return the decoded JSON of the 200 answer.

        Raises ``AttemptFailed`` for a failure of this page attempt, ``ServerNotReady`` for bad
        credentials and ``ServerUnavailable`` once the outage breaker is open. ``on_hedge`` is called
        for each second request sent because this one was slow.
        """
        self._ensure_started()
        self._raise_if_open()
        if _slot_owner.get() is self:
            return await self._complete_or_abort(body, on_hedge)
        async with self.slot():
            return await self._complete_or_abort(body, on_hedge)

    def _raise_if_open(self) -> None:
        if self._breaker.open_message is not None:
            raise ServerUnavailable(self._breaker.open_message)

    async def _complete_or_abort(self, body: bytes, on_hedge: Callable[[], None] | None) -> dict[str, Any]:
        concurrency = self._settings.concurrency
        guided_field = await self._guided_decoding_field()
        if guided_field is not None:
            body = with_guided_decoding(body, guided_field)
        if concurrency.scheduling_policy == "priority":
            # vLLM serves its waiting queue by this value; under fcfs it would ignore the field, so it is
            # only ever added here, and bodies stay olmOCR's byte for byte otherwise.
            body = with_priority(body, concurrency.priority)
        # The retry loop runs as its own task so an opening breaker can cut short a backoff sleep or
        # a hung request at once instead of letting every caller wait out its budget.
        work = asyncio.ensure_future(
            self._hedger.race(
                lambda: CallState(self._clock()), lambda call: self._complete_with_retries(body, call), on_hedge
            )
        )
        try:
            await asyncio.wait({work, self._outage.opened()}, return_when=asyncio.FIRST_COMPLETED)
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

    async def _complete_with_retries(self, body: bytes, call: CallState) -> dict[str, Any]:
        retrying = AsyncRetrying(
            stop=lambda state: self._should_stop(state, call),
            wait=lambda state: self._backoff(state, call),
            retry=retry_if_exception_type(Retryable),
            before_sleep=lambda state: self._count_retry(state, call),
            sleep=self._sleep,
            reraise=True,
        )
        try:
            return await retrying(self._attempt, body, call)
        except Retryable as exc:
            if self._breaker.is_open:
                raise ServerUnavailable(self._breaker.open_message or "") from None
            self._outcomes["budget_exhausted"] += 1
            raise AttemptFailed(
                f"transport: {exc.message} (retry budget of {self._settings.retries.request_retry_budget_s:g} s spent)"
            ) from None
        finally:
            self._breaker.call_finished(call)
            self._outage.watch()

    def _should_stop(self, state: RetryCallState, call: CallState) -> bool:
        if self._breaker.is_open:
            return True
        spent = self._clock() - call.started + state.upcoming_sleep
        if spent < self._settings.retries.request_retry_budget_s:
            return False
        # Give up on this page only if the server demonstrably works (it answered a request or a probe
        # since our previous attempt started); otherwise this may be an outage, which the breaker
        # must decide.
        return self._breaker.alive_since(call.previous_attempt_started)

    def _backoff(self, state: RetryCallState, call: CallState) -> float:
        exc = state.outcome.exception() if state.outcome is not None else None
        if self._replicas.candidates(call.failed_replicas, self._clock(), strict=True):
            # Another replica has not failed this call yet: try it now, the failure was local.
            return 0.0
        call.failed_replicas.clear()
        call.backoff_rounds += 1
        retry_after = exc.retry_after if isinstance(exc, Retryable) else None
        return backoff_delay(self._settings.retries, call.backoff_rounds, retry_after)

    def _count_retry(self, state: RetryCallState, call: CallState) -> None:
        call.backing_off = True
        self._retries += 1
        exc = state.outcome.exception() if state.outcome is not None else None
        log.debug("retrying in %.2f s after %s", state.upcoming_sleep, exc)

    async def _trace_delivery(self, call: CallState, event: str, info: Mapping[str, Any]) -> None:
        """httpcore's connection events of one attempt: once its body is written (or the write failed
        and the server may answer anyway), the server may hold it."""
        if event.endswith((".send_request_body.complete", ".send_request_body.failed")):
            call.delivered_at, call.in_transit = self._clock(), False

    async def _attempt(self, body: bytes, call: CallState) -> dict[str, Any]:
        replica = self._replicas.pick(call.failed_replicas, self._clock())
        started = self._clock()
        call.previous_attempt_started = call.last_attempt_started
        call.last_attempt_started = started
        call.backing_off = False
        call.delivered_at, call.in_transit = None, self._traces_delivery
        replica.outstanding += 1
        replica.requests += 1
        self._requests += 1
        try:
            response = await self._http.post(
                replica.completions_url,
                content=body,
                headers=self._headers,
                extensions={"trace": functools.partial(self._trace_delivery, call)},
            )
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
        self, call: CallState, replica: Replica, started: float, response: httpx.Response
    ) -> dict[str, Any]:
        status = response.status_code
        if status == 429 or status >= 500:
            kind = "http_429" if status == 429 else "http_5xx"
            message = f"HTTP {status} from {replica.display}{self._snippet(response)}"
            failure = Retryable(kind, message, replica, retry_after_seconds(response))
            self._record_failure(call, replica, started, failure)
            raise failure
        # Whatever else it answered, the server is up: that is progress as far as outages go.
        self._breaker.success(self._clock())
        self._outage.watch()
        replica.answered()
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
        self._gpu_busy.count_tokens(replica, usage_tokens(payload))
        self._outcomes["ok"] += 1
        self._hedger.policy.record(self._clock() - started)
        return payload

    def _failed(self, call: CallState, replica: Replica, started: float, kind: str, exc: BaseException) -> Retryable:
        failure = Retryable(kind, f"{self._describe_exception(exc)} ({replica.display})", replica)
        self._record_failure(call, replica, started, failure)
        return failure

    def _record_failure(self, call: CallState, replica: Replica, started: float, failure: Retryable) -> None:
        self._outcomes[failure.kind] += 1
        replica.failed(failure.kind, self._clock())
        call.failed_replicas.add(replica)
        self._breaker.failure(call, started, failure.message, failure.kind)
        self._outage.watch()
        log.debug("request to %s failed: %s", replica.display, failure.message)

    # -- outage ----------------------------------------------------------------------------------

    async def _probe_server(self) -> str | None:
        """Is the server up although requests fail? Any replica listing the model says it is (None);
        otherwise, why none does."""
        timeout = httpx.Timeout(min(_PROBE_TIMEOUT_S, max(0.05, self._settings.retries.outage_window_s / 4)))
        results = await asyncio.gather(*(r.probe.probe(self._control_http, timeout) for r in self._replicas))
        if any(result.ready for result in results):
            return None
        return "; ".join(f"{r.display}: {res.detail}" for r, res in zip(self._replicas, results, strict=True))

    # -- helpers ---------------------------------------------------------------------------------

    def _describe_exception(self, exc: BaseException) -> str:
        text = str(exc) or repr(exc)
        return redact(f"{type(exc).__name__}: {text}", self._secrets)[:_ERROR_SNIPPET_CHARS]

    def _snippet(self, response: httpx.Response) -> str:
        text = response.text.strip().replace("\n", " ")
        if not text:
            return ""
        return ": " + redact(text, self._secrets)[:_ERROR_SNIPPET_CHARS]

    def _headers_without_body(self) -> dict[str, str]:
        return {key: value for key, value in self._headers.items() if key != "Content-Type"}

    # -- stats -----------------------------------------------------------------------------------

    def stats(self) -> ClientStats:
        return ClientStats(
            requests=self._requests,
            retries=self._retries,
            outcomes=dict(self._outcomes),
            in_flight=self._replicas.outstanding,
            slots_in_use=self._limiter.in_use,
            window=self._limiter.limit,
            window_mode=self._window.mode,
            breaker_open=self._breaker.is_open,
            replicas=self._replicas.stats(self._clock()),
            hedged=self._hedger.sent,
            probes_ok=self._breaker.probes_ok,
            probes_failed=self._breaker.probes_failed,
        )


def _consume_outcome(task: asyncio.Future[Any]) -> None:
    # A cancelled caller abandons its retry task; fetch its outcome so asyncio does not warn about it.
    if not task.cancelled():
        task.exception()
