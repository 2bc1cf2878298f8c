"""The vllm tier: vLLM's CPU build serving a tiny olmOCR-shaped model, started through ``olmocr-tasks serve-vllm``.

The tier installs vLLM into a virtualenv of its own (``environment``; cached, first install several
minutes), builds the model there (``tiny_model``, offline, seconds) and runs the real ``vllm`` command
under our launcher, so the launcher's command line, readiness wait and signal handling meet the real
binary. One server runs at a time (~3 GiB): ``vllm_servers.serve(policy)`` keeps the running one when it
has the asked scheduling policy and otherwise stops it and starts another. Every socket stays on the
loopback interface. ``make test`` runs the tier in a pytest process of its own, after the rest.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from olmocr_testkit.ports import free_port
from tests.vllm import environment

TIER_DIR = Path(__file__).resolve().parent
MODEL_NAME = "olmocr-tiny-random"
MAX_MODEL_LEN = 16384
# Cold start on a busy 2-core machine: ~40 s alone, minutes while the rest of the suite runs.
READY_TIMEOUT_S = 600.0
# What the CPU build needs on a small shared machine, and loopback for its internal sockets too.
VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if TIER_DIR in item.path.parents and not item.get_closest_marker("vllm"):
            item.add_marker(pytest.mark.vllm)


@dataclass
class RunningVllm:
    """One real vLLM under ``olmocr-tasks serve-vllm``: where it answers and how it was started."""

    launcher: subprocess.Popen[bytes]
    port: int
    policy: str
    log: Path

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.root_url + "/v1"

    model = MODEL_NAME
    max_model_len = MAX_MODEL_LEN


class VllmServers:
    """Starts the real server on demand, one at a time, and stops it through the launcher (SIGTERM)."""

    def __init__(self, venv: Path, model_dir: Path, work: Path) -> None:
        self.venv, self.model_dir, self.work = venv, model_dir, work
        self.current: RunningVllm | None = None
        self.starts = 0

    def serve(self, policy: str = "fcfs") -> RunningVllm:
        if self.current is not None and self.current.policy == policy and self.current.launcher.poll() is None:
            return self.current
        self.stop()
        self.current = self._start(policy)
        return self.current

    def _start(self, policy: str) -> RunningVllm:
        port = free_port()
        self.starts += 1
        log = self.work / f"serve-vllm-{self.starts}-{policy}.log"
        # Under priority scheduling one sequence at a time makes the waiting queue's order observable.
        engine_args = [
            "--dtype",
            "bfloat16",
            "--enforce-eager",
            *(["--max-num-seqs", "1"] if policy == "priority" else []),
        ]
        command = [
            str(Path(sys.executable).with_name("olmocr-tasks")),
            "serve-vllm",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-model-len",
            str(MAX_MODEL_LEN),
            "--scheduling-policy",
            policy,
            "--vllm-binary",
            str(self.venv / "bin" / "vllm"),
            "--ready-timeout",
            str(READY_TIMEOUT_S),
            "--max-restarts",
            "1",
            "--",
            *engine_args,
        ]
        env = {
            **os.environ,
            **VLLM_ENV,
            "VLLM_CACHE_ROOT": str(self.work / "vllm-cache"),
            "HF_HOME": str(self.work / "hf-home"),
        }
        handle = log.open("wb")
        launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=handle, env=env)
        running = RunningVllm(launcher, port, policy, log)
        try:
            _wait_for_announcement(launcher, log)
        except BaseException:
            self._stop(running)
            raise
        return running

    def stop(self) -> int | None:
        """Stop the running server through its launcher; the launcher's exit code (None: none ran)."""
        if self.current is None:
            return None
        code = self._stop(self.current)
        self.current = None
        return code

    @staticmethod
    def _stop(running: RunningVllm) -> int:
        if running.launcher.poll() is None:
            running.launcher.send_signal(signal.SIGTERM)
        try:
            return running.launcher.wait(120)
        except subprocess.TimeoutExpired:
            running.launcher.kill()
            return running.launcher.wait()


def _wait_for_announcement(launcher: subprocess.Popen[bytes], log: Path) -> None:
    """Read the launcher's stdout until it prints that vLLM is ready (it waited for ``/v1/models``)."""
    assert launcher.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(launcher.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + READY_TIMEOUT_S + 30
    seen = b""
    while time.monotonic() < deadline:
        if selector.select(timeout=1.0):
            line = launcher.stdout.readline()
            seen += line
            if line.startswith(b"vLLM is ready"):
                return
            if not line and launcher.poll() is not None:
                break
    tail = log.read_text(errors="replace")[-3000:]
    raise RuntimeError(f"serve-vllm did not announce a ready vLLM (exit {launcher.poll()}): {seen!r}\n{tail}")


@pytest.fixture(scope="session")
def vllm_venv() -> Path:
    return environment.ensure_venv()


@pytest.fixture(scope="session")
def tiny_model(vllm_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random olmOCR-shaped model, built now (no download) by the vLLM virtualenv's Python."""
    output = tmp_path_factory.mktemp("tiny-model")
    subprocess.run(
        [str(environment.python_of(vllm_venv)), str(TIER_DIR / "tiny_model.py"), str(output)],
        check=True,
        env={**os.environ, **VLLM_ENV},
    )
    return output


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


def wait_for(predicate: object, timeout_s: float = 60.0, interval_s: float = 0.2) -> None:
    """Poll ``predicate`` until it holds; fail with its last value otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():  # type: ignore[operator]
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s:g} s")
        time.sleep(interval_s)


def metrics_text(root_url: str) -> str:
    return httpx.get(root_url + "/metrics", timeout=10).text
