"""What the OCR runs page shows of a run besides its counts, folded at publish into the summary.

A run's page must open without reading its entries (a run of 100,000 documents has ten shards of
about 1.5 MB each), so the writer folds, entry by entry, what the charts and the problem list need
into a bounded ``overview`` object of the summary:

* ``latency_histogram``: the page-latency histogram the chart draws (at most 12 bins);
* ``progress``: cumulative converted pages against cumulative conversion seconds, in manifest order,
  thinned to at most ``2 * PROGRESS_POINTS`` points (every other point dropped whenever it doubles);
* ``failure_classes``: failed documents and dead letters per error class, each source version once;
* ``failed`` and ``dead_letters``: the first ``PROBLEMS_KEPT`` of each with their total.

Its size is bounded whatever the run's size (about 40 KB at most with long error messages). Runs
published before it have none: ``overview_of`` folds the same object from their entries.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

PROBLEMS_KEPT = 25
# Error texts are kept whole in the shards; the summary's problem list shows their start.
ERROR_CHARS = 400
PROGRESS_POINTS = 300
# Failed identities remembered to count a dead letter that also failed in this run once; past this
# many failures (an archive failing wholesale) dead letters are counted without that check.
_IDENTITIES_KEPT = 100_000
# Axis maxima whose quarters are round too, and bin widths for histograms (shared with the charts).
AXIS_STEPS = (1.0, 1.2, 1.6, 2.0, 2.4, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)
BIN_STEPS = (1.0, 2.0, 2.5, 5.0, 10.0)


def nice_ceiling(value: float, steps: Sequence[float] = AXIS_STEPS) -> float:
    """The smallest step times a power of ten that is >= value, so ticks and bins are round numbers."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    exponent = math.floor(math.log10(value))
    for step in steps:
        candidate = round(step * 10**exponent, 12)
        if candidate >= value * (1 - 1e-12):
            return candidate
    return 10.0 ** (exponent + 1)


def format_number(value: float) -> str:
    """Tick labels: integers without decimals, small values with up to two significant decimals."""
    if value == int(value) and abs(value) < 1e15:
        whole = int(value)
        if abs(whole) >= 10_000:
            return f"{whole / 1000:g}k"
        return str(whole)
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.1f}".rstrip("0").rstrip(".")
    return f"{value:.2f}".rstrip("0").rstrip(".")


def histogram_bins(values: Iterable[float], bins: int = 12) -> list[tuple[str, int]]:
    """Equal-width bins from 0 to the largest value, labelled by their lower edge in seconds.

    A sequence is read twice rather than copied: a run's page latencies stay in their 8-byte array.
    """
    if not isinstance(values, Sequence):
        values = list(values)

    def finite() -> Iterator[float]:
        return (v for v in values if isinstance(v, int | float) and math.isfinite(v) and v >= 0)

    top = max(finite(), default=None)
    if top is None:
        return []
    if top == 0:
        return [("0 s", sum(1 for _ in finite()))]
    width = nice_ceiling(top / bins, BIN_STEPS)
    n_bins = max(1, min(bins, math.ceil(top / width + 1e-9)))
    counts = [0] * n_bins
    for value in finite():
        counts[min(int(value / width), n_bins - 1)] += 1
    return [(f"{format_number(i * width)} s", n) for i, n in enumerate(counts)]


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0.0
    return float(value)


def _problem(index: int, entry: dict[str, Any]) -> dict[str, Any]:
    error = entry.get("error")
    return {
        "index": index,
        "source": entry.get("source"),
        "error_class": entry.get("error_class"),
        "error": error[:ERROR_CHARS] if isinstance(error, str) else error,
        "attempts": entry.get("attempts"),
        "failed_attempts": entry.get("failed_attempts"),
        "task": entry.get("task") if isinstance(entry.get("task"), dict) else None,
    }


class OverviewFolder:
    """Folds entries (as dicts, in manifest order) into the bounded ``overview`` of a summary."""

    def __init__(self) -> None:
        self.documents = 0
        self.busy_s = 0.0
        self.pages = 0
        self.converted = 0
        self.latencies: list[float] = []
        self.points: list[list[float]] = []
        self.stride = 1
        self.failed: list[dict[str, Any]] = []
        self.failed_total = 0
        self.dead: list[dict[str, Any]] = []
        self.dead_total = 0
        self.classes: Counter[str] = Counter()
        self._failed_ids: set[tuple[str, str]] = set()
        # The last converted document's point: the curve always ends at the run's exact total.
        self._last: list[float] | None = None

    def add(self, entry: dict[str, Any], *, latencies: bool = True) -> None:
        """One document entry. ``latencies`` False: the caller keeps the latencies (``RunTotals``)."""
        index = self.documents
        self.documents += 1
        self.busy_s += max(_number(entry.get("seconds")), 0.0)
        status = entry.get("status")
        if status == "converted":
            self.converted += 1
            pages = entry.get("pages")
            self.pages += pages if isinstance(pages, int) and not isinstance(pages, bool) else 0
            if self.converted % self.stride == 0:
                self.points.append([self.documents, round(self.busy_s, 3), self.pages])
                if len(self.points) > 2 * PROGRESS_POINTS:
                    # Thin to every other point: the kept ones stay evenly spread over the run.
                    self.stride *= 2
                    self.points = self.points[1::2]
            self._last = [self.documents, round(self.busy_s, 3), self.pages]
            if latencies and isinstance(entry.get("page_latencies_s"), list):
                self.latencies.extend(_number(v) for v in entry["page_latencies_s"])
        elif status == "failed":
            self.failed_total += 1
            if len(self.failed) < PROBLEMS_KEPT:
                self.failed.append(_problem(index, entry))
            self.classes[str(entry.get("error_class") or "unknown")] += 1
            if len(self._failed_ids) < _IDENTITIES_KEPT:
                self._failed_ids.add((str(entry.get("source")), str(entry.get("sha256"))))

    def add_dead_letter(self, entry: dict[str, Any]) -> None:
        if len(self.dead) < PROBLEMS_KEPT:
            self.dead.append(_problem(self.dead_total, entry))
        self.dead_total += 1
        # A dead letter is usually also a failed document of an earlier run: count each version once.
        if (str(entry.get("source")), str(entry.get("sha256"))) not in self._failed_ids:
            self.classes[str(entry.get("error_class") or "unknown")] += 1

    def finish(self, latencies: Sequence[float] | None = None) -> dict[str, Any]:
        """The ``overview`` object; ``latencies`` when the caller kept them instead of this folder (read
        in place, not copied: a publish's latencies are an array of 8 bytes a page)."""
        points = list(self.points)
        if self._last is not None and (not points or points[-1] != self._last):
            points.append(self._last)
        values = self.latencies if latencies is None else latencies
        return {
            "latency_histogram": [list(pair) for pair in histogram_bins(values)],
            "latency_count": len(values),
            "progress": {"documents": self.documents, "busy_s": round(self.busy_s, 3), "points": points},
            "failure_classes": dict(sorted(self.classes.items(), key=lambda item: (-item[1], item[0]))),
            "failed": {"total": self.failed_total, "first": self.failed},
            "dead_letters": {"total": self.dead_total, "first": self.dead},
        }


def overview_of(documents: Iterable[dict[str, Any]], dead_letters: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The overview of a run published without one (schema 1 and 2, early schema 3), from its entries."""
    folder = OverviewFolder()
    for entry in documents:
        if isinstance(entry, dict):
            folder.add(entry)
    for entry in dead_letters:
        if isinstance(entry, dict):
            folder.add_dead_letter(entry)
    return folder.finish()
