"""The readiness verdicts on their own (``olmocr_tasks.inference.readiness``): how one ``/models``
answer or error is judged, the wait for a starting server, and the check over every replica before a
run. The servers are ``httpx.MockTransport`` handlers; no socket is opened."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from olmocr_tasks.core.config import TimeoutSettings
from olmocr_tasks.core.errors import ServerMisconfigured, ServerNotReady
from olmocr_tasks.inference.readiness import ModelsProbe, ProbeResult, certificate_rejected, check_ready, wait_ready

pytestmark = pytest.mark.timeout(60)

KEY = "sk-readiness-0123456789"
URL = "http://vllm.test:8000/v1"
MODELS = {"data": [{"id": "allenai/olmOCR"}, {"id": "other"}]}
Handler = Callable[[httpx.Request], httpx.Response]


def probe(url: str = URL, *, api_key: str | None = KEY) -> ModelsProbe:
    return ModelsProbe(url, "allenai/olmOCR", api_key=api_key)


def http_for(handler: Handler) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def run(make: Callable[[], Any]) -> Any:
    return asyncio.run(make())


def answering(*responses: httpx.Response) -> tuple[Handler, list[httpx.Request]]:
    """Answers with the next of ``responses``, then with the last one; records every request."""
    seen: list[httpx.Request] = []
    queue = list(responses)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return handler, seen


def refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused")


def untrusted_certificate(request: httpx.Request) -> httpx.Response:
    try:
        raise ssl.SSLCertVerificationError(1, "certificate verify failed: self-signed certificate")
    except ssl.SSLCertVerificationError as exc:
        raise httpx.ConnectError("TLS handshake failed") from exc


# -- one answer, judged ---------------------------------------------------------------------------


def test_a_server_listing_the_model_is_ready_and_the_probe_asks_with_the_key() -> None:
    handler, seen = answering(httpx.Response(200, json=MODELS))

    async def scenario() -> ProbeResult:
        async with http_for(handler) as http:
            return await probe(URL + "/").probe(http, 5.0)

    result = run(scenario)
    assert result == ProbeResult(
        "ready", f"{URL} serves allenai/olmOCR", models=("allenai/olmOCR", "other"), status=200
    )
    assert result.ready
    (request,) = seen
    assert request.method == "GET" and str(request.url) == URL + "/models"
    assert request.headers["authorization"] == f"Bearer {KEY}"


def test_without_a_key_no_authorization_header_is_sent() -> None:
    handler, seen = answering(httpx.Response(200, json=MODELS))
    with httpx.Client(transport=httpx.MockTransport(handler)) as http:
        result = probe(api_key=None).probe_sync(http, 5.0)
    assert result.state == "ready" and "authorization" not in seen[0].headers


@pytest.mark.parametrize(
    ("api_key", "status", "configured"), [(KEY, 401, "a key is configured"), (None, 403, "no key is configured")]
)
def test_a_refused_key_is_misconfigured(api_key: str | None, status: int, configured: str) -> None:
    result = probe(api_key=api_key).judge_response(httpx.Response(status))
    assert (result.state, result.reason, result.status) == ("misconfigured", "auth", status)
    assert result.detail == f"{URL}/models answered HTTP {status}: the API key is missing or wrong ({configured})"


def test_a_missing_route_says_the_base_url_is_probably_not_the_api_root() -> None:
    result = probe().judge_response(httpx.Response(404))
    assert (result.state, result.reason, result.status) == ("misconfigured", "url", 404)
    assert "is the base URL the OpenAI API root (usually ending in /v1)?" in result.detail


@pytest.mark.parametrize("status", [500, 502, 503, 429])
def test_other_error_statuses_mean_the_server_is_still_starting(status: int) -> None:
    assert probe().judge_response(httpx.Response(status)) == ProbeResult("starting", f"HTTP {status}", status=status)


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, text="<html>login</html>"),
        httpx.Response(200, json={"models": ["allenai/olmOCR"]}),
        httpx.Response(200, json={"data": [{"name": "allenai/olmOCR"}]}),
    ],
)
def test_a_200_that_is_not_a_model_list_is_misconfigured(answer: httpx.Response) -> None:
    result = probe().judge_response(answer)
    assert (result.state, result.reason) == ("misconfigured", "not_a_model_list")
    assert result.detail == f"{URL}/models answered HTTP 200 but not an OpenAI model list"


def test_a_server_serving_another_model_says_which() -> None:
    result = probe().judge_response(httpx.Response(200, json={"data": [{"id": "a"}, {"id": "b"}]}))
    assert (result.state, result.reason, result.models) == ("misconfigured", "model_missing", ("a", "b"))
    assert result.detail == f"{URL} serves a, b; configured model is allenai/olmOCR"
    empty = probe().judge_response(httpx.Response(200, json={"data": []}))
    assert empty.detail == f"{URL} serves no model; configured model is allenai/olmOCR"


def test_a_refused_connection_is_starting_and_its_message_carries_no_secret() -> None:
    secret_url = "http://reader:url-password-42@vllm.test:8000/v1"
    one = ModelsProbe(secret_url, "m", api_key=KEY, secrets=["url-password-42"])

    def leaky(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"refused {KEY} url-password-42 " + "x" * 400)

    async def scenario() -> ProbeResult:
        async with http_for(leaky) as http:
            return await one.probe(http, 5.0)

    result = run(scenario)
    assert result.state == "starting" and result.reason == "" and result.status is None
    assert result.detail.startswith("ConnectError: refused ***")
    assert KEY not in result.detail and "url-password-42" not in result.detail
    assert len(result.detail) == 300
    assert one.display == "http://***@vllm.test:8000/v1"


def test_an_untrusted_certificate_is_misconfigured_with_what_to_do() -> None:
    async def scenario() -> ProbeResult:
        async with http_for(untrusted_certificate) as http:
            return await probe().probe(http, 5.0)

    result = run(scenario)
    assert (result.state, result.reason) == ("misconfigured", "tls")
    assert result.detail.startswith(f"{URL}: TLS certificate verification failed (ConnectError: TLS handshake failed)")
    assert "SSL_CERT_FILE" in result.detail and "--insecure" in result.detail


def test_certificate_rejection_is_found_anywhere_in_the_cause_chain_and_loops_end() -> None:
    outer = RuntimeError("outer")
    middle = OSError("middle")
    outer.__context__ = middle
    middle.__cause__ = ssl.SSLCertVerificationError(1, "verify failed")
    assert certificate_rejected(outer)
    looping = RuntimeError("a")
    other = RuntimeError("b")
    looping.__context__, other.__context__ = other, looping
    assert not certificate_rejected(looping)
    assert not certificate_rejected(httpx.ConnectError("refused"))


# -- waiting for one server -----------------------------------------------------------------------


def wait(*answers: httpx.Response, timeout_s: float = 30.0) -> tuple[ProbeResult, int]:
    """``wait_ready``'s verdict against a server giving ``answers`` in turn, and how often it was asked."""
    handler, seen = answering(*answers)

    async def scenario() -> ProbeResult:
        async with http_for(handler) as http:
            return await wait_ready(probe(), http, timeout_s=timeout_s, interval_s=0.01, request_timeout=5.0)

    return run(scenario), len(seen)


