"""A convert instance whose batch has a hung request gives its pool slot back long before the read
timeout: with the hedging defaults, the hung page is hedged soon after the batch's other pages are
answered (the server's queue emptied), not after a fixed floor or the 300-s read timeout; a short batch
too, whose hung request comes before the client has timed the 8 answers its percentile needs."""

from __future__ import annotations

from datetime import datetime

import pytest

from olmocr_tasks.core.config import ServerSettings
from olmocr_testkit.bucket import Bucket
from olmocr_testkit.cluster import Deployment
from tests.deployment.published import converted

pytestmark = [pytest.mark.deployment, pytest.mark.timeout(600)]

DAG = "olmocr_ingest"


@pytest.mark.parametrize(
    ("doc_id", "pages", "hung_page"),
    [
        pytest.param(241, 12, 12, id="last-of-12"),
        # Cold start: the run's first request hangs and only one other page is ever answered.
        pytest.param(242, 2, 1, id="first-of-2"),
    ],
)
def test_batch_with_a_hung_request_releases_its_slot_without_waiting_for_the_read_timeout(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None, prefix: str, doc_id: int, pages: int, hung_page: int
) -> None:
    source = bucket.put_pdf(f"{prefix}input/long.pdf", pages=pages, doc_id=doc_id)
    output = bucket.uri(f"{prefix}output/")
    # That page's first request is accepted and never answered.
    deployment.standin.configure(scripts={f"{doc_id}:{hung_page}": ["hang"]})
    response = deployment.api.trigger(DAG, {"input_uri": bucket.uri(f"{prefix}input/"), "output_uri": output})
    assert response.status_code == 200, response.text
    run = deployment.api.wait_for_run(DAG, response.json()["dag_run_id"], timeout=500)

    assert run["state"] == "success"
    manifest = bucket.manifest(output, DAG, run["dag_run_id"])
    assert manifest is not None and converted(manifest) == [source]
    assert manifest["counts"]["hedged"] >= 1 and manifest["counts"]["fallback_pages"] == 0
    ours = [r for r in deployment.standin.requests() if r["marker"] and r["marker"]["doc_id"] == doc_id]
    hung = [r for r in ours if r["marker"]["page_number"] == hung_page]
    # Answered by a hedge while the hung request was still open, not by a retry after a read timeout.
    assert [r["fault"] for r in hung][:1] == ["hang"] and any(r["status"] == 200 for r in hung)
    (convert,) = [ti for ti in deployment.api.task_instances(DAG, run["dag_run_id"]) if ti["task_id"] == "convert"]
    assert convert["try_number"] == 1
    held = datetime.fromisoformat(convert["end_date"]) - datetime.fromisoformat(convert["start_date"])
    assert held.total_seconds() < ServerSettings().timeouts.read_timeout_s
