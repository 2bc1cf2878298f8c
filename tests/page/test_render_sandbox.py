"""Render workers as a sandbox, on real generated PDFs: no credentials in their environment, nothing they
send is unpickled or believed unchecked, a memory bomb fails its document (typed) and the next one
converts, CPU time is limited per request and per worker life, and the page cap is typed."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import psutil
import pytest

from olmocr_tasks.core.config import DocumentLimits
from olmocr_tasks.core.errors import ConfigurationError, TooLargeError, TooManyPagesError
from olmocr_tasks.page.render_pool import RenderError, RenderPool, worker_environment
from olmocr_testkit import pdfgen
from olmocr_testkit.page_marker import Marker
from tests.fixtures.render_hooks import FORGERIES, HookedRenderPool, forging_worker_main
from tests.page.test_rendering import decode, marker, write

SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
# Far below the 2 GiB default, far above the ~100 MiB a worker takes at rest and the ~60 MiB of a page.
SMALL_MEMORY = 256 * 1024 * 1024


def test_workers_start_without_the_parents_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"postgresql://airflow:{SECRET}@db/airflow")
    monkeypatch.setenv("OLMOCR_VLLM_API_KEY", SECRET)
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    path = write(tmp_path, "doc.pdf", pdfgen.text_pdf(1, 7))

    async def body() -> dict[str, str]:
        async with RenderPool(workers=1) as pool:
            # A production worker, proven to work in that environment by rendering a page.
            assert marker(decode(await pool.render_page(path, 0))) == Marker(7, 1, 0)
            (pid,) = pool.worker_pids()
            return psutil.Process(pid).environ()

    environment = asyncio.run(body())
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == SECRET  # the parent has it ...
    assert not any(SECRET in value for value in environment.values()), environment  # ... the worker not
    assert not any(name.startswith(("AWS_", "AIRFLOW_", "OLMOCR_")) for name in environment)
    assert environment["PATH"] == os.environ["PATH"] and environment["LC_ALL"] == "C.UTF-8"
    assert worker_environment({"HOME": "/h", "GOOGLE_APPLICATION_CREDENTIALS": "/k.json"}) == {"HOME": "/h"}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_forged_replies_are_protocol_errors_and_never_unpickled(forgery: str, tmp_path: Path) -> None:
    path = write(tmp_path, f"{forgery}.pdf", pdfgen.text_pdf(1, 1))
    trap = tmp_path / f"{forgery}.unpickled"

    async def body() -> tuple[RenderError, int]:
        async with RenderPool(workers=1, worker_main=forging_worker_main) as pool:
            call = pool.inspect(path) if forgery == "bad_inspect" else pool.render_page(path, 0)
            with pytest.raises(RenderError) as caught:
                await call
            return caught.value, pool.replacements

    error, replacements = asyncio.run(body())
    assert error.reason == "protocol", error
    assert "broke the protocol" in str(error)
    assert replacements == 1  # the forger lost its place
    assert not trap.exists()  # what unpickling the reply would have created


def test_memory_bomb_fails_its_document_as_too_large_and_the_next_converts(tmp_path: Path) -> None:
    bomb = write(tmp_path, "bomb.pdf", pdfgen.memory_bomb_pdf())
    good = write(tmp_path, "good.pdf", pdfgen.text_pdf(2, 9))
    assert os.path.getsize(bomb) < 4096

    async def body() -> tuple[list[Exception], list[Marker | None], int, int]:
        async with RenderPool(workers=1, limits=DocumentLimits(render_memory_bytes=SMALL_MEMORY)) as pool:
            (pid,) = pool.worker_pids()
            # Opening it is cheap (PDFium parses page content only when a page is loaded) ...
            assert (await pool.inspect(bomb)).page_count == 1
            errors: list[Exception] = []
            # ... rendering the page, or reading its text for a fallback, is not.
            for call in (pool.render_page(bomb, 0), pool.page_text(bomb, 0)):
                with pytest.raises(TooLargeError) as caught:
                    await call
                errors.append(caught.value)
            markers = [marker(decode(await pool.render_page(good, index))) for index in range(2)]
            (replacement,) = pool.worker_pids()
            assert replacement != pid
            return errors, markers, pool.replacements, psutil.Process(replacement).rlimit(psutil.RLIMIT_AS)[0]

    errors, markers, replacements, limit = asyncio.run(body())
    for error in errors:
        assert type(error) is TooLargeError and error.error_class == "too_large"
        assert f"{SMALL_MEMORY:,}" in str(error), error
    assert markers == [Marker(9, 1, 0), Marker(9, 2, 0)]
    assert replacements == 2 and limit == SMALL_MEMORY


def test_python_out_of_memory_is_too_large_and_retires_the_worker() -> None:
    pool = HookedRenderPool(workers=1, limits=DocumentLimits(render_memory_bytes=SMALL_MEMORY))

    async def body() -> tuple[int, int, int, int]:
        async with pool:
            before = await pool.pid()
            with pytest.raises(TooLargeError, match="more memory than a render worker may use"):
                await pool.allocate(2 * SMALL_MEMORY)
            small = await pool.allocate(SMALL_MEMORY // 8)
            return before, await pool.pid(), small, pool.retirements

    before, after, small, retirements = asyncio.run(body())
    # Answered, then replaced in good order (not killed): the next request meets a fresh worker.
    assert (retirements, pool.replacements, small) == (1, 0, SMALL_MEMORY // 8)
    assert after != before


def test_a_request_that_outruns_its_cpu_budget_ends_its_worker() -> None:
    # The wall-clock limit is the hang guard here; the CPU limit (render_timeout_s CPU seconds per
    # request) is what ends the spin, whatever the box's load does to wall-clock time.
    pool = HookedRenderPool(workers=1, limits=DocumentLimits(render_timeout_s=1.0))

    async def body() -> RenderError:
        async with pool:
            with pytest.raises(RenderError) as caught:
                await pool.spin(60.0, timeout=600)
            assert await pool.pid() > 0  # replaced and answering
            return caught.value

    error = asyncio.run(body())
    assert error.reason == "timeout" and "CPU time limit" in str(error), error
    assert pool.replacements == 1


def test_a_worker_near_its_lifetime_cpu_limit_is_retired_not_killed() -> None:
    # Lifetime 4 CPU seconds, 2 per request: once a worker has used 2 s, one more request could
    # reach its hard limit mid-page, so the pool replaces it after the answer that says so.
    pool = HookedRenderPool(workers=1, limits=DocumentLimits(render_timeout_s=2.0, render_worker_cpu_s=4.0))

    async def body() -> tuple[int, float, int]:
        async with pool:
            first = await pool.pid()
            used = await pool.spin(2.2)
            return first, used, await pool.pid()

    first, used, second = asyncio.run(body())
    assert used >= 2.2 and second != first
    assert (pool.retirements, pool.replacements) == (1, 0)
    with pytest.raises(ConfigurationError, match="render_worker_cpu_s"):
        DocumentLimits(render_timeout_s=120.0, render_worker_cpu_s=200.0)


def test_page_cap_is_typed_and_checked_before_rendering(tmp_path: Path) -> None:
    at_cap = write(tmp_path, "at_cap.pdf", pdfgen.shared_page_pdf(DocumentLimits.max_pages))
    over_cap = write(tmp_path, "over_cap.pdf", pdfgen.shared_page_pdf(DocumentLimits.max_pages + 1))

    async def body() -> tuple[int, TooManyPagesError]:
        async with RenderPool(workers=1) as pool:
            pages = (await pool.inspect(at_cap)).page_count
            with pytest.raises(TooManyPagesError) as caught:
                await pool.inspect(over_cap)
            return pages, caught.value

    pages, error = asyncio.run(body())
    assert pages == DocumentLimits.max_pages == 2000  # olmOCR-style: a few thousand pages at most
    assert error.error_class == "too_many_pages" and isinstance(error, TooLargeError)
    assert f"{DocumentLimits.max_pages + 1} pages" in str(error)


def test_a_deployment_sets_the_page_cap_and_render_memory_from_its_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from olmocr_tasks.core import environment

    for name in ("OLMOCR_MAX_DOCUMENT_PAGES", "OLMOCR_RENDER_MEMORY_BYTES"):
        monkeypatch.delenv(name, raising=False)
    assert environment.document_limits() == DocumentLimits()
    monkeypatch.setenv("OLMOCR_MAX_DOCUMENT_PAGES", "300")
    monkeypatch.setenv("OLMOCR_RENDER_MEMORY_BYTES", str(SMALL_MEMORY))
    limits = environment.document_limits()
    assert (limits.max_pages, limits.render_memory_bytes) == (300, SMALL_MEMORY)
    monkeypatch.setenv("OLMOCR_RENDER_MEMORY_BYTES", "0")
    with pytest.raises(ConfigurationError, match="OLMOCR_RENDER_MEMORY_BYTES"):
        environment.document_limits()


def test_a_memory_limit_below_a_resting_worker_is_refused_at_start_with_the_setting_named() -> None:
    pool = RenderPool(workers=1, limits=DocumentLimits(render_memory_bytes=16 * 1024 * 1024))
    with pytest.raises(RenderError, match="render_memory_bytes") as caught:
        pool.start()
    assert "refused to start" in str(caught.value)
    assert pool.worker_pids() == []
