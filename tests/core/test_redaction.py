"""One set of secret rules (``olmocr_tasks.core.redaction``) for storage errors, logs and the runs page."""

from __future__ import annotations

import pytest

from olmocr_tasks.core.redaction import (
    SECRET_ENVIRONMENT_VARIABLES,
    environment_secrets,
    is_secret_name,
    redact_fields,
    redact_urls,
    secret_values,
)


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("api_key", True),
        ("aws_secret_access_key", True),
        ("aws_session_token", True),
        ("key", True),
        ("username", True),
        ("Authorization", True),
        ("max_tokens", False),
        ("api_key_set", False),
        ("endpoint_url", False),
        ("keyword", False),
    ],
)
def test_secret_names_are_whole_name_parts(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_secret_values_are_found_in_nested_storage_options() -> None:
    options = {
        "key": "AKIAEXAMPLE",
        "secret": "s3cr3t-value",
        "client_kwargs": {"endpoint_url": "http://minio:9000", "aws_session_token": "session-token"},
        "config_kwargs": {"s3": {"addressing_style": "path"}},
        "anon": False,
    }
    assert sorted(secret_values(options)) == ["AKIAEXAMPLE", "s3cr3t-value", "session-token"]


def test_every_credential_variable_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    environ = {name: f"value-of-{name}" for name in SECRET_ENVIRONMENT_VARIABLES}
    assert environment_secrets(environ) == list(environ.values())
    assert "AWS_SECURITY_TOKEN" in SECRET_ENVIRONMENT_VARIABLES


def test_urls_inside_text_lose_their_user_info() -> None:
    text = "PUT http://user:hunter22@minio:9000/b/x failed; see s3://key:pw@bucket/k"
    assert redact_urls(text) == "PUT http://***@minio:9000/b/x failed; see s3://***@bucket/k"


def test_fields_hide_secret_values_and_url_passwords() -> None:
    server = {"base_urls": ["http://user:hunter2@vllm:8000/v1"], "api_key": "sk-live", "max_tokens": 8000}
    assert redact_fields(server) == {
        "base_urls": ["http://user:***@vllm:8000/v1"],
        "api_key": "***",
        "max_tokens": 8000,
    }
