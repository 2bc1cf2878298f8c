"""One request body sent to the replicas until it is answered or its retry budget is spent.

Each attempt goes to the least busy replica this request has not failed on yet; its answer is
judged here: 429, 5xx and transport failures are retried (tenacity, with the backoff of
``request_retries``), anything else the server answered ends the request. Every outcome is fed to
whoever learns from it: the replica's cool-off, the outage breaker (kept on time by its watch), the
hedge policy's latency record and the GPU-busy meter. The counts of requests, retries and outcomes
are the client's statistics.
"""

from __future__ import annotations

import functools
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from olmocr_tasks.core.config import RetrySettings
from olmocr_tasks.core.errors import AttemptFailed, ServerMisconfigured, ServerUnavailable
from olmocr_tasks.inference.error_text import ErrorText
from olmocr_tasks.inference.gpu_busy import GpuBusyMeter
from olmocr_tasks.inference.hedging_policy import HedgePolicy
from olmocr_tasks.inference.outage_watch import OutageWatch
from olmocr_tasks.inference.replicas import Replica, ReplicaSet
from olmocr_tasks.inference.request_retries import CallState, Retryable, backoff_delay, retry_after_seconds
from olmocr_tasks.page.protocol import usage_tokens

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]


class RequestSender:
    """Sends request bodies with retries over ``replicas`` through ``http``.

    ``traces_delivery``: whether ``http``'s transport reports when a request's body has been written
    (httpx's own does; an injected one may not, and then hedging judges a request from when it was sent).
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        headers: Mapping[str, str],
        replicas: ReplicaSet,
        outage: OutageWatch,
        *,
        retries: RetrySettings,
        hedge_policy: HedgePolicy,
        gpu_busy: GpuBusyMeter,
        errors: ErrorText,
        clock: Callable[[], float],
        sleep: Sleep,
        traces_delivery: bool,
    ) -> None:
        self.http = http
        self._headers = dict(headers)
        self._replicas = replicas
        self._outage = outage
        self._breaker = outage.breaker
        self._retry_settings = retries
        self._hedge_policy = hedge_policy
        self._gpu_busy = gpu_busy
        self._errors = errors
        self._clock = clock
        self._sleep = sleep
        self._traces_delivery = traces_delivery
        self.requests = 0
        self.retries = 0
        self.outcomes: Counter[str] = Counter()

    async def send(self, body: bytes, call: CallState) -> dict[str, Any]:
        """The decoded JSON object of the 200 answer to ``body``; ``AttemptFailed`` once the budget is
        spent or the server's answer ends the request, ``ServerUnavailable`` once the breaker is open."""
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
            self.outcomes["budget_exhausted"] += 1
            raise AttemptFailed(
                f"transport: {exc.message} (retry budget of {self._retry_settings.request_retry_budget_s:g} s spent)"
            ) from None
        finally:
            self._breaker.call_finished(call)
            self._outage.watch()

    def _should_stop(self, state: RetryCallState, call: CallState) -> bool:
        if self._breaker.is_open:
            return True
        spent = self._clock() - call.started + state.upcoming_sleep
        if spent < self._retry_settings.request_retry_budget_s:
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
        return backoff_delay(self._retry_settings, call.backoff_rounds, retry_after)

    def _count_retry(self, state: RetryCallState, call: CallState) -> None:
        call.backing_off = True
        self.retries += 1
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
        self.requests += 1
        try:
            response = await self.http.post(
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
            self.outcomes["bad_body"] += 1
            raise AttemptFailed(f"unreadable answer: {self._errors.exception(exc)}") from None
        finally:
            replica.outstanding -= 1
        return self._handle_response(call, replica, started, response)

    def _handle_response(
        self, call: CallState, replica: Replica, started: float, response: httpx.Response
    ) -> dict[str, Any]:
        status = response.status_code
        if status == 429 or status >= 500:
            kind = "http_429" if status == 429 else "http_5xx"
            message = f"HTTP {status} from {replica.display}{self._errors.snippet(response)}"
            failure = Retryable(kind, message, replica, retry_after_seconds(response))
            self._record_failure(call, replica, started, failure)
            raise failure
        # Whatever else it answered, the server is up: that is progress as far as outages go.
        self._breaker.success(self._clock())
        self._outage.watch()
        replica.answered()
        if status in (401, 403):
            self.outcomes["auth"] += 1
            raise ServerMisconfigured(
                f"{replica.display} answered HTTP {status} to a completion request: the API key is missing or wrong"
            )
        if status != 200:
            self.outcomes["http_4xx"] += 1
            raise AttemptFailed(f"HTTP {status}{self._errors.snippet(response)}")
        try:
            payload = json.loads(response.content)
        except ValueError:
            self.outcomes["bad_json"] += 1
            raise AttemptFailed("HTTP 200 with a body that is not JSON") from None
        if not isinstance(payload, dict):
            self.outcomes["bad_json"] += 1
            raise AttemptFailed("HTTP 200 with a JSON body that is not an object")
        replica.successes += 1
        self._gpu_busy.count_tokens(replica, usage_tokens(payload))
        self.outcomes["ok"] += 1
        self._hedge_policy.record(self._clock() - started)
        return payload

    def _failed(self, call: CallState, replica: Replica, started: float, kind: str, exc: BaseException) -> Retryable:
        failure = Retryable(kind, f"{self._errors.exception(exc)} ({replica.display})", replica)
        self._record_failure(call, replica, started, failure)
        return failure

    def _record_failure(self, call: CallState, replica: Replica, started: float, failure: Retryable) -> None:
        self.outcomes[failure.kind] += 1
        replica.failed(failure.kind, self._clock())
        call.failed_replicas.add(replica)
        self._breaker.failure(call, started, failure.message, failure.kind)
        self._outage.watch()
        log.debug("request to %s failed: %s", replica.display, failure.message)
