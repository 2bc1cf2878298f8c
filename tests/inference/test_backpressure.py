"""Adaptive concurrency pieces in isolation: the metrics parser, the AIMD controller, the limiter."""

from __future__ import annotations

import asyncio

import pytest

from olmocr_tasks.inference.backpressure import AdaptiveLimiter, AimdController, high_water, target_waiting
from olmocr_tasks.inference.vllm_metrics import MetricsFormatError, QueueSample, parse_vllm_sample

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="allenai/olmOCR-2-7B-1025-FP8"} 12.0
vllm:num_requests_running{engine="1",model_name="allenai/olmOCR-2-7B-1025-FP8"} 10.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="allenai/olmOCR-2-7B-1025-FP8"} 3.0
vllm:num_requests_waiting{engine="1",model_name="allenai/olmOCR-2-7B-1025-FP8"} 4.0
vllm:num_requests_waiting_by_reason{reason="capacity"} 99.0
vllm:request_success_total{finished_reason="stop"} 1234.0
"""


def test_parse_sums_label_sets_and_ignores_other_metrics() -> None:
    assert parse_vllm_sample(VLLM_METRICS).queue == QueueSample(running=22.0, waiting=7.0)


def test_parse_unlabelled_with_timestamp_and_tricky_label_values() -> None:
    text = (
        "vllm:num_requests_running 5 1700000000000\n"
        'vllm:num_requests_waiting{model_name="we}ird \\"name\\" here"} 2\n'
        'vllm:num_requests_waiting{model_name="x"} NaN\n'
    )
    assert parse_vllm_sample(text).queue == QueueSample(running=5.0, waiting=2.0)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "<html>not found</html>",
        "vllm:num_requests_running 1\n",  # waiting missing
        'vllm:num_requests_running{a="1" 1\nvllm:num_requests_waiting 0\n',  # unterminated labels
        "vllm:num_requests_running abc\nvllm:num_requests_waiting 0\n",
    ],
)
def test_parse_rejects_what_is_not_vllm_metrics(text: str) -> None:
    with pytest.raises(MetricsFormatError):
        parse_vllm_sample(text)


def test_target_keeps_a_short_non_empty_queue() -> None:
    assert target_waiting(0) == 2
    assert target_waiting(40) == 10
    assert high_water(0) == 6
    assert high_water(40) == 20


def test_slow_start_doubles_then_caps_at_ceiling() -> None:
    controller = AimdController(floor=4, ceiling=64)
    assert controller.window == 16
    idle = [QueueSample(running=10, waiting=0)]
    seen = [controller.update(idle, demand=100) for _ in range(4)]
    assert seen == [32, 64, 64, 64]


def test_growth_needs_demand() -> None:
    controller = AimdController(floor=4, ceiling=64, initial=8)
    assert controller.update([QueueSample(running=1, waiting=0)], demand=3) == 8


def test_shrinks_multiplicatively_with_holdoff_then_grows_additively() -> None:
    controller = AimdController(floor=4, ceiling=64, initial=40)
    flooded = [QueueSample(running=16, waiting=50)]
    assert controller.update(flooded, demand=40) == 28
    # The queue has not had time to answer: no second cut straight away.
    assert controller.update(flooded, demand=40) == 28
    assert controller.update(flooded, demand=40) == 19
    # Inside the band (target 4 .. high water 8) during the hold-off after a cut: hold.
    assert controller.update([QueueSample(running=16, waiting=6)], demand=40) == 19
    # Below target: additive increase now that slow start has ended.
    assert controller.update([QueueSample(running=16, waiting=1)], demand=40) == 23


def test_never_below_floor() -> None:
    controller = AimdController(floor=4, ceiling=64, initial=5, holdoff_polls=0)
    for _ in range(5):
        controller.update([QueueSample(running=2, waiting=500)], demand=5)
    assert controller.window == 4


def test_samples_of_replicas_are_pooled() -> None:
    controller = AimdController(floor=2, ceiling=100, initial=50)
    # One replica flooded, the other idle: pooled waiting 10 vs pooled high water 6 + 6.
    replicas = [QueueSample(running=0, waiting=10), QueueSample(running=0, waiting=0)]
    # Inside the pooled band: no cut, only a probe of one request.
    assert controller.update(replicas, demand=50) == 51
    assert controller.update([], demand=50) == 51


def test_limiter_shrink_keeps_holders_and_blocks_new_acquirers() -> None:
    async def scenario() -> None:
        limiter = AdaptiveLimiter(3)
        for _ in range(3):
            await limiter.acquire()
        limiter.set_limit(1)
        assert limiter.in_use == 3
        blocked = asyncio.ensure_future(limiter.acquire())
        await asyncio.sleep(0.01)
        limiter.release()
        limiter.release()
        await asyncio.sleep(0.01)
        assert not blocked.done()  # 1 still held, limit 1
        limiter.release()
        await asyncio.wait_for(blocked, 1)
        assert limiter.in_use == 1

    asyncio.run(scenario())


def test_limiter_growth_wakes_waiters_in_order() -> None:
    async def scenario() -> None:
        limiter = AdaptiveLimiter(1)
        await limiter.acquire()
        order: list[int] = []

        async def take(index: int) -> None:
            await limiter.acquire()
            order.append(index)

        tasks = [asyncio.ensure_future(take(index)) for index in range(3)]
        await asyncio.sleep(0.01)
        assert limiter.waiting == 3
        limiter.set_limit(3)
        await asyncio.sleep(0.01)
        assert order == [0, 1]
        limiter.release()
        await asyncio.wait_for(asyncio.gather(*tasks), 1)
        assert order == [0, 1, 2]
        assert limiter.in_use == 3

    asyncio.run(scenario())


def test_limiter_cancelled_waiter_does_not_leak_a_slot() -> None:
    async def scenario() -> None:
        limiter = AdaptiveLimiter(1)
        await limiter.acquire()
        waiter = asyncio.ensure_future(limiter.acquire())
        await asyncio.sleep(0.01)
        # Hand the slot over and cancel in the same tick: the slot must come back.
        limiter.release()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert limiter.in_use == 0
        await asyncio.wait_for(limiter.acquire(), 1)

    asyncio.run(scenario())


# -- windows of several runs sharing one server (a fluid model of the queue: no clock, no sleeps) --------


def _share_server(controllers: list[AimdController], capacity: int, polls: int) -> list[list[int]]:
    """Every client keeps its window full; the server runs ``capacity`` requests and queues the rest.
    Returns each poll's windows."""
    history = []
    for _ in range(polls):
        in_flight = sum(controller.window for controller in controllers)
        sample = QueueSample(running=min(in_flight, capacity), waiting=max(0, in_flight - capacity))
        history.append([controller.update([sample], demand=controller.window) for controller in controllers])
    return history


