"""One request's retries: the failures another attempt may fix, the request's bookkeeping across
its attempts, and how long to wait before the next (jittered exponential backoff honouring a
server's ``Retry-After``). The retry loop itself (tenacity) runs in ``client``."""

from __future__ import annotations

import email.utils
import math
import random
import time

import httpx

from olmocr_tasks.core.config import RetrySettings
from olmocr_tasks.inference.replicas import Replica


class Retryable(Exception):
    """An attempt failed in a way another attempt may fix (server side or network)."""

    def __init__(self, kind: str, message: str, replica: Replica, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.replica = replica
        self.retry_after = retry_after


class CallState:
    """Bookkeeping of one request (a page's, or one of its hedges) across its attempts."""

    __slots__ = (
        "backing_off",
        "backoff_rounds",
        "delivered_at",
        "failed_replicas",
        "in_transit",
        "last_attempt_started",
        "previous_attempt_started",
        "started",
    )

    def __init__(self, started: float) -> None:
        self.started = started
        self.last_attempt_started = started
        self.previous_attempt_started = started
        self.failed_replicas: set[Replica] = set()
        self.backoff_rounds = 0
        # Between a failed attempt and the next: no request of this call is at the server.
        self.backing_off = False
        # When the latest attempt's body was fully written to its connection (None: not known, e.g. a
        # transport that does not trace), and whether it is still being sent (waiting for a pooled
        # connection, connecting, writing): until then the server cannot hold it, so its absence from
        # the server's gauges says nothing about it being lost.
        self.delivered_at: float | None = None
        self.in_transit = False


def backoff_delay(settings: RetrySettings, rounds: int, retry_after: float | None = None) -> float:
    """Jittered exponential backoff for the ``rounds``-th wait of a call (1-based), never above
    ``backoff_max_s``; a server's ``Retry-After`` lengthens it up to that cap."""
    ceiling = min(settings.backoff_max_s, settings.backoff_initial_s * 2 ** min(rounds - 1, 32))
    delay = ceiling / 2 + random.uniform(0, ceiling / 2)
    if retry_after is not None:
        delay = max(delay, min(retry_after, settings.backoff_max_s))
    return delay


def retry_after_seconds(response: httpx.Response) -> float | None:
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
