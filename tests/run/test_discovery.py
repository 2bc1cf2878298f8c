"""Discovery of PDFs and page images over real local folders and a moto S3 bucket."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from olmocr_tasks.core.errors import ConfigurationError
from olmocr_tasks.core.formats import is_document_name, parse_formats
from olmocr_tasks.run.discovery import MissingSource, in_interval, iter_documents, resolve_explicit
from olmocr_tasks.storage.store import ObjectInfo, RetryPolicy, Storage
from tests.fixtures.s3 import FaultProxy

NAMES = ["a.pdf", "B.PDF", "sub/c.Pdf", "sub/deeper/d.pdf", "sub/notes.txt", "sub/pdf", "e.pdf.bak", "x/.pdf"]
PDFS = ["B.PDF", "a.pdf", "sub/c.Pdf", "sub/deeper/d.pdf"]


def _uris(infos: list[ObjectInfo], base: str) -> list[str]:
    return sorted(info.uri[len(base) + 1 :] for info in infos)


IMAGES = ["scans/p1.TIF", "scans/p2.tiff", "scans/photo.JPG", "scans/photo2.jpeg", "scans/page.Png", "scans/w.webp"]
NOT_DOCUMENTS = ["scans/anim.gif", "scans/page.bmp", "scans/x.tif.part", "scans/.tiff", "scans/tif"]


def test_document_names_in_any_letter_case() -> None:
    assert is_document_name("s3://b/x.pdf") and is_document_name("/a/X.PDF") and is_document_name("y.pDf")
    assert not is_document_name("s3://b/x.pdf/") and not is_document_name("/a/.pdf")
    assert not is_document_name("a.pdfx") and not is_document_name("/a.pdf/readme")
    for name in IMAGES:
        assert is_document_name(name), name
    for name in NOT_DOCUMENTS:
        assert not is_document_name(name), name
    # --formats restricts by the format, whatever the spelling of the extension.
    tiff_only = parse_formats("tif")
    assert is_document_name("a.TIFF", tiff_only) and is_document_name("a.tif", tiff_only)
    assert not is_document_name("a.pdf", tiff_only) and not is_document_name("a.jpg", tiff_only)
    assert parse_formats("PDF, jpg") == {"pdf", "jpeg"} and parse_formats(None) == parse_formats("")
    with pytest.raises(ConfigurationError, match="unknown format 'gif'"):
        parse_formats("pdf,gif")


def test_local_discovery_lists_images_beside_pdfs_and_formats_restrict_it(tmp_path: Path) -> None:
    for name in NAMES + IMAGES + NOT_DOCUMENTS:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    storage = Storage()
    assert _uris(list(iter_documents(str(tmp_path), storage)), str(tmp_path)) == sorted(PDFS + IMAGES)
    only = _uris(list(iter_documents(str(tmp_path), storage, formats=parse_formats("tiff,png"))), str(tmp_path))
    assert only == ["scans/p1.TIF", "scans/p2.tiff", "scans/page.Png"]
    [single] = iter_documents(str(tmp_path / "scans/p1.TIF"), storage)
    assert single.uri == str(tmp_path / "scans/p1.TIF")
    # A single file of a format the run leaves out is not listed either.
    assert list(iter_documents(str(tmp_path / "scans/p1.TIF"), storage, formats={"pdf"})) == []


def test_interval_is_half_open() -> None:
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    t1, t2 = t0 + timedelta(hours=1), t0 + timedelta(hours=2)
    assert not in_interval(t0, t0, t1) and in_interval(t1, t0, t1)
    assert in_interval(t1, None, None) and in_interval(t0, None, t1) and not in_interval(t2, None, t1)
    # Consecutive windows take every timestamp exactly once.
    for stamp in (t0, t1, t2, t1 + timedelta(microseconds=1)):
        assert in_interval(stamp, None, t1) + in_interval(stamp, t1, None) == 1


def test_local_discovery_nested_mixed_case(tmp_path: Path) -> None:
    for name in NAMES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"%PDF")
    storage = Storage()
    assert _uris(list(iter_documents(str(tmp_path), storage)), str(tmp_path)) == PDFS
    assert _uris(list(iter_documents(f"{tmp_path}/", storage)), str(tmp_path)) == PDFS
    # A single file works, and so does a file:// URI.
    [single] = iter_documents(str(tmp_path / "sub/c.Pdf"), storage)
    assert single.uri == str(tmp_path / "sub/c.Pdf") and single.size == 4
    [via_uri] = iter_documents(f"file://{tmp_path}/sub/deeper", storage)
    assert via_uri.uri == f"file://{tmp_path}/sub/deeper/d.pdf"
    assert list(iter_documents(str(tmp_path / "missing.pdf"), storage)) == []
    assert list(iter_documents(str(tmp_path / "missing"), storage)) == []


def test_local_discovery_interval(tmp_path: Path) -> None:
    base = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    for index, name in enumerate(["old.pdf", "edge.pdf", "new.pdf"]):
        path = tmp_path / name
        path.write_bytes(b"%PDF")
        stamp = (base + timedelta(hours=index)).timestamp()
        os.utime(path, (stamp, stamp))
    storage = Storage()
    edge = base + timedelta(hours=1)

    def names(**window: Any) -> list[str]:
        return _uris(list(iter_documents(str(tmp_path), storage, **window)), str(tmp_path))

    assert names(modified_until=edge) == ["edge.pdf", "old.pdf"]
    assert names(modified_after=edge) == ["new.pdf"]
    assert names(modified_after=base, modified_until=edge) == ["edge.pdf"]
    assert names() == ["edge.pdf", "new.pdf", "old.pdf"]
    with pytest.raises(ConfigurationError):
        list(iter_documents(str(tmp_path), storage, modified_after=datetime(2024, 1, 1)))


def test_s3_discovery_nested_mixed_case(s3_bucket: str, s3_storage_options: dict[str, Any], s3_put_many: Any) -> None:
    storage = Storage(s3_storage_options)
    for name in NAMES:
        storage.write_bytes_atomic(f"s3://{s3_bucket}/in/{name}", b"%PDF")
    s3_put_many(s3_bucket, {"in/sub/folder.pdf/": b""})  # a console-made "folder" marker
    storage.write_bytes_atomic(f"s3://{s3_bucket}/input/not-under-in.pdf", b"%PDF")
    base = f"s3://{s3_bucket}/in"
    found = list(iter_documents(base, storage))
    assert _uris(found, base) == PDFS
    assert [info.uri for info in found] == sorted(info.uri for info in found)  # S3 key order
    assert all(info.etag and info.last_modified.tzinfo for info in found)
    [single] = iter_documents(f"{base}/sub/c.Pdf", storage)
    assert single.uri == f"{base}/sub/c.Pdf" and single.etag == found[2].etag
    assert len(list(iter_documents(f"s3://{s3_bucket}", storage))) == 5


def test_s3_discovery_interval_on_last_modified(s3_bucket: str, s3_storage_options: dict[str, Any]) -> None:
    storage = Storage(s3_storage_options)
    base = f"s3://{s3_bucket}/in"
    storage.write_bytes_atomic(f"{base}/first.pdf", b"1")
    storage.write_bytes_atomic(f"{base}/second.pdf", b"2")
    first_batch = {info.uri: info.last_modified for info in iter_documents(base, storage)}
    watermark = max(first_batch.values())
    time.sleep(1.1)  # S3 LastModified has one-second resolution
    storage.write_bytes_atomic(f"{base}/third.pdf", b"3")
    all_now = {info.uri: info.last_modified for info in iter_documents(base, storage)}
    assert all_now[f"{base}/third.pdf"] > watermark
    # Two consecutive runs with the watermark as boundary take each object exactly once.
    run1 = [info.uri for info in iter_documents(base, storage, modified_until=watermark)]
    run2 = [info.uri for info in iter_documents(base, storage, modified_after=watermark)]
    assert sorted(run1) == sorted(first_batch)
    assert run2 == [f"{base}/third.pdf"]
    later = all_now[f"{base}/third.pdf"]
    assert list(iter_documents(base, storage, modified_after=later)) == []
    assert [i.uri for i in iter_documents(base, storage, modified_after=watermark, modified_until=later)] == run2


def test_resolve_explicit_local(tmp_path: Path) -> None:
    (tmp_path / "a.pdf").write_bytes(b"%PDF")
    (tmp_path / "scan.bin").write_bytes(b"%PDF-1.7")
    uris = [str(tmp_path / "a.pdf"), str(tmp_path / "gone.pdf"), str(tmp_path / "scan.bin"), str(tmp_path / "a.pdf")]
    resolved = resolve_explicit(uris, Storage())
    assert [type(item).__name__ for item in resolved] == ["ObjectInfo", "MissingSource", "ObjectInfo"]
    missing = resolved[1]
    assert isinstance(missing, MissingSource)
    assert missing.uri == str(tmp_path / "gone.pdf") and missing.reason == "not found"
    assert missing.error_class == "unreadable"


def test_resolve_explicit_s3_with_forbidden_object(
    s3_bucket: str, s3_storage_options: dict[str, Any], s3_fault_proxy: FaultProxy
) -> None:
    Storage(s3_storage_options).write_bytes_atomic(f"s3://{s3_bucket}/ok.pdf", b"%PDF")
    Storage(s3_storage_options).write_bytes_atomic(f"s3://{s3_bucket}/secret.pdf", b"%PDF")
    s3_fault_proxy.add_rule(method="HEAD", path="secret.pdf", action="denied")
    storage = Storage(s3_fault_proxy.storage_options, retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.01))
    resolved = resolve_explicit(
        [f"s3://{s3_bucket}/ok.pdf", f"s3://{s3_bucket}/secret.pdf", f"s3://{s3_bucket}/nope.pdf", f"s3://{s3_bucket}"],
        storage,
    )
    assert isinstance(resolved[0], ObjectInfo) and resolved[0].size == 4
    assert [type(item) for item in resolved[1:]] == [MissingSource] * 3
    assert "403" in resolved[1].reason or "denied" in resolved[1].reason.lower()
    assert resolved[2].reason == "not found"
    assert "not an object" in resolved[3].reason
