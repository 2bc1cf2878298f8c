"""The one spelling of "now" written into state records, plans and manifests (UTC, milliseconds, ``Z``)."""

from __future__ import annotations

from datetime import UTC, datetime


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
