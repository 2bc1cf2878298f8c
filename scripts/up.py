"""`make up` / `make up-cluster`: Airflow with its UI on 127.0.0.1:8080, the CPU OCR engine, pool and connections.

    make up            embedded: `airflow standalone` (SQLite, LocalExecutor) in .airflow/
    make up-cluster    the deployment the tests run: api-server, scheduler, dag-processor, triggerer and
                       two Celery workers, each its own process, on the local PostgreSQL and Redis
                       (database olmocr_airflow, kept between starts; state in .airflow-cluster/),
                       with Airflow's production heartbeat timings (--test-timings: the test deployment's)

The login is printed once the UI answers and the scheduler, triggerer and dag-processor report
healthy. Ctrl-C or SIGTERM stops everything it started. ``OLMOCR_INPUT_URI`` / ``OLMOCR_OUTPUT_URI``
choose the DAGs' default input and output (default ``examples/`` and ``demo-output/``);
``AIRFLOW__API__PORT`` the UI port; ``OLMOCR_CPU_ENGINE_PORT`` the engine's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from local_airflow import (
    AIRFLOW_HOME,
    ROOT,
    airflow_env,
    allow_lists,
    input_uri,
    output_uri,
    prepare,
    vllm_connection,
)

from olmocr_tasks.servers.cpu_engine import CPU_ENGINE_MODEL
from olmocr_testkit.cluster import (
    ADMIN_USER,
    AirflowCluster,
    ClusterSettings,
    DeploymentError,
    Process,
    answers,
    start_process,
)

ENGINE_PORT = int(os.environ.get("OLMOCR_CPU_ENGINE_PORT", "8011"))
UI_PORT = int(os.environ.get("AIRFLOW__API__PORT", "8080"))
CLUSTER_DIR = ROOT / ".airflow-cluster"
CLUSTER_DATABASE = "olmocr_airflow"
# Importing Airflow in each component takes a while on a small, busy machine.
START_TIMEOUT_S = 600


def _stop_on_signals() -> None:
    # SIGTERM unwinds like Ctrl-C, through the finally blocks that stop every process. SIGINT is set
    # explicitly: a shell starting `make up` in the background hands it down ignored, and Python then
    # keeps ignoring it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)


def start_engine(log_dir: Path) -> Process:
    command = [sys.executable, "-m", "olmocr_tasks.cli", "serve-cpu", "--host", "127.0.0.1", "--port", str(ENGINE_PORT)]
    engine = start_process("cpu-engine", command, os.environ, log_dir, own_group=False)
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{ENGINE_PORT}/v1/models", timeout=5).status_code == 200:
                return engine
        except httpx.HTTPError:
            pass
        if not engine.alive or time.monotonic() > deadline:
            engine.stop()
            raise DeploymentError(f"the CPU OCR engine did not start; see {engine.log}")
        time.sleep(0.5)


def healthy(port: int) -> bool:
    try:
        health = httpx.get(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return False
    parts = ("metadatabase", "scheduler", "triggerer", "dag_processor")
    return all((health.get(part) or {}).get("status") == "healthy" for part in parts)


def print_ready(port: int, login: str, topology: str) -> None:
    print(f"\nAirflow UI ({topology}): http://127.0.0.1:{port}  login: {login}", flush=True)
    allowed = allow_lists()
    print(f"DAGs read {input_uri()} and write {output_uri()} (OLMOCR_INPUT_URI / OLMOCR_OUTPUT_URI).")
    print(
        f"Runs may read only {allowed['OLMOCR_ALLOWED_INPUTS']} and write only {allowed['OLMOCR_ALLOWED_OUTPUTS']} "
        "(OLMOCR_ALLOWED_INPUTS / OLMOCR_ALLOWED_OUTPUTS)."
    )
    print("DAGs start paused: unpause olmocr_ingest in the UI, or trigger it with the form. Ctrl-C stops.", flush=True)


def run_embedded(engine_url: str) -> int:
    env = airflow_env(vllm_url=engine_url, model=CPU_ENGINE_MODEL)
    env["AIRFLOW__API__PORT"] = str(UI_PORT)
    prepare(env)
    log_dir = AIRFLOW_HOME / "logs"
    command = [str(Path(sys.executable).parent / "airflow"), "standalone"]
    airflow = start_process("standalone", command, env, log_dir, own_group=False)
    print(f"starting airflow standalone (log: {airflow.log.relative_to(ROOT)}) ...", flush=True)
    passwords = AIRFLOW_HOME / "simple_auth_manager_passwords.json.generated"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (healthy(UI_PORT) and passwords.exists()):
            if not airflow.alive:
                print(f"error: airflow standalone exited; see {airflow.log}", file=sys.stderr)
                return 1
            if time.monotonic() > deadline:
                print(f"error: Airflow was not healthy after {START_TIMEOUT_S} s; see {airflow.log}", file=sys.stderr)
                return 1
            time.sleep(1)
        logins = json.loads(passwords.read_text())
        print_ready(UI_PORT, ", ".join(f"{user} / {password}" for user, password in logins.items()), "embedded")
        while airflow.alive:
            time.sleep(1)
        print(f"error: airflow standalone exited; see {airflow.log}", file=sys.stderr)
        return 1
    finally:
        airflow.stop()


def cluster_settings(engine_url: str, *, test_timings: bool = False) -> ClusterSettings:
    """``make up-cluster``'s deployment: Airflow's production timings unless ``test_timings``."""
    env = {
        "AIRFLOW_CONN_OLMOCR_VLLM": vllm_connection(engine_url, CPU_ENGINE_MODEL),
        "OLMOCR_INPUT_URI": input_uri(),
        "OLMOCR_OUTPUT_URI": output_uri(),
        **allow_lists(),
    }
    return ClusterSettings(
        work_dir=CLUSTER_DIR,
        api_port=UI_PORT,
        env=env,
        database=CLUSTER_DATABASE,
        drop_database=False,
        persistent_secrets=True,
        attached=True,
        test_timings=test_timings,
    )


def run_cluster(settings: ClusterSettings) -> int:
    CLUSTER_DIR.mkdir(exist_ok=True)
    cluster = AirflowCluster(settings)
    print(f"starting the local cluster (logs: {cluster.log_dir.relative_to(ROOT)}/) ...", flush=True)
    try:
        cluster.start(timeout=START_TIMEOUT_S)
        print_ready(UI_PORT, f"{ADMIN_USER} / {cluster.admin_password}", "local Celery cluster")
        while cluster.healthy():
            time.sleep(5)
        print(f"error: a component stopped; see {cluster.log_dir}", file=sys.stderr)
        return 1
    except DeploymentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        cluster.stop()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cluster", action="store_true", help="the multi-process Celery deployment")
    parser.add_argument(
        "--test-timings",
        action="store_true",
        help="with --cluster: the test deployment's Airflow timings (a lost worker's task retried after 30 s "
        "without heartbeats instead of Airflow's 300 s), not production's",
    )
    args = parser.parse_args(argv)
    if args.test_timings and not args.cluster:
        parser.error("--test-timings applies to --cluster only")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _stop_on_signals()
    log_dir = (CLUSTER_DIR if args.cluster else AIRFLOW_HOME) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    for port, what, variable in (
        (UI_PORT, "the UI", "AIRFLOW__API__PORT"),
        (ENGINE_PORT, "the CPU engine", "OLMOCR_CPU_ENGINE_PORT"),
    ):
        if answers("127.0.0.1", port):
            print(
                f"error: 127.0.0.1:{port} ({what}) is already in use: stop what runs there or set {variable}",
                file=sys.stderr,
            )
            return 1
    try:
        engine = start_engine(log_dir)
    except DeploymentError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    engine_url = f"http://127.0.0.1:{ENGINE_PORT}/v1"
    try:
        if args.cluster:
            return run_cluster(cluster_settings(engine_url, test_timings=args.test_timings))
        return run_embedded(engine_url)
    except KeyboardInterrupt:
        return 0
    finally:
        print("stopping ...", flush=True)
        engine.stop()


if __name__ == "__main__":
    sys.exit(main())
