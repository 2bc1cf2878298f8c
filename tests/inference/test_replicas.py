"""The replica bookkeeping on its own (``olmocr_tasks.inference.replicas``): which replica an attempt
goes to, when a failing one is benched and for how long, and what its stats say. Times are plain
numbers from a hand-moved clock; no request is sent."""

from __future__ import annotations

import pytest

from olmocr_tasks.inference.readiness import ModelsProbe
from olmocr_tasks.inference.replicas import COOLOFF_INITIAL_S, COOLOFF_MAX_S, Replica, ReplicaSet
from olmocr_tasks.inference.vllm_metrics import QueueSample
from tests.fixtures.clock import FakeClock


def replica(url: str = "http://a.test:8000/v1") -> Replica:
    return Replica(url, ModelsProbe(url, "m"), url + "/metrics")


def replica_set(count: int) -> tuple[ReplicaSet, list[Replica]]:
    replicas = [replica(f"http://r{index}.test:8000/v1") for index in range(count)]
    return ReplicaSet(replicas), replicas


# -- one replica: failures, cool-off and recovery -------------------------------------------------


def test_urls_are_built_from_the_base_without_its_trailing_slash_and_shown_without_a_password() -> None:
    one = replica("http://reader:hunter2-password@vllm.test:8000/v1/")
    assert one.base_url == "http://reader:hunter2-password@vllm.test:8000/v1"
    assert one.completions_url == "http://reader:hunter2-password@vllm.test:8000/v1/chat/completions"
    assert one.display == "http://***@vllm.test:8000/v1"
    assert one.stats(0.0).url == "http://***@vllm.test:8000/v1"


def test_a_refused_connection_benches_the_replica_at_once_for_the_initial_cool_off() -> None:
    clock = FakeClock()
    one = replica()
    one.failed("connect", clock())
    assert one.failures == 1 and one.cool_until == clock.now + COOLOFF_INITIAL_S
    assert one.cooling(clock())
    clock.advance(COOLOFF_INITIAL_S - 0.01)
    assert one.cooling(clock())
    clock.advance(0.01)
    assert not one.cooling(clock())


def test_each_repeated_bench_doubles_the_cool_off_up_to_its_cap() -> None:
    clock = FakeClock()
    one = replica()
    cool_offs = []
    for _ in range(5):
        one.failed("connect", clock())
        cool_offs.append(one.cool_until - clock.now)
        clock.advance(one.cool_until - clock.now)
    assert cool_offs == [5.0, 10.0, 20.0, COOLOFF_MAX_S, COOLOFF_MAX_S]
    assert one.failures == 5 and one.consecutive_failures == 5


@pytest.mark.parametrize("kind", ["timeout", "transport"])
def test_one_slow_or_dropped_request_does_not_bench_the_replica_a_second_in_a_row_does(kind: str) -> None:
    clock = FakeClock()
    one = replica()
    one.failed(kind, clock())
    assert not one.cooling(clock()) and one.consecutive_failures == 1
    one.failed(kind, clock())
    assert one.cool_until == clock.now + COOLOFF_INITIAL_S


@pytest.mark.parametrize("kind", ["http_5xx", "http_429"])
def test_answers_that_are_errors_never_bench_the_replica(kind: str) -> None:
    clock = FakeClock()
    one = replica()
    for _ in range(4):
        one.failed(kind, clock())
    assert one.failures == 4 and one.consecutive_failures == 4
    assert not one.cooling(clock()) and one.cooloffs == 0


def test_an_answer_ends_the_cool_off_and_restarts_its_doubling() -> None:
    clock = FakeClock()
    one = replica()
    one.failed("connect", clock())
    one.failed("connect", clock())
    assert one.cool_until == clock.now + 10.0
    one.answered()
    assert not one.cooling(clock()) and one.consecutive_failures == 0
    # The next timeout is again a first one, and the next bench starts from the initial cool-off.
    one.failed("timeout", clock())
    assert not one.cooling(clock())
    one.failed("connect", clock())
    assert one.cool_until == clock.now + COOLOFF_INITIAL_S
    assert one.failures == 4


def test_stats_say_what_was_seen_of_the_replica() -> None:
    clock = FakeClock()
    one = replica()
    one.requests, one.successes, one.outstanding = 7, 5, 2
    one.failed("connect", clock())
    one.sample = QueueSample(running=3.0, waiting=4.0)
    stats = one.stats(clock())
    assert (stats.requests, stats.successes, stats.failures, stats.outstanding) == (7, 5, 1, 2)
    assert stats.cooling_off is True and (stats.running, stats.waiting) == (3.0, 4.0)
    unread = replica().stats(clock())
    assert unread.cooling_off is False and (unread.running, unread.waiting) == (None, None)


# -- the set: which replica an attempt goes to ----------------------------------------------------


def test_pick_takes_the_replica_with_the_fewest_outstanding_requests() -> None:
    replicas, (a, b, c) = replica_set(3)
    a.outstanding, b.outstanding, c.outstanding = 3, 1, 2
    assert replicas.pick(set(), 0.0) is b
    assert replicas.outstanding == 6
    assert b.picks == 1 and a.picks == 0 and c.picks == 0


def test_pick_breaks_ties_by_recent_failures_then_by_how_often_each_was_picked() -> None:
    clock = FakeClock()
    replicas, (a, b) = replica_set(2)
    a.failed("http_5xx", clock())
    assert replicas.pick(set(), clock()) is b
    a.answered()
    # Equal otherwise: the less picked one, so idle replicas take turns.
    assert replicas.pick(set(), clock()) is a
    assert [replicas.pick(set(), clock()) for _ in range(4)] == [a, b, a, b]


def test_candidates_leave_out_replicas_this_call_already_failed_on_and_cooling_ones() -> None:
    clock = FakeClock()
    replicas, (a, b, c) = replica_set(3)
    c.failed("connect", clock())
    assert replicas.candidates({a}, clock()) == [b]
    assert replicas.pick({a}, clock()) is b


def test_strict_candidates_may_be_none_while_the_lenient_ones_fall_back_to_any_ready_replica() -> None:
    clock = FakeClock()
    replicas, (a, b) = replica_set(2)
    b.failed("connect", clock())
    # "Is there another replica to try at once?": no, the only ready one already failed this call.
    assert replicas.candidates({a}, clock(), strict=True) == []
    assert replicas.candidates({a}, clock()) == [a]


def test_when_every_replica_is_cooling_the_one_back_first_is_still_tried() -> None:
    clock = FakeClock()
    replicas, (a, b, c) = replica_set(3)
    a.failed("connect", clock())
    a.failed("connect", clock())  # 10 s
    b.failed("connect", clock())  # 5 s
    c.cool_off(clock(), 20.0)
    assert replicas.candidates(set(), clock(), strict=True) == []
    assert replicas.candidates({a, b, c}, clock()) == [b]
    assert replicas.pick(set(), clock()) is b
    clock.advance(COOLOFF_INITIAL_S)
    assert replicas.candidates(set(), clock()) == [b]


def test_set_stats_list_every_replica_in_order() -> None:
    clock = FakeClock()
    replicas, (a, b) = replica_set(2)
    b.failed("connect", clock())
    stats = replicas.stats(clock())
    assert [s.url for s in stats] == [a.display, b.display]
    assert [s.cooling_off for s in stats] == [False, True]
    assert len(replicas) == 2 and list(replicas) == [a, b]
