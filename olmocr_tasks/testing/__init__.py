"""Dev support for this checkout: what the tests, ``make up-cluster``, ``bench/`` and ``scripts/`` share.

    standin/      the vLLM stand-in server (``python -m olmocr_tasks.testing.standin``)
    cpu_vllm/     the real vLLM (CPU build) serving a tiny random model: the vllm tier's and the bench's
    pdfgen        generated PDFs whose pages carry an identity marker (``page_marker``)
    ports         free, reserved and refusing loopback ports
    airflow_env   a throw-away SQLite Airflow driven through subprocesses
    cluster       the multi-process Airflow deployment (``make up-cluster``, the deployment tests)
    bucket        a moto S3 bucket: generated PDFs in, published manifests out
    tier_record   the record ``make test`` checks: each solo tier in one process, started once

Needs the ``test`` extra (reportlab, pypdf, aiohttp, moto). It starts Airflow only as subprocesses and
never imports it (the one driver that does is ``olmocr_tasks.provider.testing``); nothing else in
``olmocr_tasks`` imports this package.
"""

from pathlib import Path

# The checkout this package is installed from (editable install): dags/, plugins/ and test-output/.
REPO_ROOT = Path(__file__).resolve().parents[2]
