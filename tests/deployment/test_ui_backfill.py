"""The UI's Trigger → Backfill dialog in headless Chromium, against the running deployment.

A user types another input into the dialog's "Input" field. Unless "Override parameters on existing
runs" is ticked, the dialog sends no Params at all (``dag_run_conf: null``), so the backfill converts
the DAG's default input (``OLMOCR_INPUT_URI``) for those intervals, not the typed one; ticked, it
sends every Param and converts the typed input. Both cases are driven through the dialog, the request
it sent is recorded, and the outcome is read from the published manifests.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page

from olmocr_testkit.bucket import Bucket
from olmocr_testkit.cluster import Deployment, wait_until
from tests.deployment.browser import log_in
from tests.deployment.published import converted, only, statuses

pytestmark = [pytest.mark.deployment, pytest.mark.browser, pytest.mark.timeout(1500)]

DAG = "olmocr_ingest"


def _backfill_through_dialog(
    page: Page, start: datetime, end: datetime, typed_input: str, typed_output: str, override: bool, screenshots: Path
) -> dict[str, Any]:
    """Fill and submit the dialog; returns the body of the ``POST /api/v2/backfills`` it sent."""
    page.get_by_role("button", name="Trigger").first.click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_text("Backfill", exact=True).click()
    for index, moment in enumerate((start, end)):
        dialog.get_by_test_id("datetime-input").nth(index).click()
        picker = page.locator("[data-scope=popover][data-part=content]:visible")
        picker.get_by_placeholder("YYYY/MM/DD").fill(f"{moment:%Y/%m/%d}")
        picker.get_by_placeholder("HH:mm").fill(f"{moment:%H:%M}")
        page.keyboard.press("Escape")
        # The next field's picker opens only once this one has closed (both match while it fades out).
        picker.wait_for(state="hidden")
    # The dialog's dry run answers once both dates are set.
    dialog.get_by_text(re.compile(r"\b1 run will be triggered")).wait_for()
    dialog.get_by_text("Input and output").click()
    page.locator("#element_input_uri").fill(typed_input)
    page.locator("#element_output_uri").fill(typed_output)
    if override:
        dialog.get_by_text("Override parameters on existing runs").click()
    with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/api/v2/backfills")) as sent:
        dialog.get_by_role("button", name="Run Backfill").click()
    page.screenshot(path=str(screenshots / f"ui-backfill-override-{override}.png"))
    return json.loads(sent.value.post_data or "{}")


def _wait_for_backfill(deployment: Deployment, start: datetime, end: datetime) -> list[dict[str, Any]]:
    def completed() -> list[dict[str, Any]] | None:
        backfills = deployment.api.ok("GET", "/api/v2/backfills", params={"dag_id": DAG, "limit": 100})["backfills"]
        mine = [b for b in backfills if datetime.fromisoformat(b["from_date"]) == start]
        return mine if mine and all(b["completed_at"] for b in mine) else None

    wait_until(completed, timeout=900, interval=3, what=f"UI backfill from {start} completed")
    runs = deployment.api.dag_runs(
        DAG, run_type="backfill", logical_date_gte=start.isoformat(), logical_date_lte=end.isoformat()
    )
    assert len(runs) == 1, runs
    return runs


def _converted_by(
    bucket: Bucket, output_uri: str, runs: list[dict[str, Any]], own: str
) -> tuple[list[str], dict[str, Any]]:
    """What the runs converted under ``own`` (this test's prefix), repeats kept, and every status for messages."""
    found: list[str] = []
    seen: dict[str, Any] = {}
    for run in runs:
        manifest = bucket.manifest(output_uri, DAG, run["dag_run_id"])
        if manifest is not None:
            found += converted(only(manifest, own))
            seen[run["dag_run_id"]] = statuses(manifest)
    return sorted(found), seen


@pytest.mark.parametrize("override", [False, True], ids=["override-unticked", "override-ticked"])
def test_ui_backfill_dialog_uses_typed_params_only_when_override_is_ticked(
    deployment: Deployment,
    bucket: Bucket,
    ingest_unpaused: None,
    browser: Browser,
    override: bool,
    prefix: str,
    scheduled_prefix: str,
) -> None:
    # One interval hours before the session, another for each case: "Missing Runs" skips dates
    # that have runs. From and To are the same date: one run.
    start = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=5 if override else 6)
    end = start
    # The default input is the DAGs' (shared): this test's PDF there lies in a folder of its own.
    default_pdf = bucket.put_pdf(
        f"{scheduled_prefix}default.pdf", doc_id=210 + override, last_modified=start + 30 * timedelta(seconds=1)
    )
    typed_input, typed_output = bucket.uri(f"{prefix}input/"), bucket.uri(f"{prefix}output/")
    typed_pdf = bucket.put_pdf(
        f"{prefix}input/typed.pdf", doc_id=220 + override, last_modified=start + 40 * timedelta(seconds=1)
    )

    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60_000)
    try:
        log_in(page, deployment, f"/dags/{DAG}")
        body = _backfill_through_dialog(
            page, start, end, typed_input, typed_output, override, deployment.cluster.work_dir
        )
    finally:
        context.close()
    runs = _wait_for_backfill(deployment, start, end)

    # The default input's runs may also re-drive other tests' failed PDFs there: only this test's count.
    from_default, default_seen = _converted_by(bucket, deployment.output_uri, runs, bucket.uri(scheduled_prefix))
    from_typed, typed_seen = _converted_by(bucket, typed_output, runs, typed_input)
    if override:
        assert body["dag_run_conf"]["input_uri"] == typed_input
        assert from_typed == [typed_pdf], typed_seen
        assert from_default == [], default_seen
    else:
        assert body["dag_run_conf"] is None, "the dialog sent Params without the override ticked"
        assert all(run["conf"] in ({}, None) for run in runs)
        assert from_default == [default_pdf], default_seen
        assert from_typed == [], typed_seen
    assert {run["state"] for run in runs} == {"success"}
