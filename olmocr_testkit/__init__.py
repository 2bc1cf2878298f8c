"""Dev support for this checkout: what the tests, ``make up-cluster``, ``bench/`` and ``scripts/`` share.

    standin/      the vLLM stand-in server (``python -m olmocr_testkit.standin``)
    cpu_vllm/     the real vLLM (CPU build) serving a tiny random model: the vllm tier's and the bench's
    pdfgen        generated PDFs whose pages carry an identity marker (``page_marker``)
    page_query    olmOCR's page request as a dict, for requests built by hand
    ports         free, reserved and refusing loopback ports
    airflow_env   a throw-away SQLite Airflow driven through subprocesses
    cluster       the multi-process Airflow deployment (``make up-cluster``, the deployment tests)
    bucket        a moto S3 bucket: generated PDFs in, published manifests out
    tier_record   the record ``make test`` checks: each solo tier in one process, started once
    dag_test_driver  ``dag.test()`` in a subprocess (``python -m olmocr_testkit.dag_test_driver``)

Needs the ``test`` extra (reportlab, pypdf, aiohttp, moto). It starts Airflow only as subprocesses;
the one module that imports it is ``dag_test_driver``, which those subprocesses run.

Not part of the product: the wheel holds ``olmocr_tasks`` only, and neither it nor ``dags/`` and
``plugins/`` import this package (pyproject's import contract). It lives in the checkout, importable
in the dev virtualenv (``make``'s install puts the checkout on its path), so its paths are the
checkout's.
"""

from pathlib import Path

# The checkout this package lives in: dags/, plugins/ and test-output/.
REPO_ROOT = Path(__file__).resolve().parents[1]
