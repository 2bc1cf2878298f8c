"""Airflow metrics: convert tasks count pages, fallbacks and documents through Airflow's own Stats."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def test_batch_counters_reach_a_statsd_server(tmp_path) -> None:
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(20)
    port = receiver.getsockname()[1]
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(port),
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
    }
    code = (
        "from olmocr_tasks.provider.tasks import emit_metrics;"
        "emit_metrics({'pages': 12, 'fallback_pages': 1, 'converted': 3, 'failed': 1, 'skipped': 0})"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    received: set[str] = set()
    try:
        while len(received) < 4:
            packet = receiver.recv(4096).decode()
            if packet.startswith("airflow.olmocr."):  # Airflow emits its own timings too
                received.add(packet)
    finally:
        receiver.close()
    assert received == {
        "airflow.olmocr.pages:12|c",
        "airflow.olmocr.fallback_pages:1|c",
        "airflow.olmocr.converted:3|c",
        "airflow.olmocr.failed:1|c",
    }
