"""Guided decoding (``olmocr_tasks.inference.guided``): the field chosen from the server's vLLM version,
the body it makes, and what the client does with a server that would not apply it."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from olmocr_tasks.core.errors import ServerMisconfigured
from olmocr_tasks.inference.client_factory import build_client
from olmocr_tasks.inference.guided import GUIDED_REGEX, STRUCTURED_OUTPUTS, field_for_version, with_guided_decoding
from olmocr_tasks.page.protocol import OLMOCR_FRONT_MATTER_REGEX, parse_completion
from tests.fixtures.client import fast_server_settings, page_body, run
from tests.fixtures.standin import StandinServer


@pytest.mark.parametrize(
    ("version", "field"),
    [
        ("0.32.0", STRUCTURED_OUTPUTS),
        ("0.12.0", STRUCTURED_OUTPUTS),
        ("1.0.0rc1", STRUCTURED_OUTPUTS),
        ("0.11.2", GUIDED_REGEX),
        ("0.6.3.post1", GUIDED_REGEX),
        ("v0.10.2", GUIDED_REGEX),
    ],
)
def test_the_field_follows_the_vllm_release(version: str, field: str) -> None:
    assert field_for_version(version) == field


@pytest.mark.parametrize("version", ["0.3.3", "dev", ""])
def test_a_release_without_guided_decoding_is_refused(version: str) -> None:
    with pytest.raises(ValueError):
        field_for_version(version)


def test_the_constraint_is_the_last_key_as_json_dumps_writes_it() -> None:
    body = page_body()
    for field, value in [
        (GUIDED_REGEX, OLMOCR_FRONT_MATTER_REGEX),
        (STRUCTURED_OUTPUTS, {"regex": OLMOCR_FRONT_MATTER_REGEX}),
    ]:
        assert with_guided_decoding(body, field) == json.dumps(json.loads(body) | {field: value}).encode()


@pytest.mark.parametrize(("version", "field"), [("0.32.0", STRUCTURED_OUTPUTS), ("0.11.2", GUIDED_REGEX)])
def test_the_client_sends_the_field_the_servers_version_reads(
    standin_factory: Callable[..., StandinServer], version: str, field: str
) -> None:
    # Every answer would be garbage unconstrained: only a constraint the server applies makes it parse.
    standin = standin_factory(vllm_version=version, fault_rates={"garbage": 1.0})

    async def scenario() -> dict:
        async with build_client(fast_server_settings(standin, guided_decoding=True)) as client:
            await client.check_ready()
            return await client.complete(page_body())

    assert parse_completion(run(scenario())).response.is_rotation_valid
    (record,) = standin.requests()
    assert record["guided"] == field and record["keys"][-1] == field


def test_without_the_option_nothing_is_added(standin: StandinServer) -> None:
    async def scenario() -> None:
        async with build_client(fast_server_settings(standin)) as client:
            await client.check_ready()
            await client.complete(page_body())

    run(scenario())
    assert standin.bodies() == [page_body()]


@pytest.mark.parametrize("version", ["", "0.3.3"])
def test_a_server_that_would_ignore_it_fails_the_readiness_check(
    standin_factory: Callable[..., StandinServer], version: str
) -> None:
    standin = standin_factory(vllm_version=version)

    async def scenario() -> None:
        async with build_client(fast_server_settings(standin, guided_decoding=True)) as client:
            await client.check_ready()

    with pytest.raises(ServerMisconfigured, match="would not apply it"):
        run(scenario())
    assert standin.requests() == []
