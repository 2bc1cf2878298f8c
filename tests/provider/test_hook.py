"""VllmHook: the ``olmocr_vllm`` connection → ServerSettings, and readiness against the stand-in."""

from __future__ import annotations

import json
from typing import Any

import pytest
from airflow.sdk import Connection

from olmocr_tasks.core.config import DEFAULT_MODEL, ServerSettings
from olmocr_tasks.core.errors import ConfigurationError, ServerNotReady
from olmocr_tasks.provider.hooks import VllmHook, base_url, settings_from_connection
from olmocr_testkit.standin.server import StandinServer


def connection(**fields: Any) -> Connection:
    extra = fields.pop("extra", None)
    return Connection(
        conn_id="olmocr_vllm", conn_type="olmocr_vllm", extra=json.dumps(extra) if extra else None, **fields
    )


@pytest.mark.parametrize(
    ("host", "schema", "port", "expected"),
    [
        ("vllm.internal", None, 8000, "http://vllm.internal:8000/v1"),
        ("vllm.internal", "https", None, "https://vllm.internal/v1"),
        ("vllm.internal", "HTTPS", 8443, "https://vllm.internal:8443/v1"),
        ("vllm.internal/openai/v1/", None, 80, "http://vllm.internal:80/openai/v1"),
        ("https://vllm.example.com/v1", None, None, "https://vllm.example.com/v1"),
        ("https://vllm.example.com", "http", 9000, "https://vllm.example.com:9000/v1"),
        ("http://127.0.0.1:8001/v1", None, 9999, "http://127.0.0.1:8001/v1"),
        (" http://10.0.0.5:8000 ", None, None, "http://10.0.0.5:8000/v1"),
    ],
)
def test_base_url_from_bare_host_or_full_url(host: str, schema: str | None, port: int | None, expected: str) -> None:
    assert base_url(host, schema, port) == expected


