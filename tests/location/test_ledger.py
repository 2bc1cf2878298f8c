"""The ledger's decisions (new / done / failed / dead letter) on real local folders and moto S3."""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from olmocr_tasks.location.ledger import (
    ContentRecord,
    Ledger,
    conversion_key,
    fingerprint,
    source_id,
)
from olmocr_tasks.location.outputs import output_stem, write_document_outputs
from olmocr_tasks.page.results import DocumentResult, PageResult
from olmocr_tasks.storage.store import ObjectInfo, RetryPolicy, Storage
from olmocr_tasks.storage.uri import join_uri
from tests.fixtures.s3 import FaultProxy

CONV = conversion_key("allenai/olmOCR-2-7B-1025-FP8", "olmocr-v4-yaml", 1288)
T0 = datetime(2024, 6, 1, tzinfo=UTC)


def _info(uri: str, size: int = 100, etag: str | None = "etag-1", at: datetime = T0) -> ObjectInfo:
    return ObjectInfo(uri, size, etag, at)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _convert(ledger: Ledger, info: ObjectInfo, data: bytes, output_uri: str, run_id: str) -> dict[str, str]:
    """What the engine does after a successful conversion: outputs first, then the done marker."""
    page = PageResult.fallback(1, data.decode(), attempts=1, latency_s=0.0, reason="test")
    result = DocumentResult(source=info.uri, size=len(data), sha256=_sha(data), pages=[page])
    outputs = write_document_outputs(
        result,
        output_uri=output_uri,
        stem=output_stem(info.uri, "s3://bucket/in"),
        storage=ledger.storage,
        write_markdown=True,
        model="m",
        prompt_version="p",
        package_version="v",
    )
    ledger.mark_done(info, result.sha256, outputs, run_id)
    return outputs


def test_conversion_key_is_stable_and_sensitive() -> None:
    assert conversion_key("allenai/olmOCR-2-7B-1025-FP8", "olmocr-v4-yaml", 1288) == CONV
    assert len(CONV) == 16
    others = {
        conversion_key("other/model", "olmocr-v4-yaml", 1288),
        conversion_key("allenai/olmOCR-2-7B-1025-FP8", "v5", 1288),
        conversion_key("allenai/olmOCR-2-7B-1025-FP8", "olmocr-v4-yaml", 1024),
        conversion_key("allenai/olmOCR-2-7B-1025-FP8", "olmocr-v4-yaml", 1288, extra={"max_tokens": 4000}),
    }
    assert CONV not in others and len(others) == 4


def test_fingerprint_and_source_id() -> None:
    info = _info("s3://b/in/a.pdf")
    assert fingerprint(info) == fingerprint(replace(info, last_modified=T0 + timedelta(days=1)))  # S3: ETag decides
    assert fingerprint(info) != fingerprint(replace(info, etag="etag-2"))
    assert fingerprint(info) != fingerprint(replace(info, size=101))
    local = _info("/data/a.pdf", etag=None)
    assert fingerprint(local) != fingerprint(replace(local, last_modified=T0 + timedelta(microseconds=1)))
    assert source_id("/data/a.pdf") == source_id("file:///data/a.pdf") == source_id("/data/./x/../a.pdf")
    assert source_id("s3://b/in/a.pdf") != source_id("s3://b/in/A.pdf")


