"""Hedged requests: when a page's request is far slower than pages usually are, ask again.

vLLM deployments have requests that are accepted and never answered (a preemption loop, a hung
replica behind a load balancer, a connection a proxy keeps open). Waiting for the read timeout costs
minutes per such page and stalls a run's tail. The client therefore tracks how long answered
requests took (``LatencyTracker``, the last 512) and what the server is doing, and hedges a request
by one of two rules, both relative to the recent p95 answer time ``p``:

* **busy server** (requests wait in its queue): hedge once the request is ``multiple`` x ``p`` old
  (3 x p95). A request that waited in vLLM's queue looks old without being hung; while a queue stands
  its answer time is part of ``p`` already, and ``multiple`` leaves room for the queue to grow;
* **idle server** (nothing waits in vLLM's queue, or without ``/metrics`` the client's own window has
  room): every request the server holds is being generated, and generating one takes at most about
  ``p``. A request outstanding ``idle_multiple`` x ``p`` (1.25 x p95) after the later of its sending
  and the moment the queue emptied is therefore not queued but lost, and is hedged. This is the rule
  that shortens a run's tail: the pages still outstanding when the work runs out are hedged a little
  after they should have been answered, not minutes later.

Before ``MIN_SAMPLES`` answers were timed (the first pages of a run, a run of a few pages, an Airflow
convert instance with a short batch) there is no percentile yet, and a request hung then would wait
for the read timeout. The rule then uses what it has (**cold start**), the first that applies:

* some answers (fewer than ``MIN_SAMPLES``): ``COLD_MULTIPLE`` x ``hedge_multiple`` x the slowest of
  them. The first answers of a run are its fastest (requests sent together come back fastest first),
  so the multiple is twice the busy rule's;
* no answer at all: ``COLD_PRIOR_FRACTION`` of the read timeout. The read timeout is the operator's
  bound on a healthy answer; a quarter of it still leaves a GPU page of 20-40 s behind a queue room;

and at any time, cold or not, the server's own word (**lost request**): vLLM's gauges count every
request its engine holds, running or waiting. When two readings of ``/metrics`` taken at least
``LOST_CONFIRM_S`` apart, both at least ``LOST_SETTLE_S`` after a request was sent, say the server holds
no request at all, that request is not at the server (a proxy or load balancer holds it, a replica
dropped it): it is hedged at once. Other clients' work can only hide this (their requests count), never
fake it, and a request that finished between a reading and its answer is not old enough to be judged.

``max_hedges_per_request`` bounds the pages a request may have decoded at once. A request the server
says it does not hold costs it nothing, so past that bound the lost-request rule alone may send up to
as many hedges again: with 5 % of requests hung, one page in about 8,000 has its request and both
hedges hung, and would otherwise wait for the read timeout.

No rule fires before a request is ``min_delay_s`` old. The caller checks that the server has room
before it sends a hedge (``client``), so hedges take free capacity, never a queued page's place.

Pure: the caller reports latencies and the server's state with the time it observed them (an injected
clock), and asks when a request becomes worth hedging; no I/O.
"""

from __future__ import annotations

import bisect
import collections
import math

from olmocr_tasks.core.config import HedgeSettings

# Recent answers the percentile is taken over: long enough to be stable, short enough to follow a
# server whose speed changes (another run starting, a replica joining).
LATENCY_WINDOW = 512
# Answered requests needed before any hedge: the p95 of fewer is their maximum, which still bounds
# what a page takes; a batch of a dozen pages must be able to hedge its last one.
MIN_SAMPLES = 8
# Cold start: with a few answers, hedge at this many times the busy rule's multiple of the slowest one.
COLD_MULTIPLE = 2.0
# Cold start without any answer: hedge at this fraction of the read timeout (75 s of the default 300 s).
COLD_PRIOR_FRACTION = 0.25
# Lost request: the empty readings must start this long after the request was sent (vLLM's API server
# prepares a request, e.g. decodes its image, before its engine counts it) and span this long (a request
# whose generation ended just before a reading is answered milliseconds later, not a second).
LOST_SETTLE_S = 1.0
LOST_CONFIRM_S = 1.0
# Readings kept of the current run of empty ones: the first after a request's settling time and the
# last are all a judgement needs.
_EMPTY_READINGS = 16


class LatencyTracker:
    """Latencies of recently answered requests, for a high percentile."""

    def __init__(self, size: int = LATENCY_WINDOW) -> None:
        self._recent: collections.deque[float] = collections.deque(maxlen=size)

    def __len__(self) -> int:
        return len(self._recent)

    def record(self, seconds: float) -> None:
        if math.isfinite(seconds) and seconds >= 0:
            self._recent.append(seconds)

    def percentile(self, fraction: float) -> float | None:
        if not self._recent:
            return None
        ordered = sorted(self._recent)
        # Nearest rank: the smallest sample with at least ``fraction`` of the samples at or below it.
        rank = max(1, math.ceil(fraction * len(ordered)))
        return ordered[min(rank, len(ordered)) - 1]


