"""Behaviour of the PDFium render pool on real generated PDFs: sizes, rotation, markers, text, typed
errors for every bad input, worker replacement after hangs and crashes, memory and concurrency."""

from __future__ import annotations

import asyncio
import base64
import io
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import psutil
import pytest
from PIL import Image, ImageChops

from olmocr_tasks.core.config import DocumentLimits
from olmocr_tasks.core.errors import (
    CorruptPdfError,
    DocumentError,
    EmptyDocumentError,
    EncryptedPdfError,
    TooLargeError,
    UnsupportedFormatError,
)
from olmocr_tasks.core.formats import check_format, read_head
from olmocr_tasks.page.render_pool import RenderError, RenderPool, default_render_workers
from olmocr_tasks.page.render_worker import PdfInfo, open_document_sync, render_page_png_sync, target_size
from olmocr_testkit import pdfgen
from olmocr_testkit.page_marker import Marker, read_marker
from tests.fixtures.render_hooks import HookedRenderPool

T = TypeVar("T")
LETTER_LANDSCAPE = (792.0, 612.0)
A4 = (595.28, 841.89)


def run(pool: RenderPool, body: Callable[[RenderPool], Awaitable[T]]) -> T:
    async def main() -> T:
        return await body(pool)

    return asyncio.run(main())


def decode(b64: bytes) -> Image.Image:
    # validate=True rejects anything outside the standard alphabet, including newlines.
    image = Image.open(io.BytesIO(base64.b64decode(b64, validate=True)))
    assert image.format == "PNG"
    return image


def write(tmp_path: Path, name: str, data: bytes) -> str:
    return str(pdfgen.write_pdf(tmp_path / name, data))


def marker(image: Image.Image) -> Marker | None:
    return read_marker(image)


# -- sizes -------------------------------------------------------------------------------------------


def test_target_size_rounds_to_the_exact_longest_side() -> None:
    assert target_size(612, 792, 1288, 10**9) == (995, 1288)
    assert target_size(792, 612, 1288, 10**9) == (1288, 995)
    assert target_size(14400, 14400, 1288, 10**9) == (1288, 1288)
    # An absurd strip keeps its longest side and at least one pixel across.
    assert target_size(14400, 1, 1288, 10**9) == (1288, 1)
    # Over the pixel budget the whole render shrinks, keeping the aspect ratio.
    width, height = target_size(612, 792, 1288, 500_000)
    assert width * height <= 500_000 and abs(width / height - 612 / 792) < 0.01
    with pytest.raises(ValueError):
        target_size(0, 792, 1288, 10**9)


@pytest.mark.parametrize(("cores", "workers"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 4), (64, 4)])
def test_default_render_workers_leaves_a_core_for_the_loop_above_two_at_most_four(
    monkeypatch: pytest.MonkeyPatch, cores: int, workers: int
) -> None:
    # The cores this process may run on (a container's CPU set), not the machine's.
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cores)), raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 128)
    assert default_render_workers() == workers


