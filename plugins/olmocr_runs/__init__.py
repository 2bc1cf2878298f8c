"""The "OCR runs" pages of olmocr-airflow: run manifests as tables and charts inside the Airflow UI.

``create_app`` builds the FastAPI app; ``olmocr_runs_plugin.py`` next to this package mounts it in
the Airflow api-server. The app needs no running Airflow, so it can also be served on its own::

    OLMOCR_OUTPUT_URI=s3://bucket/output uvicorn --factory olmocr_runs:create_app
"""

from .app import create_app

__all__ = ["create_app"]
