"""When failing requests amount to an outage: a breaker over the client's request outcomes.

An outage means the server is down, not that some requests are slow. Requests that fail without an
answer from the server (timeouts, refused or dropped connections) are ambiguous: one hung request
looks the same as a dead server. So while such failures go on, the caller probes the server
(``/models``, short timeout) whenever ``probe_due()`` says so; a server that answers its probe is
alive, which stops the outage clock as a success does. Only a server that also fails its probes for
the outage window opens the breaker. Failures the server answers itself (5xx, 429) need no probe:
they are the server saying it cannot serve completions, and open the breaker after the window as
before.

Pure: no I/O and no event loop. The caller feeds it outcomes, runs the probes it asks for, calls
``check()`` when ``next_check_in()`` says a decision is due, and aborts its work once ``is_open``.
The clock is injected, so the decisions can be tested without waiting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable

log = logging.getLogger(__name__)

# Failure kinds the server itself answered; the others (no answer) are confirmed by probing.
ANSWERED_FAILURES = frozenset({"http_5xx", "http_429"})


class OutageBreaker:
    """Decides when failures amount to an outage.

    The outage clock starts at the first failure after the server was last known alive (at the start
    of that failed attempt, so a request that failed after hanging counts the time it hung). It runs
    only while some call keeps retrying: if every failing call ends without anyone succeeding (for
    instance cancelled), there is no more evidence and the clock stops. Any success stops it too, and
    so does a probe the server answers while the failures are ambiguous ones.
    """

    def __init__(
        self,
        window_s: float,
        clock: Callable[[], float],
        *,
        probe_interval_s: float | None = None,
    ) -> None:
        self.window_s = window_s
        self._clock = clock
        # Often enough that a live server is noticed long before the window ends.
        self.probe_interval_s = probe_interval_s if probe_interval_s is not None else min(15.0, window_s / 6)
        self.last_success_at: float | None = None
        # The last moment the server was shown to work: an answered request or an answered probe.
        self.last_alive_at: float | None = None
        self.failing_since: float | None = None
        self.last_error: str = ""
        self.open_message: str | None = None
        self.probes_ok = 0
        self.probes_failed = 0
        self._failing_calls: set[Hashable] = set()
        self._answered_failures = False
        self._probe_started: float | None = None
        self._last_probe_started: float | None = None
        self._last_failed_probe: float | None = None
        self._last_probe_error = ""
        self._warned = False
        # Transient 5xx happen; only a failing streak this old is worth a warning.
        self._warn_after_s = min(5.0, window_s / 10)

    @property
    def is_open(self) -> bool:
        return self.open_message is not None

    def alive_since(self, moment: float) -> bool:
        """Was the server shown to work (an answer, or an answered probe) at or after ``moment``?"""
        return self.last_alive_at is not None and self.last_alive_at >= moment

    def success(self, now: float) -> None:
        self.last_success_at = now
        self._alive(now, "requests succeed again")

    def failure(self, call: Hashable, started: float, error: str, kind: str = "") -> None:
        """``call`` (any hashable token of one logical request) failed an attempt begun at ``started``."""
        if self.is_open:
            return
        self.last_error = error
        self._failing_calls.add(call)
        if kind in ANSWERED_FAILURES:
            self._answered_failures = True
        if self.failing_since is None:
            since = started
            if self.last_alive_at is not None:
                since = max(since, self.last_alive_at)
            self.failing_since = since
        self.check()

    def call_finished(self, call: Hashable) -> None:
        self._failing_calls.discard(call)
        if not self._failing_calls and self.failing_since is not None and not self.is_open:
            self._stop_clock()

    # -- probes ----------------------------------------------------------------------------------

    def probe_due(self) -> bool:
        """Should the caller probe the server now? (Then ``probe_started()``, and later one of
        ``probe_answered()`` / ``probe_failed()``.)"""
        if self.failing_since is None or self.is_open or self._answered_failures or self._probe_started is not None:
            return False
        last = self._last_probe_started
        return last is None or last < self.failing_since or self._clock() - last >= self.probe_interval_s

    def probe_started(self) -> float:
        now = self._clock()
        self._probe_started = self._last_probe_started = now
        return now

    def probe_answered(self) -> None:
        self._probe_started = None
        self.probes_ok += 1
        if self.is_open:
            return
        if self._answered_failures:
            # The server answers /models yet fails completions with errors: not evidence of health.
            return
        self._alive(self._clock(), "it answers its readiness probe, so the failures are slow requests")

    def probe_failed(self, error: str) -> None:
        started = self._probe_started
        self._probe_started = None
        self.probes_failed += 1
        self._last_failed_probe = started
        self._last_probe_error = error
        self.check()

    # -- decisions -------------------------------------------------------------------------------

    def check(self) -> bool:
        """Decide now (warn, open); returns whether the breaker is open."""
        if self.failing_since is None or self.is_open:
            return self.is_open
        elapsed = self._clock() - self.failing_since
        if not self._warned and elapsed >= self._warn_after_s:
            self._warned = True
            log.warning(
                "inference server failing for %.1f s (last error: %s); aborting if it stays down for "
                "the %.0f s outage window",
                elapsed,
                self.last_error,
                self.window_s,
            )
        if elapsed >= self.window_s and self._confirmed():
            self._open(elapsed)
        return self.is_open

    def next_check_in(self) -> float | None:
        """Seconds until ``check()`` or a probe is due (backoff sleeps and hung requests produce no
        events), or None while there is nothing to decide (clock stopped, or a probe's answer awaited)."""
        if self.failing_since is None or self.is_open:
            return None
        now = self._clock()
        elapsed = now - self.failing_since
        waits: list[float] = []
        if not self._warned:
            waits.append(max(0.0, self._warn_after_s - elapsed))
        if elapsed < self.window_s:
            waits.append(self.window_s - elapsed)
        if not self._answered_failures and self._probe_started is None:
            last = self._last_probe_started
            if last is None or last < self.failing_since:
                waits.append(0.0)
            else:
                waits.append(max(0.0, last + self.probe_interval_s - now))
        return min(waits) if waits else None

    def _confirmed(self) -> bool:
        """Is the streak an outage rather than slow requests?"""
        if self._answered_failures:
            return True
        # A recent probe begun during this streak failed, and none answered since (that would have
        # reset the streak). A stale verdict does not count: a fresh probe is due first.
        failed = self._last_failed_probe
        if failed is None or self.failing_since is None:
            return False
        return failed >= self.failing_since and self._clock() - failed <= 2 * self.probe_interval_s

    def _alive(self, now: float, why: str) -> None:
        self.last_alive_at = now
        if self.failing_since is not None:
            if self._warned:
                log.warning("inference server is up: %s (after %.1f s of failures)", why, now - self.failing_since)
            self._stop_clock()
        self._failing_calls.clear()

    def _stop_clock(self) -> None:
        self.failing_since = None
        self._warned = False
        self._answered_failures = False

    def _open(self, elapsed: float) -> None:
        probes = f"; readiness probes failed too ({self._last_probe_error})" if not self._answered_failures else ""
        self.open_message = (
            f"inference server unavailable: no request succeeded for {elapsed:.1f} s "
            f"(outage window {self.window_s:g} s); last error: {self.last_error}{probes}"
        )
        log.error("%s; aborting pending requests", self.open_message)