def test_default_render_workers_falls_back_to_the_cpu_count(monkeypatch: pytest.MonkeyPatch) -> None:
    def unsupported(_pid: int) -> set[int]:
        raise OSError("sched_getaffinity unsupported")

    monkeypatch.setattr(os, "sched_getaffinity", unsupported, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert default_render_workers() == 2
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert default_render_workers() == 1


@pytest.mark.parametrize(
    ("name", "data", "size", "correction"),
    [
        ("portrait", pdfgen.text_pdf(1, 1), (995, 1288), 0),
        ("landscape", pdfgen.text_pdf(1, 1, page_size=LETTER_LANDSCAPE), (1288, 995), 0),
        ("a4", pdfgen.text_pdf(1, 1, page_size=A4), (911, 1288), 0),
        # /Rotate is applied as a viewer shows the page: turned, as the model must correct it.
        ("rotate90", pdfgen.rotated_pdf(90, 1, 1), (1288, 995), 90),
        ("rotate180", pdfgen.rotated_pdf(180, 1, 1), (995, 1288), 180),
        ("huge", pdfgen.huge_page_pdf(1), (1288, 1288), 0),
        ("image_only", pdfgen.image_only_pdf(1, 1), (995, 1288), 0),
    ],
)
def test_longest_side_is_the_target(
    render_pool: RenderPool, tmp_path: Path, name: str, data: bytes, size: tuple[int, int], correction: int
) -> None:
    path = write(tmp_path, f"{name}.pdf", data)
    image = decode(run(render_pool, lambda pool: pool.render_page(path, 0)))
    assert image.size == size
    assert image.mode == "RGB"
    # The render shows the document's own first page, turned as its /Rotate says.
    assert marker(image) == Marker(doc_id=1, page_number=1, rotation_correction=correction)


def test_other_targets_and_pixel_cap(render_pool: RenderPool, tmp_path: Path) -> None:
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf(1, 1))
    image = decode(run(render_pool, lambda pool: pool.render_page(path, 0, target_longest_image_dim=640)))
    assert image.size == (495, 640)
    # The pixel budget wins over the target for oversized requests.
    pdf = open_document_sync(path)
    try:
        png = render_page_png_sync(pdf, 0, 4000, 1, max_render_pixels=1_000_000)
    finally:
        pdf.close()
    width, height = Image.open(io.BytesIO(png)).size
    assert width * height <= 1_000_000 and height > 1000


# -- rotation and markers ----------------------------------------------------------------------------


@pytest.mark.parametrize("rotate", [0, 90, 180, 270])
def test_page_rotate_shows_as_the_rotation_a_model_would_correct(
    render_pool: RenderPool, tmp_path: Path, rotate: int
) -> None:
    path = write(tmp_path, "rotated.pdf", pdfgen.rotated_pdf(rotate, pages=2, doc_id=9))

    async def body(pool: RenderPool) -> list[Image.Image]:
        return [decode(await pool.render_page(path, 1)), decode(await pool.render_page(path, 1, rotation=rotate))]

    as_displayed, corrected = run(render_pool, body)
    # PDFium honours /Rotate, so the sideways page reaches the model sideways...
    assert marker(as_displayed) == Marker(doc_id=9, page_number=2, rotation_correction=rotate)
    # ...and rendering with the model's rotation_correction makes it upright.
    assert marker(corrected) == Marker(doc_id=9, page_number=2, rotation_correction=0)


@pytest.mark.parametrize("rotation", [90, 180, 270])
def test_rotation_equals_pil_transpose_of_the_upright_render(
    render_pool: RenderPool, tmp_path: Path, rotation: int
) -> None:
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf(1, 3))

    async def body(pool: RenderPool) -> tuple[Image.Image, Image.Image]:
        return decode(await pool.render_page(path, 0)), decode(await pool.render_page(path, 0, rotation=rotation))

    upright, rotated = run(render_pool, body)
    expected = upright.convert("RGB").transpose(getattr(Image.Transpose, f"ROTATE_{rotation}"))
    assert rotated.size == expected.size
    assert ImageChops.difference(expected, rotated.convert("RGB")).getbbox() is None


def test_invalid_rotation_is_rejected(render_pool: RenderPool, tmp_path: Path) -> None:
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf(1, 1))
    with pytest.raises(ValueError, match="rotation"):
        run(render_pool, lambda pool: pool.render_page(path, 0, rotation=45))


# -- good documents ------------------------------------------------------------------------------------


def test_inspect_describes_the_document(render_pool: RenderPool, tmp_path: Path) -> None:
    data = pdfgen.text_pdf(5, 1)
    path = write(tmp_path, "doc.pdf", data)
    info = run(render_pool, lambda pool: pool.inspect(path))
    assert (info.page_count, info.size_bytes, info.is_encrypted_owner_only) == (5, len(data), False)
    assert info.pdf_version is not None and 10 <= info.pdf_version <= 20


