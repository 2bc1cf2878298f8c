"""The "OCR runs" pages as a person sees them, in headless Chromium driven by Playwright.

Uses the system Chromium (Debian package ``chromium``); Playwright's own browser download is never used.
Screenshots go to ``test-output/`` for a human to look at.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.test_plugin_app import BUSY_RUN, CLEAN_RUN, XSS, key_of, write_sample_manifests

# tests.test_plugin_app has put plugins/ on sys.path.
from olmocr_runs import create_app  # isort: skip

pytestmark = pytest.mark.browser

# Debian's package puts it on PATH as `chromium`; OLMOCR_TEST_CHROMIUM overrides.
CHROMIUM = os.environ.get("OLMOCR_TEST_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[1] / "test-output"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The app served by uvicorn on a free loopback port, in a background thread."""
    import uvicorn

    output = tmp_path_factory.mktemp("ocr-output")
    write_sample_manifests(output)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(str(output)), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM or not Path(CHROMIUM).exists():
        pytest.fail(
            "Chromium not found: install the Debian package 'chromium' (apt-get install chromium) "
            "or point OLMOCR_TEST_CHROMIUM at a Chromium binary. Playwright's own browser download is not used."
        )
    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield instance
        finally:
            instance.close()


@pytest.fixture
def dialogs() -> list[str]:
    """Messages of every JavaScript dialog the page opened (a smuggled alert() would land here)."""
    return []


@pytest.fixture
def page(browser: Browser, dialogs: list[str]) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    tab = context.new_page()
    tab.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    try:
        yield tab
    finally:
        context.close()


def test_runs_list_in_browser(site: str, page: Page) -> None:
    response = page.goto(f"{site}/")
    assert response is not None and response.status == 200
    expect(page.get_by_role("heading", name="OCR runs")).to_be_visible()
    rows = page.locator("tbody tr")
    expect(rows).to_have_count(3)
    # Newest first: the clean run finished last.
    expect(rows.nth(0)).to_contain_text(CLEAN_RUN)
    expect(rows.nth(0)).to_contain_text("all converted")
    busy = rows.nth(1)
    expect(busy).to_contain_text(BUSY_RUN)
    expect(busy).to_contain_text("some failed")
    expect(busy.locator("td").nth(3)).to_have_text("40")
    expect(busy.locator("td").nth(4)).to_have_text("2")
    expect(rows.nth(2)).to_contain_text("failed budget")
    expect(page.get_by_text("manifests/broken-run.json could not be read")).to_be_visible()
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "ocr-runs-list.png"), full_page=True)

    page.get_by_role("link", name=BUSY_RUN).click()
    expect(page).to_have_url(f"{site}/runs/{quote(key_of(BUSY_RUN), safe='')}")
    expect(page.get_by_role("heading", level=1)).to_contain_text(BUSY_RUN)


def test_run_page_in_browser(site: str, page: Page, dialogs: list[str]) -> None:
    response = page.goto(f"{site}/runs/{quote(key_of(BUSY_RUN), safe='')}")
    assert response is not None and response.status == 200
    cards = page.get_by_role("region", name="summary")
    expect(cards).to_contain_text("converted")
    expect(cards).to_contain_text("allenai/olmOCR-2-7B-1025-FP8")
    expect(cards).to_contain_text("p95")

    charts = page.locator("figure svg")
    expect(charts).to_have_count(4)
    for title in (
        "Pages converted over time",
        "Page latency distribution",
        "Failures by error class",
        "Accepted attempt per page",
    ):
        expect(page.get_by_role("img", name=title)).to_be_visible()
    box = charts.first.bounding_box()
    assert box is not None and box["width"] > 300 and box["height"] > 100

    table = page.locator("table", has=page.get_by_role("columnheader", name="Error class"))
    expect(table.locator("tbody tr")).to_have_count(3)
    expect(table).to_contain_text("ServerUnavailable")
    expect(table).to_contain_text("dead letter")
    # The hostile source and error are shown as text, literally; no script ran.
    expect(table.get_by_text(f"s3://acme-scans/2025/{XSS}.pdf").first).to_be_visible()
    expect(table.get_by_text(f"{XSS} pdfium could not render page 3").first).to_be_visible()
    assert dialogs == []
    assert page.locator("script").count() == 0
    log_link = table.get_by_role("link", name="log").first
    assert "/dags/olmocr_convert/runs/" in (log_link.get_attribute("href") or "")

    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "ocr-run-detail.png"), full_page=True)


def test_unknown_run_in_browser(site: str, page: Page) -> None:
    response = page.goto(f"{site}/runs/{quote('../../etc/passwd', safe='')}")
    assert response is not None and response.status == 404
    expect(page.get_by_role("heading", level=1)).to_contain_text("not found")
    page.get_by_role("link", name="All runs").click()
    expect(page.locator("tbody tr").first).to_contain_text(CLEAN_RUN)
