"""Hung requests through Airflow: some requests are accepted and never answered, and the run still
converts everything on its first try, without a false outage.

The stand-in holds the first request for a few pages open forever (its ``hang`` fault: accepted,
never answered, as a preempted or lost request on a real vLLM). The convert task hedges such a
request once it is far older than the server's recent answers and takes the hedge's answer; it must
not read the silence as the server being down. Hedging runs with the connection's defaults (the
deployment's ``olmocr_vllm`` connection sets none).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from olmocr_testkit.bucket import Bucket
from olmocr_testkit.cluster import Deployment
from tests.deployment.published import assert_outputs_name_their_pages, converted, documents, sources

pytestmark = [pytest.mark.deployment, pytest.mark.timeout(1500)]

DAG = "olmocr_ingest"
DOC_ID = 246
PAGES = 12
# The first request for each of these pages is never answered; later ones are. Late pages of the
# document, so its convert task has timed enough answers to know what "far slower" means (the client
# hedges only after 8 answers: in a batch of fewer pages a hung request waits for the read timeout).
HUNG = (f"{DOC_ID}:10", f"{DOC_ID}:12")


def page(record: dict[str, Any]) -> str:
    """The stand-in's ``doc:page`` key of a request it received."""
    return f"{record['marker']['doc_id']}:{record['marker']['page_number']}"


def _convert_logs(deployment: Deployment, run_id: str) -> list[str]:
    root = deployment.cluster.log_dir / "tasks" / f"dag_id={DAG}" / f"run_id={run_id}" / "task_id=convert"
    return [path.read_text(errors="replace") for path in Path(root).rglob("*.log")]


def test_hung_requests_are_hedged_and_the_run_converts_everything_without_an_outage(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None, prefix: str
) -> None:
    source = bucket.put_pdf(f"{prefix}input/long.pdf", pages=PAGES, doc_id=DOC_ID)
    doc_ids = {source: DOC_ID}
    output = bucket.uri(f"{prefix}output/")
    # One document, one convert instance (one client, one latency history), 4 requests in flight.
    conf = {"input_uri": bucket.uri(f"{prefix}input/"), "output_uri": output, "max_concurrent_requests": 4}
    deployment.standin.configure(latency_s=0.2, scripts={page: ["hang"] for page in HUNG})
    response = deployment.api.trigger(DAG, conf)
    assert response.status_code == 200, response.text
    run_id = response.json()["dag_run_id"]
    run = deployment.api.wait_for_run(DAG, run_id, timeout=900)

    assert run["state"] == "success"
    converts = [ti for ti in deployment.api.task_instances(DAG, run_id) if ti["task_id"] == "convert"]
    # No false outage: an outage fails the attempt and Airflow retries it; here the first try succeeded.
    assert [(ti["state"], ti["try_number"]) for ti in converts] == [("success", 1)]
    logs = _convert_logs(deployment, run_id)
    assert logs and not any("outage window" in text or "aborting pending requests" in text for text in logs)

    ours = [
        record for record in deployment.standin.requests() if record["marker"] and record["marker"]["doc_id"] == DOC_ID
    ]
    # The hung requests really hung (never answered) and were each followed by one that was answered.
    assert sorted(page(record) for record in ours if record["fault"] == "hang") == sorted(HUNG)
    assert all(record["status"] is None for record in ours if record["fault"] == "hang")
    answered = Counter(page(record) for record in ours if record["status"] == 200)
    every_page = {f"{DOC_ID}:{number}" for number in range(1, PAGES + 1)}
    assert set(answered) == every_page, sorted(every_page - set(answered))

    manifest = bucket.manifest(output, DAG, run_id)
    assert manifest is not None, "the run published no manifest"
    assert sources(manifest) == converted(manifest) == [source]
    counts = manifest["counts"]
    assert (counts["pages"], counts["failed"], counts["fallback_pages"]) == (PAGES, 0, 0)
    # Each hung request was rescued by a hedge (a slow answer on a loaded machine may add one).
    assert counts["hedged"] >= len(HUNG)
    assert documents(manifest)[source]["hedged"] >= len(HUNG)
    assert_outputs_name_their_pages(bucket, manifest, doc_ids)
