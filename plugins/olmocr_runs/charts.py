"""Small server-side SVG charts: no JavaScript, no external assets, safe to inline in a page.

Every label that reaches the SVG is escaped here, because error classes and similar labels come
from run data. The functions return SVG markup as a string; callers may embed it verbatim.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from itertools import count

from olmocr_tasks.public import AXIS_STEPS, BIN_STEPS, format_number, histogram_bins, nice_ceiling

WIDTH = 560
HEIGHT = 260
# Room for the axis labels and tick labels around the plot area.
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 16, 36, 58
_BAR_COLOUR = "#3b6fb6"
_LINE_COLOUR = "#2f8f5b"
_AXIS_COLOUR = "#666"
_GRID_COLOUR = "#e3e3e3"
_MAX_POINTS = 600

# Distinct ids per chart so several charts on one page never share an aria-labelledby target.
_ids = count(1)


# The binning and tick rules are shared with the publish step, which folds the latency histogram
# into the summary (olmocr_tasks.location.manifest_overview).
__all__ = ["AXIS_STEPS", "BIN_STEPS", "bar_chart", "format_number", "histogram_bins", "line_chart", "nice_ceiling"]


def _frame(title: str, description: str, body: list[str], x_label: str, y_label: str) -> str:
    chart_id = f"chart-{next(_ids)}"
    plot_bottom = HEIGHT - _BOTTOM
    mid_y = (_TOP + plot_bottom) / 2
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" role="img" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'aria-labelledby="{chart_id}-title {chart_id}-desc">',
        f'<title id="{chart_id}-title">{escape(title)}</title>',
        f'<desc id="{chart_id}-desc">{escape(description)}</desc>',
        f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" class="chart-title" '
        f'font-size="14" font-weight="600" fill="#222">{escape(title)}</text>',
        *body,
        f'<text x="{(_LEFT + WIDTH - _RIGHT) / 2}" y="{HEIGHT - 8}" text-anchor="middle" '
        f'font-size="11" fill="{_AXIS_COLOUR}">{escape(x_label)}</text>',
        f'<text x="14" y="{mid_y}" text-anchor="middle" font-size="11" fill="{_AXIS_COLOUR}" '
        f'transform="rotate(-90 14 {mid_y})">{escape(y_label)}</text>',
        "</svg>",
    ]
    return "\n".join(parts)


def _whole_ticks(y_max: float) -> float:
    """An axis maximum whose four intervals are whole numbers (for counts)."""
    return float(max(4, math.ceil(y_max / 4) * 4))


def _y_axis(y_max: float) -> tuple[list[str], float]:
    """Grid lines and tick labels for 0..y_max; returns them with the pixels per unit."""
    plot_bottom = HEIGHT - _BOTTOM
    scale = (plot_bottom - _TOP) / y_max
    parts = []
    for i in range(5):
        value = y_max * i / 4
        y = plot_bottom - value * scale
        parts.append(f'<line x1="{_LEFT}" y1="{y:.1f}" x2="{WIDTH - _RIGHT}" y2="{y:.1f}" stroke="{_GRID_COLOUR}"/>')
        parts.append(
            f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="10" '
            f'fill="{_AXIS_COLOUR}">{escape(format_number(value))}</text>'
        )
    parts.append(
        f'<line x1="{_LEFT}" y1="{plot_bottom}" x2="{WIDTH - _RIGHT}" y2="{plot_bottom}" stroke="{_AXIS_COLOUR}"/>'
    )
    return parts, scale


def _empty(title: str, x_label: str, y_label: str, message: str) -> str:
    body = [
        f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" font-size="13" '
        f'fill="{_AXIS_COLOUR}">{escape(message)}</text>'
    ]
    return _frame(title, message, body, x_label, y_label)


def bar_chart(
    title: str,
    bars: Sequence[tuple[str, float]],
    *,
    x_label: str = "",
    y_label: str = "",
    empty_message: str = "No data",
) -> str:
    """Vertical bars, one per (label, value); labels are shortened to fit under their bar."""
    if not bars:
        return _empty(title, x_label, y_label, empty_message)
    y_max = nice_ceiling(max(value for _, value in bars))
    if all(float(value).is_integer() for _, value in bars):
        y_max = _whole_ticks(y_max)
    grid, scale = _y_axis(y_max)
    plot_bottom = HEIGHT - _BOTTOM
    slot = (WIDTH - _RIGHT - _LEFT) / len(bars)
    bar_width = max(2.0, slot * 0.7)
    # Roughly 6 px per character at font-size 10; long labels get an ellipsis, the full text stays
    # available as the bar's tooltip.
    max_chars = max(3, int(slot / 6))
    show_every = max(1, math.ceil(len(bars) / 24))
    body = list(grid)
    for index, (label, value) in enumerate(bars):
        x = _LEFT + index * slot + (slot - bar_width) / 2
        height = value * scale
        tooltip = f"{label}: {format_number(value)}"
        body.append(
            f'<rect x="{x:.1f}" y="{plot_bottom - height:.1f}" width="{bar_width:.1f}" '
            f'height="{height:.1f}" fill="{_BAR_COLOUR}"><title>{escape(tooltip)}</title></rect>'
        )
        if index % show_every == 0:
            short = label if len(label) <= max_chars else label[: max_chars - 1] + "\u2026"
            body.append(
                f'<text x="{x + bar_width / 2:.1f}" y="{plot_bottom + 14}" text-anchor="middle" '
                f'font-size="10" fill="#333">{escape(short)}</text>'
            )
    description = "; ".join(f"{label}: {format_number(value)}" for label, value in bars[:50])
    return _frame(title, description, body, x_label, y_label)


def line_chart(
    title: str,
    points: Sequence[tuple[float, float]],
    *,
    x_label: str = "",
    y_label: str = "",
    empty_message: str = "No data",
    whole_y: bool = False,
) -> str:
    """A step-free polyline through (x, y) points sorted by x, with both axes starting at zero.

    ``whole_y``: y counts things (pages), so every tick is a whole number.
    """
    if len(points) < 2:
        return _empty(title, x_label, y_label, empty_message)
    ordered = sorted(points)
    if len(ordered) > _MAX_POINTS:
        # A run of 50,000 documents would otherwise inline 50,000 coordinates; a few hundred draw the
        # same curve at this size.
        step = math.ceil(len(ordered) / _MAX_POINTS)
        ordered = [*ordered[::step], ordered[-1]]
    x_max = nice_ceiling(max(x for x, _ in ordered))
    y_max = nice_ceiling(max(y for _, y in ordered))
    if whole_y:
        y_max = _whole_ticks(y_max)
    grid, y_scale = _y_axis(y_max)
    plot_bottom = HEIGHT - _BOTTOM
    x_scale = (WIDTH - _RIGHT - _LEFT) / x_max
    body = list(grid)
    for i in range(5):
        value = x_max * i / 4
        x = _LEFT + value * x_scale
        body.append(
            f'<text x="{x:.1f}" y="{plot_bottom + 14}" text-anchor="middle" font-size="10" '
            f'fill="{_AXIS_COLOUR}">{escape(format_number(value))}</text>'
        )
    coords = " ".join(f"{_LEFT + x * x_scale:.1f},{plot_bottom - y * y_scale:.1f}" for x, y in ordered)
    body.append(f'<polyline points="{coords}" fill="none" stroke="{_LINE_COLOUR}" stroke-width="2"/>')
    last_x, last_y = ordered[-1]
    description = f"{len(ordered)} points, ending at {format_number(last_x)}, {format_number(last_y)}"
    return _frame(title, description, body, x_label, y_label)
