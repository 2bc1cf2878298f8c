"""OpenLineage for the TaskFlow tasks: what a task read and wrote goes to Airflow's hook-lineage collector.

``@task`` functions have no operator of their own to carry ``get_openlineage_facets_on_complete``, and
the objects a convert instance touches are only known once it has run, so static ``inlets``/``outlets``
cannot name them either. Airflow's answer for runtime lineage is the hook-lineage collector: a task
adds input and output asset URIs while it runs, and the OpenLineage provider (when installed and given
a transport) turns them into the task's OpenLineage datasets, S3 objects as ``s3://bucket`` + key and
local files as ``file://host`` + path. Without the provider the collector is a no-op.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from olmocr_tasks.storage.dataset_names import DEFAULT_MAX_ASSETS, Lineage, batch_lineage, manifest_lineage


class _StorageContext:
    """What the collector records as the lineage's origin: our storage layer, not an Airflow hook.

    The collector only uses it to tell sources apart; the s3 and file asset converters ignore it.
    """


STORAGE_CONTEXT = _StorageContext()


def max_assets() -> int:
    """Airflow's per-task cap on collected assets; more would be dropped silently."""
    from airflow.sdk import conf

    return conf.getint("lineage", "max_assets_per_collector", fallback=DEFAULT_MAX_ASSETS)


def report(lineage: Lineage, context: Any = STORAGE_CONTEXT) -> None:
    """Hand a task's inputs and outputs to the hook-lineage collector of this task process."""
    from airflow.sdk.lineage import get_hook_lineage_collector

    collector = get_hook_lineage_collector()
    for uri in lineage.inputs:
        collector.add_input_asset(context, uri=uri)
    for uri in lineage.outputs:
        collector.add_output_asset(context, uri=uri)


def report_converted(entries: Iterable[Any]) -> Lineage:
    """Call at the end of a convert task with its batch's manifest entries (objects or dicts)."""
    lineage = batch_lineage(entries, max_assets=max_assets())
    report(lineage)
    return lineage


def report_published(manifest_uri: str) -> Lineage:
    """Call at the end of the publish task with the manifest it wrote."""
    lineage = manifest_lineage(manifest_uri)
    report(lineage)
    return lineage
