"""The server's API key rotated in the middle of a run (issue 12, item 6).

The deployment's stand-in wants a key, which the ``olmocr_vllm`` connection carries. Once a convert
instance is midway, the stand-in's key changes (as when an operator revokes or rotates it): every
request of this deployment's tasks now gets 401. Retrying cannot help, so each convert instance that
meets the 401 fails at its first try without Airflow retries (the task has retries for outages),
saying why in its log; the manifest is still published, with what was converted before the
rotation and the rest recorded as not converted because the server refused the run (re-driven by a
later run). The key itself reaches
no task log, XCom or manifest.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from olmocr_testkit.bucket import Bucket
from olmocr_testkit.cluster import Deployment, wait_until
from tests.deployment.published import converted, documents, sources

pytestmark = [pytest.mark.deployment, pytest.mark.timeout(1500)]

DAG = "olmocr_ingest"


def _task_logs(deployment: Deployment, run_id: str) -> dict[Path, str]:
    root = deployment.cluster.log_dir / "tasks" / f"dag_id={DAG}" / f"run_id={run_id}"
    return {path: path.read_text(errors="replace") for path in root.rglob("*.log")}


def _xcom_values(deployment: Deployment, run_id: str) -> list[Any]:
    path = f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/~/xcomEntries"
    entries = deployment.api.ok("GET", path, params={"limit": 1000, "map_index": -1})["xcom_entries"]
    values = []
    for entry in entries:
        item = f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/{entry['task_id']}/xcomEntries/{entry['key']}"
        values.append(deployment.api.ok("GET", item, params={"map_index": entry["map_index"]})["value"])
    return values


def test_a_key_rotated_mid_run_fails_convert_at_its_first_try_without_leaking_it(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None, prefix: str
) -> None:
    doc_ids = {bucket.put_pdf(f"{prefix}input/doc-{n}.pdf", pages=3, doc_id=230 + n): 230 + n for n in range(4)}
    output = bucket.uri(prefix + "output/")
    conf = {"input_uri": bucket.uri(prefix + "input/"), "output_uri": output, "max_concurrent_requests": 1}
    key = deployment.standin.config()["api_key"]
    assert key, "the deployment's stand-in must want a key for this test"

    with deployment.slow_server(latency_s=1.0):
        response = deployment.api.trigger(DAG, conf)
        assert response.status_code == 200, response.text
        run_id = response.json()["dag_run_id"]

        def converting_with_some_output() -> list[dict[str, Any]] | None:
            running = [ti for ti in deployment.running_converts() if ti["dag_run_id"] == run_id]
            return running if running and bucket.keys(prefix + "output/markdown/") else None

        wait_until(converting_with_some_output, timeout=600, interval=0.5, what="a convert instance midway")
        # The shared_deployment_restored fixture gives the stand-in its key back, however the test ends.
        deployment.standin.configure(api_key=f"rotated-{secrets.token_urlsafe(12)}")
        run = deployment.api.wait_for_run(DAG, run_id, timeout=900)

    assert run["state"] == "failed"
    converts = [ti for ti in deployment.api.task_instances(DAG, run_id) if ti["task_id"] == "convert"]
    failed = [ti for ti in converts if ti["state"] == "failed"]
    assert failed, {ti["map_index"]: ti["state"] for ti in converts}
    assert {ti["state"] for ti in converts} <= {"success", "failed"}
    for ti in failed:
        # Failed at its first try: no retry was scheduled although the task has retries.
        assert ti["try_number"] == 1, ti
        assert len(deployment.api.task_tries(DAG, run_id, "convert", ti["map_index"])) == 1
    logs = _task_logs(deployment, run_id)
    failed_logs = [text for path, text in logs.items() if "task_id=convert" in str(path) and "rejected" in text]
    assert failed_logs and all("401" in text for text in failed_logs), sorted(str(path) for path in logs)

    manifest = bucket.manifest(output, DAG, run_id)
    assert manifest is not None, "the run published no manifest"
    assert sources(manifest) == sorted(doc_ids)
    docs = documents(manifest)
    done = converted(manifest)
    assert done, "the rotation came after some output was written: that document stays converted"
    for source in set(doc_ids) - set(done):
        # Not converted, saying why; later runs retry it.
        assert (docs[source]["status"], docs[source]["error_class"]) == ("failed", "not_converted"), docs[source]
        assert "refused this run" in docs[source]["error"] and "401" in docs[source]["error"], docs[source]
    assert manifest["counts"]["converted"] == len(done)
    assert manifest["counts"]["pages"] == sum(docs[source]["pages"] for source in done)

    # The key (old or new) is nowhere a user of Airflow can read.
    assert key not in json.dumps(manifest)
    assert all(key not in text for text in logs.values())
    assert all(key not in json.dumps(value) for value in _xcom_values(deployment, run_id))