def test_wait_ready_polls_a_starting_server_until_it_lists_the_model() -> None:
    result, asked = wait(httpx.Response(503), httpx.Response(503), httpx.Response(200, json=MODELS))
    assert result.state == "ready" and asked == 3


def test_wait_ready_does_not_wait_out_a_configuration_error() -> None:
    result, asked = wait(httpx.Response(401))
    assert result.reason == "auth" and asked == 1


def test_wait_ready_gives_the_last_starting_verdict_at_its_timeout() -> None:
    result, asked = wait(httpx.Response(502), httpx.Response(503), timeout_s=0.1)
    assert result == ProbeResult("starting", "HTTP 503", status=503)
    assert asked >= 2


# -- the check over every replica before a run ----------------------------------------------------


def by_host(**handlers: Handler) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        return handlers[request.url.host.split(".")[0]](request)

    return handler


def check(handler: Handler, *hosts: str, **timeouts: float) -> Any:
    probes = [probe(f"http://{host}.test:8000/v1") for host in hosts]

    async def scenario() -> Any:
        async with http_for(handler) as http:
            return await check_ready(probes, http, TimeoutSettings(**timeouts)), probes

    return run(scenario)


def test_every_replica_ready_gives_the_models_they_list_each_once_in_order() -> None:
    first, _ = answering(httpx.Response(200, json=MODELS))
    second, _ = answering(httpx.Response(200, json={"data": [{"id": "third"}, {"id": "allenai/olmOCR"}]}))
    readiness, _ = check(by_host(a=first, b=second), "a", "b")
    assert readiness.models == ["allenai/olmOCR", "other", "third"]
    assert readiness.not_ready == {}


def test_probes_use_the_connect_and_write_timeouts_and_a_read_timeout_of_at_most_30_s() -> None:
    handler, seen = answering(httpx.Response(200, json=MODELS))
    check(handler, "a", connect_timeout_s=3.0, read_timeout_s=300.0, write_timeout_s=7.0)
    assert seen[0].extensions["timeout"] == {"connect": 3.0, "read": 30.0, "write": 7.0, "pool": None}
    handler, seen = answering(httpx.Response(200, json=MODELS))
    check(handler, "a", read_timeout_s=12.0)
    assert seen[0].extensions["timeout"]["read"] == 12.0


def test_a_replica_still_down_at_the_timeout_is_reported_while_the_others_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    up, _ = answering(httpx.Response(200, json=MODELS))
    with caplog.at_level(logging.WARNING, logger="olmocr_tasks.inference.readiness"):
        readiness, (_, down) = check(by_host(up=up, down=refused), "up", "down", readiness_timeout_s=0.2)
    assert readiness.models == ["allenai/olmOCR", "other"]
    assert readiness.not_ready == {
        down: "http://down.test:8000/v1: not ready after 0.2 s: ConnectError: connection refused"
    }
    assert [record.getMessage() for record in caplog.records] == [
        "replica not ready, continuing with the others: "
        "http://down.test:8000/v1: not ready after 0.2 s: ConnectError: connection refused"
    ]


def test_no_replica_ready_at_the_timeout_fails_the_check_with_each_ones_reason() -> None:
    starting, _ = answering(httpx.Response(503))
    with pytest.raises(ServerNotReady) as caught:
        check(by_host(a=refused, b=starting), "a", "b", readiness_timeout_s=0.2)
    assert type(caught.value) is ServerNotReady
    assert str(caught.value) == (
        "http://a.test:8000/v1: not ready after 0.2 s: ConnectError: connection refused; "
        "http://b.test:8000/v1: not ready after 0.2 s: HTTP 503"
    )


def test_a_misconfigured_replica_fails_the_check_without_waiting_for_a_starting_one() -> None:
    # The starting replica would be waited for up to an hour; the wrong model ends the check first.
    starting, starting_seen = answering(httpx.Response(503))
    wrong, _ = answering(httpx.Response(200, json={"data": [{"id": "someone/else"}]}))
    with pytest.raises(ServerMisconfigured) as caught:
        check(by_host(a=starting, b=wrong), "a", "b", readiness_timeout_s=3600.0)
    assert str(caught.value) == "http://b.test:8000/v1 serves someone/else; configured model is allenai/olmOCR"
    assert len(starting_seen) >= 1
