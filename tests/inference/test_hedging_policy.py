"""The hedging rule on its own (``olmocr_tasks.inference.hedging_policy``): times are plain numbers, no clock runs; then
the hedger that acts on it (``olmocr_tasks.inference.hedger``) with requests the test answers, no server."""

from __future__ import annotations

import asyncio
import heapq
import random
import time
from typing import Any

import pytest

from olmocr_tasks.core.config import ServerSettings
from olmocr_tasks.core.errors import AttemptFailed, ServerUnavailable
from olmocr_tasks.inference.backpressure import InFlightWindow, target_waiting
from olmocr_tasks.inference.hedger import Hedger, QueueView, hedge_cap
from olmocr_tasks.inference.hedging_policy import (
    COLD_MULTIPLE,
    COLD_PRIOR_FRACTION,
    MIN_SAMPLES,
    HedgePolicy,
    LatencyTracker,
)
from olmocr_tasks.inference.readiness import ModelsProbe
from olmocr_tasks.inference.replicas import Replica
from olmocr_tasks.inference.vllm_metrics import QueueSample


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


def test_a_request_still_on_its_way_to_the_server_is_not_judged_lost() -> None:
    """A loaded client may take longer than the settling time to get a connection and write a large
    image: the server holds nothing meanwhile, and saying so is no sign the request was lost."""
    policy = policy_with([])
    sent = 10.0
    for read_at in (11.5, 12.6, 13.7):
        policy.observe_reading(holds_requests=False, read_at=read_at)
    assert policy.lost_at(sent) == 12.6
    assert policy.due_at(sent, in_transit=True) == pytest.approx(sent + COLD_PRIOR_FRACTION * 300.0)
    # Delivered at 12.0: only readings from a settling time after that count, and two a second apart.
    assert policy.due_at(sent, delivered_at=12.0) == pytest.approx(sent + COLD_PRIOR_FRACTION * 300.0)
    policy.observe_reading(holds_requests=False, read_at=14.8)
    assert policy.due_at(sent, delivered_at=12.0) == pytest.approx(14.8)


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


# -- the hedger: a page's request racing its hedges, on a running event loop ------------------------


