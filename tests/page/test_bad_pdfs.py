"""Hostile and broken PDFs end to end through the CLI: each ends with its error class or converts, the
process survives, and memory stays bounded whatever the page count.

The mixed corpus of ``olmocr_testkit.pdfgen`` (encrypted, owner-password-only, truncated, empty, zero pages, not a
PDF, broken page tree) is run again here as a separate process with its memory sampled, together with
the inputs that only matter at this level: a repairable xref, an enormous page, a sliver page, a page
that takes far longer to render than allowed, a page whose render needs more memory than a render
worker may have, and documents over the byte and page limits.
"""

from __future__ import annotations

import io
import zlib
from pathlib import Path

import pytest
from pypdf import PdfReader, PdfWriter

from olmocr_testkit import pdfgen
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.cli_process import RssSampler, start_cli
from tests.fixtures.manifests import load_whole
from tests.fixtures.reader_view import assert_reader_view_consistent

FAST = ["--read-timeout", "10", "--outage-window", "10", "--ready-timeout", "5"]
MAX_BYTES = 150_000
MAX_PAGES = 50
MAX_PIXELS = 1_000_000
RENDER_TIMEOUT_S = 2.0
SLOW_PAGES = 4
# A render worker's address space here; the memory bomb needs a gigabyte.
RENDER_MEMORY = 256 * 1024 * 1024
RENDER_WORKERS = 2
# Generous absolute bounds: the converting process holds a few pages at a time, a worker one document.
PARENT_RSS_LIMIT = 400 * 1024 * 1024
WORKER_RSS_LIMIT = 500 * 1024 * 1024


def slow_page_pdf(operations: int = 3000) -> bytes:
    """One page of thousands of large overlapping filled polygons: tiny (Flate) on disk, yet PDFium
    needs about 3 ms per polygon at 1288 px, i.e. ~10 s for the page. A real slow page rather than a
    test hook, so the whole path (engine, pool, kill, replacement, fallback) is the production one."""
    content = b"0.5 0 0 rg 10 10 m 600 20 l 20 780 l 590 770 l h f\n" * operations
    return pdfgen.one_page_pdf(zlib.compress(content, 9))


def with_slow_pages(doc_id: int, slow_pages: int) -> bytes:
    """One ordinary page followed by ``slow_pages`` pages that each take ~10 s to render."""
    writer = PdfWriter()
    writer.append(PdfReader(io.BytesIO(pdfgen.text_pdf(1, doc_id=doc_id))))
    for _ in range(slow_pages):
        writer.append(PdfReader(io.BytesIO(slow_page_pdf())))
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


def padded_pdf(doc_id: int, size: int) -> bytes:
    """A valid PDF grown past ``size`` bytes by a trailing comment (readers ignore it)."""
    data = pdfgen.text_pdf(1, doc_id=doc_id)
    return data + b"%" + b"x" * (size - len(data)) + b"\n"


def extra_inputs() -> dict[str, tuple[bytes, str | None, int | None]]:
    """name -> (bytes, expected error class or None, doc id whose markers its pages carry)."""
    return {
        "repaired_xref.pdf": (pdfgen.malformed_objects_pdf("bad_xref", doc_id=31), None, 31),
        "enormous_page.pdf": (pdfgen.huge_page_pdf(doc_id=32), None, 32),
        # 200 inches by 2 points: renders as a strip a few pixels high; converts, nothing to decode.
        "sliver_page.pdf": (pdfgen.text_pdf(1, doc_id=33, page_size=(14400, 2)), None, None),
        # Its later pages cannot render in time: the first to fall back fails the error-rate guard.
        "slow_render.pdf": (with_slow_pages(34, SLOW_PAGES), "error_rate_exceeded", 34),
        "too_many_pages.pdf": (pdfgen.many_pages_pdf(MAX_PAGES + 10, doc_id=35), "too_many_pages", None),
        "too_many_bytes.pdf": (padded_pdf(36, MAX_BYTES + 1000), "too_large", None),
        # A few KB on disk; its one page decompresses to a gigabyte.
        "memory_bomb.pdf": (pdfgen.memory_bomb_pdf(), "too_large", None),
    }


