"""The real vLLM (CPU build) serving the tiny model, started through ``olmocr-tasks serve-vllm``.

``build_tiny_model`` writes the model with the vLLM virtualenv's Python (``tiny_model.py``, offline,
seconds). ``VllmServers.serve(policy)`` keeps one server running (~3 GiB): the running one when it has
the asked scheduling policy, otherwise it stops it and starts another; ``stop`` ends it through the
launcher (SIGTERM). Every socket stays on the loopback interface. The vllm test tier and
``bench/real_vllm.py`` share this.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx
from prometheus_client.parser import text_string_to_metric_families

from olmocr_testkit.cpu_vllm import environment
from olmocr_testkit.ports import free_port

TINY_MODEL_SCRIPT = Path(__file__).resolve().with_name("tiny_model.py")
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


def build_tiny_model(venv: Path, output: Path) -> Path:
    """The tiny random olmOCR-shaped model in ``output``, built now (no download) by ``venv``'s Python."""
    subprocess.run(
        [str(environment.python_of(venv)), str(TINY_MODEL_SCRIPT), str(output)],
        check=True,
        env={**os.environ, **VLLM_ENV},
    )
    return output


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
        # Every writer appends (O_APPEND): the launcher's stderr and the copies of its stdout below.
        log.write_bytes(b"")
        handle = log.open("ab")
        launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=handle, env=env)
        running = RunningVllm(launcher, port, policy, log)
        try:
            _wait_for_announcement(launcher, log)
        except BaseException:
            self._stop(running)
            raise
        # vLLM logs to the stdout it shares with the launcher: read on, or a full pipe would block it.
        threading.Thread(target=_copy_lines, args=(launcher.stdout, log), daemon=True).start()
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
    """Read the launcher's stdout (vLLM's too, copied to ``log``) until it prints that vLLM is ready (it
    waited for ``/v1/models``)."""
    assert launcher.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(launcher.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + READY_TIMEOUT_S + 30
    seen = b""
    with log.open("ab") as copy:
        while time.monotonic() < deadline:
            if selector.select(timeout=1.0):
                line = launcher.stdout.readline()
                seen += line
                copy.write(line)
                if line.startswith(b"vLLM is ready"):
                    return
                if not line and launcher.poll() is not None:
                    break
    tail = log.read_text(errors="replace")[-3000:]
    raise RuntimeError(f"serve-vllm did not announce a ready vLLM (exit {launcher.poll()}): {seen!r}\n{tail}")


def _copy_lines(stream: IO[bytes], log: Path) -> None:
    with log.open("ab") as copy:
        for line in iter(stream.readline, b""):
            copy.write(line)
            copy.flush()


def metrics_text(root_url: str) -> str:
    """The server's ``/metrics`` page (Prometheus text)."""
    return httpx.get(root_url + "/metrics", timeout=10).text


def metric_total(text: str, name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` (a counter's with its ``_total``) whose labels include ``labels``."""
    wanted = labels.items()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and wanted <= sample.labels.items()
    )


def by_label(text: str, name: str, label: str) -> dict[str, float]:
    """The samples named ``name`` summed per value of ``label`` (e.g. finished requests by finish reason)."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and label in sample.labels:
                totals[sample.labels[label]] = totals.get(sample.labels[label], 0.0) + sample.value
    return totals