class Request:
    """The bookkeeping the hedger reads of one request (the client's is its retry state)."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.last_attempt_started = time.monotonic()
        self.backing_off = False
        self.delivered_at: float | None = None
        self.in_transit = False


def hedger_with(*, ceiling: int = 16, recheck_s: float = 0.02, **settings: float | bool) -> Hedger:
    """A hedger that hedges a request outstanding 50 ms (recent answers took 10 ms), over a fixed
    window with room, so the client's own window is the server's queue."""
    values: dict[str, float | bool] = {"hedge_min_delay_s": 0.05, **settings}
    policy = policy_with([0.01] * MIN_SAMPLES, **values)
    window = InFlightWindow(floor=1, ceiling=ceiling, adaptive=False)
    return Hedger(policy, QueueView([], window, time.monotonic), time.monotonic, recheck_s=recheck_s)


class Requests:
    """Makes requests and sends them: ``answers[n]`` is what request ``n`` (0 the first, then the
    hedges) does: a dict answers, an exception raises, None hangs until cancelled."""

    def __init__(self, *answers: dict[str, Any] | BaseException | None) -> None:
        self.answers = list(answers)
        self.made: list[Request] = []
        self.cancelled: list[int] = []
        self.hedged = 0

    def start(self) -> Request:
        self.made.append(Request(len(self.made)))
        return self.made[-1]

    async def send(self, request: Request) -> dict[str, Any]:
        answer = self.answers[request.number] if request.number < len(self.answers) else None
        if isinstance(answer, BaseException):
            raise answer
        if answer is not None:
            return answer
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.append(request.number)
            raise
        raise AssertionError("unreachable")

    def on_hedge(self) -> None:
        self.hedged += 1


def race(hedger: Hedger, requests: Requests) -> dict[str, Any]:
    async def bounded() -> dict[str, Any]:
        return await asyncio.wait_for(hedger.race(requests.start, requests.send, requests.on_hedge), 45)

    return asyncio.run(bounded())


def test_hedger_sends_nothing_for_a_request_that_answers() -> None:
    hedger = hedger_with()
    requests = Requests({"answer": 0})
    assert race(hedger, requests) == {"answer": 0}
    assert (hedger.sent, requests.hedged, len(requests.made)) == (0, 0, 1)


def test_hedger_first_answer_wins_and_the_slow_request_is_cancelled() -> None:
    hedger = hedger_with()
    requests = Requests(None, {"answer": 1})
    assert race(hedger, requests) == {"answer": 1}
    assert hedger.sent == 1 and requests.hedged == 1 and hedger.in_flight == 0
    assert requests.cancelled == [0]


def test_hedger_a_failed_request_leaves_its_hedge_racing() -> None:
    hedger = hedger_with()
    requests = Requests(None, AttemptFailed("HTTP 400"), {"answer": 2})
    # The first hangs, its hedge fails as a page attempt: the race goes on, and the next hedge
    # (allowed: max_hedges_per_request is 2) answers.
    assert race(hedger, requests) == {"answer": 2}
    assert hedger.sent == 2 and requests.cancelled == [0]


def test_hedger_raises_the_failure_when_every_request_failed() -> None:
    hedger = hedger_with(hedge_requests=False)
    requests = Requests(AttemptFailed("HTTP 400"))
    with pytest.raises(AttemptFailed, match="HTTP 400"):
        race(hedger, requests)


def test_hedger_any_other_error_ends_the_race() -> None:
    hedger = hedger_with()
    requests = Requests(None, ServerUnavailable("down"))
    with pytest.raises(ServerUnavailable):
        race(hedger, requests)
    assert requests.cancelled == [0] and hedger.in_flight == 0


def test_hedger_sends_no_hedge_while_the_request_backs_off() -> None:
    hedger = hedger_with()
    requests = Requests(None)

    async def scenario() -> int:
        def start() -> Request:
            request = requests.start()
            request.backing_off = True  # between two attempts: nothing of it is at the server
            return request

        task = asyncio.ensure_future(hedger.race(start, requests.send))
        # Many times the 50-ms hedge delay.
        await asyncio.sleep(0.5)
        sent = hedger.sent
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return sent

    assert asyncio.run(scenario()) == 0
    assert requests.cancelled == [0]


def test_hedger_keeps_hedges_in_flight_under_a_quarter_of_the_window() -> None:
    # A window of 4 allows one hedge in flight at once; every request hangs, the second hedge would
    # be due 50 ms after the first.
    hedger = hedger_with(ceiling=4)
    requests = Requests()

    async def scenario() -> tuple[int, int]:
        task = asyncio.ensure_future(hedger.race(requests.start, requests.send))
        while hedger.sent == 0:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)
        seen = hedger.sent, hedger.in_flight
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return seen

    assert asyncio.run(scenario()) == (1, 1)
    assert sorted(requests.cancelled) == [0, 1] and hedger.in_flight == 0
    assert [hedge_cap(window) for window in (1, 4, 7, 8, 64)] == [1, 1, 1, 2, 16]


# -- the server's queue as the hedger sees it ----------------------------------------------------------


def _replica(url: str, sample: QueueSample | None, read_at: float | None = None) -> Replica:
    replica = Replica(url, ModelsProbe(url, "m"), url + "/metrics")
    replica.sample, replica.sample_read_at = sample, read_at
    return replica


def test_queue_view_reads_vllm_metrics_when_the_window_adapts() -> None:
    window = InFlightWindow(floor=1, ceiling=8, adaptive=True)
    busy = [_replica("http://a/v1", QueueSample(running=16, waiting=4), 10.0), _replica("http://b/v1", None)]
    view = QueueView(busy, window, lambda: 20.0)
    assert not view.idle()
    # Queued no deeper than the depth worth keeping for what runs: room for a hedge; deeper: none.
    assert target_waiting(16) == 4 and view.has_room()
    busy[0].sample = QueueSample(running=16, waiting=5)
    assert not view.has_room()
    # A cooling replica's reading is stale: without a fresh one, the client's own window (empty) decides.
    busy[0].cool_off(now=20.0, seconds=5.0)
    assert view.idle() and view.has_room()
    busy[0].cool_until = float("-inf")
    assert view.latest_reading() is None  # replica b was never read
    busy[1].sample, busy[1].sample_read_at = QueueSample(running=0, waiting=0), 12.0
    assert view.latest_reading() == (True, 10.0)
    empty = [_replica("http://a/v1", QueueSample(running=0, waiting=0), 11.0)]
    assert QueueView(empty, window, lambda: 20.0).latest_reading() == (False, 11.0)
    assert QueueView(empty, window, lambda: 20.0).idle()


def test_queue_view_without_metrics_uses_the_clients_window() -> None:
    window = InFlightWindow(floor=1, ceiling=1, adaptive=False)
    view = QueueView([_replica("http://a/v1", QueueSample(running=9, waiting=9), 1.0)], window, lambda: 2.0)
    # A fixed window ignores /metrics: one free place means room, and nothing queued.
    assert view.idle() and view.has_room() and view.latest_reading() is None

    async def occupied() -> tuple[bool, bool]:
        await window.limiter.acquire()
        try:
            return view.idle(), view.has_room()
        finally:
            window.limiter.release()

    assert asyncio.run(occupied()) == (False, False)
