"""What our client relies on vLLM for, asserted against the real CPU vLLM and against the stand-in alike.

Each test runs twice (``server`` is parametrised): once on vLLM 0.32's CPU build serving the tiny random
model, once on ``olmocr_testkit.standin``. A difference is a stand-in bug (the stand-in follows the
real server) or a README statement to correct. Requests are olmOCR-shaped (one text part, one PNG).
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from PIL import Image

from olmocr_tasks.core.config import ServerSettings
from olmocr_tasks.inference.client_factory import build_client
from olmocr_tasks.inference.vllm_metrics import (
    GENERATION_TOKENS_METRIC,
    PROMPT_TOKENS_METRIC,
    RUNNING_METRIC,
    SUCCESS_METRIC,
    WAITING_METRIC,
    QueueSample,
    parse_vllm_sample,
)
from olmocr_tasks.page.protocol import OLMOCR_FRONT_MATTER_REGEX, parse_completion
from olmocr_testkit.cpu_vllm.server import MAX_MODEL_LEN, MODEL_NAME, metric_total, metrics_text
from tests.vllm.conftest import ContractServer, wait_for

# A generation long enough to watch while it runs: the tiny model makes a few hundred tokens a second
# on a busy machine; the stand-in is held by its latency instead.
LONG_TOKENS = 6000
# The families backpressure, gpu_busy and the run summary read.
READ_METRICS = {RUNNING_METRIC, WAITING_METRIC, PROMPT_TOKENS_METRIC, GENERATION_TOKENS_METRIC, SUCCESS_METRIC}


def _png_base64(size: tuple[int, int] = (224, 280)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, "white").save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def queue(server: ContractServer) -> Any:
    return parse_vllm_sample(metrics_text(server.root_url)).queue


def page_request(
    text: str = "Read this page.", image_size: tuple[int, int] = (224, 280), **fields: Any
) -> dict[str, Any]:
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{_png_base64(image_size)}"}}
    message = {"role": "user", "content": [{"type": "text", "text": text}, image]}
    return {"model": MODEL_NAME, "messages": [message], "max_tokens": 20, "temperature": 0.0} | fields


@contextmanager
def abandoned_request(server: ContractServer, body: dict[str, Any]) -> Iterator[None]:
    """A request sent on a connection of its own, which is closed unanswered when the block ends."""
    encoded = json.dumps(body).encode()
    port = int(server.root_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as connection:
        connection.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(encoded)}\r\n\r\n".encode()
            + encoded
        )
        yield


def post(server: ContractServer, body: dict[str, Any], timeout: float = 120.0) -> httpx.Response:
    return httpx.post(server.base_url + "/chat/completions", json=body, timeout=timeout)


def test_the_model_list_names_the_served_model_and_its_context(server: ContractServer) -> None:
    listing = httpx.get(server.base_url + "/models", timeout=10).json()
    assert listing["object"] == "list"
    assert [(card["id"], card["object"], card["max_model_len"]) for card in listing["data"]] == [
        (MODEL_NAME, "model", MAX_MODEL_LEN)
    ]


def test_the_version_endpoint_names_a_release(server: ContractServer) -> None:
    version = httpx.get(server.root_url + "/version", timeout=10).json()["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", version)


def test_an_answer_has_one_choice_a_finish_reason_and_consistent_usage(server: ContractServer) -> None:
    payload = post(server, page_request()).json()
    (choice,) = payload["choices"]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    usage = payload["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_an_answer_cut_at_max_tokens_finishes_with_length(server: ContractServer) -> None:
    # min_tokens (vLLM's) keeps a model from ending before the limit; the stand-in's answers are longer.
    payload = post(server, page_request(max_tokens=3, min_tokens=3)).json()
    assert payload["choices"][0]["finish_reason"] == "length"
    assert payload["usage"]["completion_tokens"] == 3


def test_max_tokens_beyond_the_context_is_capped_not_refused(server: ContractServer) -> None:
    # vLLM caps the completion at what the context leaves; only a prompt over the context is a 400.
    payload = post(server, page_request(max_tokens=MAX_MODEL_LEN)).json()
    assert payload["usage"]["total_tokens"] <= MAX_MODEL_LEN


def test_a_prompt_longer_than_the_context_is_a_400_saying_so(server: ContractServer) -> None:
    response = post(server, page_request(text="hello world " * 9000))
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("BadRequestError", 400, "input_tokens")
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in error["message"]


def test_a_page_image_that_takes_the_prompt_over_the_context_is_a_400_saying_so(server: ContractServer) -> None:
    # A 4,000 px square image is scaled to Qwen2.5-VL's 12,845,056-pixel limit: 16,384 image tokens, and
    # the text takes the prompt over the context. vLLM counts the image in after checking the text alone
    # and says it in other words, without a param.
    response = post(server, page_request(image_size=(4000, 4000)))
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("BadRequestError", 400, None)
    expected = rf"Input length \(\d+\) exceeds model's maximum context length \({MAX_MODEL_LEN}\)\."
    assert re.fullmatch(expected, error["message"]), error["message"]


def test_an_unknown_model_is_a_404(server: ContractServer) -> None:
    response = post(server, page_request(model="no-such-model"))
    assert response.status_code == 404
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("NotFoundError", 404, "model")
    assert "The model `no-such-model` does not exist." in error["message"]


def test_metrics_carry_the_names_and_labels_our_readers_use(server: ContractServer) -> None:
    post(server, page_request(max_tokens=2, min_tokens=2))
    text = metrics_text(server.root_url)
    labels: dict[str, set[frozenset[str]]] = {}
    reasons = set()
    for line in text.splitlines():
        match = re.match(r"^(vllm:[a-z_:]+)\{([^}]*)\} ", line)
        if match:
            pairs = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
            labels.setdefault(match.group(1), set()).add(frozenset(pairs))
            if match.group(1) == SUCCESS_METRIC:
                reasons.add(pairs["finished_reason"])
            if match.group(1) in READ_METRICS:
                assert pairs["model_name"] == MODEL_NAME
    for name in READ_METRICS - {SUCCESS_METRIC}:
        assert labels[name] == {frozenset({"engine", "model_name"})}, name
    assert labels[SUCCESS_METRIC] == {frozenset({"engine", "finished_reason", "model_name"})}
    assert {"stop", "length", "abort"} <= reasons
    sample = parse_vllm_sample(text)
    assert sample.processed_tokens is not None and sample.processed_tokens > 0


def test_priority_is_accepted_under_fcfs(server: ContractServer) -> None:
    response = post(server, page_request(priority=5))
    assert response.status_code == 200, response.text


def test_structured_outputs_constrain_the_answer_to_olmocrs_front_matter(server: ContractServer) -> None:
    body = page_request(max_tokens=200, structured_outputs={"regex": OLMOCR_FRONT_MATTER_REGEX})
    payload = post(server, body).json()
    content = payload["choices"][0]["message"]["content"]
    assert re.fullmatch(OLMOCR_FRONT_MATTER_REGEX, content), content
    assert parse_completion(payload).response.is_rotation_valid in (True, False)


def test_an_invalid_structured_outputs_regex_is_a_400(server: ContractServer) -> None:
    response = post(server, page_request(structured_outputs={"regex": "("}))
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "BadRequestError"


def test_a_client_that_disconnects_frees_its_place(server: ContractServer) -> None:
    """vLLM aborts a request whose client went away (a hedge's loser, a cancelled task): its place in
    the batch is free again at once, not after the whole answer."""
    with (
        server.long_requests(),
        abandoned_request(server, page_request(max_tokens=LONG_TOKENS, min_tokens=LONG_TOKENS)),
    ):
        wait_for(lambda: queue(server).running == 1)
    wait_for(lambda: queue(server).running == 0, timeout_s=30)


# -- through our client ----------------------------------------------------------------------------

# How long the stand-in holds the slow request and its hedges: past the 1-s and 2-s moments at which
# the client hedges it (the cold-start rule after one fast answer, never sooner than hedge_min_delay_s).
HEDGED_HOLD_S = 5.0
# The real server's slow request: ~15 s of generation at the ~100 tokens/s the tiny model made beside
# other work, against a hedge due at 6 x a 2-token answer (well under a second; the ratio holds on a
# loaded machine, where both slow down alike).
HEDGED_TOKENS = 1500


def test_a_hedged_requests_loser_is_aborted_at_the_server(server: ContractServer) -> None:
    """Our client (hedging at its defaults) hedges a request that outlasts the answer before it, takes
    the first answer and cancels the other copies; the server aborts them (vLLM on the client's
    disconnect). While the page is outstanding the server runs it and a hedge side by side; once it is
    answered the server holds nothing, and its success counter grew by the two answers alone, so no
    cancelled copy ran on to its end."""
    settings = ServerSettings(base_urls=(server.base_url,), model=MODEL_NAME)
    quick = json.dumps(page_request(max_tokens=2, min_tokens=2)).encode()
    slow = json.dumps(page_request(max_tokens=HEDGED_TOKENS, min_tokens=HEDGED_TOKENS)).encode()
    finished_before = metric_total(metrics_text(server.root_url), SUCCESS_METRIC)

    async def scenario() -> tuple[dict[str, Any], Any, float]:
        most_running = 0.0
        async with build_client(settings) as client, httpx.AsyncClient(timeout=10) as http:
            # One answer timed: the cold-start rule then hedges at 2 x hedge_multiple x its time.
            await client.complete(quick)
            with server.long_requests(HEDGED_HOLD_S):
                page = asyncio.ensure_future(client.complete(slow))
                while not page.done():
                    reading = await http.get(server.root_url + "/metrics")
                    most_running = max(most_running, parse_vllm_sample(reading.text).queue.running)
                    await asyncio.wait({page}, timeout=0.2)
            return page.result(), client.stats(), most_running

    answer, stats, most_running = asyncio.run(scenario())
    assert answer["usage"]["completion_tokens"] > 0
    assert stats.hedged >= 1 and stats.outcomes == {"ok": 2} and stats.retries == 0
    assert most_running >= 2
    wait_for(lambda: queue(server) == QueueSample(running=0, waiting=0), timeout_s=30)
    assert metric_total(metrics_text(server.root_url), SUCCESS_METRIC) - finished_before == 2
