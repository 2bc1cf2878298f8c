"""When failing requests amount to an outage: a breaker over the client's request outcomes.

Pure: no I/O and no event loop. The caller feeds it outcomes with the times they happened, asks
``check()`` when ``next_check_in()`` says a decision is due, and aborts its work once ``is_open``.
The clock is injected, so the decisions can be tested without waiting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable

log = logging.getLogger(__name__)


class OutageBreaker:
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
        self._failing_calls: set[Hashable] = set()
        self._warned = False
        # Transient 5xx happen; only a failing streak this old is worth a warning.
        self._warn_after_s = min(5.0, window_s / 10)

    @property
    def is_open(self) -> bool:
        return self.open_message is not None

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

    def failure(self, call: Hashable, started: float, error: str) -> None:
        """``call`` (any hashable token of one logical request) failed an attempt begun at ``started``."""
        if self.is_open:
            return
        self.last_error = error
        self._failing_calls.add(call)
        if self.failing_since is None:
            since = started
            if self.last_success_at is not None:
                since = max(since, self.last_success_at)
            self.failing_since = since
        self.check()

    def call_finished(self, call: Hashable) -> None:
        self._failing_calls.discard(call)
        if not self._failing_calls and self.failing_since is not None and not self.is_open:
            self._stop_clock()

    def check(self) -> bool:
        """Decide now (warn, open); returns whether the breaker is open."""
        if self.failing_since is None or self.is_open:
            return self.is_open
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
        return self.is_open

    def next_check_in(self) -> float | None:
        """Seconds until ``check()`` has a decision to make (backoff sleeps and hung requests produce
        no events), or None while the outage clock is stopped."""
        if self.failing_since is None or self.is_open:
            return None
        elapsed = self._clock() - self.failing_since
        due = self.window_s if self._warned else min(self._warn_after_s, self.window_s)
        return max(0.0, due - elapsed)

    def _stop_clock(self) -> None:
        self.failing_since = None
        self._warned = False

    def _open(self, elapsed: float) -> None:
        self.open_message = (
            f"inference server unavailable: no request succeeded for {elapsed:.1f} s "
            f"(outage window {self.window_s:g} s); last error: {self.last_error}"
        )
        log.error("%s; aborting pending requests", self.open_message)
