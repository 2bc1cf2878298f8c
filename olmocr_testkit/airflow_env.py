"""A throw-away Airflow for tests: SQLite in a temp ``AIRFLOW_HOME``, this repo's ``dags/`` and ``plugins/``.

Airflow reads its configuration when it is first imported, so the tests never import it themselves:
every Airflow action runs in a subprocess started with ``AirflowEnv.env``. Connections are passed
as ``AIRFLOW_CONN_<ID>`` variables (JSON form), so each test can point them at its own servers.

``AirflowEnv.dag_test`` runs one DAG run through the driver in ``olmocr_testkit.dag_test_driver``
(the one module here that imports Airflow, run only in that subprocess). Paths are this checkout's
(``dags/``, ``plugins/``).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from olmocr_testkit import REPO_ROOT

# The driver prints its summary on a line starting with this (olmocr_testkit.dag_test_driver).
RESULT_PREFIX = "DAG_TEST_RESULT "
POOL = "olmocr_vllm"


def base_env(home: Path) -> dict[str, str]:
    """The environment of every Airflow subprocess: isolated home, repo DAGs, no examples."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AIRFLOW", "OLMOCR_"))}
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO_ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        }
    )
    return env


def vllm_connection(url: str, model: str, api_key: str | None = None, **extra: Any) -> str:
    """``AIRFLOW_CONN_OLMOCR_VLLM`` for a server at ``url`` (a full base URL in the host field)."""
    return json.dumps(
        {"conn_type": "olmocr_vllm", "host": url, "password": api_key, "extra": {"model": model, **extra}}
    )


def aws_connection(endpoint_url: str, key: str, secret: str, region: str = "us-east-1") -> str:
    """``AIRFLOW_CONN_AWS_DEFAULT`` for an S3-compatible endpoint (moto, MinIO)."""
    return json.dumps(
        {
            "conn_type": "aws",
            "login": key,
            "password": secret,
            "extra": {
                "endpoint_url": endpoint_url,
                "region_name": region,
                "config_kwargs": {"s3": {"addressing_style": "path"}},
            },
        }
    )


@dataclass
class DagTestResult:
    returncode: int
    state: str | None
    run_id: str | None
    seconds: float  # wall time of the subprocess
    dag_seconds: float | None  # inside dag.test(): the run itself, without imports and parsing
    output: str = field(repr=False)

    @property
    def succeeded(self) -> bool:
        return self.returncode == 0 and self.state == "success"

    def tail(self, chars: int = 6000) -> str:
        return self.output[-chars:]


@dataclass
class AirflowEnv:
    home: Path
    env: dict[str, str]

    def with_env(self, **variables: str | None) -> AirflowEnv:
        """A copy whose subprocesses also see ``variables`` (None removes one)."""
        env = dict(self.env)
        for key, value in variables.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return AirflowEnv(self.home, env)

    def airflow(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        command = [str(Path(sys.executable).parent / "airflow"), *args]
        result = subprocess.run(
            command, env=self.env, cwd=self.home, text=True, capture_output=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(f"airflow {' '.join(args)} exited {result.returncode}:\n{result.stderr[-4000:]}")
        return result

    def python(self, code: str, *, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", code],
            env=self.env,
            cwd=REPO_ROOT,
            text=True,
            capture_output=True,
            timeout=timeout,
            check=False,
        )

    def dag_test(
        self,
        dag_id: str,
        *,
        logical_date: str | None = "now",
        conf: Mapping[str, Any] | None = None,
        timeout: float = 600,
    ) -> DagTestResult:
        """Run one manual DAG run to completion in a subprocess; ``logical_date`` None = no logical date."""
        command = [sys.executable, "-m", "olmocr_testkit.dag_test_driver", "dag-test", dag_id]
        command += ["--logical-date", "none" if logical_date is None else logical_date]
        if conf is not None:
            command += ["--conf", json.dumps(conf)]
        started = time.monotonic()
        result = subprocess.run(
            command, env=self.env, cwd=REPO_ROOT, text=True, capture_output=True, timeout=timeout, check=False
        )
        output = result.stdout + result.stderr
        summary: dict[str, Any] = {}
        for line in reversed(result.stdout.splitlines()):
            if line.startswith(RESULT_PREFIX):
                # The first JSON value only: a log line another thread of `dags test` (OpenLineage's
                # adapter) writes between our print's text and its newline lands on the same line.
                summary, _ = json.JSONDecoder().raw_decode(line[len(RESULT_PREFIX) :])
                break
        return DagTestResult(
            result.returncode,
            summary.get("state"),
            summary.get("run_id"),
            time.monotonic() - started,
            summary.get("seconds"),
            output,
        )

    def xcom_sizes(self) -> list[tuple[str, str, str, int, int]]:
        """``(dag_id, run_id, task_id, map_index, bytes)`` of every XCom value in the metadata DB."""
        with sqlite3.connect(self.home / "airflow.db") as db:
            rows = db.execute("SELECT dag_id, run_id, task_id, map_index, length(value) FROM xcom").fetchall()
        return [(dag, run, task, index, size or 0) for dag, run, task, index, size in rows]

    def task_states(self, dag_id: str, run_id: str) -> dict[tuple[str, int], str]:
        with sqlite3.connect(self.home / "airflow.db") as db:
            rows = db.execute(
                "SELECT task_id, map_index, state FROM task_instance WHERE dag_id = ? AND run_id = ?",
                (dag_id, run_id),
            ).fetchall()
        return {(task, index): state for task, index, state in rows}


def prepare(home: Path, pool_slots: int = 4) -> AirflowEnv:
    """Create the metadata DB and the pool the convert tasks run in."""
    home.mkdir(parents=True, exist_ok=True)
    airflow = AirflowEnv(home, base_env(home))
    airflow.airflow("db", "migrate")
    airflow.airflow("pools", "set", POOL, str(pool_slots), "vLLM capacity for the tests")
    return airflow
