"""REST-triggered runs through the deployment: a token from ``POST /auth/token``, then a dagRun with conf."""

from __future__ import annotations

import httpx
import pytest

from tests.deployment.corpus import Bucket, assert_outputs_name_their_pages, converted, documents
from tests.deployment.harness import Deployment

# The first test of a session also pays for starting the deployment (one to three minutes on a
# loaded 2-core machine); runs wait on a real scheduler and real Celery workers.
pytestmark = [pytest.mark.deployment, pytest.mark.timeout(1500)]

DAG = "olmocr_ingest"


def test_rest_run_converts_exactly_the_listed_documents(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None
) -> None:
    wanted = {
        bucket.put_pdf("rest/input/alpha.pdf", pages=2, doc_id=101): 101,
        bucket.put_pdf("rest/input/nested/beta.pdf", pages=1, doc_id=102): 102,
    }
    untouched = bucket.put_pdf("rest/input/gamma.pdf", doc_id=103)
    output = bucket.uri("rest/output/")
    conf = {"input_uri": bucket.uri("rest/input/"), "output_uri": output, "documents": sorted(wanted)}

    response = deployment.api.trigger(DAG, conf)
    assert response.status_code == 200, response.text
    run = deployment.api.wait_for_run(DAG, response.json()["dag_run_id"])

    assert run["state"] == "success"
    assert run["run_type"] == "manual" and run["triggered_by"] == "rest_api"
    manifest = bucket.manifest(output, DAG, run["dag_run_id"])
    assert manifest is not None, "the run published no manifest"
    assert set(documents(manifest)) == set(wanted)
    assert converted(manifest) == set(wanted)
    assert manifest["counts"]["pages"] == 3
    assert_outputs_name_their_pages(bucket, manifest, wanted)
    assert untouched not in documents(manifest)


def test_invalid_conf_is_refused_with_the_params_message(deployment: Deployment, bucket: Bucket) -> None:
    response = deployment.api.trigger(DAG, {"output_uri": bucket.uri("rest/output/"), "max_documents": 0})

    assert response.status_code == 400, response.text
    assert "0 is less than the minimum of 1" in response.text


def test_trigger_without_a_token_is_refused(deployment: Deployment) -> None:
    response = httpx.post(
        f"{deployment.api.base_url}/api/v2/dags/{DAG}/dagRuns", json={"logical_date": None, "conf": {}}, timeout=30
    )

    assert response.status_code == 401
