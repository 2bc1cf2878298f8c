"""``make up`` from a fresh clone: it starts what it says, prints a login that works, and stops cleanly.

The test clones the committed HEAD and runs what the ``up`` target runs after its install step
(``.venv/bin/python scripts/up.py``) with this virtualenv's interpreter and, as under ``make``, without
the virtualenv on PATH. It waits for the login line, logs in through the API, checks that the
scheduler, triggerer and dag-processor are healthy and that the DAGs took ``OLMOCR_INPUT_URI`` /
``OLMOCR_OUTPUT_URI`` from the environment, then presses Ctrl-C (SIGINT to the whole process group,
as a terminal does) and expects every process gone. (SIGTERM takes the same way out.)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from tests.deployment.harness import REPO_ROOT, AirflowApi, answers, free_port

pytestmark = [pytest.mark.deployment, pytest.mark.timeout(900)]

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


def test_make_up_from_a_fresh_clone_serves_a_working_login_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO_ROOT), str(clone)], check=True)
    ui_port, engine_port = free_port(), free_port()
    inbox, outbox = tmp_path / "inbox", tmp_path / "outbox"
    inbox.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AIRFLOW", "OLMOCR_", "VIRTUAL_ENV"))}
    env |= {
        "PATH": _without_virtualenv(os.environ.get("PATH", "")),
        "AIRFLOW__API__PORT": str(ui_port),
        "OLMOCR_CPU_ENGINE_PORT": str(engine_port),
        "OLMOCR_INPUT_URI": str(inbox),
        "OLMOCR_OUTPUT_URI": str(outbox),
    }
    process = subprocess.Popen(
        [sys.executable, "scripts/up.py"],
        cwd=clone,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if LOGIN.search(line):
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # Generous: a fresh SQLite database, then four Airflow components importing on a busy 2-core box.
        ready.wait(timeout=600)
        assert ready.is_set(), "no login printed:\n" + "".join(lines[-40:])
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
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise
    reader.join(timeout=10)

    assert process.returncode == 0, "".join(lines[-40:])
    assert not answers("127.0.0.1", ui_port) and not answers("127.0.0.1", engine_port)
    assert _processes_in(clone) == []
