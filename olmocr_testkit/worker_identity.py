"""``[core] hostname_callable`` for deployments that run several Celery workers on one machine.

Every worker of the local cluster would otherwise report the same host name, so neither the grid nor
a test could tell which worker ran a task instance. Each worker process gets ``OLMOCR_WORKER_NAME``;
other components fall back to the machine's name, as Airflow's default does.
"""

from __future__ import annotations

import os
import socket


def worker_hostname() -> str:
    return os.environ.get("OLMOCR_WORKER_NAME") or socket.getfqdn()
