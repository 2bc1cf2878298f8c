"""REST-triggered runs through the deployment: a token from ``POST /auth/token``, then a dagRun with conf."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from olmocr_tasks.location.manifest import manifest_uri
from olmocr_testkit.bucket import Bucket
from olmocr_testkit.cluster import CONSUMER_DAG, Deployment, wait_until
from tests.deployment.published import assert_outputs_name_their_pages, converted, sources

# The first test of a session also pays for starting the deployment (one to three minutes on a
# loaded 2-core machine); runs wait on a real scheduler and real Celery workers.
pytestmark = [pytest.mark.deployment, pytest.mark.timeout(1500)]

DAG = "olmocr_ingest"


def test_rest_run_converts_exactly_the_listed_documents(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None, prefix: str
) -> None:
    wanted = {
        bucket.put_pdf(f"{prefix}input/alpha.pdf", pages=2, doc_id=101): 101,
        bucket.put_pdf(f"{prefix}input/nested/beta.pdf", pages=1, doc_id=102): 102,
    }
    untouched = bucket.put_pdf(f"{prefix}input/gamma.pdf", doc_id=103)
    output = bucket.uri(f"{prefix}output/")
    conf = {"input_uri": bucket.uri(f"{prefix}input/"), "output_uri": output, "documents": sorted(wanted)}

    response = deployment.api.trigger(DAG, conf)
    assert response.status_code == 200, response.text
    run = deployment.api.wait_for_run(DAG, response.json()["dag_run_id"])

    assert run["state"] == "success"
    assert run["run_type"] == "manual" and run["triggered_by"] == "rest_api"
    manifest = bucket.manifest(output, DAG, run["dag_run_id"])
    assert manifest is not None, "the run published no manifest"
    assert sources(manifest) == sorted(wanted)
    assert converted(manifest) == sorted(wanted)
    assert manifest["counts"]["pages"] == 3
    assert_outputs_name_their_pages(bucket, manifest, wanted)
    assert untouched not in sources(manifest)


def test_invalid_conf_is_refused_with_the_params_message(deployment: Deployment, bucket: Bucket) -> None:
    response = deployment.api.trigger(DAG, {"output_uri": bucket.uri("rest/output/"), "max_documents": 0})

    assert response.status_code == 400, response.text
    assert "0 is less than the minimum of 1" in response.text


def test_trigger_without_a_token_is_refused(deployment: Deployment) -> None:
    response = httpx.post(
        f"{deployment.api.base_url}/api/v2/dags/{DAG}/dagRuns", json={"logical_date": None, "conf": {}}, timeout=30
    )

    assert response.status_code == 401


def _outputs_events(deployment: Deployment, run_id: str) -> list[dict[str, Any]]:
    params = {"source_dag_id": DAG, "source_run_id": run_id, "limit": 100}
    return deployment.api.ok("GET", "/api/v2/assets/events", params=params)["asset_events"]


def _consumed_by(deployment: Deployment, run: dict[str, Any]) -> set[str]:
    """The source runs of the asset events that triggered a run of the consumer DAG."""
    path = f"/api/v2/dags/{CONSUMER_DAG}/dagRuns/{run['dag_run_id']}/upstreamAssetEvents"
    return {event["source_run_id"] for event in deployment.api.ok("GET", path)["asset_events"]}


def test_only_a_run_that_converted_something_wakes_the_outputs_consumers(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None, prefix: str, unpause: Callable[[str], None]
) -> None:
    source = bucket.put_pdf(f"{prefix}input/only.pdf", doc_id=121)
    output = bucket.uri(prefix + "output/")
    conf = {"input_uri": bucket.uri(prefix + "input/"), "output_uri": output}
    unpause(CONSUMER_DAG)
    runs = []
    # The second run finds the PDF already converted: nothing new, yet a manifest to publish.
    for _ in range(2):
        response = deployment.api.trigger(DAG, conf)
        assert response.status_code == 200, response.text
        runs.append(deployment.api.wait_for_run(DAG, response.json()["dag_run_id"]))
    converting, idle = runs
    assert converting["state"] == idle["state"] == "success"
    first = bucket.manifest(output, DAG, converting["dag_run_id"])
    second = bucket.manifest(output, DAG, idle["dag_run_id"])
    assert first is not None and converted(first) == [source]
    assert second is not None, "a run that converted nothing still publishes its manifest"
    assert second["counts"]["converted"] == 0 and second["counts"]["already_converted"] == 1

    [event] = _outputs_events(deployment, converting["dag_run_id"])
    assert event["name"] == "olmocr_outputs"
    assert event["extra"]["manifest"] == manifest_uri(output, f"{DAG}__{converting['dag_run_id']}")
    assert _outputs_events(deployment, idle["dag_run_id"]) == []

    def consumer_run_of_the_converting_run() -> dict[str, Any] | None:
        for run in deployment.api.dag_runs(CONSUMER_DAG):
            if converting["dag_run_id"] in _consumed_by(deployment, run):
                return run
        return None

    woken = wait_until(consumer_run_of_the_converting_run, 300, 2, what="the consumer DAG woken by the event")
    assert deployment.api.wait_for_run(CONSUMER_DAG, woken["dag_run_id"])["state"] == "success"
    assert all(idle["dag_run_id"] not in _consumed_by(deployment, run) for run in deployment.api.dag_runs(CONSUMER_DAG))
