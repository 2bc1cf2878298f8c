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

Neither rule fires before a request is ``min_delay_s`` old, nor before ``MIN_SAMPLES`` answers were
timed. The caller checks that the server has room before it sends a hedge (``client``), so hedges take
free capacity, never a queued page's place.

Pure: the caller reports latencies and the server's state with the time it observed them (an injected
clock), and asks when a request becomes worth hedging; no I/O.
"""

from __future__ import annotations

import collections
import math

from olmocr_tasks.config import ServerSettings

# Recent answers the percentile is taken over: long enough to be stable, short enough to follow a
# server whose speed changes (another run starting, a replica joining).
LATENCY_WINDOW = 512
# Answered requests needed before any hedge: the p95 of fewer is their maximum, which still bounds
# what a page takes; a batch of a dozen pages must be able to hedge its last one.
MIN_SAMPLES = 8


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
    """When a request outstanding since some moment deserves a second one (``ServerSettings.hedge_*``)."""

    def __init__(self, settings: ServerSettings, tracker: LatencyTracker | None = None) -> None:
        self.enabled = settings.hedge_requests and settings.max_hedges_per_request > 0
        self.max_hedges = settings.max_hedges_per_request
        self._percentile = settings.hedge_percentile
        self._multiple = settings.hedge_multiple
        self._idle_multiple = settings.hedge_idle_multiple
        self._min_delay_s = settings.hedge_min_delay_s
        self.tracker = tracker or LatencyTracker()
        # Since when the server has had no queue (None while it has one, or before it was observed).
        self.idle_since: float | None = None

    def record(self, seconds: float) -> None:
        self.tracker.record(seconds)

    def observe_server(self, idle: bool, now: float) -> None:
        """The server was seen ``idle`` (no request waiting in its queue) or busy at ``now``."""
        if not idle:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = now

    def typical(self) -> float | None:
        """The recent high percentile of answer times, or None without enough answers (or when off)."""
        if not self.enabled or len(self.tracker) < MIN_SAMPLES:
            return None
        return self.tracker.percentile(self._percentile)

    def delay(self) -> float | None:
        """Seconds after which an outstanding request is hedged while the server is busy."""
        high = self.typical()
        return None if high is None else max(self._min_delay_s, self._multiple * high)

    def due_at(self, sent_at: float) -> float | None:
        """The moment a request sent at ``sent_at`` becomes worth hedging, as far as known now: the
        earlier of the busy and the idle rule (the latter only while the server is idle). None while
        hedging is off or no latency distribution is known yet."""
        high = self.typical()
        if high is None:
            return None
        floor = sent_at + self._min_delay_s
        due = max(floor, sent_at + self._multiple * high)
        if self.idle_since is not None:
            due = min(due, max(floor, max(sent_at, self.idle_since) + self._idle_multiple * high))
        return due
