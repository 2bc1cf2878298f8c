"""How a run's documents are split into mapped convert instances: by pages, the pool and the map limit.

The rule (``BatchingRule``), with ``P`` the run's estimated pages:

* the **target** of an instance is ``min_pages`` pages (default: a convert task's request window,
  ``max_concurrent_requests``): an instance with fewer pages cannot keep its share of the server
  busy, and each instance pays Airflow's start-up;
* but never more than ``P // parallel``, so a small run still spreads over every convert slot
  that can run at once (``parallel``: the ``olmocr_vllm`` pool's slots, bounded by workers times their
  concurrency), and both workers render;
* and never less than ``ceil(P / max_batches)``, doubled until the run fits Airflow's
  ``max_map_length``;
* a document of at least the target gets its own instance; smaller ones are packed in discovery
  order until their pack reaches the target (or ``max_documents`` documents).

Pages are **estimated from the listing's byte sizes** (``size / bytes_per_page``, at least 1): plan
reads one listing and nothing per document, which keeps a 50,000-object discovery to seconds on S3,
where opening each PDF to count its pages would cost several ranged GETs per document. A wrong estimate
only changes how documents are grouped, never what is converted; the manifest has the real pages.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from olmocr_tasks.runs import SourceDocument

# A born-digital text page is 10-100 KB, a scanned one 100-500 KB: 64 KiB errs towards counting more
# pages, i.e. towards more (smaller) instances, which costs start-up time but never starves the server.
DEFAULT_BYTES_PER_PAGE = 64 * 1024
DEFAULT_PARALLEL = 4


@dataclass(frozen=True)
class BatchingRule:
    """The parameters of the packing rule (see the module docstring)."""

    min_pages: int = 64
    parallel: int = DEFAULT_PARALLEL
    max_batches: int = 1024
    bytes_per_page: int = DEFAULT_BYTES_PER_PAGE
    max_documents: int = 200

    def __post_init__(self) -> None:
        for name in ("min_pages", "parallel", "max_batches", "bytes_per_page", "max_documents"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")

    def estimated_pages(self, source: SourceDocument) -> int:
        return max(1, math.ceil((source.info.size or 0) / self.bytes_per_page))

    def target_pages(self, total_pages: int) -> int:
        """Pages one instance should get for a run of ``total_pages``."""
        spread = min(self.min_pages, total_pages // self.parallel)
        return max(1, spread, math.ceil(total_pages / self.max_batches))


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
    sources: Sequence[SourceDocument], pages: Sequence[int], target: int, max_documents: int
) -> list[list[SourceDocument]]:
    batches: list[list[SourceDocument]] = []
    current: list[SourceDocument] = []
    current_pages = 0
    for source, count in zip(sources, pages, strict=True):
        if count >= target:
            batches.append([source])
            continue
        current.append(source)
        current_pages += count
        if current_pages >= target or len(current) >= max_documents:
            batches.append(current)
            current, current_pages = [], 0
    if current:
        batches.append(current)
    return batches
