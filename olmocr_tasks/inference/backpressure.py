"""Adaptive concurrency: size the in-flight window from the inference server's own queue.

olmOCR bounds in-flight requests with one fixed number, so several runs sharing a server each push
their full quota and vLLM's waiting queue grows without bound (olmOCR issue #317). Here every client
reads vLLM's ``/metrics`` and runs an AIMD controller over its window: grow while the server's waiting
queue is short, shrink multiplicatively when it passes a high-water mark. Independent clients doing
this converge on a short, non-empty queue, which keeps the GPU fed without piling up requests, and
share the server about equally (AIMD converges to equal windows).

Priority classes (``priority``) meet the window here. Under vLLM's ``--scheduling-policy priority`` the
server serves the waiting queue by class, so a high-priority request passes every lower one queued;
lower classes keep backing off on the whole queue, which now includes the high class's requests, so
they give way while high-priority work waits. A client of the highest class does not shrink for a queue
it is served ahead of (``served_first``). Under ``fcfs`` every class backs off alike.

Here are the controller and the resizable limiter it adjusts (both pure), and the poller that reads
``/metrics`` and feeds the controller (``vllm_metrics`` parses the text) and the GPU-busy meter
(``gpu_busy``) that the manifest's cost is computed from.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx

from olmocr_tasks.inference.gpu_busy import GpuBusyMeter
from olmocr_tasks.inference.vllm_metrics import MetricsFormatError, QueueSample, parse_vllm_sample

log = logging.getLogger(__name__)

_METRICS_TIMEOUT_S = 5.0


def target_waiting(running: float) -> float:
    """The queue depth worth keeping per replica: enough that a finished sequence is replaced at once."""
    return max(2.0, 0.25 * running)


def high_water(running: float) -> float:
    """Above this many waiting requests per replica the window shrinks."""
    target = target_waiting(running)
    return max(2.0 * target, target + 4.0)


class AimdController:
    """Additive-increase / multiplicative-decrease over the in-flight window.

    Starts with slow start (doubling) until the first decrease, as TCP does, so a lone client reaches
    its ceiling in a few polls; after a decrease it grows by a fixed step. A decrease is followed by
    a hold-off of a few polls because the queue answers a smaller window only as running sequences
    finish, and reacting again before then would collapse the window to the floor.
    """

    def __init__(
        self,
        floor: int,
        ceiling: int,
        initial: int | None = None,
        *,
        decrease_factor: float = 0.7,
        holdoff_polls: int = 2,
        served_first: bool = False,
    ) -> None:
        self.floor = max(1, min(floor, ceiling))
        self.ceiling = max(1, ceiling)
        start = initial if initial is not None else max(self.floor, self.ceiling // 4)
        self.window = min(self.ceiling, max(self.floor, start))
        self._step = max(1, self.ceiling // 16)
        self._decrease_factor = decrease_factor
        self._holdoff_polls = holdoff_polls
        self._holdoff = 0
        self._slow_start = True
        # Under vLLM's priority scheduling, a client of the highest class is served before whatever
        # waits in the queue: the queue is other classes' and it must not shrink for it (they do).
        self._served_first = served_first

    def update(self, samples: Iterable[QueueSample], demand: int) -> int:
        """Fold one round of per-replica samples into the window and return it.

        ``demand`` is this client's slots in use plus acquirers waiting: growing a window the client
        does not fill would only let a later burst land on the server all at once.
        """
        samples = list(samples)
        if not samples:
            return self.window
        waiting = 0.0 if self._served_first else sum(sample.waiting for sample in samples)
        target = sum(target_waiting(sample.running) for sample in samples)
        ceiling_waiting = sum(high_water(sample.running) for sample in samples)
        if self._holdoff > 0:
            self._holdoff -= 1
        if waiting > ceiling_waiting:
            if self._holdoff == 0:
                self.window = max(self.floor, math.floor(self.window * self._decrease_factor))
                self._holdoff = self._holdoff_polls
                self._slow_start = False
        elif waiting < target and demand >= self.window:
            grown = self.window * 2 if self._slow_start else self.window + self._step
            self.window = min(self.ceiling, grown)
        elif demand >= self.window and self._holdoff == 0:
            # Inside the band: probe by one request. Holding still would freeze whatever split of the
            # server clients happen to have (one run at 9, a later one at its floor of 4, forever);
            # probing brings the queue back to the high-water mark now and then, where every client
            # shrinks by the same factor, which is what evens their windows out.
            self.window = min(self.ceiling, self.window + 1)
        return self.window


class AdaptiveLimiter:
    """A FIFO semaphore whose limit can move while slots are held.

    Lowering the limit never interrupts holders: new acquisitions wait until enough slots are
    released. Raising it wakes waiters at once.
    """

    def __init__(self, limit: int) -> None:
        self._limit = max(1, limit)
        self._in_use = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def in_use(self) -> int:
        return self._in_use

    @property
    def waiting(self) -> int:
        return sum(1 for waiter in self._waiters if not waiter.done())

    def set_limit(self, limit: int) -> None:
        self._limit = max(1, limit)
        self._wake()

    async def acquire(self) -> None:
        if self._in_use < self._limit and not self._waiters:
            self._in_use += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        # Waiters already handed a slot stay queued until they resume; a free slot must not wait for that.
        self._wake()
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                # The slot was handed over just as we were cancelled: pass it on.
                self._in_use -= 1
                self._wake()
            else:
                waiter.cancel()
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    def release(self) -> None:
        if self._in_use <= 0:
            raise RuntimeError("release() without acquire()")
        self._in_use -= 1
        self._wake()

    def _wake(self) -> None:
        for waiter in self._waiters:
            if self._in_use >= self._limit:
                break
            if not waiter.done():
                # Count the slot as taken now so a concurrent fast-path acquire cannot steal it.
                self._in_use += 1
                waiter.set_result(None)


def metrics_url_for(base_url: str) -> str:
    """vLLM serves ``/metrics`` at the root while the API lives under ``/v1``; keep any proxy prefix."""
    parts = urlsplit(base_url.rstrip("/"))
    path = parts.path
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return urlunsplit((parts.scheme, parts.netloc, path + "/metrics", "", ""))


class MetricsSource(Protocol):
    """A replica as the poller sees it: where its metrics are and the last sample read there."""

    metrics_url: str
    sample: QueueSample | None
    # The poller's clock when ``sample`` was read (hedging judges a request by readings taken after it).
    sample_read_at: float | None
    metrics_absent: bool


class InFlightWindow:
    """The client's in-flight window: a limiter, sized by the AIMD controller while adaptive."""

    def __init__(self, *, floor: int, ceiling: int, adaptive: bool, served_first: bool = False) -> None:
        self.controller = AimdController(floor=floor, ceiling=max(1, ceiling), served_first=served_first)
        self.adaptive = adaptive
        self.limiter = AdaptiveLimiter(self.controller.window if adaptive else self.controller.ceiling)

    @property
    def mode(self) -> str:
        return "adaptive" if self.adaptive else "fixed"

    def fold(self, samples: Sequence[QueueSample]) -> int:
        """Resize the window from one round of samples; returns the new limit."""
        demand = self.limiter.in_use + self.limiter.waiting
        before = self.controller.window
        window = self.controller.update(samples, demand)
        if window != before:
            log.debug("in-flight window %d -> %d (%s)", before, window, samples)
            self.limiter.set_limit(window)
        return self.limiter.limit

    def use_fixed(self, why: str) -> None:
        self.adaptive = False
        self.limiter.set_limit(self.controller.ceiling)
        log.info("%s; using a fixed window of %d requests", why, self.controller.ceiling)