def test_owner_password_only_pdf_converts(render_pool: RenderPool, tmp_path: Path) -> None:
    path = write(tmp_path, "owner.pdf", pdfgen.owner_only_encrypted_pdf(pages=2, doc_id=4))

    async def body(pool: RenderPool) -> tuple[PdfInfo, Image.Image, str]:
        return await pool.inspect(path), decode(await pool.render_page(path, 1)), await pool.page_text(path, 1)

    info, image, text = run(render_pool, body)
    assert info.page_count == 2 and info.is_encrypted_owner_only
    assert marker(image) == Marker(doc_id=4, page_number=2, rotation_correction=0)
    assert pdfgen.page_line(4, 2) in text


def test_page_text_returns_the_text_layer(render_pool: RenderPool, tmp_path: Path) -> None:
    sentences = ["Zürich naïve café: 42 ≥ 41.", "Second sentence here."]
    text_path = write(tmp_path, "text.pdf", pdfgen.text_pdf(2, 6, sentences=sentences))
    image_path = write(tmp_path, "image.pdf", pdfgen.image_only_pdf(1, 7))

    async def body(pool: RenderPool) -> list[str]:
        return [
            await pool.page_text(text_path, 0),
            await pool.page_text(text_path, 1),
            await pool.page_text(image_path, 0),
        ]

    first, second, image_text = run(render_pool, body)
    assert first.strip() == "Document 6 page 1: Zürich naïve café: 42 ≥ 41."
    assert second.strip() == "Document 6 page 2: Second sentence here."
    assert "\r" not in first
    assert image_text.strip() == ""


def test_repairable_xref_damage_still_converts(render_pool: RenderPool, tmp_path: Path) -> None:
    path = write(tmp_path, "bad_xref.pdf", pdfgen.malformed_objects_pdf("bad_xref", doc_id=8))

    async def body(pool: RenderPool) -> tuple[PdfInfo, Image.Image]:
        return await pool.inspect(path), decode(await pool.render_page(path, 1))

    info, image = run(render_pool, body)
    assert info.page_count == 2
    assert marker(image) == Marker(doc_id=8, page_number=2, rotation_correction=0)


def test_page_index_out_of_range_fails_the_call_not_the_pool(render_pool: RenderPool, tmp_path: Path) -> None:
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf(2, 1))
    with pytest.raises(RenderError, match="out of range") as caught:
        run(render_pool, lambda pool: pool.render_page(path, 2))
    assert caught.value.reason == "failed"
    # The pool still renders, and the right page: the last one of the document.
    assert marker(decode(run(render_pool, lambda pool: pool.render_page(path, 1)))) == Marker(
        doc_id=1, page_number=2, rotation_correction=0
    )


# -- bad documents -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "data", "error", "message"),
    [
        ("empty.pdf", pdfgen.empty_file(), EmptyDocumentError, "empty"),
        ("zero_pages.pdf", pdfgen.zero_page_pdf(), EmptyDocumentError, "no pages"),
        # The worker goes by content (it is handed temporary paths): text is no format it converts. A
        # PNG is an image document now (tests/page/test_image_pages.py); names are judged before
        # rendering (core.formats.check_format).
        ("text.txt", b"hello, world\n" * 200, UnsupportedFormatError, "not a format this converts"),
        ("encrypted.pdf", pdfgen.encrypted_pdf(), EncryptedPdfError, "password"),
        ("truncated.pdf", pdfgen.truncated_pdf(), CorruptPdfError, "damaged"),
        ("page_tree.pdf", pdfgen.malformed_objects_pdf("broken_page_tree"), CorruptPdfError, "damaged"),
    ],
)
def test_bad_inputs_raise_typed_errors(
    render_pool: RenderPool, tmp_path: Path, name: str, data: bytes, error: type[DocumentError], message: str
) -> None:
    path = write(tmp_path, name, data)
    with pytest.raises(error, match=message) as caught:
        run(render_pool, lambda pool: pool.inspect(path))
    assert len(str(caught.value)) < 100
    assert str(tmp_path) not in str(caught.value)
    # Rendering an unusable document fails the same way (the worker opens it the same way).
    with pytest.raises(error):
        run(render_pool, lambda pool: pool.render_page(path, 0))


def test_missing_file_is_unreadable(render_pool: RenderPool, tmp_path: Path) -> None:
    with pytest.raises(DocumentError) as caught:
        run(render_pool, lambda pool: pool.inspect(str(tmp_path / "gone.pdf")))
    assert caught.value.error_class == "unreadable"


