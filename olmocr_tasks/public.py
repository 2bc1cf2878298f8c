"""The engine's public API for code outside the package: reading an output location and its run manifests.

``dags/`` and ``plugins/`` import ``olmocr_tasks.provider`` (the Airflow side) and this module, nothing
else of ``olmocr_tasks`` (an import contract in ``pyproject.toml``), so the engine's modules can move
and change behind these names. What is here is what the "OCR runs" pages (``plugins/olmocr_runs``)
read: storage and its access rules, the output location's layout, manifests and their overview, and
the redaction and errors they show. A name goes here only when code outside the package needs it.
"""

from __future__ import annotations

from olmocr_tasks.core.config import positive_number
from olmocr_tasks.core.errors import ConfigurationError, StorageError, UnreadableSourceError
from olmocr_tasks.core.redaction import redact, redact_url
from olmocr_tasks.location.layout import OutputLocation, summary_path
from olmocr_tasks.location.manifest import COUNT_KEYS
from olmocr_tasks.location.manifest_overview import (
    AXIS_STEPS,
    BIN_STEPS,
    format_number,
    histogram_bins,
    nice_ceiling,
    overview_of,
)
from olmocr_tasks.location.manifest_reader import ManifestFormatError, ManifestReader
from olmocr_tasks.storage.access import AccessPolicy, LocationNotAllowedError
from olmocr_tasks.storage.store import ReadLimitExceeded, Storage

__all__ = [
    "AXIS_STEPS",
    "BIN_STEPS",
    "COUNT_KEYS",
    "AccessPolicy",
    "ConfigurationError",
    "LocationNotAllowedError",
    "ManifestFormatError",
    "ManifestReader",
    "OutputLocation",
    "ReadLimitExceeded",
    "Storage",
    "StorageError",
    "UnreadableSourceError",
    "format_number",
    "histogram_bins",
    "nice_ceiling",
    "overview_of",
    "positive_number",
    "redact",
    "redact_url",
    "summary_path",
]
