"""Our Airflow path: ``airflow dags test olmocr_ingest`` on SQLite, as one measured subprocess.

``dags test`` runs the whole DAG run in one process (no scheduler, no executor): check the server,
plan, the mapped convert instances one after another, publish the manifest, enforce the error budget.
Its wall time therefore includes Airflow's start-up, DAG parsing and per-task bookkeeping, which is
exactly the overhead the Airflow path adds to the CLI. The metadata DB and the ``olmocr_vllm`` pool are
set up once per harness session with the test suite's helper (``olmocr_testkit.airflow_env.prepare``).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import MODEL, VENV_BIN, Row, bytecode_env, fresh_dir
from bench.corpus import Corpus
from bench.measure import run_measured
from bench.run_cli import manifest_check, read_manifest

DAG_ID = "olmocr_ingest"


class AirflowHome:
    """A throw-away AIRFLOW_HOME with a migrated SQLite DB, made on first use."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._env: Any = None
        self.setup_error: str | None = None

    def env(self) -> Any:
        if self._env is None and self.setup_error is None:
            from olmocr_testkit.airflow_env import prepare

            try:
                self._env = prepare(fresh_dir(self.path))
            except Exception as exc:  # reported in the table as a pending row, never a crash
                self.setup_error = f"Airflow set-up failed: {exc}"[:500]
        return self._env


def dag_ready() -> str | None:
    """Why the Airflow row cannot run yet (the DAG file is another engineer's work), or None."""
    dag = VENV_BIN.parent.parent / "dags" / f"{DAG_ID}.py"
    if not dag.is_file():
        return f"dags/{DAG_ID}.py does not exist yet"
    if not (VENV_BIN / "airflow").exists():
        return "Airflow is not installed in the venv (the [airflow] extra)"
    return None


def measure_airflow(corpus: Corpus, server: str, work: Path, regime: str, home: AirflowHome) -> Row:
    system = "ours: Airflow (dags test)"
    reason = dag_ready()
    airflow_env = home.env() if reason is None else None
    if airflow_env is None:
        return Row(system, regime, corpus.pages, None, False, f"pending: {reason or home.setup_error}")
    from olmocr_testkit.airflow_env import vllm_connection

    slug = f"airflow-{regime}-{corpus.folder.name}"
    output = fresh_dir(work / slug)
    conf = {"input_uri": str(corpus.folder), "output_uri": str(output), "scope": "all"}
    # The worker's allow-lists fail closed: name the corpus and the output folder, as a deployment
    # names its prefixes.
    env = bytecode_env(
        airflow_env.with_env(
            AIRFLOW_CONN_OLMOCR_VLLM=vllm_connection(server, MODEL),
            OLMOCR_ALLOWED_INPUTS=str(corpus.folder),
            OLMOCR_ALLOWED_OUTPUTS=str(output),
        ).env
    )
    log = work / f"{slug}.log"
    command = [str(VENV_BIN / "airflow"), "dags", "test", DAG_ID, "-c", json.dumps(conf)]
    measurement = run_measured(command, label=f"{system} / {regime}", env=env, cwd=airflow_env.home, log_path=log)
    ok, note, details = manifest_check(read_manifest(output), corpus)
    details.update(_timeline(log))
    if measurement.returncode != 0:
        ok, note = False, f"exit {measurement.returncode}; see {slug}.log"
    return Row(system, regime, corpus.pages, measurement, ok, note, details)


_TASK_EDGE = re.compile(r"^(\S+Z) .*\[DAG TEST\] (starting|end task) task_id=(\S+) map_index=(-?\d+)", re.M)


def _timeline(log: Path) -> dict[str, Any]:
    """From the ``dags test`` log: batches packed, the DAG run's own duration and each task's."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return {}
    found: dict[str, Any] = {}
    match = re.search(r"packed \d+ documents into (\d+) batches", text)
    found["convert_instances"] = int(match.group(1)) if match else None
    match = re.search(r"run_duration=([0-9.]+)", text)
    found["dag_run_s"] = float(match.group(1)) if match else None
    starts: dict[str, datetime] = {}
    durations: dict[str, float] = {}
    for stamp, edge, task, index in _TASK_EDGE.findall(text):
        key = task if index == "-1" else f"{task}[{index}]"
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        if edge == "starting":
            starts[key] = when
        elif key in starts:
            durations[key] = round((when - starts[key]).total_seconds(), 2)
    found["task_s"] = durations
    return found
