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

This module keeps a page's way through them: its place in the window, its body, its race against hedges
and the outage. ``request_sender`` sends one request with its retries (their bookkeeping and backoff
live in ``request_retries``); each other policy lives in its own module, and ``client_factory`` builds
the client from ``ServerSettings``. The HTTP transport can be injected there (``transport``): unit tests
answer with ``httpx.MockTransport``.
The API key only ever travels in the ``Authorization`` header; exception texts and stats are redacted.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

from olmocr_tasks.core.config import ServerSettings
from olmocr_tasks.core.errors import ServerMisconfigured, ServerUnavailable
from olmocr_tasks.core.gpu_busy import GpuBusy
from olmocr_tasks.inference.backpressure import InFlightWindow, MetricsPoller
from olmocr_tasks.inference.gpu_busy import GpuBusyMeter
from olmocr_tasks.inference.guided import server_field, with_guided_decoding
from olmocr_tasks.inference.hedger import Hedger
from olmocr_tasks.inference.outage_watch import OutageWatch
from olmocr_tasks.inference.priority import with_priority
from olmocr_tasks.inference.readiness import check_ready
from olmocr_tasks.inference.replicas import COOLOFF_INITIAL_S, Replica, ReplicaSet, ReplicaStats
from olmocr_tasks.inference.request_retries import CallState
from olmocr_tasks.inference.request_sender import RequestSender

# Outage probes and the guided-decoding question ask what a live server answers at once, whatever its queue.
PROBE_TIMEOUT_S = 10.0

_slot_owner: contextvars.ContextVar[object | None] = contextvars.ContextVar("olmocr_slot_owner", default=None)


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


class InferenceClient:
    """Talks to the inference replicas for every document a process converts.

    Built by ``client_factory.build_client(settings)`` and used as ``async with build_client(settings) as
    client``; page workers take ``client.slot()`` before rendering a page and call ``complete()`` inside
    it, so rendering is bounded by the same window as requests and memory stays flat.

    ``control_http`` is the client of probes and ``/metrics`` polls, sent with ``headers`` (the
    credentials); pages go through ``sender``. ``poller`` reads ``/metrics`` for an adaptive window.
    """

    def __init__(
        self,
        settings: ServerSettings,
        *,
        replicas: ReplicaSet,
        control_http: httpx.AsyncClient,
        headers: Mapping[str, str],
        window: InFlightWindow,
        outage: OutageWatch,
        hedger: Hedger,
        poller: MetricsPoller | None,
        gpu_busy: GpuBusyMeter,
        sender: RequestSender,
        clock: Callable[[], float],
    ) -> None:
        self._settings = settings
        self._replicas = replicas
        self._control_http = control_http
        self._headers = dict(headers)
        self._window = window
        self._limiter = window.limiter
        self._outage = outage
        self._breaker = outage.breaker
        self._hedger = hedger
        self._poller = poller
        self._gpu_busy = gpu_busy
        self._sender = sender
        self._clock = clock
        # The field guided decoding travels in, chosen from the replicas' vLLM version before the first page.
        self._guided_field: str | None = None
        self._guided_lock = asyncio.Lock()
        self._closed = False

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
        await self._sender.http.aclose()
        await self._control_http.aclose()

    def _ensure_started(self) -> None:
        if self._closed:
            raise RuntimeError("InferenceClient is closed")
        if self._poller is not None:
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
                timeout = httpx.Timeout(PROBE_TIMEOUT_S)
                asked = replicas if replicas else list(self._replicas)
                fields = {
                    replica.display: await server_field(
                        self._control_http, replica.base_url, replica.display, self._headers, timeout
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
            self._hedger.race(lambda: CallState(self._clock()), lambda call: self._sender.send(body, call), on_hedge)
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
        self._sender.outcomes["unavailable"] += 1
        raise ServerUnavailable(self._breaker.open_message or "inference server unavailable")

    # -- stats -----------------------------------------------------------------------------------

    def stats(self) -> ClientStats:
        return ClientStats(
            requests=self._sender.requests,
            retries=self._sender.retries,
            outcomes=dict(self._sender.outcomes),
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