def test_two_runs_of_one_class_converge_to_a_fair_share() -> None:
    # One run had the server to itself (window 64), a second one starts at the floor.
    first, second = AimdController(floor=4, ceiling=64, initial=64), AimdController(floor=4, ceiling=64, initial=4)
    history = _share_server([first, second], capacity=8, polls=120)
    # Served in arrival order, each run gets the server in proportion to its window.
    late = history[60:]
    shares = [sum(windows[i] for windows in late) / sum(sum(windows) for windows in late) for i in (0, 1)]
    assert min(shares) >= 0.4, shares


def test_a_low_run_gives_way_while_high_priority_work_waits() -> None:
    low = AimdController(floor=4, ceiling=64, initial=64)
    _share_server([low], capacity=8, polls=30)
    settled = low.window
    # A high-priority run arrives: it is served ahead of the queue, so it does not shrink for it ...
    high = AimdController(floor=4, ceiling=64, initial=4, served_first=True)
    history = _share_server([low, high], capacity=8, polls=30)
    high_windows = [windows[1] for windows in history]
    assert high_windows[-1] > 4 and high_windows == sorted(high_windows)
    # ... while the low run backs off from the queue the high run's requests add to.
    assert max(windows[0] for windows in history[5:]) < settled
    assert low.window == low.floor


def test_served_first_ignores_the_queue_but_not_its_ceiling_or_demand() -> None:
    controller = AimdController(floor=4, ceiling=32, initial=8, served_first=True)
    flooded = [QueueSample(running=8, waiting=500)]
    assert controller.update(flooded, demand=8) == 16
    assert controller.update(flooded, demand=3) == 16  # no demand, no growth
    for _ in range(5):
        controller.update(flooded, demand=controller.window)
    assert controller.window == 32
