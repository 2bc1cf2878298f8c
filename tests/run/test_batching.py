"""The packing rule: documents with enough pages run alone, small ones are packed, every slot gets work."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from olmocr_tasks.location.documents import SourceDocument
from olmocr_tasks.run.batching import LOW_CLASS_MIN_WAVES, BatchingRule, pack_batches
from olmocr_tasks.storage.store import ObjectInfo

PAGE = 1000  # bytes per page in these tests


def _documents(*pages: int) -> list[SourceDocument]:
    when = datetime(2026, 3, 1, tzinfo=UTC)
    return [
        SourceDocument(
            info=ObjectInfo(uri=f"/in/d{index:04d}.pdf", size=count * PAGE, etag=None, last_modified=when),
            stem=f"d{index:04d}",
        )
        for index, count in enumerate(pages)
    ]


def _shape(batches: list[list[SourceDocument]]) -> list[int]:
    return [len(batch) for batch in batches]


def test_a_few_small_documents_get_an_instance_each_so_every_slot_works() -> None:
    rule = BatchingRule(min_pages=64, parallel=4, bytes_per_page=PAGE)
    assert _shape(pack_batches(_documents(1, 2, 1, 2), rule)) == [1, 1, 1, 1]
    # More small documents than slots: packed, but still into at least as many instances as slots.
    batches = pack_batches(_documents(*[2] * 12), rule)
    assert _shape(batches) == [3, 3, 3, 3]


def test_many_small_documents_are_packed_to_the_target_and_large_ones_run_alone() -> None:
    rule = BatchingRule(min_pages=64, parallel=3, bytes_per_page=PAGE)
    sources = _documents(*([1, 2] * 250), 150, 64, 63)
    # 1,027 pages: 5 waves of 3 instances of at least 64 pages, so a target of 68.5 pages each.
    assert rule.target_pages(1027) == pytest.approx(1027 / 15)
    batches = pack_batches(sources, rule)
    assert sorted(source.uri for batch in batches for source in batch) == [source.uri for source in sources]
    pages = [sum(rule.estimated_pages(source) for source in batch) for batch in batches]
    assert pages == [69] * 10 + [150, 60, 64, 63]
    assert [len(batch) for batch in batches][10:] == [1, 40, 1, 1]  # the 150-page document runs alone


def test_a_small_run_is_one_wave_over_every_slot() -> None:
    rule = BatchingRule(min_pages=64, parallel=3, bytes_per_page=PAGE)
    batches = pack_batches(_documents(60, 12, 15, 18, *[3] * 12), rule)
    assert [sum(rule.estimated_pages(source) for source in batch) for batch in batches] == [60, 48, 33]


def test_never_more_instances_than_max_map_length() -> None:
    rule = BatchingRule(min_pages=4, parallel=4, max_batches=10, bytes_per_page=PAGE)
    batches = pack_batches(_documents(*[100] * 25, *[1] * 500), rule)
    assert len(batches) <= 10
    assert sum(map(len, batches)) == 525


def test_pages_are_estimated_from_sizes_and_the_rule_refuses_nonsense() -> None:
    rule = BatchingRule(bytes_per_page=PAGE)
    assert [rule.estimated_pages(source) for source in _documents(0, 1, 7)] == [1, 1, 7]
    with pytest.raises(ValueError, match="parallel"):
        BatchingRule(parallel=0)
    assert pack_batches([], rule) == []


def test_a_low_priority_run_is_cut_like_any_other_unless_waves_are_set() -> None:
    """By default a low-priority run's instances are as long as any run's (each pays a fixed start-up
    cost); with OLMOCR_LOW_CLASS_WAVES set, its instances each hold a slot for a short share of the run,
    and a run that already has more waves than the floor is cut as before."""
    sources = _documents(*[1] * 128)  # 128 pages: one wave of 2 x 64 by the default rule
    normal = BatchingRule(min_pages=64, parallel=2, bytes_per_page=PAGE)
    default_low = BatchingRule(min_pages=64, parallel=2, bytes_per_page=PAGE, min_waves=LOW_CLASS_MIN_WAVES)
    assert _shape(pack_batches(sources, normal)) == _shape(pack_batches(sources, default_low)) == [64, 64]
    low = BatchingRule(min_pages=64, parallel=2, bytes_per_page=PAGE, min_waves=8)
    batches = pack_batches(sources, low)
    assert len(batches) == 2 * 8
    assert _shape(batches) == [8] * 16  # each a sixteenth of the run
    assert sorted(source.uri for batch in batches for source in batch) == [source.uri for source in sources]
    # A small run is not cut into instances of a page or two, each paying Airflow's start-up.
    small = _documents(*[1] * 24)
    assert (
        _shape(pack_batches(small, BatchingRule(min_pages=64, parallel=4, bytes_per_page=PAGE, min_waves=8))) == [6] * 4
    )
    many = _documents(*[4] * 1000)  # 4,000 pages: 31 waves of 64-page instances, above the floor
    assert len(pack_batches(many, low)) == len(pack_batches(many, normal))
    with pytest.raises(ValueError, match="min_waves"):
        BatchingRule(min_waves=0)


def test_a_run_sized_by_the_window_alone_is_cut_into_at_most_max_waves() -> None:
    """Before any measured cost, each wave pays every slot an instance's fixed cost: a big run is cut
    into max_waves waves of larger instances rather than one wave per request window of pages."""
    sources = _documents(*[1] * 10_000)
    uncapped = BatchingRule(min_pages=64, parallel=4, bytes_per_page=PAGE)
    capped = BatchingRule(min_pages=64, parallel=4, bytes_per_page=PAGE, max_waves=8)
    assert len(pack_batches(sources, uncapped)) == 4 * (10_000 // 256)
    batches = pack_batches(sources, capped)
    # 32 targets of 312.5 pages; packs are cut at the page nearest their target, so the rounding may
    # leave a remainder of its own.
    assert len(batches) in (4 * 8, 4 * 8 + 1)
    assert all(312 <= len(batch) <= 313 for batch in batches[:-1])
    assert sorted(source.uri for batch in batches for source in batch) == sorted(source.uri for source in sources)
    # A run with fewer waves than the cap is cut as before, and an explicit floor of waves still wins.
    small = _documents(*[1] * 480)
    assert _shape(pack_batches(small, capped)) == _shape(pack_batches(small, uncapped)) == [120] * 4
    # Never instances beyond max_pages: the waves grow again past max_waves.
    bounded = BatchingRule(min_pages=64, parallel=2, bytes_per_page=PAGE, max_waves=4, max_pages=1024)
    assert _shape(pack_batches(sources, bounded)) == [1000] * 10
    assert _shape(pack_batches(_documents(*[1] * 2_000), bounded)) == [250] * 8
    floored = BatchingRule(min_pages=64, parallel=4, bytes_per_page=PAGE, max_waves=1, min_waves=3)
    assert len(pack_batches(sources, floored)) in (4 * 3, 4 * 3 + 1)
    with pytest.raises(ValueError, match="max_waves"):
        BatchingRule(max_waves=0)
    with pytest.raises(ValueError, match="max_pages"):
        BatchingRule(max_pages=0)