@pytest.mark.parametrize(
    ("host", "schema", "message"),
    [("", None, "no host"), ("vllm.internal", "ftp", "http or https"), ("grpc://vllm:1", None, "http or https")],
)
def test_base_url_rejects_unusable_hosts(host: str, schema: str | None, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        base_url(host, schema)


def test_settings_from_a_full_connection() -> None:
    conn = connection(
        host="vllm.internal",
        schema="https",
        port=8000,
        password="s3cret-key",
        extra={
            "model": "my/model",
            "replicas": "https://replica-2.internal/v1, replica-3.internal:8000",
            "max_concurrent_requests": "12",
            "verify_tls": "false",
            "read_timeout_s": 45,
            "readiness_timeout_s": "5",
            "hedge_min_delay_s": "30",
            "hedge_multiple": 2.5,
            "hedge_requests": "off",
            "hedge_idle_multiple": "1.5",
            "scheduling_policy": "Priority",
        },
    )
    settings = settings_from_connection(conn)
    assert (settings.hedging.hedge_idle_multiple, settings.concurrency.scheduling_policy) == (1.5, "priority")
    assert settings.connection.base_urls == (
        "https://vllm.internal:8000/v1",
        "https://replica-2.internal/v1",
        "https://replica-3.internal:8000/v1",
    )
    assert settings.connection.model == "my/model"
    assert settings.connection.api_key == "s3cret-key"
    assert settings.concurrency.max_concurrent_requests == 12
    assert settings.connection.verify_tls is False
    assert settings.timeouts.read_timeout_s == 45.0
    assert settings.timeouts.readiness_timeout_s == 5.0
    assert (settings.hedging.hedge_min_delay_s, settings.hedging.hedge_multiple, settings.hedging.hedge_requests) == (
        30.0,
        2.5,
        False,
    )
    # The key never reaches what is logged or written to a manifest.
    assert "s3cret-key" not in json.dumps(settings.public_dict()) + repr(settings)


def test_settings_defaults_for_a_minimal_connection() -> None:
    settings = settings_from_connection(connection(host="gpu-box", port=8000))
    default = ServerSettings()
    assert settings.connection.base_urls == ("http://gpu-box:8000/v1",)
    assert settings.connection.model == DEFAULT_MODEL
    assert settings.connection.api_key is None
    assert settings.concurrency.max_concurrent_requests == default.concurrency.max_concurrent_requests
    assert settings.connection.verify_tls is True
    assert settings.hedging.hedge_requests is True
    assert settings.concurrency.scheduling_policy == "fcfs"
    assert (settings.hedging.hedge_min_delay_s, settings.hedging.hedge_multiple) == (
        default.hedging.hedge_min_delay_s,
        default.hedging.hedge_multiple,
    )


def test_replicas_as_a_json_list_and_prefixed_form_fields() -> None:
    conn = connection(
        host="a:1",
        extra={"extra__olmocr_vllm__model": "legacy/model", "replicas": ["b:2", "a:1"]},
    )
    settings = settings_from_connection(conn)
    assert settings.connection.base_urls == ("http://a:1/v1", "http://b:2/v1")
    assert settings.connection.model == "legacy/model"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"max_concurrent_requests": "many"}, "must be a number"),
        ({"max_concurrent_requests": 0}, "must be positive"),
        ({"verify_tls": "perhaps"}, "must be a boolean"),
        ({"read_timeout_s": -1}, "must be positive"),
        ({"hedge_multiple": 0}, "must be positive"),
        ({"scheduling_policy": "lottery"}, "scheduling_policy must be one of fcfs, priority"),
        ({"hedge_min_delay_s": "soon"}, "must be a number"),
        ({"hedge_requests": "sometimes"}, "must be a boolean"),
    ],
)
def test_invalid_extras_are_configuration_errors(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        settings_from_connection(connection(host="h", extra=extra))


def test_hook_attributes_match_the_provider_registration() -> None:
    from olmocr_tasks.provider import get_provider_info

    (registered,) = get_provider_info()["connection-types"]
    assert registered["connection-type"] == VllmHook.conn_type == "olmocr_vllm"
    assert registered["hook-class-name"] == f"{VllmHook.__module__}.{VllmHook.__name__}"
    assert registered["hook-name"] == VllmHook.hook_name == "olmOCR vLLM"
    assert VllmHook.default_conn_name == "olmocr_vllm"
    assert VllmHook.conn_name_attr == "vllm_conn_id"
    # The connection form offers the hedging extras the hook reads.
    assert {"hedge_requests", "hedge_min_delay_s", "hedge_multiple"} <= set(registered["conn-fields"])


def _use_connection(monkeypatch: pytest.MonkeyPatch, url: str, **extra: Any) -> None:
    value = {"conn_type": "olmocr_vllm", "host": url, "extra": extra}
    monkeypatch.setenv("AIRFLOW_CONN_OLMOCR_VLLM", json.dumps(value))


def test_hook_reads_the_connection_and_applies_overrides(
    monkeypatch: pytest.MonkeyPatch, standin: StandinServer
) -> None:
    _use_connection(
        monkeypatch,
        standin.url,
        model=standin.model,
        max_concurrent_requests=8,
        hedge_min_delay_s=45,
        hedge_requests=True,
    )
    hook = VllmHook()
    assert hook.get_conn().connection.base_urls == (standin.url,)
    assert hook.get_conn().hedging.hedge_min_delay_s == 45.0 and hook.get_conn().hedging.hedge_requests is True
    assert hook.server_settings(max_concurrent_requests=None).concurrency.max_concurrent_requests == 8
    assert hook.server_settings(max_concurrent_requests=3).concurrency.max_concurrent_requests == 3


def test_check_ready_and_test_connection_against_the_standin(
    monkeypatch: pytest.MonkeyPatch, standin: StandinServer
) -> None:
    _use_connection(monkeypatch, standin.url, model=standin.model)
    hook = VllmHook()
    assert standin.model in hook.check_ready()
    ok, message = hook.test_connection()
    assert ok, message


def test_wrong_model_is_reported_clearly(monkeypatch: pytest.MonkeyPatch, standin: StandinServer) -> None:
    _use_connection(monkeypatch, standin.url, model="someone/else")
    with pytest.raises(ServerNotReady, match="configured model is someone/else"):
        VllmHook().check_ready()
    ok, message = VllmHook().test_connection()
    assert not ok
    assert "someone/else" in message


def test_unreachable_server_times_out_as_server_not_ready(monkeypatch: pytest.MonkeyPatch, closed_port: int) -> None:
    _use_connection(monkeypatch, f"http://127.0.0.1:{closed_port}/v1", readiness_timeout_s=0.5)
    with pytest.raises(ServerNotReady, match="not ready after"):
        VllmHook().check_ready()
