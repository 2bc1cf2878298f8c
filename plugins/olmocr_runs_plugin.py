"""Airflow plugin: serves the "OCR runs" pages in the api-server and links them from the UI's nav.

The output location is read from ``OLMOCR_OUTPUT_URI`` or the Airflow Variable
``olmocr_output_uri`` when a page is requested, so the plugin loads even before either is set.
"""

from __future__ import annotations

from airflow.api_fastapi.core_api.security import requires_authenticated
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends
from olmocr_runs import create_app

from olmocr_tasks.provider.hooks import storage_for
from olmocr_tasks.storage.store import Storage

URL_PREFIX = "/olmocr"


def _storage(output_uri: str) -> Storage:
    # The manifests are read as the tasks wrote them: S3 through the aws_default connection (its
    # endpoint_url extra for MinIO and the like), not only the api-server's own AWS environment.
    return storage_for([output_uri])


# The api-server does not guard plugin apps; run data (sources, error text) is for signed-in users
# only. The UI's session cookie is sent along when the pages are opened from the navigation.
app = create_app(dependencies=[Depends(requires_authenticated())], storage_for=_storage)


class OlmocrRunsPlugin(AirflowPlugin):
    name = "olmocr_runs"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "OCR runs"}]
    # With a url_route the UI shows the pages inside its own frame at /plugin/ocr-runs; Airflow
    # drops external views that have none.
    external_views = [
        {
            "name": "OCR runs",
            "href": f"{URL_PREFIX}/",
            "destination": "nav",
            "url_route": "ocr-runs",
            "category": "browse",
        }
    ]