def test_new_done_changed_and_renamed(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    ledger = Ledger(out, Storage(), CONV)
    a = _info("s3://bucket/in/a.pdf")
    assert ledger.snapshot().status(a) == "new"

    outputs = _convert(ledger, a, b"content A", out, "run-1")
    snapshot = ledger.snapshot()
    assert snapshot.status(a) == "done" and len(snapshot) == 1 and snapshot.done_count == 1
    assert ledger.status(a) == "done"
    # Re-uploaded with identical bytes: same ETag, newer LastModified → still done.
    assert snapshot.status(replace(a, last_modified=T0 + timedelta(hours=3))) == "done"

    # Changed content under the same key: a new version, to be converted.
    a2 = replace(a, size=200, etag="etag-2")
    assert snapshot.status(a2) == "new"

    # A renamed copy is "new" by listing, but after download its SHA-256 finds the earlier output.
    copy = _info("s3://bucket/in/renamed.pdf", etag="etag-1")
    assert snapshot.status(copy) == "new"
    record = ledger.find_content(_sha(b"content A"))
    assert isinstance(record, ContentRecord)
    assert record.source == a.uri and record.outputs == outputs and record.run_id == "run-1"
    ledger.mark_done(copy, record.sha256, record.outputs, "run-2", duplicate_of=record.source)
    assert ledger.snapshot().status(copy) == "done"
    assert ledger.find_content(_sha(b"content A")).source == a.uri  # first conversion stays the record
    assert ledger.find_content(_sha(b"never seen")) is None

    # Another model/prompt starts from a clean slate.
    assert Ledger(out, Storage(), conversion_key("other", "p", 1288)).snapshot().status(a) == "new"


def test_find_content_ignores_outputs_that_no_longer_hold_the_content(tmp_path: Path) -> None:
    out = str(tmp_path)
    storage = Storage()
    ledger = Ledger(out, storage, CONV)
    a = _info("s3://bucket/in/a.pdf")
    _convert(ledger, a, b"version one", out, "run-1")
    assert ledger.find_content(_sha(b"version one")) is not None
    # The same key gets new content and is reconverted: the old content's outputs are gone.
    _convert(ledger, replace(a, etag="etag-2"), b"version two", out, "run-2")
    assert ledger.find_content(_sha(b"version one")) is None
    assert ledger.find_content(_sha(b"version one"), verify_outputs=False) is not None
    assert ledger.find_content(_sha(b"version two")) is not None
    # Deleted outputs are not reused either.
    storage.delete(join_uri(out, "markdown/a.md"))
    assert ledger.find_content(_sha(b"version two")) is None
    with pytest.raises(ValueError):
        ledger.find_content("not-a-sha")


def test_failures_are_counted_per_run_then_dead_lettered(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path), Storage(), CONV)
    bad = _info("s3://bucket/in/bad.pdf")
    assert ledger.mark_failed(bad, "corrupt", "xref broken", "run-1") == 1
    assert ledger.mark_failed(bad, "corrupt", "xref broken again", "run-1") == 1  # same run: once
    assert ledger.snapshot().status(bad) == ("failed", 1)
    assert ledger.mark_failed(bad, "corrupt", "still broken", "run-2") == 2
    assert ledger.mark_failed(bad, "corrupt", "x" * 10_000, "run-3") == 3
    snapshot = ledger.snapshot()
    assert snapshot.status(bad) == ("failed", 3) and snapshot.failures(bad) == 3
    assert snapshot.is_dead_letter(bad, max_attempts=3) and not snapshot.is_dead_letter(bad, max_attempts=4)
    assert snapshot.failed_count == 1
    last = ledger.last_failure(bad)
    assert last is not None and last.error_class == "corrupt" and last.run_id in {"run-1", "run-2", "run-3"}
    assert len(last.error) <= 2000
    # A fixed upload (new ETag) starts over; a later success wins over the old failures.
    assert snapshot.status(replace(bad, etag="fixed")) == "new"
    ledger.mark_done(bad, "cd" * 32, {"dolma": "x"}, "run-4")
    assert ledger.snapshot().status(bad) == "done"
    assert not ledger.snapshot().is_dead_letter(bad, max_attempts=1)


