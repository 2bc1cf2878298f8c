"""Hedged requests: when a page's request is far slower than pages usually are, ask again.

vLLM deployments have requests that are accepted and never answered (a preemption loop, a hung
replica behind a load balancer, a connection a proxy keeps open). Waiting for the read timeout costs
minutes per such page and stalls a run's tail. The client therefore tracks how long answered
requests took; a request outstanding for ``multiple`` times a recent high percentile (and never less
than ``min_delay_s``, so that long pages of up to 8,000 tokens are not hedged early) gets a second
request for the same page, if the server has room. The first answer wins; the other is cancelled.

Pure: the caller reports latencies and asks for the delay; no I/O, no clock.
"""

from __future__ import annotations

import collections
import math

from olmocr_tasks.config import ServerSettings

# Recent answers the percentile is taken over: long enough to be stable, short enough to follow a
# server whose speed changes (another run starting, a replica joining).
LATENCY_WINDOW = 512
# Answered requests needed before any hedge: a percentile of three samples says nothing.
MIN_SAMPLES = 20


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
    """When a request outstanding this long deserves a second one (``ServerSettings.hedge_*``)."""

    def __init__(self, settings: ServerSettings, tracker: LatencyTracker | None = None) -> None:
        self.enabled = settings.hedge_requests and settings.max_hedges_per_request > 0
        self.max_hedges = settings.max_hedges_per_request
        self._percentile = settings.hedge_percentile
        self._multiple = settings.hedge_multiple
        self._min_delay_s = settings.hedge_min_delay_s
        self.tracker = tracker or LatencyTracker()

    def record(self, seconds: float) -> None:
        self.tracker.record(seconds)

    def delay(self) -> float | None:
        """Seconds after which an outstanding request is hedged, or None while hedging is off or the
        latency distribution is not known yet."""
        if not self.enabled or len(self.tracker) < MIN_SAMPLES:
            return None
        high = self.tracker.percentile(self._percentile)
        if high is None:
            return None
        return max(self._min_delay_s, self._multiple * high)