def test_mixed_corpus_outcomes(
    render_pool: RenderPool, pdf_dir: Path, pdf_corpus: dict[str, pdfgen.CorpusEntry]
) -> None:
    async def outcome(pool: RenderPool, name: str) -> str | None:
        try:
            # As the conversion does: the name and the content are compared before the worker opens it
            # (a PNG named .pdf is a PNG to the worker).
            check_format(read_head(str(pdf_dir / name)), name)
            await pool.inspect(str(pdf_dir / name))
        except DocumentError as exc:
            return exc.error_class
        return None

    async def body(pool: RenderPool) -> dict[str, str | None]:
        names = sorted(pdf_corpus)
        results = await asyncio.gather(*(outcome(pool, name) for name in names))
        return dict(zip(names, results, strict=True))

    assert run(render_pool, body) == {name: entry.error_class for name, entry in pdf_corpus.items()}


def test_size_and_page_limits(tmp_path: Path) -> None:
    small = write(tmp_path, "small.pdf", pdfgen.text_pdf(3, 1))
    big = write(tmp_path, "big.pdf", pdfgen.image_only_pdf(2, 1))
    limits = DocumentLimits(max_bytes=os.path.getsize(big) - 1, max_pages=2)

    async def body() -> None:
        async with RenderPool(workers=1, limits=limits) as pool:
            with pytest.raises(TooLargeError, match="pages"):
                await pool.inspect(small)
            with pytest.raises(TooLargeError, match="bytes"):
                await pool.inspect(big)

    asyncio.run(body())


# -- worker failures -------------------------------------------------------------------------------------


@pytest.fixture
def hook_pool() -> HookedRenderPool:
    """One worker that accepts the test-only request kinds, with a short time limit."""
    return HookedRenderPool(workers=1, limits=DocumentLimits(render_timeout_s=2.0))


def _gone(pid: int) -> bool:
    # Reaped, not a zombie.
    return not psutil.pid_exists(pid)


async def _until_started(started: Path) -> None:
    deadline = time.monotonic() + 30  # a hang guard: a worker takes the call within milliseconds
    while not started.exists():
        assert time.monotonic() < deadline, "the worker never started the call"
        await asyncio.sleep(0.01)


def test_hanging_worker_is_killed_and_replaced(hook_pool: HookedRenderPool, tmp_path: Path) -> None:
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf(1, 2))

    async def body() -> None:
        async with hook_pool as pool:
            [old_pid] = pool.worker_pids()
            # No stopwatch needed: a 60 s sleep that ran its course would return, not raise "timeout".
            with pytest.raises(RenderError) as caught:
                await pool.sleep(60)
            assert caught.value.reason == "timeout"
            assert marker(decode(await pool.render_page(path, 0))) == Marker(2, 1, 0)
            [new_pid] = pool.worker_pids()
            assert new_pid != old_pid and _gone(old_pid)
            assert pool.replacements == 1

    asyncio.run(body())


def test_crashing_worker_is_replaced(hook_pool: HookedRenderPool, tmp_path: Path) -> None:
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf(1, 2))

    async def body() -> None:
        async with hook_pool as pool:
            with pytest.raises(RenderError, match="SIGSEGV") as caught:
                await pool.crash()
            assert caught.value.reason == "crashed"
            # Killed from outside while busy (what the OOM killer does).
            pid = await pool.pid()
            started = tmp_path / "started"
            sleeper = asyncio.ensure_future(pool.sleep(60, started))
            await _until_started(started)
            os.kill(pid, 9)
            with pytest.raises(RenderError, match="SIGKILL") as caught:
                await asyncio.wait_for(sleeper, 30)  # a hang guard, well under the 60 s the sleep would take
            assert caught.value.reason == "crashed"
            assert marker(decode(await pool.render_page(path, 0))) == Marker(2, 1, 0)
            assert pool.replacements == 2

    asyncio.run(body())


