"""``make up`` from a fresh clone: it starts what it says, prints a login that works, and stops cleanly.

The test clones the committed HEAD and runs what the ``up`` target runs after its install step
(``.venv/bin/python scripts/up.py``) with this virtualenv's interpreter and, as under ``make``, without
the virtualenv on PATH. It waits for the login line, logs in through the API, checks that the
scheduler, triggerer and dag-processor are healthy and that the DAGs took ``OLMOCR_INPUT_URI`` /
``OLMOCR_OUTPUT_URI`` from the environment, then presses Ctrl-C (SIGINT to the whole process group,
as a terminal does) and expects every process gone. (SIGTERM takes the same way out.)
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from olmocr_testkit.cluster import REPO_ROOT, AirflowApi, answers
from olmocr_testkit.ports import PORT_ATTEMPTS, address_in_use, free_port

# Not in the deployment tier: it starts its own embedded Airflow (SQLite) from a clone, not the shared
# Celery deployment, so it runs beside that tier instead of lengthening it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

LOGIN = re.compile(r"Airflow UI \(embedded\): (http://127\.0\.0\.1:\d+)\s+login: (\S+) / (\S+)")


def _without_virtualenv(path: str) -> str:
    venv_bin = str(Path(sys.executable).parent)
    return os.pathsep.join(part for part in path.split(os.pathsep) if part and part != venv_bin)


def _processes_in(folder: Path) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline", "cwd"]):
        info = process.info
        if str(folder) in " ".join(info.get("cmdline") or []) or str(folder) == (info.get("cwd") or ""):
            found.append(process)
    return found


class _MakeUp:
    """``scripts/up.py`` started from a fresh clone on the given ports, its output collected by a thread."""

    def __init__(self, clone: Path, ui_port: int, engine_port: int, inbox: Path, outbox: Path) -> None:
        self.clone, self.ui_port, self.engine_port = clone, ui_port, engine_port
        subprocess.run(["git", "clone", "--quiet", str(REPO_ROOT), str(clone)], check=True)
        env = {
            key: value for key, value in os.environ.items() if not key.startswith(("AIRFLOW", "OLMOCR_", "VIRTUAL_ENV"))
        }
        env |= {
            "PATH": _without_virtualenv(os.environ.get("PATH", "")),
            "AIRFLOW__API__PORT": str(ui_port),
            "OLMOCR_CPU_ENGINE_PORT": str(engine_port),
            "OLMOCR_INPUT_URI": str(inbox),
            "OLMOCR_OUTPUT_URI": str(outbox),
        }
        self.process = subprocess.Popen(
            [sys.executable, "scripts/up.py"],
            cwd=clone,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            if LOGIN.search(line):
                self.ready.set()

    def lost_a_port(self) -> bool:
        """Another process took a port between our choosing it and a component binding it."""
        logs = sorted((self.clone / ".airflow" / "logs").glob("*.log"))
        return address_in_use("".join(self.lines)) or any(address_in_use(log.read_bytes()) for log in logs)

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.wait(1) and time.monotonic() < deadline and not self.lost_a_port():
            if self.process.poll() is not None:
                self.reader.join(timeout=10)
                return

    def interrupt(self) -> None:
        """Ctrl-C as a terminal sends it: SIGINT to the whole process group."""
        with contextlib.suppress(ProcessLookupError):  # it may have exited on its own
            os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            raise
        self.reader.join(timeout=10)


def _start_on_free_ports(tmp_path: Path, inbox: Path, outbox: Path) -> _MakeUp:
    """``make up`` is told its ports by number: when one was taken before it bound it, again on fresh ones."""
    for attempt in range(1, PORT_ATTEMPTS + 1):
        # Generous: a fresh SQLite database, then four Airflow components importing on a busy 2-core box.
        ui_port = free_port()
        engine_port = next(port for port in iter(free_port, None) if port != ui_port)
        up = _MakeUp(tmp_path / f"clone-{attempt}", ui_port, engine_port, inbox, outbox)
        up.wait_ready(timeout=600)
        if up.ready.is_set() or attempt == PORT_ATTEMPTS or not up.lost_a_port():
            return up
        up.interrupt()
    raise AssertionError("unreachable")


def test_make_up_from_a_fresh_clone_serves_a_working_login_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    inbox, outbox = tmp_path / "inbox", tmp_path / "outbox"
    inbox.mkdir()
    up = _start_on_free_ports(tmp_path, inbox, outbox)
    process, lines, ui_port, engine_port = up.process, up.lines, up.ui_port, up.engine_port
    try:
        assert up.ready.is_set(), "no login printed:\n" + "".join(lines[-40:])
        url, user, password = LOGIN.search("".join(lines)).groups()  # type: ignore[union-attr]
        assert url == f"http://127.0.0.1:{ui_port}"

        api = AirflowApi(url, user, password)
        health = api.ok("GET", "/api/v2/monitor/health")
        assert {part: health[part]["status"] for part in ("scheduler", "triggerer", "dag_processor")} == dict.fromkeys(
            ("scheduler", "triggerer", "dag_processor"), "healthy"
        )
        params = api.wait_for_dag("olmocr_ingest") and api.ok("GET", "/api/v2/dags/olmocr_ingest/details")["params"]
        assert params["input_uri"]["value"] == str(inbox)
        assert params["output_uri"]["value"] == str(outbox)
        api.close()
    finally:
        up.interrupt()

    assert process.returncode == 0, "".join(lines[-40:])
    assert not answers("127.0.0.1", ui_port) and not answers("127.0.0.1", engine_port)
    assert _processes_in(up.clone) == []


def test_up_cluster_runs_with_airflows_production_timings_unless_told_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """``make up-cluster`` is for trying the deployment: Airflow's own heartbeat timeout (300 s), not the
    tests' 30 s, unless ``--test-timings`` asks for them; the test deployment asks for them."""
    import importlib.util

    from olmocr_testkit.cluster import TEST_TIMINGS, ClusterSettings, timing_env

    # up.py puts scripts/ on sys.path for its helpers: undone after the test.
    monkeypatch.setattr(sys, "path", list(sys.path))
    spec = importlib.util.spec_from_file_location("up_script", REPO_ROOT / "scripts" / "up.py")
    assert spec is not None and spec.loader is not None
    up = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(up)

    def timings(*argv: str) -> dict[str, str]:
        args = up.parse_args(list(argv))
        return timing_env(up.cluster_settings("http://127.0.0.1:8011/v1", test_timings=args.test_timings))

    assert timings("--cluster") == {}, "a plain make up-cluster overrides Airflow's heartbeat timings"
    assert timings("--cluster", "--test-timings") == TEST_TIMINGS
    assert TEST_TIMINGS["AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT"] == "30"
    assert timing_env(ClusterSettings(work_dir=REPO_ROOT)) == {}, "production timings are the default"
    with pytest.raises(SystemExit):
        up.parse_args(["--test-timings"])  # the embedded Airflow has no such setting to change
