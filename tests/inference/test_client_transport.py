"""InferenceClient's own logic through an injected ``httpx.MockTransport``: what it sends, how it
retries and backs off, how it reads answers, and when it calls an outage. No server runs; the tests
against the vLLM stand-in (``test_client``) cover what only real sockets show."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
import pytest

from olmocr_tasks.core.config import ServerSettings
from olmocr_tasks.core.errors import AttemptFailed, ServerMisconfigured, ServerUnavailable
from olmocr_tasks.inference.client import InferenceClient
from olmocr_tasks.inference.client_factory import build_client

pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")
URL = "http://vllm.test:8000/v1"
KEY = "sk-transport-0123456789"
BODY = b'{"model":"m","messages":[]}'
ANSWER = {"choices": [{"message": {"content": "text"}}], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}


def settings(**overrides: Any) -> ServerSettings:
    values: dict[str, Any] = {
        "base_urls": (URL,),
        "model": "m",
        "api_key": KEY,
        "request_retry_budget_s": 30.0,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 5.0,
        "adaptive_concurrency": False,
        "hedge_requests": False,
    }
    return ServerSettings(**{**values, **overrides})


class Server:
    """Answers each request with the next of ``answers`` (a response or an exception to raise), then
    with the last one; records every request."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def completions(self) -> list[httpx.Request]:
        return [r for r in self.requests if r.url.path.endswith("/chat/completions")]


class Sleeps:
    """The backoff sleeps the client asked for; returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def run(coro: Awaitable[T]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, 45)

    return asyncio.run(bounded())


def client_for(
    handler: Callable[[httpx.Request], httpx.Response],
    sleep: Callable[[float], Awaitable[None]] | None = None,
    **overrides: Any,
) -> InferenceClient:
    extra: dict[str, Any] = {"sleep": sleep} if sleep is not None else {}
    return build_client(settings(**overrides), transport=httpx.MockTransport(handler), **extra)


def complete(
    server: Server, sleep: Callable[[float], Awaitable[None]] | None = None, **overrides: Any
) -> tuple[dict[str, Any], Any]:
    async def scenario() -> tuple[dict[str, Any], Any]:
        async with client_for(server, sleep, **overrides) as client:
            return await client.complete(BODY), client.stats()

    return run(scenario())


def test_the_body_goes_out_byte_for_byte_with_the_key_in_the_header_only() -> None:
    server = Server(httpx.Response(200, json=ANSWER))
    payload, stats = complete(server)
    assert payload == ANSWER
    (request,) = server.completions()
    assert str(request.url) == URL + "/chat/completions" and request.method == "POST"
    assert request.content == BODY
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["content-type"] == "application/json"
    assert stats.requests == 1 and stats.retries == 0 and stats.outcomes == {"ok": 1}


def test_server_errors_and_dropped_connections_are_retried_until_an_answer() -> None:
    server = Server(
        httpx.Response(503, text="busy"),
        httpx.RemoteProtocolError("peer closed"),
        httpx.Response(200, json=ANSWER),
    )
    sleeps = Sleeps()
    payload, stats = complete(server, sleeps)
    assert payload == ANSWER
    assert len(server.completions()) == 3 and stats.retries == 2
    assert stats.outcomes == {"http_5xx": 1, "transport": 1, "ok": 1}
    # Jittered exponential backoff: the n-th wait lies in [initial * 2^(n-1) / 2, initial * 2^(n-1)].
    assert 0.005 <= sleeps.delays[0] <= 0.01 and 0.01 <= sleeps.delays[1] <= 0.02


def test_retry_after_lengthens_the_backoff_up_to_its_cap() -> None:
    sleeps = Sleeps()
    server = Server(httpx.Response(429, headers={"Retry-After": "2"}), httpx.Response(200, json=ANSWER))
    complete(server, sleeps)
    assert sleeps.delays == [2.0]
    capped = Sleeps()
    server = Server(httpx.Response(429, headers={"Retry-After": "3600"}), httpx.Response(200, json=ANSWER))
    complete(server, capped, backoff_max_s=0.5)
    assert capped.delays == [0.5]


def test_a_refused_key_is_a_configuration_error_not_a_page_failure() -> None:
    server = Server(httpx.Response(401, text=f"bad key {KEY}"))
    with pytest.raises(ServerMisconfigured, match="API key is missing or wrong") as caught:
        complete(server)
    assert KEY not in str(caught.value) and len(server.completions()) == 1


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (httpx.Response(400, text="prompt too long"), "HTTP 400: prompt too long"),
        (httpx.Response(200, text="<html>"), "HTTP 200 with a body that is not JSON"),
        (httpx.Response(200, json=[1, 2]), "HTTP 200 with a JSON body that is not an object"),
    ],
)
def test_answers_that_no_retry_can_fix_fail_the_page_attempt_at_once(answer: httpx.Response, message: str) -> None:
    server = Server(answer)
    with pytest.raises(AttemptFailed, match=message):
        complete(server)
    assert len(server.completions()) == 1


def test_secrets_in_error_texts_are_redacted() -> None:
    server = Server(httpx.Response(400, text=f"echo {KEY}"))
    with pytest.raises(AttemptFailed) as caught:
        complete(server)
    assert KEY not in str(caught.value)


def test_check_ready_asks_the_models_route_through_the_same_transport() -> None:
    server = Server(httpx.Response(200, json=ANSWER))

    async def scenario() -> list[str]:
        async with client_for(server) as client:
            return await client.check_ready()

    assert run(scenario()) == ["m"]
    assert [r.url.path for r in server.requests] == ["/v1/models"]
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"


def test_requests_and_probes_that_keep_failing_are_an_outage() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    async def scenario() -> Any:
        async with client_for(down, outage_window_s=0.3, request_retry_budget_s=0.1, backoff_max_s=0.05) as client:
            with pytest.raises(ServerUnavailable, match="readiness probes failed too") as caught:
                await client.complete(BODY)
            # Once open, every later call fails at once.
            with pytest.raises(ServerUnavailable):
                await client.complete(BODY)
            return caught.value, client.stats()

    error, stats = run(scenario())
    assert "outage window 0.3 s" in str(error)
    assert stats.breaker_open and stats.probes_failed >= 1 and stats.probes_ok == 0


def test_a_server_that_answers_its_probes_is_not_down_while_its_requests_fail() -> None:
    # Completions time out (a hung request each time) but /models answers: slow pages, no outage;
    # the page attempt fails once its retry budget is spent.
    def hung(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": [{"id": "m"}]})
        raise httpx.ReadTimeout("timed out")

    async def scenario() -> Any:
        async with client_for(hung, outage_window_s=0.2, request_retry_budget_s=0.5, backoff_max_s=0.05) as client:
            with pytest.raises(AttemptFailed, match=r"retry budget of 0\.5 s spent"):
                await client.complete(BODY)
            return client.stats()

    stats = run(scenario())
    assert not stats.breaker_open and stats.probes_ok >= 1
    assert stats.outcomes["timeout"] >= 2 and stats.outcomes["budget_exhausted"] == 1
