"""A convert instance whose batch has a hung request gives its pool slot back long before the read
timeout: with the hedging defaults, the hung page is hedged soon after the batch's other pages are
answered (the server's queue emptied), not after a fixed floor or the 300-s read timeout."""

from __future__ import annotations

from datetime import datetime

import pytest

from olmocr_tasks.config import ServerSettings
from tests.deployment.corpus import Bucket, converted
from tests.deployment.harness import Deployment

pytestmark = [pytest.mark.deployment, pytest.mark.timeout(600)]

DAG = "olmocr_ingest"
DOC_ID, PAGES = 241, 12


def test_batch_with_a_hung_request_releases_its_slot_without_waiting_for_the_read_timeout(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None, prefix: str
) -> None:
    source = bucket.put_pdf(f"{prefix}input/long.pdf", pages=PAGES, doc_id=DOC_ID)
    output = bucket.uri(f"{prefix}output/")
    # The last page's first request is accepted and never answered: the tail of the batch.
    deployment.standin.configure(scripts={f"{DOC_ID}:{PAGES}": ["hang"]})
    response = deployment.api.trigger(DAG, {"input_uri": bucket.uri(f"{prefix}input/"), "output_uri": output})
    assert response.status_code == 200, response.text
    run = deployment.api.wait_for_run(DAG, response.json()["dag_run_id"], timeout=500)

    assert run["state"] == "success"
    manifest = bucket.manifest(output, DAG, run["dag_run_id"])
    assert manifest is not None and converted(manifest) == [source]
    assert manifest["counts"]["hedged"] >= 1 and manifest["counts"]["fallback_pages"] == 0
    ours = [r for r in deployment.standin.requests() if r["marker"] and r["marker"]["doc_id"] == DOC_ID]
    last_page = [r for r in ours if r["marker"]["page_number"] == PAGES]
    # Answered by a hedge while the hung request was still open, not by a retry after a read timeout.
    assert [r["fault"] for r in last_page][:1] == ["hang"] and any(r["status"] == 200 for r in last_page)
    (convert,) = [ti for ti in deployment.api.task_instances(DAG, run["dag_run_id"]) if ti["task_id"] == "convert"]
    assert convert["try_number"] == 1
    held = datetime.fromisoformat(convert["end_date"]) - datetime.fromisoformat(convert["start_date"])
    assert held.total_seconds() < ServerSettings().read_timeout_s
