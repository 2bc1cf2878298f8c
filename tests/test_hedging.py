"""The hedging rule on its own (``olmocr_tasks.hedging``): times are plain numbers, no clock runs."""

from __future__ import annotations

import heapq
import random

import pytest

from olmocr_tasks.config import ServerSettings
from olmocr_tasks.hedging import COLD_MULTIPLE, COLD_PRIOR_FRACTION, MIN_SAMPLES, HedgePolicy, LatencyTracker


def policy_with(latencies: list[float], **settings: float | bool) -> HedgePolicy:
    server = ServerSettings(**settings)
    policy = HedgePolicy(server.hedging, server.timeouts.read_timeout_s)
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


def test_switched_off_never_hedges() -> None:
    assert policy_with([1.0] * 50, hedge_requests=False).due_at(0.0) is None
    assert policy_with([1.0] * 50, max_hedges_per_request=0).due_at(0.0) is None
    off = policy_with([], hedge_requests=False)
    off.observe_reading(holds_requests=False, read_at=5.0)
    off.observe_reading(holds_requests=False, read_at=6.0)
    assert off.due_at(0.0) is None


def test_cold_start_without_any_answer_waits_a_quarter_of_the_read_timeout() -> None:
    # A one-page run: nothing has been timed, the read timeout is the only scale there is.
    assert policy_with([]).due_at(10.0) == pytest.approx(10.0 + COLD_PRIOR_FRACTION * 300.0)
    assert policy_with([], read_timeout_s=60.0).due_at(10.0) == pytest.approx(10.0 + 15.0)
    # The floor still holds for a read timeout of a few seconds.
    assert policy_with([], read_timeout_s=2.0, hedge_min_delay_s=1.0).due_at(10.0) == pytest.approx(11.0)


def test_cold_start_with_a_few_answers_waits_a_wide_multiple_of_the_slowest() -> None:
    # Answers so far are the fastest of their cohort: twice the busy rule's multiple of the slowest.
    policy = policy_with([0.4, 0.5])
    assert policy.due_at(0.0) == pytest.approx(COLD_MULTIPLE * 3.0 * 0.5)
    # Slow answers say the server is slow: they are trusted over the read-timeout prior.
    slow = policy_with([25.0, 30.0, 35.0])
    assert slow.due_at(0.0) == pytest.approx(COLD_MULTIPLE * 3.0 * 35.0)
    # An idle server does not shorten it: the idle rule needs a percentile.
    slow.observe_server(idle=True, now=36.0)
    assert slow.due_at(0.0) == pytest.approx(COLD_MULTIPLE * 3.0 * 35.0)


def test_cold_start_ends_at_min_samples_and_a_request_is_judged_again() -> None:
    # The due time of one request sent at 0 follows what is known at each moment.
    policy = policy_with([])
    assert policy.due_at(0.0) == pytest.approx(75.0)
    policy.record(2.0)
    assert policy.due_at(0.0) == pytest.approx(12.0)
    for _ in range(MIN_SAMPLES - 2):
        policy.record(1.0)
    assert policy.typical() is None and policy.due_at(0.0) == pytest.approx(12.0)
    policy.record(1.0)  # the eighth answer: the percentile rule (p95 of eight is their maximum)
    assert policy.typical() == 2.0 and policy.due_at(0.0) == pytest.approx(6.0)


def test_lost_request_needs_two_empty_readings_after_it_was_sent() -> None:
    policy = policy_with([])
    sent = 10.0
    # Readings before the request was sent, or while vLLM may still be preparing it, say nothing.
    for read_at in (9.0, 10.5):
        policy.observe_reading(holds_requests=False, read_at=read_at)
    assert policy.lost_at(sent) is None
    policy.observe_reading(holds_requests=False, read_at=11.2)
    assert policy.lost_at(sent) is None  # one reading: a generation may just have ended
    policy.observe_reading(holds_requests=False, read_at=11.7)
    assert policy.lost_at(sent) is None  # two, but not a second apart
    policy.observe_reading(holds_requests=False, read_at=12.3)
    assert policy.lost_at(sent) == 12.3
    assert policy.due_at(sent) == pytest.approx(12.3)
    # The same reading seen again adds nothing; a request sent later is judged by later readings.
    policy.observe_reading(holds_requests=False, read_at=12.3)
    assert policy.lost_at(11.5) is None


