"""How a run's documents are split into mapped convert instances: by pages, the pool and the map limit.

The rule (``BatchingRule``), with ``P`` the run's estimated pages and ``S`` the convert instances that
can run at once (``parallel``: the ``olmocr_vllm`` pool's slots, at most workers times their
concurrency):

* an instance should get at least ``min_pages`` pages (default: a convert task's request window,
  ``max_concurrent_requests``): with fewer it cannot keep its share of the server busy, and each
  instance pays Airflow's start-up (about 6 s per instance under Celery on a loaded 2-core machine,
  ``bench/mapping.py``);
* the number of instances is a whole number of *waves* of ``S``:
  ``n = S * max(min_waves, P // (S * min_pages))``, so no instance runs alone after the others
  finished; a small run (``P < S * min_pages``) still spreads over all ``S`` slots, so every worker
  renders;
* ``min_waves`` (default 1) is raised for low-priority runs (``LOW_CLASS_MIN_WAVES``, ``W``): such a
  run gets up to ``W`` waves, as many as give each instance at least ``min_pages / W`` pages, so each
  instance holds a slot for about ``1 / (S * W)`` of the run, slots turn over often, and a high-priority
  instance, queued first by its weight, gets the next one within seconds rather than after a
  backfill's long instance (``olmocr_tasks.inference.priority``, README "Priority classes"); a run big enough
  for ``W`` waves of ``min_pages`` is cut as any other;
* each instance's target is ``P / n`` pages: a document of at least that many pages gets its own
  instance, smaller ones are packed in discovery order, each pack cut where its pages come closest to
  the target (or at ``max_documents`` documents);
* never more than ``max_batches`` (Airflow's ``max_map_length``): the target doubles until it fits.

Pages are **estimated from the listing's byte sizes** (``size / bytes_per_page``, at least 1): plan
reads one listing and nothing per document, which keeps a 50,000-object discovery to seconds on S3,
where opening each PDF to count its pages would cost several ranged GETs per document. A wrong estimate
only changes how documents are grouped, never what is converted; the manifest has the real pages.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from olmocr_tasks.location.documents import SourceDocument

# A born-digital text page is 10-100 KB, a scanned one 100-500 KB: 64 KiB errs towards counting more
# pages, i.e. towards more (smaller) instances, which costs start-up time but never starves the server.
DEFAULT_BYTES_PER_PAGE = 64 * 1024
DEFAULT_PARALLEL = 4
# Waves of a low-priority run: up to 8 * S instances of at least min_pages / 8 pages. With S = 2 and a run
# of 1,000 pages at 16 pages/s an instance holds its slot ~4 s instead of the whole minute; each costs
# its Airflow start-up, which overlaps the other slots' work (bench/priority.py measures what the big run loses).
LOW_CLASS_MIN_WAVES = 8


@dataclass(frozen=True)
class BatchingRule:
    """The parameters of the packing rule (see the module docstring)."""

    min_pages: int = 64
    parallel: int = DEFAULT_PARALLEL
    max_batches: int = 1024
    bytes_per_page: int = DEFAULT_BYTES_PER_PAGE
    max_documents: int = 200
    min_waves: int = 1

    def __post_init__(self) -> None:
        for name in ("min_pages", "parallel", "max_batches", "bytes_per_page", "max_documents", "min_waves"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")

    def estimated_pages(self, source: SourceDocument) -> int:
        return max(1, math.ceil((source.info.size or 0) / self.bytes_per_page))

    def target_pages(self, total_pages: int) -> float:
        """Pages one instance should get for a run of ``total_pages``: a whole number of waves."""
        waves = max(1, total_pages // (self.parallel * self.min_pages))
        if self.min_waves > 1:
            # More waves, but instances no shorter than a min_waves-th of min_pages: a small run is not
            # cut into instances that each pay Airflow's start-up for a page or two.
            shortest = math.ceil(self.min_pages / self.min_waves)
            waves = max(waves, min(self.min_waves, total_pages // (self.parallel * shortest)))
        instances = min(self.parallel * waves, self.max_batches, max(1, total_pages))
        return total_pages / instances


def pack_batches(sources: Sequence[SourceDocument], rule: BatchingRule | None = None) -> list[list[SourceDocument]]:
    """Group documents into batches by the rule: each document once, at most ``rule.max_batches`` batches."""
    rule = rule or BatchingRule()
    if not sources:
        return []
    pages = [rule.estimated_pages(source) for source in sources]
    target = rule.target_pages(sum(pages))
    max_documents = rule.max_documents
    while True:
        batches = _pack(sources, pages, target, max_documents)
        if len(batches) <= rule.max_batches:
            return batches
        target *= 2
        max_documents *= 2


def _pack(
    sources: Sequence[SourceDocument], pages: Sequence[int], target: float, max_documents: int
) -> list[list[SourceDocument]]:
    batches: list[list[SourceDocument]] = []
    current: list[SourceDocument] = []
    current_pages = 0
    last_pack: list[SourceDocument] | None = None
    for source, count in zip(sources, pages, strict=True):
        if count >= target:
            batches.append([source])
            continue
        # Cut before this document when the pack would overshoot its target by more than it falls short.
        if current and (current_pages + count - target >= target - current_pages or len(current) >= max_documents):
            batches.append(current)
            last_pack, current, current_pages = current, [], 0
        current.append(source)
        current_pages += count
    if current:
        # A remainder under half a target joins the previous pack instead of taking a slot of its own.
        if last_pack is not None and current_pages < target / 2 and len(last_pack) + len(current) <= max_documents:
            last_pack.extend(current)
        else:
            batches.append(current)
    return batches
