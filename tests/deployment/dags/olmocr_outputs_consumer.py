"""A downstream DAG, as a user of the package would write one: it runs when ``olmocr_outputs`` gets an event.

The deployment tests load it from a DAG bundle of its own (beside the product's ``dags/``), so it
never ships; it is paused unless a test unpauses it. Its one task logs the manifests it was woken for.
"""

from __future__ import annotations

import logging

from airflow.sdk import dag, get_current_context, task

from olmocr_tasks.provider.tasks import OUTPUTS_ASSET

log = logging.getLogger(__name__)


@dag(dag_id="olmocr_outputs_consumer", schedule=[OUTPUTS_ASSET], catchup=False, tags=["olmocr", "tests"])
def olmocr_outputs_consumer() -> None:
    @task
    def read_manifests() -> list[str]:
        events = get_current_context()["triggering_asset_events"][OUTPUTS_ASSET]
        manifests = [event.extra["manifest"] for event in events]
        for uri in manifests:
            log.info("new outputs: %s", uri)
        return manifests

    read_manifests()


olmocr_outputs_consumer()
