"""An embedded Airflow for this checkout: SQLite metadata and logs under ``.airflow/`` (git-ignored).

Shared by ``make demo`` and ``make up`` so both see the same database, pool and connections. Input and
output default to ``examples/`` and ``demo-output/``; ``OLMOCR_INPUT_URI`` / ``OLMOCR_OUTPUT_URI`` in
the environment replace them (a local folder or ``s3://bucket/prefix/``). The workers' allow-lists
(``OLMOCR_ALLOWED_INPUTS`` / ``OLMOCR_ALLOWED_OUTPUTS``, closed when unset) are set explicitly to those
two locations unless the environment names its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AIRFLOW_HOME = ROOT / ".airflow"
POOL = "olmocr_vllm"
HIGH_PRIORITY_POOL = "olmocr_vllm_high"
# Airflow's own commands live beside this interpreter; they start further `airflow` processes by
# name, so that folder goes first on PATH (a `make` target does not activate the virtualenv).
BIN_DIR = Path(sys.executable).parent


def input_uri() -> str:
    return os.environ.get("OLMOCR_INPUT_URI") or str(ROOT / "examples")


def output_uri() -> str:
    return os.environ.get("OLMOCR_OUTPUT_URI") or str(ROOT / "demo-output")


def allow_lists() -> dict[str, str]:
    """The workers' allow-lists: the environment's own, else exactly the input and the output."""
    return {
        "OLMOCR_ALLOWED_INPUTS": os.environ.get("OLMOCR_ALLOWED_INPUTS") or input_uri(),
        "OLMOCR_ALLOWED_OUTPUTS": os.environ.get("OLMOCR_ALLOWED_OUTPUTS") or output_uri(),
    }


def vllm_connection(vllm_url: str, model: str | None) -> str:
    """``AIRFLOW_CONN_OLMOCR_VLLM`` for a server at ``vllm_url`` (``http://host:port/v1``)."""
    return json.dumps({"conn_type": "olmocr_vllm", "host": vllm_url, "extra": {"model": model} if model else {}})


def airflow_env(vllm_url: str | None = None, model: str | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "AIRFLOW_HOME": str(AIRFLOW_HOME),
            "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            # Small machines: a few worker processes are plenty for one GPU-less engine.
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__API__HOST": "127.0.0.1",
            # A worker slot is not held ~5 s past each task's end (see docker/compose.yaml).
            "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
            "OLMOCR_INPUT_URI": input_uri(),
            "OLMOCR_OUTPUT_URI": output_uri(),
            **allow_lists(),
            "PATH": os.pathsep.join([str(BIN_DIR), os.environ.get("PATH", "")]),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
    )
    if vllm_url:
        env["AIRFLOW_CONN_OLMOCR_VLLM"] = vllm_connection(vllm_url, model)
    return env


def airflow(*args: str, env: dict[str, str], quiet: bool = True) -> subprocess.CompletedProcess[str]:
    command = [str(BIN_DIR / "airflow"), *args]
    result = subprocess.run(command, env=env, text=True, capture_output=quiet, check=False)
    if result.returncode != 0:
        if quiet:
            sys.stderr.write(result.stdout[-4000:] + result.stderr[-4000:])
        raise SystemExit(f"error: `airflow {' '.join(args)}` failed with exit code {result.returncode}")
    return result


def prepare(env: dict[str, str], pool_slots: int = 4) -> None:
    """Create or upgrade the SQLite database and the pools the convert tasks run in."""
    AIRFLOW_HOME.mkdir(exist_ok=True)
    airflow("db", "migrate", env=env)
    airflow("pools", "set", POOL, str(pool_slots), "Bounds concurrent convert tasks per vLLM deployment", env=env)
    # Reserved for high-priority runs (REST documents runs): README "Priority classes".
    airflow("pools", "set", HIGH_PRIORITY_POOL, "1", "Convert tasks of high-priority runs", env=env)