@pytest.mark.slow
def test_hostile_inputs_end_with_their_error_class_and_the_process_survives(
    tmp_path: Path, standin: StandinServer
) -> None:
    expected: dict[str, str | None] = {}
    doc_ids: dict[str, int] = {}
    for entry in pdfgen.mixed_corpus():
        pdfgen.write_pdf(tmp_path / "in" / entry.name, entry.data)
        expected[entry.name] = entry.error_class
        if entry.doc_id is not None:
            doc_ids[entry.name] = entry.doc_id
    for name, (data, error_class, doc_id) in extra_inputs().items():
        pdfgen.write_pdf(tmp_path / "in" / name, data)
        expected[name] = error_class
        if doc_id is not None:
            doc_ids[name] = doc_id
    out = tmp_path / "out"
    log = tmp_path / "cli.log"
    process = start_cli(
        "convert", str(tmp_path / "in"), str(out), "--server", standin.url, "--run-id", "hostile",
        "--max-document-bytes", str(MAX_BYTES), "--max-document-pages", str(MAX_PAGES),
        "--max-render-pixels", str(MAX_PIXELS), "--render-timeout", str(RENDER_TIMEOUT_S),
        "--render-workers", str(RENDER_WORKERS), "--render-memory-bytes", str(RENDER_MEMORY), *FAST, log=log,
    )  # fmt: skip
    with RssSampler(process.pid) as memory:
        code = process.wait(timeout=180)  # a hang guard only: the run takes well under a minute even on a busy box
    output = log.read_text()
    assert code == 1, output  # documents failed beyond the error budget, and said so: not a crash
    assert "Traceback" not in output and "internal_error" not in output

    manifest = load_whole(str(out / "manifests" / "hostile.json"))
    outcomes = {Path(doc["source"]).name: doc for doc in manifest["documents"]}
    assert set(outcomes) == set(expected)
    for name, error_class in expected.items():
        doc = outcomes[name]
        if error_class is None:
            assert doc["status"] == "converted", (name, doc["error"])
        else:
            assert (doc["status"], doc["error_class"]) == ("failed", error_class), (name, doc["error"])
    slow = outcomes["slow_render.pdf"]
    assert f"1 of {SLOW_PAGES + 1} pages" in slow["error"] and "no result within" in slow["error"], slow["error"]
    # One render time limit, not ~10 s per page and not one time limit per slow page: the document is
    # failed as soon as its first fallback makes the error-rate guard certain to fail, and its queued
    # renders are dropped. Counted, not timed: only the slow pages already rendering when the guard
    # fired (at most one per worker) fell back and had their worker killed and replaced; waiting out
    # every slow page would have made SLOW_PAGES fallbacks and SLOW_PAGES replacements. The memory bomb
    # costs one worker more: its document fails at once, without a second try on its text layer.
    assert slow["fallback_pages"] <= RENDER_WORKERS < SLOW_PAGES, slow
    assert len(memory.child_pids) <= 2 * RENDER_WORKERS + 1 < RENDER_WORKERS + SLOW_PAGES + 1, memory.child_pids
    assert str(MAX_PAGES) in outcomes["too_many_pages.pdf"]["error"]
    assert str(MAX_BYTES) in outcomes["too_many_bytes.pdf"]["error"]
    assert f"{RENDER_MEMORY:,}" in outcomes["memory_bomb.pdf"]["error"]

    sizes = [record["image_size"] for record in standin.requests()]
    assert sizes and all(width * height <= MAX_PIXELS for width, height in sizes)
    huge = [r["image_size"] for r in standin.requests() if (r["marker"] or {}).get("doc_id") == 32]
    assert huge and huge[0][0] * huge[0][1] > 0.95 * MAX_PIXELS  # scaled to the cap, not below it
    view = assert_reader_view_consistent(str(out), doc_ids=doc_ids)
    assert len(view.dolma) == sum(1 for error_class in expected.values() if error_class is None)
    assert memory.parent_peak < PARENT_RSS_LIMIT and memory.child_peak < WORKER_RSS_LIMIT, (
        memory.parent_peak,
        memory.child_peak,
    )


def convert_one(tmp_path: Path, standin: StandinServer, name: str, data: bytes) -> tuple[dict, RssSampler]:
    pdfgen.write_pdf(tmp_path / name / "in" / f"{name}.pdf", data)
    out = tmp_path / name / "out"
    process = start_cli(
        "convert", str(tmp_path / name / "in"), str(out), "--server", standin.url, "--run-id", name,
        "--target-longest-image-dim", "256", *FAST, log=tmp_path / f"{name}.log",
    )  # fmt: skip
    with RssSampler(process.pid) as memory:
        code = process.wait(timeout=300)  # a hang guard only, far above the seconds a conversion takes
    assert code == 0, (tmp_path / f"{name}.log").read_text()
    manifest = load_whole(str(out / "manifests" / f"{name}.json"))
    return manifest, memory


@pytest.mark.slow
def test_two_thousand_pages_convert_in_order_with_flat_memory(tmp_path: Path, standin: StandinServer) -> None:
    # Small renders keep this about pages, memory and ordering rather than about rendering time.
    small, small_memory = convert_one(tmp_path, standin, "small", pdfgen.many_pages_pdf(50, doc_id=41))
    large, large_memory = convert_one(tmp_path, standin, "large", pdfgen.many_pages_pdf(2000, doc_id=42))
    (doc,) = large["documents"]
    assert doc["status"] == "converted" and doc["pages"] == 2000 and doc["fallback_pages"] == 0
    assert small["documents"][0]["pages"] == 50
    view = assert_reader_view_consistent(str(tmp_path / "large" / "out"), doc_ids={"large.pdf": 42})
    (record,) = view.dolma.values()
    assert record["metadata"]["pdf-total-pages"] == 2000
    # Forty times the pages, about the same memory: pages are rendered just in time and not kept.
    allowed = 1.3 * small_memory.parent_peak + 30 * 1024 * 1024
    assert large_memory.parent_peak < allowed, (small_memory.parent_peak, large_memory.parent_peak)
    assert large_memory.child_peak < 1.3 * small_memory.child_peak + 50 * 1024 * 1024
