"""``VllmReadyTrigger`` against the vLLM stand-in over real HTTP: ready, waiting while down, wrong
configuration failing at once, the deadline, and what its serialized form carries."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from olmocr_tasks.core.errors import ServerNotReady
from olmocr_tasks.provider.triggers import VllmReadyTrigger, models_from_event
from olmocr_testkit.airflow_env import vllm_connection
from tests.fixtures.standin import StandinServer

pytestmark = pytest.mark.timeout(60)

CONN_ID = "vllm_trigger_test"
SECRET = "sk-trigger-0123456789"
Factory = Callable[..., StandinServer]


@pytest.fixture
def connect(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Point the test connection at a server, as ``AIRFLOW_CONN_<ID>`` does in a deployment."""

    def point(url: str, model: str, api_key: str | None = None, **extra: Any) -> None:
        monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", vllm_connection(url, model, api_key, **extra))

    return point


async def first_event(trigger: VllmReadyTrigger) -> dict[str, Any]:
    events = trigger.run()
    try:
        event = await events.__anext__()
    finally:
        await events.aclose()
    return event.payload


def run(coro: Any) -> Any:
    # Generous guard against a trigger that never fires; the assertions never measure time.
    return asyncio.run(asyncio.wait_for(coro, 45))


def test_ready_server_fires_at_once_with_its_models(standin_factory: Factory, connect: Callable[..., None]) -> None:
    server = standin_factory(api_key=SECRET)
    connect(server.url, server.model, SECRET)
    payload = run(first_event(VllmReadyTrigger(CONN_ID, poll_interval_s=0.05)))
    assert payload == {"status": "ready", "models": [server.model], "not_ready": []}
    assert server.stats()["endpoint_hits"]["/v1/models"] == 1


def test_waits_while_the_server_is_down_and_fires_when_it_comes_up(
    standin_factory: Factory, connect: Callable[..., None]
) -> None:
    server = standin_factory()
    connect(server.url, server.model)
    server.refuse_for(None)

    async def scenario() -> tuple[bool, dict[str, Any]]:
        trigger = VllmReadyTrigger(CONN_ID, poll_interval_s=0.05)
        waiting = asyncio.ensure_future(first_event(trigger))
        # Let it poll the refusing server a few times: it must keep waiting, not fail.
        while trigger.polls < 3:
            await asyncio.sleep(0.05)
        fired_while_down = waiting.done()
        await asyncio.to_thread(server.resume)
        return fired_while_down, await waiting

    fired_while_down, payload = run(scenario())
    assert not fired_while_down
    assert payload["status"] == "ready" and payload["models"] == [server.model]


@pytest.mark.parametrize(
    ("model", "key", "expected"),
    [
        ("someone/else-7B", SECRET, "serves"),  # the server answers without our model
        (None, "the-wrong-key-42", "API key"),  # 401
    ],
)
def test_wrong_model_or_key_fails_at_once(
    standin_factory: Factory, connect: Callable[..., None], model: str | None, key: str, expected: str
) -> None:
    server = standin_factory(api_key=SECRET)
    connect(server.url, model or server.model, key)
    payload = run(first_event(VllmReadyTrigger(CONN_ID, poll_interval_s=0.05)))
    assert payload["status"] == "misconfigured" and expected in payload["message"]
    assert key not in payload["message"]
    assert server.stats()["endpoint_hits"]["/v1/models"] == 1  # one probe, no waiting


def test_wrong_base_url_fails_at_once(standin_factory: Factory, connect: Callable[..., None]) -> None:
    server = standin_factory()
    connect(server.url.removesuffix("/v1") + "/not-the-api", server.model)
    payload = run(first_event(VllmReadyTrigger(CONN_ID, poll_interval_s=0.05)))
    assert payload["status"] == "misconfigured" and "404" in payload["message"]


def test_unusable_connection_fails_at_once(connect: Callable[..., None]) -> None:
    connect("ftp://vllm.internal/v1", "m")
    payload = run(first_event(VllmReadyTrigger(CONN_ID)))
    assert payload["status"] == "misconfigured" and "scheme" in payload["message"]


def test_deadline_without_a_ready_server_is_a_timeout(standin_factory: Factory, connect: Callable[..., None]) -> None:
    server = standin_factory()
    connect(server.url, server.model)
    server.refuse_for(None)
    trigger = VllmReadyTrigger(CONN_ID, deadline=time.time() + 0.3, poll_interval_s=0.05)
    payload = run(first_event(trigger))
    assert payload["status"] == "timeout" and "ConnectError" in payload["message"]


def test_serialized_trigger_keeps_its_deadline_and_carries_no_secret() -> None:
    trigger = VllmReadyTrigger(CONN_ID, timeout_s=1800, poll_interval_s=5)
    path, kwargs = trigger.serialize()
    assert path == "olmocr_tasks.provider.triggers.VllmReadyTrigger"
    assert kwargs == {"conn_id": CONN_ID, "deadline": trigger.deadline, "poll_interval_s": 5}
    # Re-created after a triggerer restart, it waits for the same moment, not 30 more minutes.
    assert VllmReadyTrigger(**kwargs).deadline == trigger.deadline


def test_the_deferred_task_resumes_from_the_event() -> None:
    from airflow.sdk.exceptions import AirflowFailException

    assert models_from_event({"status": "ready", "models": ["m"], "not_ready": []}) == ["m"]
    with pytest.raises(AirflowFailException, match="serves x"):
        models_from_event({"status": "misconfigured", "message": "vllm serves x; configured model is m"})
    with pytest.raises(ServerNotReady, match="deadline"):
        models_from_event({"status": "timeout", "message": "vLLM not ready by the deadline: refused"})
