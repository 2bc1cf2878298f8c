"""InferenceClient against real HTTP servers on 127.0.0.1: the vLLM stand-in, plus a tiny capture
server where the exact request on the wire matters."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web

from olmocr_tasks.core.config import PageSettings, ServerSettings
from olmocr_tasks.core.errors import AttemptFailed, ConfigurationError, ServerNotReady, ServerUnavailable
from olmocr_tasks.inference.backpressure import high_water
from olmocr_tasks.inference.client import InferenceClient
from olmocr_tasks.inference.client_factory import build_client
from olmocr_tasks.page.ladder import PageConverter
from olmocr_tasks.page.protocol import RequestBodyBuilder
from tests.fixtures.client import (
    Factory,
    content_of,
    fast_server_settings,
    marked_png_base64,
    page_body,
    requests_for,
    run,
)
from tests.fixtures.standin import StandinServer

pytestmark = pytest.mark.timeout(60)

SECRET = "sk-test-0123456789abcdef"
# The read timeout of the tests that wait for a hung request: a hang meets it, an answer (milliseconds,
# even with two dozen at once on a loaded machine) never does, so their outcome counts are the script's.
READ_TIMEOUT_S = 2.0


async def _until(condition: Callable[[], bool]) -> None:
    """Wait for ``condition`` (``run``'s 45-s guard catches one that never comes)."""
    while not condition():
        await asyncio.sleep(0.01)


class RecordingSleep:
    """The client's backoff sleep, observed: each requested delay and whether it ran to its end.

    Tests assert on these instead of on wall-clock durations, which a loaded machine stretches.
    """

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.finished: list[bool] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        self.finished.append(False)
        index = len(self.finished) - 1
        await asyncio.sleep(delay)
        self.finished[index] = True


# -- the exact request ---------------------------------------------------------------------------


class CaptureServer:
    """Answers every completion with a fixed JSON and keeps what it received."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> CaptureServer:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/v1"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        self.seen.append(
            {
                "method": request.method,
                "path": request.path_qs,
                "headers": dict(request.headers),
                "body": await request.read(),
                "version": request.version,
            }
        )
        return web.json_response({"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]})


def test_success_sends_body_bytes_untouched_with_bearer_key() -> None:
    body = page_body(3, 7)

    async def scenario() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        async with CaptureServer() as server:
            async with build_client(fast_server_settings(server.url, api_key=SECRET)) as client:
                answer = await client.complete(body)
            return answer, server.seen

    answer, seen = run(scenario())
    assert answer == {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}
    (request,) = seen
    assert request["method"] == "POST"
    assert request["path"] == "/v1/chat/completions"
    assert (request["version"].major, request["version"].minor) == (1, 1)
    assert request["headers"]["Content-Type"] == "application/json"
    assert request["headers"]["Authorization"] == f"Bearer {SECRET}"
    assert request["headers"]["Content-Length"] == str(len(body))
    assert request["body"] == body


def test_success_against_standin_names_the_page(standin_factory: Factory) -> None:
    server = standin_factory(api_key=SECRET)
    body = page_body(4, 2)

    async def scenario() -> tuple[dict[str, Any], Any]:
        async with build_client(fast_server_settings(server, api_key=SECRET)) as client:
            models = await client.check_ready()
            assert models == [server.model]
            answer = await client.complete(body)
            return answer, client.stats()

    answer, stats = run(scenario())
    assert "document 4 page 2" in content_of(answer)
    assert server.bodies() == [body]
    assert stats.requests == 1 and stats.retries == 0 and stats.outcomes == {"ok": 1}
    assert stats.in_flight == 0 and stats.slots_in_use == 0
    assert SECRET not in repr(stats)


# -- retried failures ----------------------------------------------------------------------------


def test_500_503_429_and_drop_are_retried_until_success(standin_factory: Factory) -> None:
    server = standin_factory(scripts={"1:1": ["500", "503", "429", "drop", "ok"]}, retry_after_s=1)
    sleep = RecordingSleep()

    async def scenario() -> tuple[dict[str, Any], Any]:
        settings = fast_server_settings(server, backoff_max_s=2.0, request_retry_budget_s=10)
        async with build_client(settings, sleep=sleep) as client:
            answer = await client.complete(page_body(1, 1))
            return answer, client.stats()

    answer, stats = run(scenario())
    assert "document 1 page 1" in content_of(answer)
    assert [r["outcome"] for r in server.requests()] == ["500", "503", "429", "drop", "ok"]
    assert stats.retries == 4
    assert stats.outcomes == {"http_5xx": 2, "http_429": 1, "transport": 1, "ok": 1}
    # Retry-After: 1 was honoured (after the 429, the third wait) although the exponential backoff
    # alone is far shorter.
    assert len(sleep.delays) == 4 and all(sleep.finished)
    assert sleep.delays[2] >= 1.0
    assert max(sleep.delays[:2] + sleep.delays[3:]) < 1.0


def test_retry_after_is_capped_by_backoff_max(standin_factory: Factory) -> None:
    server = standin_factory(scripts={"1:1": ["429", "ok"]}, retry_after_s=60)
    sleep = RecordingSleep()

    async def scenario() -> None:
        async with build_client(fast_server_settings(server, backoff_max_s=0.3), sleep=sleep) as client:
            await client.complete(page_body(1, 1))

    run(scenario())
    (delay,) = sleep.delays
    assert delay == pytest.approx(0.3)  # Retry-After: 60 capped by backoff_max_s


def test_hang_hits_read_timeout_and_is_retried(standin_factory: Factory) -> None:
    server = standin_factory(scripts={"1:1": ["hang", "ok"]})

    async def scenario() -> tuple[float, Any]:
        # A read timeout far above an answer's few milliseconds, so only the hang meets it on a loaded machine.
        settings = fast_server_settings(
            server, read_timeout_s=READ_TIMEOUT_S, request_retry_budget_s=10, hedge_requests=False
        )
        async with build_client(settings) as client:
            started = time.monotonic()
            await client.complete(page_body(1, 1))
            return time.monotonic() - started, client.stats()

    elapsed, stats = run(scenario())
    assert elapsed >= READ_TIMEOUT_S
    # One timed-out attempt, then the answer: the hang cost one read timeout, not the retry budget.
    assert stats.outcomes == {"timeout": 1, "ok": 1}
    assert [record["outcome"] for record in server.requests()] == ["hang", "ok"]


# -- failures that are the page's or the configuration's -------------------------------------------


@pytest.mark.parametrize(
    ("max_model_len", "builder", "status"),
    [
        (200, RequestBodyBuilder(ServerSettings().connection.model), "HTTP 400"),  # a prompt over the context
        (16384, RequestBodyBuilder("some/other-model"), "HTTP 404"),  # model not served
    ],
)
def test_4xx_is_one_failed_attempt_at_once(
    standin_factory: Callable[..., StandinServer], max_model_len: int, builder: RequestBodyBuilder, status: str
) -> None:
    standin = standin_factory(max_model_len=max_model_len)

    async def scenario() -> AttemptFailed:
        async with build_client(fast_server_settings(standin)) as client:
            with pytest.raises(AttemptFailed) as caught:
                await client.complete(page_body(1, 1, builder))
            return caught.value

    error = run(scenario())
    assert error.reason.startswith(status)
    assert len(standin.requests()) == 1


def test_200_with_broken_json_is_a_failed_attempt(standin_factory: Factory) -> None:
    server = standin_factory(scripts={"1:1": ["bad_json"]})

    async def scenario() -> None:
        async with build_client(fast_server_settings(server)) as client:
            with pytest.raises(AttemptFailed, match="not JSON"):
                await client.complete(page_body(1, 1))

    run(scenario())
    assert len(server.requests()) == 1


def test_wrong_api_key_raises_server_not_ready_without_the_key(standin_factory: Factory) -> None:
    server = standin_factory(api_key="the-right-key-123")

    async def scenario() -> None:
        async with build_client(fast_server_settings(server, api_key=SECRET)) as client:
            with pytest.raises(ServerNotReady) as caught:
                await client.complete(page_body(1, 1))
            assert "401" in str(caught.value) and "API key" in str(caught.value)
            assert SECRET not in str(caught.value)
            assert SECRET not in repr(client.stats())

    run(scenario())
    assert len(server.requests()) == 1


def test_budget_spent_on_one_failing_request_while_others_succeed(standin_factory: Factory) -> None:
    server = standin_factory(always={"1:1": "500"}, latency_s=0.02)

    async def scenario() -> tuple[AttemptFailed, int, Any]:
        async with build_client(fast_server_settings(server, request_retry_budget_s=0.8)) as client:
            done = asyncio.Event()
            succeeded = 0

            async def healthy_traffic() -> None:
                nonlocal succeeded
                page = 0
                while not done.is_set():
                    page += 1
                    await client.complete(page_body(2, page))
                    succeeded += 1

            traffic = asyncio.ensure_future(healthy_traffic())
            started = time.monotonic()
            with pytest.raises(AttemptFailed) as caught:
                await client.complete(page_body(1, 1))
            elapsed = time.monotonic() - started
            done.set()
            await traffic
            # It gives up once the next backoff sleep (at most 0.2 s) would end past the budget and
            # a request succeeded since its last attempt began; that it gives up at all (rather than
            # waiting for the outage breaker, which healthy traffic keeps closed) is what matters,
            # and ``run``'s 45-s guard catches a call that never does.
            assert elapsed >= 0.6
            return caught.value, succeeded, client.stats()

    error, succeeded, stats = run(scenario())
    assert error.reason.startswith("transport: HTTP 500")
    assert succeeded > 5
    assert not stats.breaker_open
    assert stats.outcomes["budget_exhausted"] == 1


# -- outages -------------------------------------------------------------------------------------


def test_outage_longer_than_window_aborts_every_pending_call_promptly(standin_factory: Factory) -> None:
    server = standin_factory()
    window = 1.5
    sleep = RecordingSleep()

    async def scenario() -> tuple[list[BaseException | dict[str, Any]], float, Any]:
        # Budget far below the window, backoff sleeps far above it: calls must neither give up as
        # failed attempts nor sleep past the moment the breaker opens.
        settings = fast_server_settings(
            server, outage_window_s=window, request_retry_budget_s=0.2, backoff_initial_s=1.0, backoff_max_s=10.0
        )
        async with build_client(settings, sleep=sleep) as client:
            await client.complete(page_body(9, 1))  # warm connection pool
            server.refuse_for(None)
            started = time.monotonic()
            results = await asyncio.gather(
                *(client.complete(page_body(1, page)) for page in range(1, 9)), return_exceptions=True
            )
            elapsed = time.monotonic() - started
            with pytest.raises(ServerUnavailable):
                await client.complete(page_body(1, 99))
            with pytest.raises(ServerUnavailable):
                async with client.slot():
                    pass
            return results, elapsed, client.stats()

    results, elapsed, stats = run(scenario())
    assert all(isinstance(result, ServerUnavailable) for result in results), results
    assert elapsed >= window
    # Promptly: the opening breaker cut short the backoff sleeps still running (each 1-10 s) instead
    # of letting every caller wait its sleep out.
    assert sleep.delays and not all(sleep.finished)
    assert stats.breaker_open
    assert "budget_exhausted" not in stats.outcomes
    assert "no request succeeded" in str(results[0])
    # Refused connections are ambiguous on their own; the refused readiness probes confirmed them.
    assert stats.probes_failed >= 1 and stats.probes_ok == 0
    assert "readiness probes failed too" in str(results[0])


def test_callers_queued_for_a_slot_learn_of_the_outage_before_rendering(standin_factory: Factory) -> None:
    server = standin_factory()

    async def scenario() -> tuple[list[BaseException | None], int]:
        settings = fast_server_settings(server, outage_window_s=0.8, max_concurrent_requests=2)
        async with build_client(settings) as client:
            server.refuse_for(None)
            rendered = 0

            async def page_worker(page: int) -> None:
                nonlocal rendered
                async with client.slot():
                    rendered += 1  # stands for rendering the page image
                    await client.complete(page_body(1, page))

            results = await asyncio.gather(*(page_worker(page) for page in range(1, 7)), return_exceptions=True)
            return results, rendered

    results, rendered = run(scenario())
    assert all(isinstance(result, ServerUnavailable) for result in results), results
    assert rendered == 2  # only the two slot holders rendered; the four queued callers did not


def test_bad_base_url_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="http"):
        build_client(fast_server_settings("localhost:8000/v1"))


def test_outage_shorter_than_window_is_ridden_out(standin_factory: Factory) -> None:
    server = standin_factory(latency_s=0.02)

    async def scenario() -> tuple[list[dict[str, Any]], Any]:
        settings = fast_server_settings(server, outage_window_s=4.0, request_retry_budget_s=0.3, backoff_max_s=0.3)
        async with build_client(settings) as client:
            server.refuse_for(1.2)
            answers = await asyncio.gather(*(client.complete(page_body(1, page)) for page in range(1, 9)))
            return answers, client.stats()

    answers, stats = run(scenario())
    assert [f"document 1 page {page}." in content_of(answer) for page, answer in enumerate(answers, 1)] == [True] * 8
    assert not stats.breaker_open
    assert stats.outcomes["connect"] > 0 and stats.outcomes["ok"] == 8


def test_stalled_server_opens_breaker_after_window(standin_factory: Factory) -> None:
    server = standin_factory()

    async def scenario() -> tuple[list[BaseException | dict[str, Any]], float]:
        settings = fast_server_settings(server, outage_window_s=1.5, read_timeout_s=0.4, request_retry_budget_s=0.2)
        async with build_client(settings) as client:
            server.stall_for(None)
            started = time.monotonic()
            results = await asyncio.gather(
                *(client.complete(page_body(1, page)) for page in range(1, 5)), return_exceptions=True
            )
            return results, time.monotonic() - started

    results, elapsed = run(scenario())
    assert all(isinstance(result, ServerUnavailable) for result in results), results
    # Not before the window; that it ends at all is the point (``run``'s 45-s guard catches a hang).
    assert elapsed >= 1.5
    # A stalled server hangs its probes too: they time out, and that confirms the outage.
    assert "readiness probes failed too" in str(results[0]) and "Timeout" in str(results[0])
    assert "ReadTimeout" in str(results[0])


def test_abandoned_failing_call_does_not_open_breaker_later(standin_factory: Factory) -> None:
    server = standin_factory()

    async def scenario() -> dict[str, Any]:
        settings = fast_server_settings(server, outage_window_s=1.0)
        async with build_client(settings) as client:
            server.refuse_for(None)
            pending = asyncio.ensure_future(client.complete(page_body(1, 1)))
            # Abandoned once it has failed, so the outage clock is running.
            await _until(lambda: any(count for kind, count in client.stats().outcomes.items() if kind != "ok"))
            pending.cancel()
            server.resume()
            # Nobody is failing any more: the outage clock must have stopped, so letting the 1 s
            # window pass (what is tested, not a wait for something) opens nothing.
            await asyncio.sleep(1.2)
            return await client.complete(page_body(1, 2))

    assert "document 1 page 2" in content_of(run(scenario()))


def test_outage_message_carries_no_credentials(standin_factory: Factory) -> None:
    server = standin_factory()
    url = server.url.replace("http://", "http://reader:url-password-42@")

    async def scenario() -> None:
        async with build_client(fast_server_settings(url, api_key=SECRET, outage_window_s=0.5)) as client:
            server.refuse_for(None)
            with pytest.raises(ServerUnavailable) as caught:
                await client.complete(page_body(1, 1))
            text = str(caught.value) + repr(client.stats())
            assert "url-password-42" not in text and SECRET not in text
            assert "http://***@" in repr(client.stats()) and "reader" not in repr(client.stats())

    run(scenario())


# -- readiness -----------------------------------------------------------------------------------


def test_readiness_waits_for_a_starting_server(standin_factory: Factory) -> None:
    server = standin_factory()

    async def scenario() -> list[str]:
        async with build_client(fast_server_settings(server, readiness_timeout_s=5.0)) as client:
            server.refuse_for(1.0)
            return await client.check_ready()

    assert run(scenario()) == [server.model]


def test_readiness_reports_unreachable_server(standin_factory: Factory) -> None:
    server = standin_factory()
    server.refuse_for(None)

    async def scenario() -> None:
        async with build_client(fast_server_settings(server, readiness_timeout_s=0.5)) as client:
            with pytest.raises(ServerNotReady) as caught:
                await client.check_ready()
            message = str(caught.value)
            assert server.url in message and "ConnectError" in message

    run(scenario())


def test_readiness_reports_the_models_served(standin_factory: Factory) -> None:
    server = standin_factory(model="someone/else-7B")

    async def scenario() -> None:
        async with build_client(fast_server_settings(server, readiness_timeout_s=5.0)) as client:
            with pytest.raises(ServerNotReady) as caught:
                await client.check_ready()
            assert server.stats()["endpoint_hits"]["/v1/models"] == 1  # a configuration error is not waited out
            assert str(caught.value).endswith(
                f"serves someone/else-7B; configured model is {ServerSettings().connection.model}"
            )

    run(scenario())


def test_readiness_reports_a_bad_api_key(standin_factory: Factory) -> None:
    server = standin_factory(api_key="the-right-key-123")

    async def scenario() -> None:
        async with build_client(fast_server_settings(server, api_key=SECRET)) as client:
            with pytest.raises(ServerNotReady, match="API key") as caught:
                await client.check_ready()
            assert SECRET not in str(caught.value) and "401" in str(caught.value)

    run(scenario())


def test_readiness_goes_on_with_the_replicas_that_are_up(
    standin_factory: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    up, down = standin_factory(), standin_factory()
    down.refuse_for(None)

    async def scenario() -> tuple[list[str], Any]:
        async with build_client(fast_server_settings(up, down, readiness_timeout_s=0.5)) as client:
            models = await client.check_ready()
            await client.complete(page_body(1, 1))
            return models, client.stats()

    with caplog.at_level(logging.WARNING, logger="olmocr_tasks.inference.readiness"):
        models, stats = run(scenario())
    assert models == [up.model]
    assert stats.replicas[1].cooling_off and stats.replicas[1].requests == 0
    assert any(down.url in record.getMessage() for record in caplog.records)


# -- replicas ------------------------------------------------------------------------------------


def test_least_outstanding_favours_the_faster_replica(standin_factory: Factory) -> None:
    fast, slow = standin_factory(latency_s=0.02), standin_factory(latency_s=0.25)

    async def scenario() -> Any:
        async with build_client(fast_server_settings(fast, slow, max_concurrent_requests=4)) as client:
            await asyncio.gather(*(client.complete(page_body(1, page)) for page in range(1, 41)))
            return client.stats()

    stats = run(scenario())
    fast_count, slow_count = (replica.successes for replica in stats.replicas)
    assert fast_count + slow_count == 40
    assert fast_count > 3 * slow_count > 0


def test_killed_replica_mid_run_costs_no_page(standin_factory: Factory) -> None:
    survivor, victim = standin_factory(latency_s=0.05), standin_factory(latency_s=0.05)

    async def scenario() -> tuple[list[dict[str, Any]], Any]:
        async with build_client(fast_server_settings(survivor, victim, max_concurrent_requests=8)) as client:

            async def kill_after_some_work() -> None:
                while client.stats().replicas[1].successes < 5:
                    await asyncio.sleep(0.01)
                await asyncio.to_thread(victim.stop)

            killer = asyncio.ensure_future(kill_after_some_work())
            answers = await asyncio.gather(*(client.complete(page_body(1, page)) for page in range(1, 61)))
            await killer
            return answers, client.stats()

    answers, stats = run(scenario())
    assert len(answers) == 60
    assert all(f"document 1 page {page}." in content_of(a) for page, a in enumerate(answers, 1))
    survivor_stats, victim_stats = stats.replicas
    assert victim_stats.successes >= 5 and victim_stats.cooling_off
    assert survivor_stats.successes + victim_stats.successes == 60
    assert not stats.breaker_open and "budget_exhausted" not in stats.outcomes


# -- adaptive window -----------------------------------------------------------------------------


async def _load(client: InferenceClient, pages: int, callers: int) -> list[int]:
    """``callers`` page workers through ``pages`` requests; returns the window seen after each answer.

    One body serves every request: these tests are about flow, and encoding a page image per request
    would cost more CPU than the client itself.
    """
    body = page_body(1, 1)
    remaining = iter(range(pages))
    windows: list[int] = []

    async def worker() -> None:
        for _ in remaining:
            async with client.slot():
                await client.complete(body)
            windows.append(client.stats().window)

    await asyncio.gather(*(worker() for _ in range(callers)))
    return windows


def test_adaptive_window_grows_while_the_server_keeps_up(standin_factory: Factory) -> None:
    server = standin_factory(capacity=64, latency_s=0.3, identify=False)

    async def scenario() -> tuple[list[int], Any]:
        settings = fast_server_settings(server, adaptive_concurrency=True, max_concurrent_requests=32)
        async with build_client(settings) as client:
            assert client.stats().window == 8
            windows = await _load(client, pages=160, callers=40)
            return windows, client.stats()

    windows, stats = run(scenario())
    assert stats.window_mode == "adaptive"
    assert max(windows) == 32
    # The initial window of 8 alone could never have put more than 8 requests on the server.
    assert server.stats()["max_running"] > 12


def test_adaptive_window_shrinks_to_keep_the_queue_short(standin_factory: Factory) -> None:
    # 20 answers/s: the server, not a CPU-starved test process, is the bottleneck (see below).
    server = standin_factory(capacity=2, latency_s=0.1, identify=False)

    async def scenario() -> tuple[list[int], Any]:
        settings = fast_server_settings(
            server, adaptive_concurrency=True, max_concurrent_requests=64, min_concurrent_requests=2
        )
        async with build_client(settings) as client:
            assert client.stats().window == 16
            windows = await _load(client, pages=100, callers=40)
            return windows, client.stats()

    windows, stats = run(scenario())
    # A window of 16 keeps 14 requests queued on a server that runs 2; the adaptive window settles
    # where the queue stays between the target and the high-water mark. Inside that band it probes
    # upwards by one request at a time (so clients sharing a server even out), so the settled window is
    # the server's slots plus the high-water mark plus at most that one probe.
    assert windows[-1] <= 2 + high_water(2) + 1 < 16
    assert stats.replicas[0].waiting is not None and stats.replicas[0].waiting <= 6


def test_two_clients_sharing_a_server_converge_to_a_bounded_queue(standin_factory: Factory) -> None:
    # Slow enough (16 answers/s) that the server, not a CPU-starved test process, is the bottleneck even
    # on a loaded 2-core machine: otherwise the queue stays short because the clients cannot fill it,
    # and growing the windows is right.
    server = standin_factory(capacity=4, latency_s=0.25, identify=False)

    async def scenario() -> list[tuple[float, int]]:
        settings = fast_server_settings(
            server, adaptive_concurrency=True, max_concurrent_requests=32, min_concurrent_requests=2
        )
        # Two clients stand for two DAG runs; with fixed windows they would queue 60 requests.
        async with build_client(settings) as first, build_client(settings) as second:
            samples: list[tuple[float, int]] = []
            both_busy = True

            async def sample() -> None:
                while both_busy:
                    waiting = first.stats().replicas[0].waiting
                    if waiting is not None:
                        samples.append((waiting, first.stats().window + second.stats().window))
                    await asyncio.sleep(0.05)

            sampler = asyncio.ensure_future(sample())
            loads = [asyncio.ensure_future(_load(client, pages=80, callers=30)) for client in (first, second)]
            # Once one run ends the other rightly takes its share; judge only while both compete.
            await asyncio.wait(loads, return_when=asyncio.FIRST_COMPLETED)
            both_busy = False
            await asyncio.gather(sampler, *loads)
            return samples

    samples = run(scenario())
    settled = samples[len(samples) // 2 :]
    assert settled, "no metrics sample was taken"
    waiting = sorted(sample[0] for sample in settled)
    windows = sorted(sample[1] for sample in settled)
    assert waiting[len(waiting) // 2] <= 6
    # Fixed windows would be 64 together; the AIMD sawtooth around a 4-slot server stays far below.
    assert windows[len(windows) // 2] <= 16


def test_metrics_absent_falls_back_to_fixed_window(standin_factory: Factory, caplog: pytest.LogCaptureFixture) -> None:
    server = standin_factory(metrics=False, identify=False)

    async def scenario() -> Any:
        settings = fast_server_settings(server, adaptive_concurrency=True, max_concurrent_requests=12)
        async with build_client(settings) as client:
            await _load(client, pages=20, callers=4)
            # The poller's first /metrics answer (404) is what switches the window to fixed.
            await _until(lambda: client.stats().window_mode == "fixed")
            return client.stats()

    with caplog.at_level(logging.INFO, logger="olmocr_tasks.inference.backpressure"):
        stats = run(scenario())
    assert stats.window_mode == "fixed" and stats.window == 12
    fallbacks = [record for record in caplog.records if "fixed window" in record.getMessage()]
    assert len(fallbacks) == 1
    assert server.stats()["endpoint_hits"]["/metrics"] == 1


def test_fixed_window_when_adaptive_is_off(standin_factory: Factory) -> None:
    server = standin_factory(capacity=64, latency_s=0.1, identify=False)

    async def scenario() -> Any:
        async with build_client(fast_server_settings(server, max_concurrent_requests=6)) as client:
            await _load(client, pages=30, callers=20)
            return client.stats()

    stats = run(scenario())
    assert stats.window_mode == "fixed" and stats.window == 6
    assert server.stats()["max_running"] == 6
    assert "/metrics" not in server.stats()["endpoint_hits"]


# -- hung requests and hedging against the stand-in ----------------------------------------------------


@pytest.mark.parametrize("callers", [1, 24])
def test_hung_requests_on_a_healthy_server_are_not_an_outage(standin_factory: Factory, callers: int) -> None:
    # Each hung request outlasts the whole outage window before its read timeout fires; before
    # probing, the breaker took that for an outage and aborted the run. The window is 0.8 of the read
    # timeout, and both are long next to an answer (10 ms) and a probe's timeout (a quarter of the
    # window), so a loaded machine neither times out a healthy request nor fails a probe.
    hung = {f"1:{page}": ["hang", "hang"] for page in range(1, 3)}
    server = standin_factory(scripts=hung, latency_s=0.01)

    async def scenario() -> tuple[list[dict[str, Any]], Any]:
        settings = fast_server_settings(
            server,
            outage_window_s=0.8 * READ_TIMEOUT_S,
            read_timeout_s=READ_TIMEOUT_S,
            request_retry_budget_s=60,
            max_concurrent_requests=callers,
            hedge_requests=False,
        )
        async with build_client(settings) as client:
            answers = await asyncio.gather(*(client.complete(page_body(1, page)) for page in range(1, callers + 3)))
            return answers, client.stats()

    answers, stats = run(scenario())
    assert [f"document 1 page {page}." in content_of(a) for page, a in enumerate(answers, 1)] == [True] * len(answers)
    assert not stats.breaker_open
    # Every page answered once, each scripted hang cost its request a read timeout, and nothing else failed.
    assert stats.outcomes["ok"] == callers + 2 and stats.outcomes["timeout"] >= 4
    assert set(stats.outcomes) == {"ok", "timeout"}
    for page in range(1, 3):
        outcomes = [record["outcome"] for record in requests_for(server, 1, page)]
        assert outcomes[:2] == ["hang"] * 2 and outcomes[-1] == "ok", (page, outcomes)
    assert stats.probes_ok >= 1


def test_a_page_that_never_answers_on_a_healthy_server_costs_its_attempt_not_the_run(
    standin_factory: Factory,
) -> None:
    server = standin_factory(always={"1:1": "hang"})

    async def scenario() -> tuple[AttemptFailed, Any]:
        settings = fast_server_settings(
            server,
            outage_window_s=0.8 * READ_TIMEOUT_S,
            read_timeout_s=READ_TIMEOUT_S,
            request_retry_budget_s=2.5 * READ_TIMEOUT_S,
            hedge_requests=False,
        )
        async with build_client(settings) as client:
            with pytest.raises(AttemptFailed) as caught:
                await client.complete(page_body(1, 1))
            # The server is fine: the next page is answered.
            await client.complete(page_body(1, 2))
            return caught.value, client.stats()

    error, stats = run(scenario())
    assert error.reason.startswith("transport: ReadTimeout")
    assert not stats.breaker_open and stats.outcomes["budget_exhausted"] == 1
    assert stats.probes_ok >= 1


def hedging_settings(server: StandinServer, **overrides: Any) -> ServerSettings:
    values: dict[str, Any] = {
        "read_timeout_s": 30.0,  # the 45-s guard fails the test if only the read timeout rescues a page
        "request_retry_budget_s": 60.0,
        "outage_window_s": 60.0,
    }
    values.update(overrides)
    return fast_server_settings(server, **values)


async def _warm_up(client: InferenceClient, pages: int = 24) -> None:
    """Answered requests give the client the latency distribution hedging needs."""
    await asyncio.gather(*(client.complete(page_body(9, page)) for page in range(1, pages + 1)))


def test_hung_request_is_answered_by_its_hedge(standin_factory: Factory) -> None:
    server = standin_factory(scripts={"1:1": ["hang"]}, latency_s=0.02)
    hedges: list[int] = []

    async def scenario() -> tuple[dict[str, Any], Any]:
        async with build_client(hedging_settings(server)) as client:
            await _warm_up(client)
            answer = await client.complete(page_body(1, 1), on_hedge=lambda: hedges.append(1))
            return answer, client.stats()

    answer, stats = run(scenario())
    assert "document 1 page 1." in content_of(answer)
    assert stats.hedged == 1 and hedges == [1]
    # Answered by the hedge, not by waiting for the read timeout and retrying.
    assert "timeout" not in stats.outcomes and stats.retries == 0
    assert stats.in_flight == 0
    page_requests = requests_for(server, 1, 1)
    assert [r["outcome"] for r in page_requests] == ["hang", "ok"]


def test_request_hung_before_any_latency_history_is_hedged_once_there_is_one(standin_factory: Factory) -> None:
    server = standin_factory(scripts={"1:1": ["hang"]}, latency_s=0.02)

    async def scenario() -> tuple[dict[str, Any], Any]:
        async with build_client(hedging_settings(server)) as client:
            # The hung request is the run's first: no answer has been timed yet when it is sent.
            hung = asyncio.ensure_future(client.complete(page_body(1, 1)))
            await _warm_up(client)
            return await hung, client.stats()

    answer, stats = run(scenario())
    assert "document 1 page 1." in content_of(answer)
    assert stats.hedged == 1 and "timeout" not in stats.outcomes


def test_late_original_is_cancelled_and_ignored(standin_factory: Factory) -> None:
    server = standin_factory(scripts={"1:1": ["slow"]}, slow_s=1.5, latency_s=0.02)

    async def scenario() -> tuple[dict[str, Any], Any]:
        async with build_client(hedging_settings(server)) as client:
            await _warm_up(client)
            answer = await client.complete(page_body(1, 1))
            stats = client.stats()
            # Until the stand-in has finished with the slow original, whether cut off or answered
            # late (1.5 s): then its record says which, and the client's counts may not have moved.
            await _until(lambda: all(record["finished"] is not None for record in requests_for(server, 1, 1)))
            assert client.stats().outcomes == stats.outcomes
            return answer, stats

    answer, stats = run(scenario())
    assert "document 1 page 1." in content_of(answer)
    assert stats.hedged == 1 and stats.outcomes["ok"] == 25
    page_requests = requests_for(server, 1, 1)
    # The original was abandoned mid-generation (the connection closed), the hedge answered.
    assert [r["outcome"] for r in page_requests] == ["client_gone", "ok"]


def test_no_hedge_before_the_floor_or_without_a_latency_history(standin_factory: Factory) -> None:
    server = standin_factory(scripts={"1:1": ["slow"], "1:2": ["slow"]}, slow_s=0.6, latency_s=0.02)

    async def scenario() -> Any:
        async with build_client(hedging_settings(server, hedge_min_delay_s=5.0)) as client:
            await client.complete(page_body(1, 1))  # no history yet: never hedged
            await _warm_up(client)
            await client.complete(page_body(1, 2))  # 0.6 s is far above 3 x p95, but below the floor
            return client.stats()

    stats = run(scenario())
    assert stats.hedged == 0
    assert [r["outcome"] for page in (1, 2) for r in requests_for(server, 1, page)] == ["slow", "slow"]


class _MarkedPages:
    """A renderer that draws the stand-in's page markers instead of rendering a PDF."""

    async def render_page(
        self, path: str, page_index: int, target_longest_image_dim: int = 1288, rotation: int = 0
    ) -> bytes:
        return marked_png_base64(1, page_index + 1)

    async def page_text(self, path: str, page_index: int) -> str:
        return ""


def test_hedged_request_is_counted_on_the_page_and_is_not_an_attempt(standin_factory: Factory) -> None:
    server = standin_factory(scripts={"1:1": ["hang"]}, latency_s=0.02)

    async def scenario() -> Any:
        settings = hedging_settings(server)
        async with build_client(settings) as client:
            await _warm_up(client)
            converter = PageConverter(
                client, _MarkedPages(), RequestBodyBuilder(settings.connection.model), PageSettings()
            )
            return await converter.convert("doc.pdf", 0)

    page = run(scenario())
    assert not page.is_fallback
    assert page.attempts == 1 and page.accepted_attempt == 1
    assert page.hedged == 1
