"""Sending hedges: a page's request races the second requests sent when it is slow; the first answer wins.

``hedging`` decides when a request deserves a hedge (pure, no I/O). This module acts on it: it
watches the newest request of a page, asks the policy when it becomes worth hedging, checks that the
server has room (``QueueView``), sends the hedge, and cancels whatever is still outstanding once one
request answers. What a request is (its retries, its replica) is the caller's: it passes a function
that sends one request and one that starts a request's bookkeeping.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

from olmocr_tasks.core.errors import AttemptFailed
from olmocr_tasks.inference.backpressure import InFlightWindow, target_waiting
from olmocr_tasks.inference.hedging_policy import HedgePolicy
from olmocr_tasks.inference.replicas import Replica
from olmocr_tasks.inference.vllm_metrics import QueueSample

log = logging.getLogger(__name__)


class Outstanding(Protocol):
    """What the hedger reads of a request in flight (``client``'s retry bookkeeping of one request)."""

    # When its latest attempt was sent: hedge timing counts from there.
    last_attempt_started: float
    # When that attempt's body reached its connection, and whether it is still on its way there.
    delivered_at: float | None
    in_transit: bool
    # Between a failed attempt and the next: no request of it is at the server, so nothing to hedge.
    backing_off: bool


Request = TypeVar("Request", bound=Outstanding)


def hedge_cap(window: int) -> int:
    """Hedges in flight at once: a quarter of the window, so hedging cannot double the load."""
    return max(1, window // 4)


class QueueView:
    """The server's queue as the hedger needs it: vLLM's ``/metrics`` readings of the replicas when
    they are read (adaptive window), the client's own in-flight window otherwise."""

    def __init__(self, replicas: Iterable[Replica], window: InFlightWindow, clock: Callable[[], float]) -> None:
        self._replicas = list(replicas)
        self._window = window
        self._clock = clock

    @property
    def ceiling(self) -> int:
        return self._window.controller.ceiling

    def _fresh_samples(self) -> list[QueueSample]:
        now = self._clock()
        return [r.sample for r in self._replicas if r.sample is not None and not r.cooling(now)]

    def idle(self) -> bool:
        """Is nothing waiting in the server's queue? vLLM's metrics say so when they are read; without
        them, a client whose window has room (and nobody waiting for it) has nothing queued anywhere."""
        samples = self._fresh_samples()
        limiter = self._window.limiter
        if self._window.adaptive and samples:
            return sum(s.waiting for s in samples) == 0
        return limiter.in_use < limiter.limit and limiter.waiting == 0

    def has_room(self) -> bool:
        """Does the server have spare capacity for a second request? Its queue says so when vLLM's
        metrics are read; otherwise a free place in the in-flight window does."""
        samples = self._fresh_samples()
        if self._window.adaptive and samples:
            return sum(s.waiting for s in samples) <= sum(target_waiting(s.running) for s in samples)
        limiter = self._window.limiter
        return limiter.in_use < limiter.limit

    def latest_reading(self) -> tuple[bool, float] | None:
        """Do the servers' latest /metrics readings hold any request at all, and since when (the oldest
        reading)? None until every replica was read (ours may be at any of them, a cooling one
        included), and without an adaptive window."""
        replicas = self._replicas
        if not self._window.adaptive or any(r.sample is None or r.sample_read_at is None for r in replicas):
            return None
        held = sum(r.sample.running + r.sample.waiting for r in replicas if r.sample is not None)
        read_at = min(r.sample_read_at for r in replicas if r.sample_read_at is not None)
        return held > 0, read_at


class Hedger:
    """Runs each page's request with its hedges, and counts the hedges for the client's stats.

    ``recheck_s`` is how often a waiting page looks again at the server (once per ``/metrics`` poll):
    its queue, and with it the rule that applies, may change.
    """

    def __init__(
        self,
        policy: HedgePolicy,
        queue: QueueView,
        clock: Callable[[], float],
        *,
        recheck_s: float,
    ) -> None:
        self.policy = policy
        self._queue = queue
        self._clock = clock
        self._recheck_s = recheck_s
        self.in_flight = 0
        self.sent = 0

    def _room(self) -> bool:
        return self.in_flight < hedge_cap(self._queue.ceiling) and self._queue.has_room()

    def _observe(self) -> None:
        self.policy.observe_server(self._queue.idle(), self._clock())
        reading = self._queue.latest_reading()
        if reading is not None:
            self.policy.observe_reading(*reading)

    async def race(
        self,
        start: Callable[[], Request],
        send: Callable[[Request], Awaitable[dict[str, Any]]],
        on_hedge: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """The request, plus a hedge whenever the newest request is outstanding past its hedge time
        (``HedgePolicy.due_at``) and the server has room; the first answer wins and the others are
        cancelled. ``start()`` makes a request's bookkeeping and ``send`` sends it; an
        ``AttemptFailed`` of one request leaves the others racing, any other error ends the race."""
        # The newest request: hedge timing counts from its latest attempt, and pauses while it backs
        # off after a failure (the server answered; a hedge then would only add load to it).
        newest = start()
        arms = {asyncio.ensure_future(send(newest))}
        hedges = 0
        failure: BaseException | None = None
        policy = self.policy
        try:
            while True:
                timeout: float | None = None
                hedge_now = False
                if policy.enabled and hedges < policy.hedge_limit:
                    self._observe()
                    sent_at = newest.last_attempt_started
                    due_at = (
                        None
                        if newest.backing_off
                        else policy.due_at(
                            sent_at, hedges, delivered_at=newest.delivered_at, in_transit=newest.in_transit
                        )
                    )
                    now = self._clock()
                    # Look again at least once per recheck: a request sent before the run's first
                    # answers is judged again by the rule they make possible; a server without room
                    # may get some.
                    timeout = self._recheck_s
                    if due_at is not None and due_at > now:
                        timeout = min(timeout, due_at - now)
                    elif due_at is not None and self._room():
                        hedge_now = True
                if not hedge_now:
                    done, _ = await asyncio.wait(arms, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                    for arm in done:
                        arms.discard(arm)
                        error = arm.exception()
                        if error is None:
                            return arm.result()
                        if not isinstance(error, AttemptFailed):
                            raise error
                        # This request failed; another still outstanding may yet answer.
                        failure = failure or error
                    if not arms:
                        assert failure is not None
                        raise failure
                    continue
                newest = start()
                arms.add(asyncio.ensure_future(self._hedge(send, newest)))
                hedges += 1
                if on_hedge is not None:
                    on_hedge()
        finally:
            for arm in arms:
                arm.cancel()
            await asyncio.gather(*arms, return_exceptions=True)

    async def _hedge(self, send: Callable[[Request], Awaitable[dict[str, Any]]], request: Request) -> dict[str, Any]:
        self.in_flight += 1
        self.sent += 1
        log.debug("hedging a slow request (recent p95 answer time %.2f s)", self.policy.typical() or 0.0)
        try:
            return await send(request)
        finally:
            self.in_flight -= 1