def test_concurrent_runs_do_not_lose_failure_counts(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path), Storage(), CONV)
    bad = _info("/data/bad.pdf", etag=None)
    barrier = threading.Barrier(6)

    def fail(run: int) -> None:
        barrier.wait()
        ledger.mark_failed(bad, "corrupt", "boom", f"run-{run}")

    threads = [threading.Thread(target=fail, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert ledger.snapshot().status(bad) == ("failed", 6)


def test_state_files_are_json_and_keys_encode_status(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path), Storage(), CONV, description={"model": "m", "prompt_version": "p"})
    info = _info("s3://bucket/in/ünï.pdf")
    ledger.mark_failed(info, "not_pdf", "nope", "manual__2024-01-01T00:00:00+00:00")
    ledger.mark_done(info, "ef" * 32, {"dolma": "s3://o/d.jsonl"}, "run-2")
    state = tmp_path / "_state" / CONV
    folder = state / "sources" / source_id(info.uri)
    names = sorted(p.name for p in folder.iterdir())
    assert names[0] == f"{fingerprint(info)}.done" and names[1].startswith(f"{fingerprint(info)}.failed.")
    done = json.loads((folder / names[0]).read_text())
    assert done["source"] == info.uri and done["sha256"] == "ef" * 32 and done["run_id"] == "run-2"
    assert json.loads((state / "conversion.json").read_text())["model"] == "m"
    assert json.loads((state / "content" / f"{'ef' * 32}.json").read_text())["source"] == info.uri
    # Unknown files in the state folder are ignored, not misread.
    (folder / "notes.txt").write_text("hello")
    assert ledger.snapshot().status(info) == "done"


def test_snapshot_of_5000_local_objects(tmp_path: Path) -> None:
    storage = Storage()
    ledger = Ledger(str(tmp_path), storage, CONV)
    infos = [_info(f"s3://bucket/in/{n:05d}.pdf", etag=f"e{n}") for n in range(5000)]
    # Bulk-create the markers the way mark_done/mark_failed name them (fsync per file would dominate).
    for n, info in enumerate(infos):
        suffix = "done" if n % 10 else "failed.000000000001"
        path = tmp_path / "_state" / CONV / "sources" / source_id(info.uri) / f"{fingerprint(info)}.{suffix}"
        path.parent.mkdir(parents=True)
        path.write_text("{}")
    snapshot = ledger.snapshot()
    assert len(snapshot) == 5000 and snapshot.done_count == 4500 and snapshot.failed_count == 500
    assert snapshot.status(infos[1]) == "done" and snapshot.status(infos[0]) == ("failed", 1)
    assert snapshot.status(_info("s3://bucket/in/other.pdf")) == "new"


def test_snapshot_on_s3_is_one_listing_without_object_reads(
    s3_bucket: str, s3_fault_proxy: FaultProxy, s3_put_many: Any
) -> None:
    out = f"s3://{s3_bucket}/out"
    infos = [_info(f"s3://bucket/in/{n:05d}.pdf", etag=f"e{n}") for n in range(2100)]
    prefix = f"out/_state/{CONV}/sources"
    objects = {f"{prefix}/{source_id(i.uri)}/{fingerprint(i)}.done": b"{}" for i in infos[:2000]}
    for info in infos[2000:]:
        for run in ("000000000001", "000000000002"):
            objects[f"{prefix}/{source_id(info.uri)}/{fingerprint(info)}.failed.{run}"] = b"{}"
    s3_put_many(s3_bucket, objects)
    storage = Storage(s3_fault_proxy.storage_options, retry=RetryPolicy(initial_backoff_s=0.01))
    snapshot = Ledger(out, storage, CONV).snapshot()
    assert snapshot.done_count == 2000 and snapshot.failed_count == 100
    assert snapshot.status(infos[2050]) == ("failed", 2)
    assert snapshot.status(infos[5]) == "done"
    assert s3_fault_proxy.count("GET", r"list-type=2") == 3  # 2,200 keys: three pages of one listing
    assert s3_fault_proxy.count() == 3  # and nothing else: no per-object GET or HEAD


def test_ledger_round_trip_on_s3(s3_bucket: str, s3_storage_options: dict[str, Any]) -> None:
    out = f"s3://{s3_bucket}/out"
    ledger = Ledger(out, Storage(s3_storage_options), CONV)
    a = _info("s3://bucket/in/a.pdf")
    outputs = _convert(ledger, a, b"pdf bytes", out, "run-1")
    assert ledger.snapshot().status(a) == "done"
    assert ledger.find_content(_sha(b"pdf bytes")).outputs == outputs
    b = _info("s3://bucket/in/b.pdf")
    assert ledger.mark_failed(b, "encrypted", "password", "run-1") == 1
    assert ledger.mark_failed(b, "encrypted", "password", "run-2") == 2
    assert ledger.snapshot().status(b) == ("failed", 2)


def test_failed_sources_are_the_versions_whose_last_outcome_was_a_failure(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path / "out"), Storage(), CONV)
    once, twice, fixed = _info("s3://b/in/once.pdf"), _info("s3://b/in/twice.pdf"), _info("s3://b/in/fixed.pdf")
    ledger.mark_failed(once, "corrupt", "truncated", "run-1")
    for run_id in ("run-1", "run-2"):
        ledger.mark_failed(twice, "not_converted", "its batch did not finish", run_id)
    ledger.mark_failed(fixed, "corrupt", "truncated", "run-1")
    _convert(ledger, fixed, b"%PDF fixed", str(tmp_path / "out"), "run-2")
    snapshot = ledger.snapshot()
    # Recorded as listed when they failed (a re-drive compares them with the object as it is now).
    assert sorted(ledger.failed_sources(snapshot), key=lambda info: info.uri) == [once, twice]
    assert ledger.failed_sources(snapshot, lambda runs: runs >= 2) == [twice]
    assert ledger.failed_sources(snapshot, known=["s3://b/in/once.pdf"]) == [twice]