def test_cancelled_caller_leaves_the_pool_usable(hook_pool: HookedRenderPool, tmp_path: Path) -> None:
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf(1, 2))

    async def body() -> None:
        async with hook_pool as pool:
            # Cancelled while the worker is inside the call, not before it got there.
            started = tmp_path / "started"
            call = asyncio.ensure_future(pool.sleep(0.5, started))
            await _until_started(started)
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            assert marker(decode(await pool.render_page(path, 0))) == Marker(2, 1, 0)
            assert pool.replacements == 0

    asyncio.run(body())


def test_close_does_not_wait_for_a_busy_worker(hook_pool: HookedRenderPool, tmp_path: Path) -> None:
    async def body() -> None:
        await asyncio.to_thread(hook_pool.start)
        started = tmp_path / "started"
        sleeper = asyncio.ensure_future(hook_pool.sleep(60, started, timeout=120))
        queued = asyncio.ensure_future(hook_pool.sleep(60, timeout=120))
        await _until_started(started)
        pids = hook_pool.worker_pids()
        await hook_pool.close()
        # Event order instead of a stopwatch: when close() returns, the worker is already gone and
        # the running 60 s call ended as "closed"; a close that waited would have let it return.
        assert all(_gone(pid) for pid in pids)
        assert sleeper.done()
        for call in (sleeper, queued):
            with pytest.raises(RenderError, match="closed"):
                await call

    asyncio.run(body())


def test_production_workers_know_no_test_hook(render_pool: RenderPool) -> None:
    with pytest.raises(RenderError, match="unknown request kind") as caught:
        run(render_pool, lambda pool: pool._call("crash", (), "crashing"))
    assert caught.value.reason == "failed"


def test_close_stops_workers_and_is_idempotent(tmp_path: Path) -> None:
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf(1, 1))

    async def body() -> list[int]:
        pool = RenderPool(workers=2)
        async with pool:
            await pool.render_page(path, 0)
            pids = pool.worker_pids()
        await pool.close()
        with pytest.raises(RenderError, match="closed"):
            await pool.render_page(path, 0)
        return pids

    pids = asyncio.run(body())
    assert len(pids) == 2 and all(_gone(pid) for pid in pids)


def test_niced_workers_render_at_a_lower_priority_than_their_parent(tmp_path: Path) -> None:
    """A low-priority run's render workers yield the CPU; the converting process keeps its own niceness."""
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf(1, 1))
    own = os.getpriority(os.PRIO_PROCESS, 0)

    async def body() -> tuple[list[int], list[int]]:
        niced, plain = RenderPool(workers=1, nice=7), RenderPool(workers=1)
        async with niced, plain:
            await niced.render_page(path, 0)
            await plain.render_page(path, 0)
            return (
                [os.getpriority(os.PRIO_PROCESS, pid) for pid in niced.worker_pids()],
                [os.getpriority(os.PRIO_PROCESS, pid) for pid in plain.worker_pids()],
            )

    niced, plain = asyncio.run(body())
    assert niced == [min(own + 7, 19)] and plain == [own]
    assert os.getpriority(os.PRIO_PROCESS, 0) == own
    with pytest.raises(ValueError, match="nice"):
        RenderPool(workers=1, nice=-1)


# -- documents, memory, concurrency ----------------------------------------------------------------------


def _open_by_workers(pool: RenderPool, path: str) -> bool:
    return any(opened.path == path for pid in pool.worker_pids() for opened in psutil.Process(pid).open_files())


def test_release_closes_the_document_in_every_worker(render_pool: RenderPool, tmp_path: Path) -> None:
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf(4, 1))

    async def render_all(pool: RenderPool) -> None:
        await asyncio.gather(*(pool.render_page(path, index) for index in range(4)))

    run(render_pool, render_all)
    assert _open_by_workers(render_pool, path)
    run(render_pool, lambda pool: pool.release(path))
    deadline = time.monotonic() + 30  # a hang guard: workers drop the document within milliseconds
    while _open_by_workers(render_pool, path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _open_by_workers(render_pool, path)


def test_replaced_file_under_the_same_path_is_reopened(render_pool: RenderPool, tmp_path: Path) -> None:
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf(1, 1))
    assert marker(decode(run(render_pool, lambda pool: pool.render_page(path, 0)))) == Marker(1, 1, 0)
    tmp = write(tmp_path, "next.pdf", pdfgen.text_pdf(1, 2))
    os.replace(tmp, path)
    assert marker(decode(run(render_pool, lambda pool: pool.render_page(path, 0)))) == Marker(2, 1, 0)