class MetricsPoller:
    """Reads every replica's ``/metrics`` each ``interval_s`` and folds the queues into the window.

    A server without vLLM's queue gauges turns the window fixed at its ceiling, once. Every sample also
    goes to ``meter`` (when given) with the ``clock`` time it was read at. ``start()`` polls in a task
    of the running loop until ``stop()``; ``describe`` words an exception of that task for the log.
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        sources: Sequence[MetricsSource],
        window: InFlightWindow,
        *,
        interval_s: float,
        headers: dict[str, str],
        keep_going: Callable[[], bool],
        meter: GpuBusyMeter | None = None,
        clock: Callable[[], float] = time.monotonic,
        describe: Callable[[BaseException], str] = repr,
    ) -> None:
        self._http = http
        self._sources = sources
        self._window = window
        self._interval_s = interval_s
        self._headers = headers
        self._keep_going = keep_going
        self._meter = meter
        self._clock = clock
        self._describe = describe
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run(), name="olmocr-metrics-poller")
            self._task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        # A bug in the poller must not freeze the window at whatever size it had.
        if not task.cancelled() and task.exception() is not None:
            log.warning("adaptive concurrency stopped: %s", self._describe(task.exception()))
            self._window.use_fixed("adaptive concurrency failed")
            if self._meter is not None:
                self._meter.interrupt()

    async def stop(self) -> bool:
        """Stop polling; returns whether it was still polling until now."""
        task = self._task
        if task is None or task.done():
            return False
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return True

    async def read_all(self) -> None:
        """One reading of every replica, outside the polling rhythm."""
        await asyncio.gather(*(self.fetch(source) for source in self._sources))

    async def run(self) -> None:
        while self._keep_going():
            results = await asyncio.gather(*(self.fetch(source) for source in self._sources))
            if all(source.metrics_absent for source in self._sources):
                self._window.use_fixed("the inference server exposes no vLLM queue metrics")
                break
            self._window.fold([sample for sample in results if sample is not None])
            await asyncio.sleep(self._interval_s)
        # Polling ended while the work goes on (outage, metrics gone): the busy time is incomplete.
        if self._meter is not None:
            self._meter.interrupt()

    async def fetch(self, source: MetricsSource) -> QueueSample | None:
        # The server's state as of no earlier than this moment: a reading is dated by when it was
        # asked for, so a slow answer (a loaded client or server) never makes it look newer than it is.
        asked_at = self._clock()
        try:
            response = await self._http.get(
                source.metrics_url, headers=self._headers, timeout=httpx.Timeout(_METRICS_TIMEOUT_S, pool=None)
            )
        except (httpx.HTTPError, OSError):
            # The replica may be restarting; the request path deals with that, the window holds.
            return None
        if response.status_code in (404, 405, 501):
            source.metrics_absent = True
            return None
        if response.status_code != 200:
            return None
        try:
            sample = parse_vllm_sample(response.text)
        except MetricsFormatError:
            source.metrics_absent = True
            return None
        if self._meter is not None:
            self._meter.observe(source, self._clock(), sample)
        source.metrics_absent = False
        source.sample = sample.queue
        source.sample_read_at = asked_at
        return sample.queue
