"""The vLLM stand-in as a process of its own (``python -m olmocr_testkit.standin``), driven over HTTP.

Used by the tests, the deployment launcher, the benchmarks and ``scripts/golden_olmocr.py``: a stand-in
in its own process is stopped, killed and measured apart from whoever started it.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from olmocr_testkit import REPO_ROOT


class StandinProcess:
    """A stand-in running as ``python -m olmocr_testkit.standin``, controlled over HTTP.

    Offers the same control methods as ``StandinServer``; they go to ``control_url``, a second listener
    that stays reachable while the main port refuses connections.
    """

    def __init__(self, process: subprocess.Popen[bytes], ready: dict[str, Any], stderr_path: Path) -> None:
        self.process = process
        self.url: str = ready["url"]
        self.base_url: str = ready["base_url"]
        self.control_url: str = ready["control_url"]
        self.port: int = ready["port"]
        self.pid: int = ready["pid"]
        self.model: str = ready["model"]
        self._stderr_path = stderr_path
        self._client = httpx.Client(base_url=self.control_url, timeout=10.0)

    def __enter__(self) -> StandinProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self, timeout: float = 10.0) -> int | None:
        """Terminate (then kill) the process; returns its exit code."""
        self._client.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._stderr_path.unlink(missing_ok=True)
        return self.process.returncode

    def stderr(self) -> str:
        try:
            return self._stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._client.request(method, path, **kwargs)
        response.raise_for_status()
        return response.json()

    def configure(self, **settings: Any) -> dict[str, Any]:
        return self._json("POST", "/_control/config", json=settings)

    def config(self) -> dict[str, Any]:
        return self._json("GET", "/_control/config")

    def stats(self) -> dict[str, Any]:
        return self._json("GET", "/_control/stats")

    def requests(self, since: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        params: dict[str, int] = {"since": since}
        if limit is not None:
            params["limit"] = limit
        return self._json("GET", "/_control/requests", params=params)

    def bodies(self) -> list[bytes]:
        found = []
        while True:
            response = self._client.get(f"/_control/bodies/{len(found)}")
            if response.status_code == 404:
                return found
            response.raise_for_status()
            found.append(response.content)

    def reset(self, keep_config: bool = False) -> None:
        self._json("POST", "/_control/reset", json={"keep_config": keep_config})

    def refuse_for(self, seconds: float | None = None, drop_inflight: bool = False) -> None:
        self._json(
            "POST", "/_control/outage", json={"mode": "refuse", "seconds": seconds, "drop_inflight": drop_inflight}
        )

    def stall_for(self, seconds: float | None = None) -> None:
        self._json("POST", "/_control/outage", json={"mode": "stall", "seconds": seconds})

    def resume(self) -> None:
        self._json("POST", "/_control/resume")


def start_standin_process(
    *, timeout: float = 30.0, extra_args: list[str] | None = None, **settings: Any
) -> StandinProcess:
    """Start ``python -m olmocr_testkit.standin`` with ``StandinConfig`` ``settings``; returns once it listens.

    The caller owns the handle and must ``stop()`` it (or use it as a context manager).
    """
    fd, name = tempfile.mkstemp(prefix="standin-", suffix=".stderr")
    stderr_path = Path(name)
    command = [sys.executable, "-m", "olmocr_testkit.standin", "--config", json.dumps(settings)]
    command += extra_args or []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    # stderr goes to a file so a chatty process can never block on a full pipe nobody reads.
    with os.fdopen(fd, "wb") as stderr_file:
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr_file
        )
    assert process.stdout is not None
    line = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while not line.endswith(b"\n"):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not selector.select(remaining):
                break
            chunk = os.read(process.stdout.fileno(), 4096)
            if not chunk:
                break
            line += chunk
    if not line.endswith(b"\n"):
        process.kill()
        process.wait()
        message = stderr_path.read_text(errors="replace")
        stderr_path.unlink(missing_ok=True)
        raise RuntimeError(f"the stand-in process did not become ready:\n{message[-4000:]}")
    return StandinProcess(process, json.loads(line), stderr_path)
