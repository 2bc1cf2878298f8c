"""`make up`: embedded Airflow with its UI on 127.0.0.1, the CPU OCR engine, pool and connections ready.

Stop with Ctrl-C. The login is printed once the api-server has generated it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_airflow import AIRFLOW_HOME, airflow_env, prepare

from olmocr_tasks.cpu_engine import CPU_ENGINE_MODEL

ENGINE_PORT = int(os.environ.get("OLMOCR_CPU_ENGINE_PORT", "8011"))
UI_PORT = int(os.environ.get("AIRFLOW__API__PORT", "8080"))


def main() -> int:
    engine = subprocess.Popen(
        [sys.executable, "-m", "olmocr_tasks.cli", "serve-cpu", "--host", "127.0.0.1", "--port", str(ENGINE_PORT)]
    )
    env = airflow_env(vllm_url=f"http://127.0.0.1:{ENGINE_PORT}/v1", model=CPU_ENGINE_MODEL)
    env["AIRFLOW__API__PORT"] = str(UI_PORT)
    prepare(env)
    airflow = subprocess.Popen([str(Path(sys.executable).parent / "airflow"), "standalone"], env=env)
    passwords = AIRFLOW_HOME / "simple_auth_manager_passwords.json.generated"
    try:
        for _ in range(120):
            if passwords.exists() or airflow.poll() is not None:
                break
            time.sleep(1)
        if passwords.exists():
            logins = json.loads(passwords.read_text())
            login = ", ".join(f"{user} / {password}" for user, password in logins.items())
            print(f"\nAirflow UI: http://127.0.0.1:{UI_PORT}  login: {login}")
            print("DAGs start paused: unpause olmocr_ingest in the UI, or trigger it with the form.")
        return airflow.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        for process in (airflow, engine):
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        for process in (airflow, engine):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


if __name__ == "__main__":
    sys.exit(main())
