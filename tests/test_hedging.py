"""The hedging rule on its own (``olmocr_tasks.hedging``): times are plain numbers, no clock runs."""

from __future__ import annotations

import pytest

from olmocr_tasks.config import ServerSettings
from olmocr_tasks.hedging import MIN_SAMPLES, HedgePolicy, LatencyTracker


def policy_with(latencies: list[float], **settings: float | bool) -> HedgePolicy:
    policy = HedgePolicy(ServerSettings(**settings))  # type: ignore[arg-type]
    for seconds in latencies:
        policy.record(seconds)
    return policy


def test_nearest_rank_percentile_of_the_recent_window() -> None:
    tracker = LatencyTracker(size=4)
    assert tracker.percentile(0.95) is None
    for seconds in (1.0, 2.0, 3.0, 4.0, 5.0, float("nan"), -1.0):
        tracker.record(seconds)
    # The oldest answer left the window; nonsense latencies were never recorded.
    assert len(tracker) == 4
    assert tracker.percentile(0.95) == 5.0 and tracker.percentile(0.5) == 3.0


def test_no_hedge_without_a_latency_history_or_when_switched_off() -> None:
    policy = policy_with([1.0] * (MIN_SAMPLES - 1))
    policy.observe_server(idle=True, now=0.0)
    assert policy.due_at(0.0) is None
    policy.record(1.0)
    assert policy.due_at(0.0) is not None
    assert policy_with([1.0] * 50, hedge_requests=False).due_at(0.0) is None
    assert policy_with([1.0] * 50, max_hedges_per_request=0).due_at(0.0) is None


def test_busy_server_hedges_at_a_multiple_of_the_recent_p95() -> None:
    # 30 s pages behind a standing queue: nothing is hedged before 3 x p95, however long it waited.
    policy = policy_with([30.0] * 20 + [60.0] * 20, hedge_multiple=3.0)
    policy.observe_server(idle=False, now=100.0)
    assert policy.delay() == 180.0
    assert policy.due_at(100.0) == 280.0


def test_idle_server_hedges_soon_after_the_queue_emptied() -> None:
    # 20-40 s pages (p95 40 s): once nothing waits in vLLM's queue, every request it holds is being
    # generated and should be answered within about p95 of the moment the queue emptied.
    policy = policy_with([20.0 + i for i in range(21)], hedge_multiple=3.0, hedge_idle_multiple=1.25)
    assert policy.typical() == 39.0
    policy.observe_server(idle=False, now=0.0)
    sent_long_ago = 10.0
    assert policy.due_at(sent_long_ago) == pytest.approx(10.0 + 3 * 39.0)
    policy.observe_server(idle=True, now=50.0)
    policy.observe_server(idle=True, now=55.0)  # still idle: the queue emptied at 50
    assert policy.idle_since == 50.0
    assert policy.due_at(sent_long_ago) == pytest.approx(50.0 + 1.25 * 39.0)
    # A request sent after the queue emptied counts from its own sending.
    assert policy.due_at(70.0) == pytest.approx(70.0 + 1.25 * 39.0)
    # The queue fills again: back to the patient rule, and a later emptying restarts the idle clock.
    policy.observe_server(idle=False, now=80.0)
    assert policy.idle_since is None
    assert policy.due_at(sent_long_ago) == pytest.approx(10.0 + 3 * 39.0)
    policy.observe_server(idle=True, now=90.0)
    assert policy.due_at(sent_long_ago) == pytest.approx(10.0 + 3 * 39.0)  # the earlier of the two rules
    assert policy.due_at(60.0) == pytest.approx(90.0 + 1.25 * 39.0)


def test_floor_holds_for_both_rules() -> None:
    # Sub-second answers: a request is never hedged before the floor, busy or idle.
    policy = policy_with([0.1] * 30, hedge_min_delay_s=1.0)
    assert policy.due_at(5.0) == 6.0
    policy.observe_server(idle=True, now=0.0)
    assert policy.due_at(5.0) == 6.0
    # Half-second pages: 3 x p95 and 1.25 x p95 are above the floor and apply as they are.
    fast = policy_with([0.5] * 30)
    fast.observe_server(idle=False, now=0.0)
    assert fast.due_at(10.0) == pytest.approx(11.5)
    fast.observe_server(idle=True, now=10.0)
    assert fast.due_at(10.0) == pytest.approx(10.0 + max(1.0, 1.25 * 0.5))


def test_defaults_need_no_floor_of_minutes() -> None:
    # The defaults a user gets: hedging follows the observed latency, not a fixed two minutes.
    defaults = ServerSettings()
    assert defaults.hedge_requests and defaults.hedge_min_delay_s <= 1.0
    policy = policy_with([0.5] * 40)
    policy.observe_server(idle=True, now=0.0)
    due = policy.due_at(0.0)
    assert due is not None and due <= 1.0
