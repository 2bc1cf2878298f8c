"""Which objects a run read and wrote, named the way OpenLineage names datasets.

OpenLineage's naming spec: an S3 object is namespace ``s3://<bucket>``, name ``<key>``; a local file
is namespace ``file://<host>``, name ``<absolute path>``. Airflow carries lineage as asset URIs, which
its providers translate into exactly those (amazon for ``s3://``, common-io for ``file://``), so this
module turns our storage URIs into such asset URIs: ``s3://`` unchanged, a local path as
``file://<this host><path>``.

A converting task reads its documents and writes their Dolma and markdown objects; the publishing task
writes the manifest. Airflow keeps at most ``[lineage] max_assets_per_collector`` (100 by default) of
each per task and silently drops the rest, so a batch with more objects than that is reported by the
folders that hold them (complete, if coarser) rather than by a truncated list. Airflow-free: the
provider glue (``olmocr_tasks.provider.lineage``) hands these URIs to Airflow.
"""

from __future__ import annotations

import os
import posixpath
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from olmocr_tasks.storage.uri import is_s3, local_path

DEFAULT_MAX_ASSETS = 100  # Airflow's [lineage] max_assets_per_collector default
# Reported outputs of a converted document, by manifest output kind (the ledger's content record
# and other bookkeeping objects are not data).
DATA_OUTPUTS = ("dolma", "markdown")


@dataclass(frozen=True)
class Lineage:
    """Asset URIs a task read (``inputs``) and wrote (``outputs``), sorted, without duplicates."""

    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    # Kinds of URIs that stand for a whole folder because there were too many objects to list.
    summarised: tuple[str, ...] = field(default=())


def asset_uri(uri: str, host: str | None = None) -> str:
    """The asset URI OpenLineage translates into its standard dataset name for ``uri``.

    ``?`` and ``#`` are percent-encoded: in a URI they would start a query or fragment and cut the name.
    """
    if is_s3(uri) or ("://" in uri and uri[:7].lower() != "file://"):
        name = uri  # s3://, or another fsspec scheme (gs://, az://...) whose provider names it
    else:
        name = f"file://{host or socket.gethostname()}{os.path.abspath(local_path(uri))}"
    return name.replace("?", "%3F").replace("#", "%23")


def _entry_fields(entry: Any) -> tuple[str, str, Mapping[str, str]]:
    if isinstance(entry, Mapping):
        return entry["source"], entry["status"], entry.get("outputs") or {}
    return entry.source, entry.status, entry.outputs or {}


def batch_lineage(entries: Iterable[Any], *, max_assets: int = DEFAULT_MAX_ASSETS, host: str | None = None) -> Lineage:
    """Lineage of one converting task from its manifest entries (``DocumentEntry`` or their dicts).

    Inputs are the documents it read: converted and failed ones (a failed document was still read).
    Outputs are the Dolma and markdown objects of the documents it converted. Skipped documents
    (already converted, duplicates) were neither read nor written by this task.
    """
    inputs: set[str] = set()
    outputs: set[str] = set()
    for entry in entries:
        source, status, written = _entry_fields(entry)
        if status not in ("converted", "failed"):
            continue
        inputs.add(asset_uri(source, host))
        if status == "converted":
            outputs.update(asset_uri(written[kind], host) for kind in DATA_OUTPUTS if written.get(kind))
    summarised = []
    if len(inputs) > max_assets:
        inputs, summarised = set(_folders(inputs, max_assets)), [*summarised, "inputs"]
    if len(outputs) > max_assets:
        outputs, summarised = set(_folders(outputs, max_assets)), [*summarised, "outputs"]
    return Lineage(tuple(sorted(inputs)), tuple(sorted(outputs)), tuple(summarised))


def manifest_lineage(manifest_uri: str, *, host: str | None = None) -> Lineage:
    """Lineage of the publishing task: it writes the run manifest."""
    return Lineage(outputs=(asset_uri(manifest_uri, host),))


def _folders(uris: Iterable[str], max_assets: int) -> list[str]:
    """The folders holding ``uris``; per bucket (or host), their common folder when even those are too many."""
    folders = sorted({posixpath.dirname(uri) for uri in uris})
    if len(folders) <= max_assets:
        return folders
    by_root: dict[str, list[str]] = {}
    for folder in folders:
        scheme, rest = folder.split("://", 1)
        authority, _, path = rest.partition("/")
        by_root.setdefault(f"{scheme}://{authority}", []).append("/" + path)
    return sorted(root + posixpath.commonpath(paths).rstrip("/") for root, paths in by_root.items())
