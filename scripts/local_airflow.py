"""An embedded Airflow for this checkout: SQLite metadata and logs under ``.airflow/`` (git-ignored).

Shared by ``make demo`` and ``make up`` so both see the same database, pool and connections.
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
            "OLMOCR_INPUT_URI": str(ROOT / "examples"),
            "OLMOCR_OUTPUT_URI": str(ROOT / "demo-output"),
            "PYTHONPATH": str(ROOT),
        }
    )
    if vllm_url:
        scheme, rest = vllm_url.split("://", 1)
        hostport = rest.split("/", 1)[0]
        host, port = hostport.rsplit(":", 1)
        env["AIRFLOW_CONN_OLMOCR_VLLM"] = json.dumps(
            {
                "conn_type": "olmocr_vllm",
                "host": host,
                "port": int(port),
                "schema": scheme,
                "extra": {"model": model} if model else {},
            }
        )
    return env


def airflow(*args: str, env: dict[str, str], quiet: bool = True) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).parent / "airflow"), *args]
    result = subprocess.run(command, env=env, text=True, capture_output=quiet, check=False)
    if result.returncode != 0:
        if quiet:
            sys.stderr.write(result.stdout[-4000:] + result.stderr[-4000:])
        raise SystemExit(f"error: `airflow {' '.join(args)}` failed with exit code {result.returncode}")
    return result


def prepare(env: dict[str, str], pool_slots: int = 4) -> None:
    """Create or upgrade the SQLite database and the pool the convert tasks run in."""
    AIRFLOW_HOME.mkdir(exist_ok=True)
    airflow("db", "migrate", env=env)
    airflow("pools", "set", POOL, str(pool_slots), "Bounds concurrent convert tasks per vLLM deployment", env=env)
