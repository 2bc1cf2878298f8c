"""The "OCR runs" pages as a person sees them, in headless Chromium driven by Playwright.

Uses the system Chromium (Debian package ``chromium``); Playwright's own browser download is never used.
Screenshots go to ``test-output/`` for a human to look at.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from urllib.parse import quote

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.fixtures.asgi import served
from tests.fixtures.browser import SCREENSHOTS
from tests.fixtures.ocr_runs import CLEAN_RUN, DEAD_LETTER_RUN, XSS, RealRuns, copy_output

# tests.fixtures.ocr_runs has put plugins/ on sys.path.
from olmocr_runs import create_app  # isort: skip
from olmocr_runs.access import every_run  # isort: skip

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, runs: RealRuns) -> Iterator[str]:
    """The app over the real runs' manifests, served by uvicorn on a free loopback port in a thread."""
    output = tmp_path_factory.mktemp("ocr-output")
    copy_output(runs, output)
    with served(create_app(str(output), access=every_run)) as url:
        yield url


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


def test_runs_list_in_browser(site: str, page: Page, runs: RealRuns) -> None:
    response = page.goto(f"{site}/")
    assert response is not None and response.status == 200
    expect(page.get_by_role("heading", name="OCR runs")).to_be_visible()
    rows = page.locator("tbody tr")
    expect(rows).to_have_count(4)
    # Newest first: the dead-letter rerun finished last.
    expect(rows.nth(0)).to_contain_text(DEAD_LETTER_RUN)
    expect(rows.nth(0)).to_contain_text("some failed")
    clean = rows.nth(2)
    expect(clean).to_contain_text(CLEAN_RUN)
    expect(clean).to_contain_text("all converted")
    counts = runs.manifest(CLEAN_RUN)["counts"]
    expect(clean.locator("td").nth(2)).to_have_text("command line")
    expect(clean.locator("td").nth(4)).to_have_text(str(counts["converted"]))
    expect(clean.locator("td").nth(7)).to_have_text(str(counts["pages"]))
    airflow_run = rows.nth(3)
    expect(airflow_run).to_contain_text(runs.airflow_manifest_run_id)
    expect(airflow_run).to_contain_text("failed budget")
    expect(page.get_by_text("manifests/broken-run.json could not be read")).to_be_visible()
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "ocr-runs-list.png"), full_page=True)

    page.get_by_role("link", name=runs.airflow_manifest_run_id).click()
    expect(page).to_have_url(f"{site}/runs/{quote(runs.key(runs.airflow_manifest_run_id), safe='')}")
    expect(page.get_by_role("heading", level=1)).to_contain_text(runs.airflow_manifest_run_id)


def test_run_page_in_browser(site: str, page: Page, dialogs: list[str], runs: RealRuns) -> None:
    response = page.goto(f"{site}/runs/{quote(runs.key(runs.airflow_manifest_run_id), safe='')}")
    assert response is not None and response.status == 200
    manifest = runs.manifest(runs.airflow_manifest_run_id)
    cards = page.get_by_role("region", name="summary")
    expect(cards).to_contain_text("converted")
    expect(cards).to_contain_text(manifest["model"])
    expect(cards).to_contain_text("p95")
    expect(page.get_by_role("alert").first).to_contain_text("over the budget of 5.0%")

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

    start, end = (
        datetime.fromisoformat(stamp).strftime("%Y-%m-%d %H:%M:%S UTC") for stamp in runs.airflow_data_interval
    )
    expect(page.locator("p.trigger")).to_contain_text("Trigger: manual (UI or REST API)")
    expect(page.locator("p.trigger")).to_contain_text(f"data interval {start} → {end}")

    # Every document, not only the failed ones.
    table = page.get_by_role("table").filter(has=page.get_by_role("columnheader", name="Fallback pages"))
    rows = table.locator("tbody tr")
    expect(rows).to_have_count(len(manifest["documents"]))
    expect(table).to_contain_text("not_pdf")
    expect(table).to_contain_text("converted")
    # The hostile source is shown as text, literally; no script ran.
    expect(table.get_by_text(runs.hostile_source).first).to_be_visible()
    assert XSS in runs.hostile_source
    assert dialogs == []
    assert page.locator("script").count() == 0
    log_link = table.get_by_role("link", name="log").first
    assert f"/dags/olmocr_ingest/runs/{quote(runs.airflow_run_id, safe='')}/tasks/convert/mapped/" in (
        log_link.get_attribute("href") or ""
    )
    # Whole pages on the progress chart's axis.
    ticks = page.get_by_role("img", name="Pages converted over time").locator('text[text-anchor="end"]')
    labels = ticks.all_text_contents()
    assert len(labels) == 5 and all(label.isdigit() for label in labels), labels

    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "ocr-run-detail.png"), full_page=True)

    # A converted document's markdown opens from its row.
    converted = next(doc for doc in manifest["documents"] if doc["status"] == "converted")
    row = rows.filter(has=page.get_by_text(converted["source"], exact=True))
    row.get_by_role("link", name="markdown").click()
    expect(page.locator("body")).to_have_text(Path(converted["outputs"]["markdown"]).read_text().strip())


def test_search_across_runs_in_browser(site: str, page: Page, runs: RealRuns) -> None:
    page.goto(f"{site}/")
    page.get_by_role("searchbox").fill("memo")
    page.get_by_role("button", name="Search").click()
    matches = page.get_by_role("table").filter(has=page.get_by_role("columnheader", name="Source"))
    expect(matches.locator("tbody tr")).to_have_count(1)
    expect(matches).to_contain_text(str(runs.clean_input / "memo.pdf"))
    expect(matches).to_contain_text(CLEAN_RUN)
    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "ocr-runs-search.png"), full_page=True)
    matches.get_by_role("link", name="dolma").click()
    assert '"Source-File": "' + str(runs.clean_input / "memo.pdf") in page.locator("body").inner_text()


def test_long_run_ids_do_not_wrap_the_table(site: str, page: Page, runs: RealRuns) -> None:
    page.set_viewport_size({"width": 1100, "height": 900})
    page.goto(f"{site}/")
    rows = page.locator("tbody tr")
    long_row = rows.filter(has_text=runs.airflow_manifest_run_id)
    short_row = rows.filter(has_text=CLEAN_RUN)
    long_box, short_box = long_row.bounding_box(), short_row.bounding_box()
    assert long_box is not None and short_box is not None
    # The Airflow run id is far longer than the CLI's, yet its row is no taller.
    assert len(runs.airflow_manifest_run_id) > 3 * len(CLEAN_RUN)
    assert long_box["height"] <= short_box["height"] + 1
    # The full id stays available as the link's tooltip.
    link = long_row.get_by_role("link", name=runs.airflow_manifest_run_id)
    assert link.get_attribute("title") == runs.airflow_manifest_run_id

    SCREENSHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "ocr-run-detail.png"), full_page=True)


def test_unknown_run_in_browser(site: str, page: Page) -> None:
    response = page.goto(f"{site}/runs/{quote('../../etc/passwd', safe='')}")
    assert response is not None and response.status == 404
    expect(page.get_by_role("heading", level=1)).to_contain_text("not found")
    page.get_by_role("link", name="All runs").click()
    expect(page.locator("tbody tr").first).to_contain_text(DEAD_LETTER_RUN)
