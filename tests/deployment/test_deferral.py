"""check_server waits for a starting vLLM in the triggerer, not in a worker slot (issue 14).

With the stand-in refusing connections, a REST-triggered run's ``check_server`` is ``deferred``: its
``VllmReadyTrigger`` polls from the triggerer while no worker runs it. Once the stand-in answers again
the trigger fires, the same try resumes on a worker, and the run converts and publishes its manifest.
"""

from __future__ import annotations

from typing import Any

import pytest

from olmocr_testkit.bucket import Bucket
from olmocr_testkit.cluster import Deployment, wait_until
from tests.deployment.published import converted, sources

pytestmark = [pytest.mark.deployment, pytest.mark.timeout(1500)]

DAG = "olmocr_ingest"


def _check_server(deployment: Deployment, run_id: str) -> dict[str, Any] | None:
    instances = deployment.api.task_instances(DAG, run_id)
    return next((ti for ti in instances if ti["task_id"] == "check_server"), None)


def test_check_server_waits_deferred_while_vllm_is_down_and_resumes_when_it_is_up(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None, prefix: str
) -> None:
    wanted = bucket.put_pdf(f"{prefix}input/late-server.pdf", pages=2, doc_id=231)
    output = bucket.uri(f"{prefix}output/")
    conf = {"input_uri": bucket.uri(f"{prefix}input/"), "output_uri": output, "documents": [wanted]}

    # Refusing until resumed; should the test fail before that, the shared_deployment_restored fixture
    # ends the outage.
    deployment.standin.refuse_for(None)
    response = deployment.api.trigger(DAG, conf)
    assert response.status_code == 200, response.text
    run_id = response.json()["dag_run_id"]

    def deferred() -> dict[str, Any] | None:
        ti = _check_server(deployment, run_id)
        return ti if ti is not None and ti["state"] == "deferred" else None

    waiting = wait_until(deferred, 600, 2, what="check_server deferred")
    # Handed to the triggerer: its trigger is VllmReadyTrigger, and nothing downstream has started.
    assert waiting["trigger"]["classpath"] == "olmocr_tasks.provider.triggers.VllmReadyTrigger"
    assert waiting["try_number"] == 1
    # plan runs beside check_server (it needs no server); no convert instance starts while it waits.
    converts = [ti["state"] for ti in deployment.api.task_instances(DAG, run_id) if ti["task_id"] == "convert"]
    assert all(state in (None, "none", "scheduled") for state in converts), converts
    assert deployment.api.dag_run(DAG, run_id)["state"] == "running"
    deployment.standin.resume()

    run = deployment.api.wait_for_run(DAG, run_id)
    assert run["state"] == "success"
    # The same try resumed from the trigger's event: the outage cost no retry.
    (check,) = deployment.api.task_tries(DAG, run_id, "check_server")
    assert check["state"] == "success" and check["try_number"] == 1
    manifest = bucket.manifest(output, DAG, run_id)
    assert manifest is not None, "the run published no manifest"
    assert sources(manifest) == [wanted]
    assert converted(manifest) == [wanted]
