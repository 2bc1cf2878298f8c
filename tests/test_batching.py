"""The packing rule: documents with enough pages run alone, small ones are packed, every slot gets work."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from olmocr_tasks.batching import BatchingRule, pack_batches
from olmocr_tasks.runs import SourceDocument
from olmocr_tasks.storage import ObjectInfo

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
    batches = pack_batches(sources, rule)
    assert sorted(source.uri for batch in batches for source in batch) == [source.uri for source in sources]
    pages = [sum(rule.estimated_pages(source) for source in batch) for batch in batches]
    alone = [batch[0].uri for batch in batches if len(batch) == 1]
    assert alone == ["/in/d0500.pdf", "/in/d0501.pdf"]  # 150 and 64 pages; 63 is packed
    packs = [count for batch, count in zip(batches, pages, strict=True) if len(batch) > 1]
    assert all(64 <= count <= 65 for count in packs[:-1])
    assert len(batches) == 14  # 813 pages: 11 full packs, the last pack, and two documents alone


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