def test_a_reading_with_any_request_at_the_server_clears_the_evidence() -> None:
    policy = policy_with([])
    for read_at in (2.0, 3.0):
        policy.observe_reading(holds_requests=False, read_at=read_at)
    assert policy.lost_at(0.0) == 3.0
    policy.observe_reading(holds_requests=True, read_at=4.0)
    assert policy.lost_at(0.0) is None
    assert policy.due_at(0.0) == pytest.approx(75.0)
    policy.observe_reading(holds_requests=False, read_at=5.0)
    assert policy.lost_at(0.0) is None  # a new run of empty readings starts over
    policy.observe_reading(holds_requests=False, read_at=6.0)
    assert policy.lost_at(0.0) == 6.0


def test_lost_request_rule_applies_with_a_history_and_keeps_the_floor() -> None:
    # 30-s pages: the busy rule would wait 90 s; a server holding nothing says the request is lost.
    policy = policy_with([30.0] * 20)
    policy.observe_server(idle=False, now=0.0)
    assert policy.due_at(100.0) == pytest.approx(190.0)
    for read_at in (101.5, 102.5):
        policy.observe_reading(holds_requests=False, read_at=read_at)
    assert policy.due_at(100.0) == pytest.approx(102.5)
    # Never before the floor.
    floor = policy_with([], hedge_min_delay_s=5.0)
    for read_at in (1.5, 2.5):
        floor.observe_reading(holds_requests=False, read_at=read_at)
    assert floor.due_at(0.0) == pytest.approx(5.0)


def _gpu_cohort(seed: int, slots: int, requests: int) -> list[float]:
    """Answer times of ``requests`` sent together at 0 to ``slots`` slots taking 20-40 s (uniform), in
    arrival order: the first ``slots`` run at once, each later one when a slot frees."""
    rng = random.Random(seed)
    free = [0.0] * slots
    done = []
    for _ in range(requests):
        start = heapq.heappop(free)
        end = start + rng.uniform(20.0, 40.0)
        heapq.heappush(free, end)
        done.append(end)
    return done


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize(("slots", "requests"), [(64, 96), (64, 3), (8, 8), (1, 3)])
def test_cold_start_never_hedges_a_healthy_gpu_cohort(seed: int, slots: int, requests: int) -> None:
    # GPU-like pages (20-40 s), all sent at once and some queued behind the slots: replay the answers
    # in order and check, between each answer and the next, that no outstanding request falls due
    # before its own answer (the server holds them all, so the lost-request rule has no say).
    answers = sorted(_gpu_cohort(seed, slots, requests))
    policy = policy_with([])
    policy.observe_server(idle=False, now=0.0)
    for index, answered_at in enumerate(answers):
        due = policy.due_at(0.0)
        assert due is not None
        # Until this answer, every request is outstanding that is answered now or later: the rule must
        # not make them due before this answer (the earliest of them).
        assert due >= answered_at, f"answer {index}: a healthy request would be hedged at {due:.1f} s"
        policy.record(answered_at)


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
    assert defaults.hedging.hedge_requests and defaults.hedging.hedge_min_delay_s <= 1.0
    policy = policy_with([0.5] * 40)
    policy.observe_server(idle=True, now=0.0)
    due = policy.due_at(0.0)
    assert due is not None and due <= 1.0


def test_past_max_hedges_only_a_lost_request_is_hedged_again_up_to_the_limit() -> None:
    # 0.5-s pages, two hedges sent already (the default max): the busy and idle rules stop there.
    policy = policy_with([0.5] * 30)
    policy.observe_server(idle=True, now=0.0)
    assert policy.max_hedges == 2 and policy.hedge_limit == 4
    assert policy.due_at(10.0, hedges_sent=1) == pytest.approx(11.0)
    assert policy.due_at(10.0, hedges_sent=2) is None
    # The server says it holds nothing: the newest request is not decoding anywhere, hedge it again.
    for read_at in (11.2, 12.4):
        policy.observe_reading(holds_requests=False, read_at=read_at)
    assert policy.due_at(10.0, hedges_sent=2) == pytest.approx(12.4)
    assert policy.due_at(10.0, hedges_sent=3) == pytest.approx(12.4)
    assert policy.due_at(10.0, hedges_sent=4) is None
