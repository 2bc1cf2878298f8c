"""The vLLM stand-in behaves like the server the engine must survive: protocol, queueing, faults."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from PIL import Image

from olmocr_tasks.inference.priority import with_priority
from olmocr_tasks.inference.vllm_metrics import QueueSample, ServerMetrics, parse_vllm_sample, render_vllm_metrics
from olmocr_tasks.page.protocol import (
    FrontMatterError,
    RequestBodyBuilder,
    format_front_matter,
    parse_completion,
    parse_front_matter,
)
from olmocr_testkit.page_query import build_page_query
from olmocr_testkit.standin.__main__ import parse_args
from tests.fixtures.standin import StandinServer, marked_png, start_standin_process

JSON = {"Content-Type": "application/json"}
# One pooled client: building an httpx client (TLS context included) per call costs tens of
# milliseconds, enough to blur the timing assertions below.
CLIENT = httpx.Client(limits=httpx.Limits(max_connections=64, max_keepalive_connections=64))


def page_body(server: Any, doc_id: int | None = 3, page: int = 2, temperature: float = 0.1, **png: Any) -> bytes:
    return RequestBodyBuilder(server.model).build(marked_png(doc_id, page, as_base64=True, **png), temperature)


def chat(server: Any, body: bytes, timeout: Any = 5.0, headers: dict[str, str] | None = None) -> httpx.Response:
    return CLIENT.post(
        f"{server.url}/chat/completions", content=body, headers={**JSON, **(headers or {})}, timeout=timeout
    )


def content_of(response: httpx.Response) -> str:
    return response.json()["choices"][0]["message"]["content"]


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def wait_until(predicate: Callable[[], bool], timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


# ----- protocol ---------------------------------------------------------------------------------


def test_models_health_and_answer_in_olmocr_format(standin: StandinServer) -> None:
    models = CLIENT.get(f"{standin.url}/models").json()
    assert models["object"] == "list"
    assert models["data"][0].items() >= {"id": standin.model, "object": "model", "owned_by": "standin"}.items()
    assert CLIENT.get(f"{standin.base_url}/health").status_code == 200

    body = page_body(standin, 3, 2, temperature=0.2)
    response = chat(standin, body)
    assert response.status_code == 200
    payload = response.json()
    assert payload["object"] == "chat.completion"
    assert payload["model"] == standin.model
    assert payload["id"].startswith("chatcmpl-")
    assert isinstance(payload["created"], int)
    choice = payload["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] == "stop"
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == (
        "---\nprimary_language: en\nis_rotation_valid: True\nrotation_correction: 0\n"
        "is_table: False\nis_diagram: False\n---\nStand-in transcription of document 3 page 2."
    )
    completion = parse_completion(payload)
    assert completion.is_valid and completion.response.is_rotation_valid
    # 200x260 px page: 66 visual tokens plus the prompt's text.
    usage = payload["usage"]
    assert usage["prompt_tokens"] == 200 * 260 // 784 + 150
    assert usage["completion_tokens"] == len(choice["message"]["content"]) // 4
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]

    (record,) = standin.requests()
    assert record["model"] == standin.model
    assert record["temperature"] == 0.2 and record["max_tokens"] == 8000
    assert record["keys"] == ["model", "messages", "max_tokens", "temperature"]
    assert record["marker"] == {"doc_id": 3, "page_number": 2, "rotation_correction": 0}
    assert len(record["image_sha1"]) == 40
    assert record["status"] == 200 and record["outcome"] == "ok" and record["fault"] is None
    assert record["arrival"] <= record["queued"] <= record["started"] <= record["finished"]
    assert standin.bodies() == [body]
    stats = standin.stats()
    assert stats["total"] == 1 and stats["completed"] == 1 and stats["by_status"] == {"200": 1}


def test_keeps_only_the_first_bodies(standin_factory: Callable[..., StandinServer]) -> None:
    server = standin_factory(keep_bodies=2)
    bodies = [page_body(server, 1, page) for page in (1, 2, 3)]
    for body in bodies:
        assert chat(server, body).status_code == 200
    assert server.bodies() == bodies[:2]
    assert [r["body_index"] for r in server.requests()] == [0, 1, None]


@pytest.mark.parametrize(
    ("transpose", "rotation"),
    [
        (None, 0),
        (Image.Transpose.ROTATE_90, 270),
        (Image.Transpose.ROTATE_180, 180),
        (Image.Transpose.ROTATE_270, 90),
    ],
)
def test_reports_the_rotation_that_makes_the_page_upright(
    standin: StandinServer, transpose: Image.Transpose | None, rotation: int
) -> None:
    answer = parse_completion(chat(standin, page_body(standin, 7, 300, transpose=transpose)).json())
    assert answer.response.rotation_correction == rotation
    assert answer.response.is_rotation_valid is (rotation == 0)
    assert answer.response.natural_text == "Stand-in transcription of document 7 page 300."
    # Applying the reported correction with PIL's direction really makes the page upright.
    image = Image.new("RGB", (200, 260))
    if transpose is not None:
        image = image.transpose(transpose)
    if rotation:
        image = image.transpose(getattr(Image.Transpose, f"ROTATE_{rotation}"))
    assert image.size == (200, 260)


def test_unmarked_image_answer_derives_from_image_sha1(standin: StandinServer) -> None:
    answer = parse_completion(chat(standin, page_body(standin, None)).json())
    (record,) = standin.requests()
    assert record["marker"] is None
    assert answer.response.natural_text == f"Stand-in transcription of unmarked image sha1 {record['image_sha1']}."


def test_identify_off_skips_decoding_but_stays_traceable(standin_factory: Callable[..., StandinServer]) -> None:
    server = standin_factory(identify=False)
    first = content_of(chat(server, page_body(server, 1, 1)))
    again = content_of(chat(server, page_body(server, 1, 1, temperature=0.9)))
    other = content_of(chat(server, page_body(server, 1, 2)))
    assert first == again != other
    assert "Stand-in transcription of image digest " in first
    records = server.requests()
    assert all(r["marker"] is None and r["image_sha1"] is None for r in records)
    assert records[0]["image_size"] == [200, 260]


def test_wrong_model_is_404_like_vllm(standin: StandinServer) -> None:
    body = RequestBodyBuilder("someone/else").build(marked_png(1, 1, as_base64=True), 0.1)
    response = chat(standin, body)
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["message"] == f"The model `someone/else` does not exist. Valid aliases: {standin.model}."
    assert error["param"] == "model"
    assert standin.requests()[0]["outcome"] == "model_not_found"


def _malformed(model: str) -> list[Any]:
    png = marked_png(1, 1, as_base64=True).decode()
    good = build_page_query(model, png, 0.1)
    image_first = json.loads(json.dumps(good))
    image_first["messages"][0]["content"].reverse()
    jpeg = json.loads(json.dumps(good))
    jpeg["messages"][0]["content"][1]["image_url"]["url"] = "data:image/jpeg;base64," + png
    not_png = build_page_query(model, "aGVsbG8gd29ybGQgdGhpcyBpcyBub3QgYSBwbmcgZmlsZQ==", 0.1)
    no_temperature = {k: v for k, v in good.items() if k != "temperature"}
    system_first = json.loads(json.dumps(good))
    system_first["messages"][0]["role"] = "system"
    return [b"{not json", [1, 2], image_first, jpeg, not_png, no_temperature, system_first, {**good, "max_tokens": 0}]


def test_malformed_requests_are_400(standin: StandinServer) -> None:
    for case in _malformed(standin.model):
        body = case if isinstance(case, bytes) else json.dumps(case).encode()
        response = chat(standin, body)
        assert response.status_code == 400, case
        assert "error" in response.json()
    assert standin.stats()["by_outcome"] == {"bad_request": 8}


def test_context_limit_and_max_tokens_like_vllm(standin_factory: Callable[..., StandinServer]) -> None:
    # As vLLM 0.32: max_tokens beyond the context is capped, only a prompt over it is refused.
    standin = standin_factory(max_model_len=400)
    capped = RequestBodyBuilder(standin.model, max_tokens=16384).build(marked_png(1, 1, as_base64=True), 0.1)
    assert chat(standin, capped).json()["usage"]["total_tokens"] <= 400
    # The page image's 306 tokens take the 150 of olmOCR's prompt over the context: vLLM's message for a
    # prompt over it once the image is counted (a text alone over it: test_contract.py).
    too_long = RequestBodyBuilder(standin.model).build(marked_png(1, 1, size=(400, 600), as_base64=True), 0.1)
    response = chat(standin, too_long)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"] == "Input length (456) exceeds model's maximum context length (400)."
    assert error["param"] is None

    short = RequestBodyBuilder(standin.model, max_tokens=10).build(marked_png(1, 1, as_base64=True), 0.1)
    payload = chat(standin, short).json()
    assert payload["choices"][0]["finish_reason"] == "length"
    assert payload["usage"]["completion_tokens"] == 10
    assert len(payload["choices"][0]["message"]["content"]) == 40


def test_api_key_is_enforced_on_models_and_chat(standin_factory: Callable[..., StandinServer]) -> None:
    server = standin_factory(api_key="sekrit")
    body = page_body(server)
    assert CLIENT.get(f"{server.url}/models").status_code == 401
    assert CLIENT.get(f"{server.url}/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert chat(server, body).status_code == 401
    auth = {"Authorization": "Bearer sekrit"}
    assert CLIENT.get(f"{server.url}/models", headers=auth).status_code == 200
    assert chat(server, body, headers=auth).status_code == 200
    # vLLM guards only /v1: probes and scrapes work without the key.
    assert CLIENT.get(f"{server.base_url}/health").status_code == 200
    assert CLIENT.get(f"{server.base_url}/metrics").status_code == 200
    assert server.stats()["by_outcome"] == {"unauthorized": 1, "ok": 1}


def test_hang_fraction_leaves_the_server_healthy(standin_factory: Callable[..., StandinServer]) -> None:
    # A healthy server with a share of requests that are read and never answered (issue 13's fault).
    server = standin_factory(seed=5, fault_rates={"hang": 0.25})
    body = page_body(server)

    def attempt(_: int) -> int | None:
        try:
            return chat(server, body, timeout=httpx.Timeout(5.0, read=1.0)).status_code
        except httpx.ReadTimeout:
            return None

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(attempt, range(24)))
    hung = statuses.count(None)
    assert 0 < hung < 24 and statuses.count(200) == 24 - hung
    assert CLIENT.get(f"{server.url}/models").status_code == 200
    wait_until(lambda: server.stats()["by_outcome"] == {"hang": hung, "ok": 24 - hung})


def test_written_front_matter_and_metrics_read_back() -> None:
    # The servers we run write with the same module that reads, so the two cannot drift apart.
    for language, valid, rotation in [("en", True, 0), (None, False, 90), ("de", False, 270)]:
        text = format_front_matter(primary_language=language, is_rotation_valid=valid, rotation_correction=rotation)
        page = parse_front_matter(text + "Body")
        assert (page.primary_language, page.is_rotation_valid, page.rotation_correction) == (language, valid, rotation)
        assert page.natural_text == "Body" and not page.is_table and not page.is_diagram
    state = ServerMetrics(model='od"d\\name', running=3, waiting=7, success_by_reason={"stop": 4, "length": 1})
    text = render_vllm_metrics(state)
    assert parse_vllm_sample(text).queue == QueueSample(running=3.0, waiting=7.0)
    assert 'vllm:request_success_total{engine="0",finished_reason="length",model_name="od\\"d\\\\name"} 1.0' in text
    assert 'vllm:request_success_total{engine="0",finished_reason="abort",model_name="od\\"d\\\\name"} 0.0' in text


# ----- capacity and queueing ----------------------------------------------------------------------


def test_capacity_queues_fifo_and_metrics_show_it(standin_factory: Callable[..., StandinServer]) -> None:
    latency = 0.5
    server = standin_factory(capacity=2, latency_s=latency)
    body = page_body(server)
    observed: dict[str, float] = {}
    done = threading.Event()

    def scrape() -> None:
        # Read /metrics once the whole burst is queued (the server's own counters say when).
        while not done.is_set():
            stats = server.stats()
            if stats["running"] == 2 and stats["waiting"] == 6:
                text = CLIENT.get(f"{server.base_url}/metrics").text
                observed["running"] = metric(text, "vllm:num_requests_running")
                observed["waiting"] = metric(text, "vllm:num_requests_waiting")
                return
            time.sleep(0.01)

    scraper = threading.Thread(target=scrape)
    scraper.start()
    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda _: chat(server, body).status_code, range(8)))
    done.set()
    scraper.join()

    assert statuses == [200] * 8
    assert observed == {"running": 2.0, "waiting": 6.0}
    stats = server.stats()
    assert stats["max_running"] == 2 and stats["max_waiting"] == 6
    assert stats["running"] == 0 and stats["waiting"] == 0
    records = sorted(server.requests(), key=lambda r: r["queued"])
    starts = [r["started"] for r in records]
    assert starts == sorted(starts), "requests must start in the order they queued"
    # Event order, not a stopwatch: a request starts only after one of the two before it finished.
    by_start = sorted(records, key=lambda r: r["started"])
    for index in range(2, len(by_start)):
        finished_before = [r for r in by_start[:index] if r["finished"] <= by_start[index]["started"]]
        assert len(finished_before) >= index - 1, f"request {index} started with both slots taken"
    # Four waves of two: the server cannot have answered faster than four latencies.
    assert by_start[-1]["finished"] - by_start[0]["started"] >= 4 * latency * 0.95
    text = CLIENT.get(f"{server.base_url}/metrics").text
    assert 'vllm:request_success_total{engine="0",finished_reason="stop",model_name="' in text
    assert metric(text, "vllm:request_success_total") == 8.0


def test_client_leaving_the_queue_frees_its_place(standin_factory: Callable[..., StandinServer]) -> None:
    server = standin_factory(capacity=1, latency_s=0.4)
    body = page_body(server)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(chat, server, body)
        wait_until(lambda: server.stats()["running"] == 1)
        with pytest.raises(httpx.ReadTimeout):
            chat(server, body, timeout=0.1)
        wait_until(lambda: server.stats()["waiting"] == 0)
        assert first.result().status_code == 200
    assert server.stats()["by_outcome"] == {"client_gone": 1, "ok": 1}


def test_priority_policy_serves_the_waiting_queue_lowest_value_first(
    standin_factory: Callable[..., StandinServer],
) -> None:
    server = standin_factory(capacity=1, latency_s=0.2, scheduling_policy="priority")
    body = page_body(server)
    with ThreadPoolExecutor(8) as pool:
        blocker = pool.submit(chat, server, body)
        wait_until(lambda: server.stats()["running"] == 1)
        low = [pool.submit(chat, server, with_priority(body, 10)) for _ in range(3)]
        wait_until(lambda: server.stats()["waiting"] == 3)
        high = pool.submit(chat, server, with_priority(body, -10))
        wait_until(lambda: server.stats()["waiting"] == 4)
        assert all(f.result().status_code == 200 for f in [blocker, *low, high])
    # No preemption: the running request finished first; then the later, higher-priority one.
    order = [r["priority"] for r in sorted(server.requests(), key=lambda r: r["started"])]
    assert order == [0, -10, 10, 10, 10]


def test_fcfs_accepts_a_priority_like_vllm(standin: StandinServer) -> None:
    # vLLM 0.32 under its default fcfs takes the field and serves in arrival order (tests/vllm's contract).
    body = page_body(standin)
    assert chat(standin, with_priority(body, 5)).status_code == 200
    assert chat(standin, with_priority(body, 0)).status_code == 200
    assert [record["priority"] for record in standin.requests()] == [5, 0]


# ----- faults --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fault", "status"), [("500", 500), ("503", 503), ("429", 429)])
def test_error_status_faults(standin: StandinServer, fault: str, status: int) -> None:
    standin.configure(always={"3:2": fault}, retry_after_s=7)
    response = chat(standin, page_body(standin))
    assert response.status_code == status
    assert response.json()["error"]["code"] == status
    if fault == "429":
        assert response.headers["Retry-After"] == "7"
    assert standin.requests()[0].items() >= {"fault": fault, "outcome": fault, "status": status}.items()


def test_model_output_faults(standin: StandinServer) -> None:
    body = page_body(standin)

    standin.configure(always={"3:2": "garbage"})
    garbage = chat(standin, body)
    assert garbage.status_code == 200
    with pytest.raises(FrontMatterError):
        parse_completion(garbage.json())

    standin.configure(always={"3:2": "length"})
    length = parse_completion(chat(standin, body).json())
    assert length.finish_reason == "length" and not length.is_valid

    standin.configure(always={"3:2": "invalid_rotation"})
    rotated = chat(standin, body)
    assert "rotation_correction: 45\n" in content_of(rotated)
    with pytest.raises(FrontMatterError, match="rotation_correction"):
        parse_completion(rotated.json())

    standin.configure(always={"3:2": "overlong"})
    overlong = parse_completion(chat(standin, body).json())
    assert overlong.total_tokens > 16384 and overlong.finish_reason == "stop" and not overlong.is_valid

    standin.configure(always={"3:2": "bad_json"})
    bad = chat(standin, body)
    assert bad.status_code == 200 and bad.headers["Content-Type"].startswith("application/json")
    with pytest.raises(json.JSONDecodeError):
        json.loads(bad.content)

    outcomes = [r["outcome"] for r in standin.requests()]
    assert outcomes == ["garbage", "length", "invalid_rotation", "overlong", "bad_json"]


def test_drop_closes_the_connection_without_a_response(standin: StandinServer) -> None:
    standin.configure(always={"3:2": "drop"})
    with pytest.raises(httpx.RemoteProtocolError):
        chat(standin, page_body(standin))
    wait_until(lambda: standin.stats()["by_outcome"] == {"drop": 1})
    assert standin.requests()[0]["status"] is None


def test_hang_reads_the_request_and_never_answers(standin: StandinServer) -> None:
    standin.configure(always={"3:2": "hang"})
    with pytest.raises(httpx.ReadTimeout):
        chat(standin, page_body(standin), timeout=httpx.Timeout(5.0, read=0.3))
    # The handler ends once the client has gone, so nothing leaks.
    wait_until(lambda: standin.stats()["by_outcome"] == {"hang": 1})
    assert standin.requests()[0]["body_bytes"] > 0


def test_slow_answers_after_slow_s(standin: StandinServer) -> None:
    standin.configure(always={"3:2": "slow"}, slow_s=0.6)
    with pytest.raises(httpx.ReadTimeout):
        chat(standin, page_body(standin), timeout=httpx.Timeout(5.0, read=0.2))
    response = chat(standin, page_body(standin))
    assert response.status_code == 200
    assert parse_completion(response.json()).is_valid
    answered = standin.requests()[-1]
    assert answered["finished"] - answered["started"] >= 0.6 * 0.95
    wait_until(lambda: standin.stats()["by_outcome"] == {"client_gone": 1, "slow": 1})


def test_lowering_slow_s_answers_the_slow_pages_already_in_service(standin: StandinServer) -> None:
    """A slow server that recovers answers what it holds: the page in service is answered after the
    change, long before the hour it was started under (the order of events says so, not a stopwatch)."""
    standin.configure(always={"3:2": "slow"}, slow_s=3600)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(chat, standin, page_body(standin))
        wait_until(lambda: any(record.get("started") for record in standin.requests()))
        assert not pending.done()
        lowered_at = time.time()
        standin.configure(slow_s=0)
        response = pending.result(timeout=60)
    assert response.status_code == 200 and parse_completion(response.json()).is_valid
    (record,) = standin.requests()
    assert record["started"] < lowered_at <= record["finished"]


def test_page_script_then_normal_answers(standin: StandinServer) -> None:
    standin.configure(scripts={"3:2": ["500", "length", "ok", "garbage"]}, always={"4:1": "503"})
    body, other, doomed = page_body(standin, 3, 2), page_body(standin, 3, 1), page_body(standin, 4, 1)
    assert chat(standin, other).status_code == 200
    assert chat(standin, body).status_code == 500
    assert chat(standin, body).json()["choices"][0]["finish_reason"] == "length"
    assert parse_completion(chat(standin, body).json()).is_valid
    assert standin.stats()["scripts_remaining"] == {"3:2": ["garbage"]}
    with pytest.raises(FrontMatterError):
        parse_completion(chat(standin, body).json())
    for _ in range(3):
        assert parse_completion(chat(standin, body).json()).is_valid
        assert chat(standin, doomed).status_code == 503
    # Setting a page's script again starts it over.
    standin.configure(scripts={"3:2": ["429"]})
    assert chat(standin, body).status_code == 429
    assert chat(standin, body).status_code == 200


def test_random_faults_follow_the_seed(standin_factory: Callable[..., StandinServer]) -> None:
    rates = {"500": 0.3, "garbage": 0.3}
    first = standin_factory(seed=11, fault_rates=rates)
    second = standin_factory(seed=11, fault_rates=rates)
    body = page_body(first)
    runs = []
    for server in (first, second):
        for _ in range(30):
            chat(server, body)
        runs.append([r["outcome"] for r in server.requests()])
    assert runs[0] == runs[1]
    assert {"500", "garbage", "ok"} <= set(runs[0])
    first.configure(fault_rates={"500": None, "garbage": None})
    assert chat(first, body).status_code == 200
    with pytest.raises(ValueError, match="more than 1"):
        first.configure(fault_rates={"500": 0.6, "503": 0.6})
    with pytest.raises(ValueError, match="must be one of"):
        first.configure(always={"1:1": "explode"})


# ----- outages ------------------------------------------------------------------------------------


def test_refuse_window_refuses_connections_then_relistens_on_the_same_port(standin: StandinServer) -> None:
    body = page_body(standin)
    with httpx.Client(base_url=standin.url, headers=JSON) as pooled:
        assert pooled.post("/chat/completions", content=body).status_code == 200
        port = standin.port
        standin.refuse_for(0.5)
        started = time.monotonic()
        # Kept-alive connections are closed too, so a pooled client sees the outage as well.
        with pytest.raises(httpx.ConnectError, match="refused"):
            pooled.post("/chat/completions", content=body)
        with pytest.raises(httpx.ConnectError):
            CLIENT.get(f"{standin.url}/models")
        assert standin.stats()["outage"]["mode"] == "refuse"
        wait_until(lambda: standin.stats()["outage"] is None)
        assert time.monotonic() - started >= 0.45
        assert standin.port == port
        assert pooled.post("/chat/completions", content=body).status_code == 200

    standin.refuse_for(None)
    with pytest.raises(httpx.ConnectError):
        CLIENT.get(f"{standin.url}/models")
    standin.resume()
    assert CLIENT.get(f"{standin.url}/models").status_code == 200


def test_refuse_lets_in_flight_requests_finish_unless_told(standin_factory: Callable[..., StandinServer]) -> None:
    server = standin_factory(latency_s=0.3)
    body = page_body(server)
    with ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(chat, server, body)
        wait_until(lambda: server.stats()["running"] == 1)
        server.refuse_for(None)
        assert in_flight.result().status_code == 200
        server.resume()
        in_flight = pool.submit(chat, server, body)
        wait_until(lambda: server.stats()["running"] == 1)
        server.refuse_for(None, drop_inflight=True)
        with pytest.raises(httpx.RemoteProtocolError):
            in_flight.result()
    server.resume()


def test_stall_window_times_out_clients_then_releases_everything(standin: StandinServer) -> None:
    body = page_body(standin)
    standin.stall_for(None)
    with pytest.raises(httpx.ReadTimeout):
        chat(standin, body, timeout=httpx.Timeout(5.0, read=0.2))
    with pytest.raises(httpx.ReadTimeout):
        CLIENT.get(f"{standin.base_url}/health", timeout=httpx.Timeout(5.0, read=0.2))
    with ThreadPoolExecutor(1) as pool:
        patient = pool.submit(chat, standin, body)
        wait_until(lambda: standin.stats()["total"] == 2)
        time.sleep(0.1)
        assert not patient.done()
        standin.resume()
        assert patient.result().status_code == 200

    standin.stall_for(0.3)
    started = time.monotonic()
    assert chat(standin, body).status_code == 200
    assert time.monotonic() - started >= 0.25


def test_metrics_can_be_switched_off(standin_factory: Callable[..., StandinServer]) -> None:
    server = standin_factory(metrics=False)
    assert CLIENT.get(f"{server.base_url}/metrics").status_code == 404
    server.configure(metrics=True)
    assert CLIENT.get(f"{server.base_url}/metrics").status_code == 200


# ----- control API, replicas, process mode --------------------------------------------------------


def test_control_api_over_http(standin: StandinServer) -> None:
    control = httpx.Client(base_url=standin.base_url, timeout=5)
    config = control.post("/_control/config", json={"latency_s": 0.05, "always": {"1:1": "500"}}).json()
    assert config["latency_s"] == 0.05 and config["always"] == {"1:1": "500"}
    config = control.post("/_control/config", json={"always": {"2:2": "503", "1:1": None}}).json()
    assert config["always"] == {"2:2": "503"}
    assert control.post("/_control/config", json={"nope": 1}).status_code == 400
    assert control.post("/_control/config", json={"capacity": 0}).status_code == 400

    body = page_body(standin, 2, 2)
    assert chat(standin, body).status_code == 503
    assert chat(standin, page_body(standin, 1, 1)).status_code == 200
    assert [r["seq"] for r in control.get("/_control/requests", params={"since": 1}).json()] == [1]
    assert control.get("/_control/bodies/0").content == body
    assert control.get("/_control/bodies/9").status_code == 404
    stats = control.get("/_control/stats").json()
    assert stats["by_outcome"] == {"503": 1, "ok": 1}

    outage = control.post("/_control/outage", json={"mode": "stall", "seconds": 5}).json()["outage"]
    assert outage["mode"] == "stall" and outage["until"] > outage["since"]
    control.post("/_control/resume")
    assert control.post("/_control/outage", json={"mode": "melt"}).status_code == 400

    stats = control.post("/_control/reset").json()
    assert stats["total"] == 0 and stats["by_outcome"] == {}
    assert control.get("/_control/config").json()["always"] == {}
    control.close()


def test_factory_starts_independent_replicas(standin_factory: Callable[..., StandinServer]) -> None:
    first, second = standin_factory(model="m"), standin_factory(model="m", latency_s=0.01)
    assert first.port != second.port and first.url.endswith("/v1")
    for server in (first, second):
        assert chat(server, page_body(server)).status_code == 200
        assert server.stats()["total"] == 1


def test_cli_flags_map_to_settings() -> None:
    args, settings = parse_args(
        [
            "--port", "0", "--model", "m", "--latency", "1.0", "--capacity", "16", "--no-identify",
            "--fault", "500=0.1", "--script", "3:2=500,length", "--always", "4:1=hang",
            "--config", '{"jitter_s": 0.5}',
        ]
    )  # fmt: skip
    assert args.port == 0
    assert settings == {
        "jitter_s": 0.5,
        "model": "m",
        "latency_s": 1.0,
        "capacity": 16,
        "identify": False,
        "fault_rates": {"500": 0.1},
        "scripts": {"3:2": ["500", "length"]},
        "always": {"4:1": "hang"},
    }


def test_runs_as_a_separate_process() -> None:
    with start_standin_process(model="m", latency_s=0.01, always={"5:5": "500"}) as process:
        assert process.url.endswith("/v1") and process.control_url != process.base_url
        assert CLIENT.get(f"{process.url}/models").json()["data"][0]["id"] == "m"
        assert chat(process, page_body(process)).status_code == 200
        assert chat(process, page_body(process, 5, 5)).status_code == 500
        assert process.stats()["by_outcome"] == {"ok": 1, "500": 1}
        assert len(process.bodies()) == 2
        # The control listener stays up while the data port refuses.
        process.refuse_for(None)
        with pytest.raises(httpx.ConnectError):
            CLIENT.get(f"{process.url}/models")
        process.resume()
        assert CLIENT.get(f"{process.url}/models").status_code == 200
        process.configure(metrics=False)
        assert CLIENT.get(f"{process.base_url}/metrics").status_code == 404
        assert process.stop() == 0
