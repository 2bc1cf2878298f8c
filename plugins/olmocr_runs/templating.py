"""The pages' Jinja2 templates (``templates/``), their number and time filters, and rendering one.

Autoescaping is on for every template, so a value from a manifest is always escaped.
"""

from __future__ import annotations

import math
from datetime import UTC
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape

from .dependencies import mount_path
from .runs import STATUS_LABELS, parse_time

# Shown for figures a manifest does not have (an en dash, written as an escape for ruff's RUF001).
_BLANK = "\u2013"

_templates = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)


def _fmt_int(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else _BLANK


def _fmt_float(value: Any, digits: int = 2) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return _BLANK
    return f"{value:,.{digits}f}"


def _fmt_pct(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _BLANK
    return f"{value * 100:.2f}%"


def _fmt_time(value: Any) -> str:
    """ISO stamps shown to the second, in UTC."""
    stamp = parse_time(value)
    if stamp is None:
        return _BLANK if not value else str(value)
    return stamp.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


_templates.filters.update(n=_fmt_int, dec=_fmt_float, pct=_fmt_pct, time=_fmt_time)
_templates.globals["status_labels"] = STATUS_LABELS


def render(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    """The template as a page; its links start at the app's mount path (``base``)."""
    body = _templates.get_template(template).render(base=mount_path(request), **context)
    return HTMLResponse(body, status_code=status_code)
