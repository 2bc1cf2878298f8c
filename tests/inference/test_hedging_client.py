"""Hedging at a run's cold start, through InferenceClient against the real stand-in: a request hung
before the client has timed ``MIN_SAMPLES`` answers (a run of one or a few pages, the first pages of a
run) is hedged by the cold-start rules, not left to the read timeout."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from olmocr_tasks.core.config import DEFAULT_MODEL, ServerSettings
from olmocr_tasks.inference.client_factory import build_client
from olmocr_tasks.inference.hedging_policy import MIN_SAMPLES
from tests.fixtures.client import Factory, content_of, page_body, requests_for, run

pytestmark = pytest.mark.timeout(60)


def default_settings(server: Any, **overrides: Any) -> ServerSettings:
    """The defaults a user gets (read timeout 300 s, hedging on, /metrics polled every second)."""
    return ServerSettings(base_urls=(server.url,), model=DEFAULT_MODEL, **overrides)


def test_one_page_run_whose_only_request_hangs_is_hedged_when_the_server_holds_nothing(
    standin_factory: Factory,
) -> None:
    # No answer will ever be timed: the server's /metrics say it holds no request, so ours is lost.
    server = standin_factory(scripts={"1:1": ["hang"]}, latency_s=0.05)

    async def scenario() -> tuple[dict[str, Any], Any]:
        async with build_client(default_settings(server)) as client:
            return await client.complete(page_body(1, 1)), client.stats()

    answer, stats = run(scenario())
    assert "document 1 page 1." in content_of(answer)
    assert stats.hedged == 1 and stats.retries == 0
    # Answered by its hedge: no read timeout fired (it would have been counted) and no retry was sent.
    assert stats.outcomes == {"ok": 1}
    assert [r["outcome"] for r in requests_for(server, 1, 1)] == ["hang", "ok"]


def test_small_run_whose_first_request_hangs_finishes_by_hedging(standin_factory: Factory) -> None:
    # Three pages, fewer than MIN_SAMPLES: the first page's request is accepted and never answered.
    assert MIN_SAMPLES > 3
    server = standin_factory(scripts={"1:1": ["hang"]}, latency_s=0.2)

    async def scenario() -> tuple[list[dict[str, Any]], Any]:
        async with build_client(default_settings(server)) as client:
            first = asyncio.ensure_future(client.complete(page_body(1, 1)))
            await asyncio.sleep(0)
            rest = [client.complete(page_body(1, page)) for page in (2, 3)]
            return list(await asyncio.gather(first, *rest)), client.stats()

    answers, stats = run(scenario())
    assert [f"document 1 page {page}." in content_of(a) for page, a in enumerate(answers, 1)] == [True] * 3
    assert stats.hedged == 1 and stats.outcomes == {"ok": 3} and stats.retries == 0
    hung, hedge = requests_for(server, 1, 1)
    assert (hung["outcome"], hedge["outcome"]) == ("hang", "ok")
    others = [record for page in (2, 3) for record in requests_for(server, 1, page)]
    assert [r["outcome"] for r in others] == ["ok", "ok"]
    # Event order: the hung request was the run's first; its hedge was sent only after the other
    # pages had been answered (nothing else was hedged).
    assert hung["seq"] < min(r["seq"] for r in others)
    assert hedge["arrival"] >= max(r["finished"] for r in others)


def test_without_metrics_a_lone_hung_request_is_hedged_at_a_quarter_of_the_read_timeout(
    standin_factory: Factory,
) -> None:
    # No /metrics and no answer: only the read-timeout prior is left. With an 8-s read timeout it falls
    # due at 2 s, and the hedge answers before the read timeout would have fired and been retried.
    server = standin_factory(scripts={"1:1": ["hang"]}, latency_s=0.05, metrics=False)

    async def scenario() -> tuple[dict[str, Any], Any]:
        async with build_client(default_settings(server, read_timeout_s=8.0)) as client:
            return await client.complete(page_body(1, 1)), client.stats()

    answer, stats = run(scenario())
    assert "document 1 page 1." in content_of(answer)
    assert stats.window_mode == "fixed"
    assert stats.hedged == 1 and stats.outcomes == {"ok": 1} and stats.retries == 0
    assert [r["outcome"] for r in requests_for(server, 1, 1)] == ["hang", "ok"]


def test_a_slow_request_the_server_is_generating_is_not_hedged_at_cold_start(standin_factory: Factory) -> None:
    # A GPU-like page of 3 s on an otherwise idle server, the run's only one: /metrics count it as
    # running, so the server does not hold "nothing", and the prior (75 s) is far off.
    server = standin_factory(latency_s=3.0)

    async def scenario() -> tuple[dict[str, Any], Any]:
        async with build_client(default_settings(server)) as client:
            return await client.complete(page_body(1, 1)), client.stats()

    answer, stats = run(scenario())
    assert "document 1 page 1." in content_of(answer)
    assert stats.hedged == 0 and stats.outcomes == {"ok": 1}
    assert [r["outcome"] for r in requests_for(server, 1, 1)] == ["ok"]


def test_a_page_whose_request_and_both_hedges_hang_is_hedged_again_while_the_server_holds_nothing(
    standin_factory: Factory,
) -> None:
    # max_hedges_per_request (2) bounds duplicated decoding; requests the server does not hold decode
    # nothing, so the lost-request rule may go past it instead of leaving the page to the read timeout.
    server = standin_factory(scripts={"1:1": ["hang", "hang", "hang"]}, latency_s=0.05)

    async def scenario() -> tuple[dict[str, Any], Any]:
        async with build_client(default_settings(server)) as client:
            return await client.complete(page_body(1, 1)), client.stats()

    answer, stats = run(scenario())
    assert "document 1 page 1." in content_of(answer)
    assert stats.hedged == 3 and stats.outcomes == {"ok": 1} and stats.retries == 0
    assert [r["outcome"] for r in requests_for(server, 1, 1)] == ["hang", "hang", "hang", "ok"]
