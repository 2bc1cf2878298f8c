"""Resumable documents through Airflow: a convert attempt SIGKILLed midway through a multi-page
document is retried by Airflow, and the retry sends the stand-in only the pages not yet saved.

A document's accepted pages are saved as they complete (``OUTPUT/_state/<key>/pages/<sha256>/``,
RELIABILITY.md "Resumable documents"). The worker running the attempt is killed (its whole process
group, as a lost machine) once some pages are saved and others are not; Airflow retries the instance
after its heartbeat timeout on the other worker. The stand-in's request log, each request marked
with its document and page, says which pages were asked for before and after the kill.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest

from olmocr_testkit.bucket import Bucket
from olmocr_testkit.cluster import Deployment, wait_until
from tests.deployment.published import assert_outputs_name_their_pages, converted, documents, sources

pytestmark = [pytest.mark.deployment, pytest.mark.timeout(1500)]

DAG = "olmocr_ingest"
DOC_ID = 241
PAGES = 6
_SAVED_PAGE = re.compile(r"/pages/[0-9a-f]{64}/(\d+)\.json$")


def _saved_pages(bucket: Bucket, prefix: str) -> set[int]:
    """The page numbers whose accepted answer the page store holds for this test's output."""
    found = (_SAVED_PAGE.search(key) for key in bucket.keys(f"{prefix}output/_state/"))
    return {int(match.group(1)) for match in found if match}


def _page_requests(deployment: Deployment, before: int) -> tuple[list[int], list[int]]:
    """The page numbers of this document's requests the stand-in received: before seq ``before``, and from it."""
    records = [
        record for record in deployment.standin.requests() if record["marker"] and record["marker"]["doc_id"] == DOC_ID
    ]
    return (
        [record["marker"]["page_number"] for record in records if record["seq"] < before],
        [record["marker"]["page_number"] for record in records if record["seq"] >= before],
    )


def test_a_convert_attempt_killed_midway_resumes_with_only_the_unsaved_pages(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None, prefix: str
) -> None:
    source = bucket.put_pdf(f"{prefix}input/long.pdf", pages=PAGES, doc_id=DOC_ID)
    output = bucket.uri(f"{prefix}output/")
    # One page at a time, each answered after 1 s: the kill lands between pages, not after all.
    conf = {"input_uri": bucket.uri(f"{prefix}input/"), "output_uri": output, "max_concurrent_requests": 1}
    deployment.standin.configure(latency_s=1.0)
    response = deployment.api.trigger(DAG, conf)
    assert response.status_code == 200, response.text
    run_id = response.json()["dag_run_id"]

    def attempt_midway() -> dict[str, Any] | None:
        running = [ti for ti in deployment.running_converts() if ti["dag_run_id"] == run_id]
        saved = _saved_pages(bucket, prefix)
        return running[0] if running and running[0]["try_number"] == 1 and 2 <= len(saved) < PAGES else None

    victim = wait_until(attempt_midway, timeout=600, interval=0.3, what="the convert attempt with some pages saved")
    deployment.cluster.kill(victim["hostname"])
    # Every request the stand-in received from now on comes from another attempt.
    killed_at = deployment.standin.stats()["total"]

    def retry_running() -> list[dict[str, Any]] | None:
        tries = deployment.api.task_tries(DAG, run_id, "convert", victim["map_index"])
        return tries if len(tries) > 1 and tries[-1]["state"] in ("running", "success") else None

    wait_until(retry_running, timeout=600, interval=0.5, what="Airflow's retry of the killed attempt")
    # Listed once the killed worker's last writes have long landed, before the retry commits (it then
    # deletes the records): the retry has at least one page still to ask for, 1 s each.
    saved = _saved_pages(bucket, prefix)
    run = deployment.api.wait_for_run(DAG, run_id, timeout=900)

    assert run["state"] == "success"
    tries = deployment.api.task_tries(DAG, run_id, "convert", victim["map_index"])
    assert tries[0]["hostname"] == victim["hostname"]
    assert tries[-1]["state"] == "success" and tries[-1]["try_number"] >= 2
    assert 2 <= len(saved) < PAGES, saved
    before, after = _page_requests(deployment, killed_at)
    # Every saved page was asked for once, before the kill; after it, each unsaved page exactly once.
    assert sorted(after) == sorted(set(range(1, PAGES + 1)) - saved), (saved, Counter(before), Counter(after))
    assert all(Counter(before)[page] == 1 for page in saved), Counter(before)

    manifest = bucket.manifest(output, DAG, run_id)
    assert manifest is not None, "the run published no manifest"
    assert sources(manifest) == converted(manifest) == [source]
    assert documents(manifest)[source]["pages"] == PAGES
    assert manifest["counts"]["pages"] == PAGES and manifest["counts"]["fallback_pages"] == 0
    assert_outputs_name_their_pages(bucket, manifest, {source: DOC_ID})
    # Committed: the saved pages are gone from the store.
    assert _saved_pages(bucket, prefix) == set()
