"""How a run's documents are split into mapped convert instances: by pages, the pool and the map limit.

The rule (``BatchingRule``), with ``P`` the run's estimated pages and ``S`` the convert instances that
can run at once (``parallel``: the ``olmocr_vllm`` pool's slots, at most workers times their
concurrency):

* an instance should get at least ``min_pages`` pages: in Airflow, as many as it converts in the time
  that makes its measured fixed cost (start-up, slot turnover) at most a tenth of its slot's time
  (``olmocr_tasks.run.instance_costs``, measured on the output location's last run); before any
  measurement, and in the CLI, a convert task's request window (``max_concurrent_requests``);
* the number of instances is a whole number of *waves* of ``S``:
  ``n = S * max(min_waves, min(max_waves, P // (S * min_pages)))``, so no instance runs alone after the
  others finished; a small run (``P < S * min_pages``) still spreads over all ``S`` slots, so every
  worker renders;
* ``max_waves`` and ``max_pages`` (default: none) bound the waves while instances are sized by the
  request window alone (no measured cost yet): each wave pays every slot an instance's fixed cost, so
  a run gets at most ``max_waves`` waves, unless that would give an instance more than ``max_pages``
  pages: a first run of 10,000 one-page documents on 2 slots is 5 waves of 1,000 pages, not 78 of 64
  whose fixed cost was a third of their time on a fast server (bench/README Run 17), and one of
  1,000,000 stays in instances of ~1,000 pages rather than 8 of 125,000;
* ``min_waves`` (default 1) cuts a run into at least that many waves (``OLMOCR_LOW_CLASS_WAVES`` for
  low-priority runs, ``W``): up to ``W`` waves, as many as give each instance at least ``min_pages / W``
  pages, so slots turn over every ``1 / (S * W)`` of the run. Off by default: each instance pays a fixed
  cost (its Airflow start-up, its render workers, its readiness check), and on a backfill of one-page
  documents eight waves cost 0.56x of the CLI's throughput against 0.88x for one (bench/README, issue
  34), while an urgent run no longer waits for a backfill's instance to end: its first instance takes
  the reserved ``olmocr_vllm_high`` slot and its requests go first at the server (README "Priority
  classes"). A deployment without a reserved slot can set it to shorten the longest wait for a slot;
* each instance's target is ``P / n`` pages: a document of at least that many pages gets its own
  instance, smaller ones are packed in discovery order, each pack cut where its pages come closest to
  the target (or at ``max_documents`` documents: by default 200, or the target when larger);
* never more than ``max_batches`` (Airflow's ``max_map_length``): the target doubles until it fits.

The rule is one stream (``Packing``) over the sources in discovery order that holds two packs at most:
the Airflow plan runs it over its sources read back from storage a slice at a time (once to count the
packs, once to write them), ``pack_batches`` over a list.

Pages are **estimated from the listing's byte sizes** (``size / bytes_per_page``, at least 1): plan
reads one listing and nothing per document, which keeps a 50,000-object discovery to seconds on S3,
where opening each PDF to count its pages would cost several ranged GETs per document. A wrong estimate
only changes how documents are grouped, never what is converted; the manifest has the real pages.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

from olmocr_tasks.location.documents import SourceDocument

# A born-digital text page is 10-100 KB, a scanned one 100-500 KB: 64 KiB errs towards counting more
# pages, i.e. towards more (smaller) instances, which costs start-up time but never starves the server.
DEFAULT_BYTES_PER_PAGE = 64 * 1024
DEFAULT_PARALLEL = 4
# Waves of a low-priority run (see the module docstring): 1, cut like any other run. A low-priority run
# gives way by its pool weight, the reserved pool, vLLM's priority and niceness while others run.
LOW_CLASS_MIN_WAVES = 1
# The most waves a run is cut into while its instances are sized by the request window alone (a
# location's first run in Airflow): see the module docstring.
UNMEASURED_MAX_WAVES = 4
# ... but never instances of more than this many pages then: 16 request windows, about 40 s of a fast
# server's share and 10 minutes of a slow GPU's.
UNMEASURED_MAX_PAGES = 1024
# The most documents a pack holds unless its target is larger: the target already bounds a pack (every
# document counts at least one page), and a pack cut short of it by count would bring back the
# instances the target sized away.
DEFAULT_MAX_DOCUMENTS = 200


@dataclass(frozen=True)
class BatchingRule:
    """The parameters of the packing rule (see the module docstring)."""

    min_pages: int = 64
    parallel: int = DEFAULT_PARALLEL
    max_batches: int = 1024
    bytes_per_page: int = DEFAULT_BYTES_PER_PAGE
    # None: DEFAULT_MAX_DOCUMENTS, or the target when it is larger (see DEFAULT_MAX_DOCUMENTS).
    max_documents: int | None = None
    min_waves: int = 1
    max_waves: int | None = None
    max_pages: int | None = None

    def __post_init__(self) -> None:
        for name in ("min_pages", "parallel", "max_batches", "bytes_per_page", "min_waves"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        for name in ("max_documents", "max_waves", "max_pages"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")

    def estimated_pages(self, source: SourceDocument) -> int:
        return max(1, math.ceil((source.info.size or 0) / self.bytes_per_page))

    def target_pages(self, total_pages: int) -> float:
        """Pages one instance should get for a run of ``total_pages``: a whole number of waves."""
        waves = max(1, total_pages // (self.parallel * self.min_pages))
        if self.max_waves is not None:
            waves = min(waves, self.max_waves)
        if self.max_pages is not None:
            waves = max(waves, math.ceil(total_pages / (self.parallel * self.max_pages)))
        if self.min_waves > 1:
            # More waves, but instances no shorter than a min_waves-th of min_pages: a small run is not
            # cut into instances that each pay Airflow's start-up for a page or two.
            shortest = math.ceil(self.min_pages / self.min_waves)
            waves = max(waves, min(self.min_waves, total_pages // (self.parallel * shortest)))
        instances = min(self.parallel * waves, self.max_batches, max(1, total_pages))
        return total_pages / instances


def pack_batches(sources: Sequence[SourceDocument], rule: BatchingRule | None = None) -> list[list[SourceDocument]]:
    """Group documents into batches by the rule: each document once, at most ``rule.max_batches`` batches.

    The list form of ``Packing``, for sources held in memory; the Airflow plan streams the same rule."""
    rule = rule or BatchingRule()
    packing = Packing.fitted(lambda: sources, rule, sum(rule.estimated_pages(source) for source in sources))
    packs = dict(packing.packs(sources, rule))
    return [packs[position] for position in range(len(packs))]


@dataclass(frozen=True)
class Packing:
    """One pass of the packing rule: each pack's target pages and its most documents.

    ``packs`` streams it over the sources in discovery order, holding two packs at most, so a run's
    sources can be read back from storage a slice at a time rather than held whole.
    """

    target: float
    max_documents: int

    @classmethod
    def fitted(cls, sources: Callable[[], Iterable[SourceDocument]], rule: BatchingRule, total_pages: int) -> Packing:
        """The packing of a run of ``total_pages`` estimated pages that gives at most ``rule.max_batches``
        packs: the target (and the documents a pack may hold) doubles until it fits. ``sources`` gives
        the run's sources afresh for each counting pass."""
        target = rule.target_pages(total_pages)
        packing = cls(target, rule.max_documents or max(DEFAULT_MAX_DOCUMENTS, math.ceil(target)))
        while sum(1 for _ in packing.packs(sources(), rule)) > rule.max_batches:
            packing = cls(packing.target * 2, packing.max_documents * 2)
        return packing

    def packs(
        self, sources: Iterable[SourceDocument], rule: BatchingRule
    ) -> Iterator[tuple[int, list[SourceDocument]]]:
        """``(position, pack)`` for each pack once it is final; ``position`` is its place in the run's batches.

        A document of at least the target runs alone; smaller ones are packed in order, each pack cut
        where its pages come closest to the target. The pack cut last is held back until the next cut
        (or the end), since a remainder under half a target joins it instead of taking a slot of its
        own: that pack is the only one yielded out of position order.
        """
        target, max_documents = self.target, self.max_documents
        positions = itertools.count()
        current: list[SourceDocument] = []
        current_pages = 0
        # The pack cut last, not yielded yet: the end-of-run remainder may still join it.
        held: tuple[int, list[SourceDocument]] | None = None
        for source in sources:
            count = rule.estimated_pages(source)
            if count >= target:
                yield next(positions), [source]
                continue
            # Cut before this document when the pack would overshoot its target by more than it falls short.
            if current and (current_pages + count - target >= target - current_pages or len(current) >= max_documents):
                if held is not None:
                    yield held
                held, current, current_pages = (next(positions), current), [], 0
            current.append(source)
            current_pages += count
        if current and held is not None and current_pages < target / 2 and len(held[1]) + len(current) <= max_documents:
            held[1].extend(current)
            current = []
        if held is not None:
            yield held
        if current:
            yield next(positions), current
