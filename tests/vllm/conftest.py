"""The vllm tier: vLLM's CPU build serving a tiny olmOCR-shaped model, started through ``olmocr-tasks serve-vllm``.

The tier installs vLLM into a virtualenv of its own (``olmocr_testkit.cpu_vllm.environment``;
cached, first install several minutes), builds the model there (``tiny_model``, offline, seconds) and
runs the real ``vllm`` command under our launcher (``cpu_vllm.server``), so the launcher's command
line, readiness wait and signal handling meet the real binary. One server runs at a time (~3 GiB):
``vllm_servers.serve(policy)`` keeps the running one when it has the asked scheduling policy and
otherwise stops it and starts another. Every socket stays on the loopback interface. ``make test``
runs the tier in a pytest process of its own, after the rest.

``server`` runs a test twice: against the real server (fcfs) and against the stand-in
(``olmocr_testkit.standin``) configured alike; a difference is a stand-in bug or a README
statement to correct.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from olmocr_testkit.cpu_vllm import environment
from olmocr_testkit.cpu_vllm.server import (
    MAX_MODEL_LEN,
    MODEL_NAME,
    READY_TIMEOUT_S,
    RunningVllm,
    VllmServers,
    build_tiny_model,
)
from olmocr_testkit.standin.server import StandinServer

TIER_DIR = Path(__file__).resolve().parent
# A test may be the one that starts a server (up to READY_TIMEOUT_S on a loaded machine, where a start
# took over 300 s beside the rest of the suite), then does its own work.
TIER_TEST_TIMEOUT_S = READY_TIMEOUT_S + 300
# How long the stand-in holds a request that should outlast what a test watches (the real server's
# requests are made long by their min_tokens instead).
STANDIN_HOLD_S = 120.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if TIER_DIR not in item.path.parents:
            continue
        if not item.get_closest_marker("vllm"):
            item.add_marker(pytest.mark.vllm)
        if not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(TIER_TEST_TIMEOUT_S))


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    return environment.ensure_venv()


@pytest.fixture(scope="session")
def tiny_model(vllm_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random olmOCR-shaped model, built now (no download) by the vLLM virtualenv's Python."""
    return build_tiny_model(vllm_venv, tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def vllm_servers(vllm_venv: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServers]:
    servers = VllmServers(vllm_venv, tiny_model, tmp_path_factory.mktemp("vllm"))
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture
def real_vllm(vllm_servers: VllmServers) -> RunningVllm:
    """The real server under vLLM's default scheduling (fcfs)."""
    return vllm_servers.serve("fcfs")


@dataclass
class ContractServer:
    """The real server or the stand-in, as a test of both sees it."""

    kind: str
    base_url: str
    root_url: str
    standin: StandinServer | None = None

    @property
    def model(self) -> str:
        return MODEL_NAME

    @contextmanager
    def long_requests(self, standin_s: float = STANDIN_HOLD_S) -> Iterator[None]:
        """Requests started inside the block take ``standin_s`` on the stand-in (on the real server their
        ``min_tokens`` make them long)."""
        if self.standin is None:
            yield
            return
        self.standin.configure(latency_s=standin_s)
        try:
            yield
        finally:
            self.standin.configure(latency_s=0.0)


def _standin(policy: str) -> StandinServer:
    settings: dict[str, Any] = {"model": MODEL_NAME, "max_model_len": MAX_MODEL_LEN, "scheduling_policy": policy}
    if policy == "priority":
        settings["capacity"] = 1
    return StandinServer(**settings).start()


@contextmanager
def contract_server(kind: str, policy: str, vllm_servers: VllmServers | None) -> Iterator[ContractServer]:
    """The real server under ``policy`` (``kind`` "vllm") or a stand-in started with it ("standin")."""
    if kind == "standin":
        standin = _standin(policy)
        try:
            yield ContractServer(kind, standin.url, standin.url.removesuffix("/v1"), standin)
        finally:
            standin.stop()
        return
    assert vllm_servers is not None
    running = vllm_servers.serve(policy)
    yield ContractServer(kind, running.base_url, running.root_url)


@pytest.fixture(params=["vllm", "standin"])
def server(request: pytest.FixtureRequest) -> Iterator[ContractServer]:
    servers = request.getfixturevalue("vllm_servers") if request.param == "vllm" else None
    with contract_server(request.param, "fcfs", servers) as contract:
        yield contract


def wait_for(predicate: object, timeout_s: float = 60.0, interval_s: float = 0.2) -> None:
    """Poll ``predicate`` until it holds; fail with its last value otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():  # type: ignore[operator]
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s:g} s")
        time.sleep(interval_s)
