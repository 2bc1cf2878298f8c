"""The outage breaker (``olmocr_tasks.inference.outage_policy``) on a fake clock, and its event-loop side
(``olmocr_tasks.inference.outage_watch``) with a probe the test answers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from olmocr_tasks.inference.outage_policy import OutageBreaker
from olmocr_tasks.inference.outage_watch import OutageWatch
from tests.fixtures.clock import FakeClock

pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")


def run(coro: Awaitable[T]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, 45)

    return asyncio.run(bounded())


# -- the breaker alone ---------------------------------------------------------------------------


def test_breaker_hung_requests_on_a_server_that_answers_its_probes_are_no_outage() -> None:
    clock = FakeClock()
    breaker = OutageBreaker(window_s=180, clock=clock, probe_interval_s=15)
    breaker.success(clock.now)
    for _ in range(20):
        # A request hung for its whole 300-s read timeout: far past the window, yet no verdict
        # without a probe.
        clock.advance(300)
        breaker.failure("page", started=clock.now - 300, error="ReadTimeout", kind="timeout")
        assert not breaker.is_open
        assert breaker.probe_due() and breaker.next_check_in() == 0.0
        breaker.probe_started()
        assert not breaker.probe_due()  # one probe at a time
        clock.advance(0.01)
        breaker.probe_answered()
        assert breaker.failing_since is None and breaker.alive_since(clock.now)
    assert not breaker.is_open and breaker.probes_ok == 20


def test_breaker_opens_when_the_probes_fail_for_the_window() -> None:
    clock = FakeClock()
    breaker = OutageBreaker(window_s=180, clock=clock, probe_interval_s=15)
    breaker.failure("page", started=clock.now, error="ConnectError", kind="connect")
    probes = 0
    while not breaker.is_open:
        if breaker.probe_due():
            breaker.probe_started()
            breaker.probe_failed("ConnectError")
            probes += 1
        wait = breaker.next_check_in()
        assert wait is not None and 0 < wait <= 15
        clock.advance(wait)
        breaker.check()
    assert clock.now - 1000.0 == pytest.approx(180)
    assert probes == 12  # one at the start, then one every 15 s until the window ends
    assert "readiness probes failed too (ConnectError)" in (breaker.open_message or "")


def test_breaker_answered_errors_open_without_probes() -> None:
    clock = FakeClock()
    breaker = OutageBreaker(window_s=60, clock=clock)
    breaker.failure("page", started=clock.now, error="HTTP 503", kind="http_5xx")
    assert not breaker.probe_due()
    clock.advance(59)
    assert not breaker.check()
    breaker.probe_answered()  # /models answering does not make failing completions healthy
    clock.advance(1)
    assert breaker.check()


def test_breaker_stale_probe_confirms_nothing() -> None:
    clock = FakeClock()
    breaker = OutageBreaker(window_s=10, clock=clock, probe_interval_s=2)
    breaker.failure("first", started=clock.now, error="ConnectError", kind="connect")
    breaker.probe_started()
    breaker.probe_failed("ConnectError")
    breaker.call_finished("first")  # the failing call gave up: the clock stops
    clock.advance(5)
    breaker.failure("second", started=clock.now - 20, error="ReadTimeout", kind="timeout")
    # Past the window (the hung request counts the time it hung), but the only failed probe is
    # stale: a fresh one decides.
    assert not breaker.check()
    assert breaker.probe_due()
    breaker.probe_started()
    breaker.probe_answered()
    assert not breaker.is_open and breaker.failing_since is None


def test_breaker_warns_once_a_streak_is_old_and_success_stops_the_clock() -> None:
    clock = FakeClock()
    breaker = OutageBreaker(window_s=100, clock=clock)
    breaker.failure("page", started=clock.now, error="HTTP 502", kind="http_5xx")
    # The warning is due after min(5, window / 10) s; the decision at the window's end.
    assert breaker.next_check_in() == pytest.approx(5.0)
    clock.advance(5)
    breaker.check()
    assert breaker.next_check_in() == pytest.approx(95.0)
    breaker.success(clock.now)
    assert breaker.failing_since is None and breaker.next_check_in() is None
    assert breaker.last_success_at == clock.now and not breaker.is_open


def test_breaker_clock_stops_when_every_failing_call_ends() -> None:
    clock = FakeClock()
    breaker = OutageBreaker(window_s=10, clock=clock)
    breaker.failure("a", started=clock.now, error="HTTP 503", kind="http_5xx")
    breaker.failure("b", started=clock.now, error="HTTP 503", kind="http_5xx")
    breaker.call_finished("a")
    assert breaker.failing_since is not None  # "b" still retries: the evidence goes on
    breaker.call_finished("b")
    assert breaker.failing_since is None
    clock.advance(60)
    assert not breaker.check()


def test_breaker_streak_counts_from_the_last_sign_of_life() -> None:
    clock = FakeClock()
    breaker = OutageBreaker(window_s=30, clock=clock)
    breaker.success(clock.now)
    clock.advance(10)
    # An attempt begun before the last success cannot date the outage earlier than that success.
    breaker.failure("page", started=clock.now - 100, error="HTTP 500", kind="http_5xx")
    assert breaker.failing_since == clock.now - 10
    assert breaker.alive_since(clock.now - 10) and not breaker.alive_since(clock.now - 9)


# -- the watch: timers and probes on a running event loop ----------------------------------------


class Probe:
    """A probe the test answers: None (the server answered), a failure text, or an exception."""

    def __init__(self, verdict: str | BaseException | None) -> None:
        self.verdict = verdict
        self.calls = 0

    async def __call__(self) -> str | None:
        self.calls += 1
        if isinstance(self.verdict, BaseException):
            raise self.verdict
        return self.verdict


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.005)


def test_watch_opens_the_breaker_when_probes_keep_failing_and_announces_it() -> None:
    async def scenario() -> tuple[OutageBreaker, Probe, bool]:
        breaker = OutageBreaker(window_s=0.3, clock=time.monotonic, probe_interval_s=0.05)
        probe = Probe("connection refused")
        watch = OutageWatch(breaker, probe)
        opened = watch.opened()
        # One hung request and nothing else: no outcome will wake the breaker, the watch's timers must.
        breaker.failure("page", started=time.monotonic(), error="ReadTimeout", kind="timeout")
        watch.watch()
        await opened
        already = watch.opened().done()
        await watch.aclose()
        return breaker, probe, already

    breaker, probe, already = run(scenario())
    assert breaker.is_open and already
    assert probe.calls >= 2 and breaker.probes_failed == probe.calls
    assert "readiness probes failed too (connection refused)" in (breaker.open_message or "")


def test_watch_a_probe_the_server_answers_stops_the_outage_clock() -> None:
    async def scenario() -> tuple[OutageBreaker, Probe, bool]:
        breaker = OutageBreaker(window_s=0.2, clock=time.monotonic, probe_interval_s=0.05)
        probe = Probe(None)
        watch = OutageWatch(breaker, probe)
        breaker.failure("page", started=time.monotonic(), error="ReadTimeout", kind="timeout")
        watch.watch()
        await _until(lambda: breaker.probes_ok == 1)
        # Past the window: still closed, nothing left to decide, no further probe.
        await asyncio.sleep(0.3)
        opened = watch.opened().done()
        await watch.aclose()
        return breaker, probe, opened

    breaker, probe, opened = run(scenario())
    assert not breaker.is_open and not opened
    assert breaker.failing_since is None and breaker.next_check_in() is None
    assert probe.calls == 1


def test_watch_a_probe_that_raises_is_a_failed_probe() -> None:
    async def scenario() -> OutageBreaker:
        breaker = OutageBreaker(window_s=0.2, clock=time.monotonic, probe_interval_s=0.05)
        watch = OutageWatch(breaker, Probe(RuntimeError("a bug")), describe=lambda exc: f"described: {exc}")
        breaker.failure("page", started=time.monotonic(), error="ConnectError", kind="connect")
        watch.watch()
        await watch.opened()
        await watch.aclose()
        return breaker

    breaker = run(scenario())
    assert breaker.probes_failed >= 1 and breaker.probes_ok == 0
    assert "readiness probes failed too (described: a bug)" in (breaker.open_message or "")


def test_watch_answered_failures_open_without_any_probe() -> None:
    async def scenario() -> tuple[OutageBreaker, Probe]:
        breaker = OutageBreaker(window_s=0.2, clock=time.monotonic)
        probe = Probe(None)
        watch = OutageWatch(breaker, probe)
        breaker.failure("page", started=time.monotonic(), error="HTTP 503", kind="http_5xx")
        watch.watch()
        await watch.opened()
        await watch.aclose()
        return breaker, probe

    breaker, probe = run(scenario())
    assert breaker.is_open and probe.calls == 0


def test_watch_closed_cancels_its_probe_and_starts_nothing_more() -> None:
    async def scenario() -> tuple[OutageBreaker, int, bool]:
        breaker = OutageBreaker(window_s=60, clock=time.monotonic, probe_interval_s=10)
        started = asyncio.Event()
        cancelled = False

        async def hanging_probe() -> str | None:
            nonlocal cancelled
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled = True
                raise
            return None

        watch = OutageWatch(breaker, hanging_probe)
        breaker.failure("page", started=time.monotonic(), error="ConnectError", kind="connect")
        watch.watch()
        await started.wait()
        await watch.aclose()
        breaker.failure("other", started=time.monotonic(), error="ConnectError", kind="connect")
        watch.watch()
        await asyncio.sleep(0)
        return breaker, breaker.probes_failed + breaker.probes_ok, cancelled

    breaker, verdicts, cancelled = run(scenario())
    assert cancelled and verdicts == 0 and not breaker.is_open
