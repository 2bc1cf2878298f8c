"""serve-vllm without a GPU: command building, and readiness/restart/signal logic against a fake
``vllm`` executable that serves ``/v1/models`` the way vLLM does."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from olmocr_tasks.cli import build_parser
from olmocr_tasks.cli import vllm_options_from_args as options_from_args
from olmocr_tasks.core.config import DEFAULT_MODEL
from olmocr_tasks.servers.vllm_launcher import (
    LIMIT_MM_PER_PROMPT,
    VllmNotInstalledError,
    VllmOptions,
    VllmSupervisor,
    build_vllm_command,
    connection_env_line,
    connection_json,
)
from olmocr_testkit.ports import reserved_port

FAKE_VLLM = """\
import json, os, signal, socket, sys, threading, time
from http.server import BaseHTTPRequestHandler, HTTPServer

args = sys.argv[1:]
log = os.environ["FAKE_VLLM_LOG"]
def record(event):
    with open(log, "a") as fh:
        fh.write(json.dumps(event) + "\\n")
record({"event": "start", "args": args, "has_key": bool(os.environ.get("VLLM_API_KEY"))})
assert args[0] == "serve"
opt = lambda name: args[args.index(name) + 1]
name = os.environ.get("FAKE_VLLM_SERVE_NAME") or opt("--served-model-name")
key = os.environ.get("VLLM_API_KEY")

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        if key and self.headers.get("Authorization") != "Bearer " + key:
            self.send_response(401); self.send_header("Content-Length", "0"); self.end_headers(); return
        body = json.dumps({"object": "list", "data": [{"id": name, "object": "model"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

def on_term(signum, frame):
    record({"event": "signal", "signum": signum})
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGINT, on_term)
time.sleep(float(os.environ.get("FAKE_VLLM_STARTUP_DELAY", "0")))
class Server(HTTPServer):
    # The test holds the port bound with SO_REUSEPORT (olmocr_testkit.ports.reserved_port) until we bind it.
    def server_bind(self):
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()
server = Server((opt("--host"), int(opt("--port"))), Handler)
threading.Thread(target=server.serve_forever, daemon=True).start()
die_after = float(os.environ.get("FAKE_VLLM_DIE_AFTER", "0"))
if die_after:
    time.sleep(die_after)
    record({"event": "die"})
    os._exit(3)
while True:
    time.sleep(1)
"""


@pytest.fixture
def port() -> Iterator[int]:
    """The port the fake vllm is told to serve on, held for it until the test ends."""
    with reserved_port() as held:
        yield held


@pytest.fixture
def fake_vllm(tmp_path: Path) -> Path:
    script = tmp_path / "vllm"
    script.write_text(f"#!{sys.executable}\n{FAKE_VLLM}")
    script.chmod(0o755)
    return script


def _events(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def _options(fake: Path, log: Path, port: int, **overrides) -> VllmOptions:
    env = {"FAKE_VLLM_LOG": str(log)}
    env.update(overrides.pop("env", {}))
    base = {
        "vllm_binary": str(fake),
        "port": port,
        "ready_timeout_s": 20.0,
        "poll_interval_s": 0.1,
        "backoff_initial_s": 0.05,
        "backoff_max_s": 0.2,
        "stop_grace_s": 5.0,
        "env": env,
    }
    base.update(overrides)
    return VllmOptions(**base)


def _connection_from(output: str) -> dict:
    match = re.search(r"^AIRFLOW_CONN_OLMOCR_VLLM=(.+)$", output, re.MULTILINE)
    assert match, output
    (value,) = shlex.split(match.group(1))
    return json.loads(value)


# -- pure pieces -----------------------------------------------------------------------------------


def test_default_command_follows_olmocr():
    command = build_vllm_command(VllmOptions())
    assert command[:3] == ["vllm", "serve", DEFAULT_MODEL]
    flags = dict(zip(command[3::2], command[4::2], strict=True))
    assert flags["--served-model-name"] == DEFAULT_MODEL
    assert flags["--max-model-len"] == "16384"
    assert json.loads(flags["--limit-mm-per-prompt"]) == {"video": 0, "image": 1}
    assert flags["--limit-mm-per-prompt"] == LIMIT_MM_PER_PROMPT
    assert flags["--gpu-memory-utilization"] == "0.9"
    assert flags["--tensor-parallel-size"] == "1"
    assert flags["--data-parallel-size"] == "1"
    assert flags["--host"] == "127.0.0.1"
    assert flags["--port"] == "8000"
    assert flags["--uvicorn-log-level"] == "warning"
    assert "--disable-log-requests" not in command  # removed in vLLM 0.12; off by default since 0.10.2


def test_parser_passes_options_and_extra_args_after_double_dash():
    args = build_parser().parse_args(
        [
            "serve-vllm",
            "--model",
            "/models/olmocr",
            "--served-model-name",
            "olmocr",
            "--port",
            "9000",
            "--host",
            "0.0.0.0",
            "--gpu-memory-utilization",
            "0.8",
            "--tensor-parallel-size",
            "2",
            "--data-parallel-size",
            "4",
            "--",
            "--enforce-eager",
            "--max-num-seqs",
            "128",
        ]
    )
    assert args.command == "serve-vllm"
    command = build_vllm_command(options_from_args(args))
    assert command[:3] == ["vllm", "serve", "/models/olmocr"]
    assert command[-3:] == ["--enforce-eager", "--max-num-seqs", "128"]
    flags = dict(zip(command[3:-3:2], command[4:-3:2], strict=True))
    assert flags["--served-model-name"] == "olmocr"
    assert flags["--gpu-memory-utilization"] == "0.8"
    assert flags["--tensor-parallel-size"] == "2"
    assert flags["--data-parallel-size"] == "4"
    assert flags["--port"] == "9000"


def test_vllm_binary_may_be_a_command_line():
    command = build_vllm_command(VllmOptions(vllm_binary="python -m vllm.entrypoints.cli.main"))
    assert command[:5] == ["python", "-m", "vllm.entrypoints.cli.main", "serve", DEFAULT_MODEL]


def test_connection_line_is_valid_json_and_uses_a_reachable_host():
    line = connection_env_line(VllmOptions(host="0.0.0.0", port=8123, served_model_name="olmocr"))
    assert _connection_from(line) == {
        "conn_type": "olmocr_vllm",
        "host": "127.0.0.1",
        "port": 8123,
        "schema": "http",
        "extra": {"model": "olmocr"},
    }


def test_missing_vllm_is_a_clear_error(tmp_path):
    with pytest.raises(VllmNotInstalledError, match=re.escape("pip install 'olmocr-airflow[vllm]'")):
        VllmSupervisor(VllmOptions(vllm_binary=str(tmp_path / "no-such-vllm")))


# -- supervision against the fake vllm -------------------------------------------------------------


def test_restarts_are_bounded_with_backoff(fake_vllm, port, tmp_path):
    log = tmp_path / "events.jsonl"
    out = io.StringIO()
    options = _options(fake_vllm, log, port, max_restarts=2, env={"FAKE_VLLM_DIE_AFTER": "0.5"})
    supervisor = VllmSupervisor(options, out=out)
    assert supervisor.run() == 1
    starts = [event for event in _events(log) if event["event"] == "start"]
    assert len(starts) == 3  # the first launch plus two restarts
    assert supervisor.launches == 3
    # Announced once, on the first readiness; valid JSON for Airflow.
    assert out.getvalue().count("AIRFLOW_CONN_OLMOCR_VLLM=") == 1
    assert _connection_from(out.getvalue())["port"] == options.endpoint.port


def test_wrong_served_model_is_a_clear_error_without_restarts(fake_vllm, port, tmp_path, caplog):
    log = tmp_path / "events.jsonl"
    options = _options(fake_vllm, log, port, env={"FAKE_VLLM_SERVE_NAME": "some-other-model"})
    out = io.StringIO()
    assert VllmSupervisor(options, out=out).run() == 2
    assert "some-other-model" in caplog.text and DEFAULT_MODEL in caplog.text
    events = _events(log)
    assert [event["event"] for event in events] == ["start", "signal"]  # stopped, not restarted
    assert "AIRFLOW_CONN" not in out.getvalue()


def test_readiness_timeout_stops_the_server(fake_vllm, port, tmp_path, caplog):
    log = tmp_path / "events.jsonl"
    options = _options(fake_vllm, log, port, ready_timeout_s=1.0, env={"FAKE_VLLM_STARTUP_DELAY": "30"})
    # The fake would serve after 30 s; exit 1 with the timeout message, and the server signalled
    # before it ever served, show the 1-s timeout was honoured (no stopwatch needed).
    assert VllmSupervisor(options, out=io.StringIO()).run() == 1
    assert "within 1s" in caplog.text
    assert [event["event"] for event in _events(log)] == ["start", "signal"]


def test_api_key_goes_through_the_environment_and_is_never_printed(fake_vllm, port, tmp_path, monkeypatch):
    monkeypatch.setenv("OLMOCR_TEST_VLLM_KEY", "very-secret-value")
    log = tmp_path / "events.jsonl"
    out = io.StringIO()
    options = _options(fake_vllm, log, port, api_key_env="OLMOCR_TEST_VLLM_KEY")
    supervisor = VllmSupervisor(options, out=out)
    runner = threading.Thread(target=supervisor.run)
    runner.start()
    try:
        deadline = time.monotonic() + 20
        while "AIRFLOW_CONN" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "AIRFLOW_CONN_OLMOCR_VLLM=" in out.getvalue()  # readiness passed the Bearer check
    finally:
        supervisor.request_stop()
        runner.join(20)
    start = _events(log)[0]
    assert start["has_key"] is True
    assert not any("very-secret-value" in arg for arg in start["args"])
    assert "very-secret-value" not in out.getvalue()
    assert "OLMOCR_TEST_VLLM_KEY" in out.getvalue()


def test_cli_forwards_sigterm_and_prints_the_connection(fake_vllm, port, tmp_path):
    log = tmp_path / "events.jsonl"
    env = {**os.environ, "FAKE_VLLM_LOG": str(log)}
    command = [sys.executable, "-m", "olmocr_tasks.cli", "serve-vllm", "--vllm-binary", str(fake_vllm)]
    command += ["--port", str(port), "--ready-timeout", "30", "--", "--enforce-eager"]
    proc = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("AIRFLOW_CONN_OLMOCR_VLLM="):
                break
        connection = _connection_from("".join(lines))
        assert connection["port"] == port and connection["extra"]["model"] == DEFAULT_MODEL
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    events = _events(log)
    assert events[0]["args"][-1] == "--enforce-eager"
    assert {"event": "signal", "signum": int(signal.SIGTERM)} in events
    assert sum(event["event"] == "start" for event in events) == 1


def test_cli_missing_vllm_exits_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "olmocr_tasks.cli", "serve-vllm"],
        env={**os.environ, "PATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "pip install 'olmocr-airflow[vllm]'" in proc.stderr


def test_priority_scheduling_is_passed_to_vllm_and_named_in_the_connection():
    args = build_parser().parse_args(["serve-vllm", "--scheduling-policy", "priority"])
    options = options_from_args(args)
    command = build_vllm_command(options)
    flags = dict(zip(command[3::2], command[4::2], strict=True))
    assert flags["--scheduling-policy"] == "priority"
    assert _connection_from(connection_env_line(options))["extra"]["scheduling_policy"] == "priority"
    # By default vLLM's own fcfs: no flag, and the connection leaves the extra out.
    default = VllmOptions()
    assert "--scheduling-policy" not in build_vllm_command(default)
    assert "scheduling_policy" not in connection_json(default)["extra"]