def test_concurrent_renders_each_get_their_own_page(render_pool: RenderPool, tmp_path: Path) -> None:
    docs = {doc_id: write(tmp_path, f"doc{doc_id}.pdf", pdfgen.text_pdf(12, doc_id)) for doc_id in (11, 12, 13)}
    wanted = [(doc_id, page) for page in range(12) for doc_id in docs]

    async def body(pool: RenderPool) -> list[bytes]:
        return await asyncio.gather(*(pool.render_page(docs[doc_id], page) for doc_id, page in wanted))

    results = run(render_pool, body)
    assert [marker(decode(b64)) for b64 in results] == [Marker(doc_id, page + 1, 0) for doc_id, page in wanted]


@pytest.mark.slow
def test_parent_memory_stays_flat_over_200_pages(render_pool: RenderPool, tmp_path: Path) -> None:
    path = write(tmp_path, "long.pdf", pdfgen.many_pages_pdf(200, doc_id=20))
    me = psutil.Process()

    async def body(pool: RenderPool) -> tuple[int, int]:
        async def one(index: int) -> None:
            b64 = await pool.render_page(path, index)
            assert len(b64) > 1000

        for index in range(20):
            await one(index)
        before = me.memory_info().rss
        for start in range(20, 200, 10):
            await asyncio.gather(*(one(index) for index in range(start, start + 10)))
        return before, me.memory_info().rss

    before, after = run(render_pool, body)
    assert after - before < 25 * 1024 * 1024, f"parent RSS grew by {(after - before) / 2**20:.1f} MiB"
    for pid in render_pool.worker_pids():
        assert psutil.Process(pid).memory_info().rss < 400 * 1024 * 1024


_ORPHAN_SCRIPT = """
import asyncio, sys
from tests.fixtures.render_hooks import HookedRenderPool

async def main():
    async with HookedRenderPool() as pool:
        print(pool.worker_pids()[0], flush=True)
        await pool.sleep(120, sys.argv[1])

asyncio.run(main())
"""


def test_worker_stuck_in_a_call_dies_with_its_parent(tmp_path: Path) -> None:
    # A scheduler SIGKILLing the task process must not leave a worker stuck inside PDFium behind.
    root = str(Path(__file__).resolve().parents[2])
    started = tmp_path / "started"
    parent = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_SCRIPT, str(started)], stdout=subprocess.PIPE, cwd=root, text=True
    )
    try:
        assert parent.stdout is not None
        worker_pid = int(parent.stdout.readline())
        asyncio.run(_until_started(started))  # the worker is inside the call: stuck, as in PDFium
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 30  # a hang guard: the kernel kills the orphan at once
        while psutil.pid_exists(worker_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not psutil.pid_exists(worker_pid)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


# -- the pool's work -----------------------------------------------------------------------------------


def test_pool_pages_are_the_bare_render_loops_bytes(render_pool: RenderPool, tmp_path: Path) -> None:
    # How much CPU the pool adds (pipe transfer, base64, scheduling) is measured by
    # ``python -m bench.pool_overhead``: CPU time on a shared 2-core machine is too noisy for a unit
    # test. What a test can pin down is that the pool does exactly the bare loop's work, so only
    # transport can differ: the same PNG bytes (same size, same compression level) for every page.
    path = write(tmp_path, "dense.pdf", pdfgen.text_pdf(3, 1, body_lines=60))
    pdf = open_document_sync(path)
    try:
        expected = [render_page_png_sync(pdf, index, 1288, render_pool.png_compress_level) for index in range(3)]
    finally:
        pdf.close()

    async def render_all(pool: RenderPool) -> list[bytes]:
        return [base64.b64decode(await pool.render_page(path, index), validate=True) for index in range(3)]

    assert run(render_pool, render_all) == expected