class HedgePolicy:
    """When a request outstanding since some moment deserves a second one.

    ``read_timeout_s`` is the operator's bound on a healthy answer, which the cold-start rule uses
    before any answer was timed.
    """

    def __init__(self, settings: HedgeSettings, read_timeout_s: float, tracker: LatencyTracker | None = None) -> None:
        self.enabled = settings.hedge_requests and settings.max_hedges_per_request > 0
        self.max_hedges = settings.max_hedges_per_request
        # Hedges the lost-request rule alone may add past ``max_hedges`` (see the module's text).
        self.hedge_limit = 2 * self.max_hedges
        self._percentile = settings.hedge_percentile
        self._multiple = settings.hedge_multiple
        self._idle_multiple = settings.hedge_idle_multiple
        self._min_delay_s = settings.hedge_min_delay_s
        self._prior_s = COLD_PRIOR_FRACTION * read_timeout_s
        self.tracker = tracker or LatencyTracker()
        # Since when the server has had no queue (None while it has one, or before it was observed).
        self.idle_since: float | None = None
        # Times of the consecutive latest /metrics readings in which the server held no request at all.
        self._empty_readings: collections.deque[float] = collections.deque(maxlen=_EMPTY_READINGS)

    def record(self, seconds: float) -> None:
        self.tracker.record(seconds)

    def observe_server(self, idle: bool, now: float) -> None:
        """The server was seen ``idle`` (no request waiting in its queue) or busy at ``now``."""
        if not idle:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = now

    def observe_reading(self, holds_requests: bool, read_at: float) -> None:
        """A new reading of the server's gauges, taken at ``read_at``: does it hold any request at all
        (running or waiting, summed over the replicas)?"""
        if holds_requests:
            self._empty_readings.clear()
        elif not self._empty_readings or read_at > self._empty_readings[-1]:
            self._empty_readings.append(read_at)

    def lost_at(self, sent_at: float) -> float | None:
        """When the server's readings showed that a request sent at ``sent_at`` is not at the server
        (see the module's "lost request"), or None while they do not."""
        readings = list(self._empty_readings)
        first = bisect.bisect_left(readings, sent_at + LOST_SETTLE_S)
        if first == len(readings):
            return None
        confirmed = bisect.bisect_left(readings, readings[first] + LOST_CONFIRM_S, lo=first + 1)
        return readings[confirmed] if confirmed < len(readings) else None

    def typical(self) -> float | None:
        """The recent high percentile of answer times, or None without enough answers (or when off)."""
        if not self.enabled or len(self.tracker) < MIN_SAMPLES:
            return None
        return self.tracker.percentile(self._percentile)

    def delay(self) -> float | None:
        """Seconds after which an outstanding request is hedged while the server is busy."""
        high = self.typical()
        return None if high is None else max(self._min_delay_s, self._multiple * high)

    def due_at(
        self, sent_at: float, hedges_sent: int = 0, *, delivered_at: float | None = None, in_transit: bool = False
    ) -> float | None:
        """The moment the newest request of a page, sent at ``sent_at`` after ``hedges_sent`` hedges,
        becomes worth hedging, as far as known now: the earliest of the rules that apply (busy; idle
        while the server is idle; the cold-start rule before ``MIN_SAMPLES`` answers; lost request),
        past ``max_hedges`` the lost-request rule alone. None while hedging is off, the page has had
        ``hedge_limit`` hedges, or it has had ``max_hedges`` and the server has not said it is lost.

        The lost-request rule judges a request from ``delivered_at`` (its body fully written to the
        connection) when known, and not at all while it is ``in_transit``: on a loaded client, waiting
        for a connection or writing a large image can take longer than the rule's settling time, and
        the server cannot count a request it has not received yet."""
        if not self.enabled or hedges_sent >= self.hedge_limit:
            return None
        floor = sent_at + self._min_delay_s
        lost = None if in_transit else self.lost_at(sent_at if delivered_at is None else delivered_at)
        if hedges_sent >= self.max_hedges:
            return None if lost is None else max(floor, lost)
        high = self.typical()
        if high is not None:
            due = max(floor, sent_at + self._multiple * high)
            if self.idle_since is not None:
                due = min(due, max(floor, max(sent_at, self.idle_since) + self._idle_multiple * high))
        elif len(self.tracker):
            slowest = self.tracker.percentile(1.0)
            assert slowest is not None
            due = max(floor, sent_at + COLD_MULTIPLE * self._multiple * slowest)
        else:
            due = max(floor, sent_at + self._prior_s)
        if lost is not None:
            due = min(due, max(floor, lost))
        return due
