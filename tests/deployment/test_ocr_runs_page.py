"""The "OCR runs" pages mounted in the deployment's real api-server, in headless Chromium.

The plugin is loaded by the api-server from ``plugins/`` (as a deployment loads it), reads the
manifests the tasks published to S3 (the DAGs' ``OLMOCR_OUTPUT_URI``, through the ``aws_default``
connection) and is shown only to a signed-in user. A person signs in through Airflow's login form,
opens "OCR runs" from the UI, then a run of this test and one of its documents.
"""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import Browser, expect

from olmocr_testkit.bucket import Bucket
from olmocr_testkit.cluster import Deployment
from tests.deployment.browser import log_in
from tests.deployment.published import converted, sources
from tests.fixtures.browser import SCREENSHOTS

pytestmark = [pytest.mark.deployment, pytest.mark.browser, pytest.mark.timeout(1500)]

DAG = "olmocr_ingest"


def test_ocr_runs_page_in_the_api_server_shows_a_run_and_opens_its_document(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None, browser: Browser, prefix: str
) -> None:
    wanted = {
        bucket.put_pdf(f"{prefix}input/alpha.pdf", pages=2, doc_id=171): 171,
        bucket.put_pdf(f"{prefix}input/beta.pdf", doc_id=172): 172,
    }
    # Published where the plugin looks: the DAGs' default output.
    conf = {"input_uri": bucket.uri(f"{prefix}input/"), "output_uri": deployment.output_uri}
    response = deployment.api.trigger(DAG, conf)
    assert response.status_code == 200, response.text
    run = deployment.api.wait_for_run(DAG, response.json()["dag_run_id"])
    assert run["state"] == "success"
    manifest = bucket.manifest(deployment.output_uri, DAG, run["dag_run_id"])
    assert manifest is not None and converted(manifest) == sources(manifest) == sorted(wanted)
    run_id = manifest["run_id"]
    assert run["dag_run_id"] in run_id

    # Without signing in, the pages are refused.
    anonymous = httpx.get(f"{deployment.cluster.api_url}/olmocr/", timeout=60, follow_redirects=False)
    assert anonymous.status_code in (401, 403), anonymous.status_code

    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60_000)
    try:
        log_in(page, deployment)
        # "OCR runs" in the UI's navigation: the plugin's pages inside Airflow's own frame.
        page.goto(f"{deployment.cluster.api_url}/plugin/ocr-runs")
        frame = page.frame_locator("iframe")
        expect(frame.get_by_role("heading", name="OCR runs")).to_be_visible()
        row = frame.locator("tbody tr").filter(has=frame.get_by_role("link", name=run_id, exact=True))
        expect(row).to_have_count(1)
        counts = manifest["counts"]
        assert (counts["converted"], counts["failed"], counts["pages"]) == (2, 0, 3)
        expect(row.locator("td").nth(2)).to_contain_text("manual")
        expect(row.locator("td").nth(4)).to_have_text("2")
        expect(row.locator("td").nth(5)).to_have_text("0")
        expect(row.locator("td").nth(7)).to_have_text("3")
        SCREENSHOTS.mkdir(exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "ocr-runs-in-airflow.png"), full_page=True)

        row.get_by_role("link", name=run_id, exact=True).click()
        expect(frame.get_by_role("heading", level=1)).to_contain_text(run_id)
        documents = frame.locator("table").filter(has=frame.get_by_role("columnheader", name="Fallback pages"))
        expect(documents.locator("tbody tr")).to_have_count(2)
        alpha = next(source for source, doc_id in wanted.items() if doc_id == 171)
        document = documents.locator("tbody tr").filter(has=frame.get_by_text(alpha, exact=True))
        expect(document).to_contain_text("converted")
        page.screenshot(path=str(SCREENSHOTS / "ocr-run-in-airflow.png"), full_page=True)

        # The document's markdown, read from S3 by the api-server: the stand-in's text of both its pages.
        with page.expect_response(lambda answer: "/documents/" in answer.url) as opened:
            document.get_by_role("link", name="markdown").click()
        assert opened.value.status == 200
        assert opened.value.url.startswith(f"{deployment.cluster.api_url}/olmocr/runs/")
        body = frame.locator("body")
        expect(body).to_contain_text("document 171 page 1")
        expect(body).to_contain_text("document 171 page 2")
    finally:
        context.close()
