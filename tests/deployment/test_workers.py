"""Convert instances on two Celery workers: spread over both, bounded by the pool, and surviving a lost worker.

Each worker has 2 slots (4 in all) and the ``olmocr_vllm`` pool 3, so the pool, not the workers, is
what bounds concurrent convert instances, and whenever 3 run, both workers run one. The documents
are large (over 2 MiB, several pages), so the run maps several convert instances. The stand-in
answers slowly enough (and each instance sends one page at a time) that instances overlap.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.deployment.corpus import Bucket, assert_outputs_name_their_pages, converted, documents
from tests.deployment.harness import POOL, Deployment, wait_until

pytestmark = [pytest.mark.deployment, pytest.mark.timeout(1500)]

DAG = "olmocr_ingest"
LARGE = 2 * 1024 * 1024 + 4096


@contextlib.contextmanager
def slow_server(deployment: Deployment, latency_s: float) -> Iterator[None]:
    previous = deployment.standin.config()["latency_s"]
    deployment.standin.configure(latency_s=latency_s)
    try:
        yield
    finally:
        deployment.standin.configure(latency_s=previous)


def _put_documents(bucket: Bucket, prefix: str, count: int, pages: int, first_id: int) -> dict[str, int]:
    return {
        bucket.put_pdf(f"{prefix}input/doc-{n:02d}.pdf", pages=pages, doc_id=first_id + n, min_bytes=LARGE): first_id
        + n
        for n in range(count)
    }


def _running_converts(deployment: Deployment) -> list[dict[str, Any]]:
    path = "/api/v2/dags/~/dagRuns/~/taskInstances"
    params = {"task_id": "convert", "state": "running", "limit": 100}
    return deployment.api.ok("GET", path, params=params)["task_instances"]


def test_convert_instances_run_on_both_workers_and_never_beyond_the_pool(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None
) -> None:
    prefix = f"workers-{uuid.uuid4().hex[:6]}/"
    doc_ids = _put_documents(bucket, prefix, count=8, pages=3, first_id=160)
    output = bucket.uri(prefix + "output/")
    conf = {"input_uri": bucket.uri(prefix + "input/"), "output_uri": output, "max_concurrent_requests": 1}
    slots = deployment.api.ok("GET", f"/api/v2/pools/{POOL}")["slots"]

    with slow_server(deployment, latency_s=1.0):
        response = deployment.api.trigger(DAG, conf)
        assert response.status_code == 200, response.text
        run_id = response.json()["dag_run_id"]
        most, hosts = 0, set()
        while deployment.api.dag_run(DAG, run_id)["state"] not in ("success", "failed"):
            running = _running_converts(deployment)
            most = max(most, len(running))
            hosts |= {ti["hostname"] for ti in running if ti["dag_run_id"] == run_id}
            time.sleep(0.5)

    assert deployment.api.dag_run(DAG, run_id)["state"] == "success"
    instances = [ti for ti in deployment.api.task_instances(DAG, run_id) if ti["task_id"] == "convert"]
    assert len(instances) > 1, "the run mapped a single convert instance: nothing to spread"
    assert {ti["hostname"] for ti in instances} == set(deployment.cluster.worker_names())
    assert most <= slots, f"{most} convert instances ran at once in a pool of {slots}"
    assert most > 1, "the sampling never saw instances overlap: it proves nothing about the pool"
    assert hosts, "no running instance was ever sampled"
    manifest = bucket.manifest(output, DAG, run_id)
    assert manifest is not None and converted(manifest) == set(doc_ids)
    assert_outputs_name_their_pages(bucket, manifest, doc_ids)


def test_a_killed_worker_loses_no_page(deployment: Deployment, bucket: Bucket, ingest_unpaused: None) -> None:
    """SIGKILL the worker (its whole process group) while it converts: retried on the other worker.

    The killed attempt has already written some documents' outputs; the run's manifest must still
    count every page of every document exactly once, with the tokens and outputs of those documents.
    """
    prefix = f"worker-loss-{uuid.uuid4().hex[:6]}/"
    # Small documents, packed into few instances: the killed one has finished some of its documents.
    doc_ids = {bucket.put_pdf(f"{prefix}input/doc-{n:02d}.pdf", pages=2, doc_id=180 + n): 180 + n for n in range(6)}
    output = bucket.uri(prefix + "output/")
    conf = {"input_uri": bucket.uri(prefix + "input/"), "output_uri": output, "max_concurrent_requests": 1}

    with slow_server(deployment, latency_s=1.5):
        response = deployment.api.trigger(DAG, conf)
        assert response.status_code == 200, response.text
        run_id = response.json()["dag_run_id"]

        def converting_with_some_output() -> dict[str, Any] | None:
            running = [ti for ti in _running_converts(deployment) if ti["dag_run_id"] == run_id]
            if running and bucket.keys(prefix + "output/markdown/"):
                return running[0]
            return None

        victim = wait_until(converting_with_some_output, timeout=600, interval=0.5, what="a convert instance midway")
        killed = victim["hostname"]
        deployment.cluster.kill(killed)
    try:
        run = deployment.api.wait_for_run(DAG, run_id, timeout=900)
    finally:
        deployment.cluster.start_worker(killed)

    assert run["state"] == "success"
    tries = deployment.api.task_tries(DAG, run_id, "convert", victim["map_index"])
    assert tries[0]["hostname"] == killed
    assert tries[-1]["state"] == "success" and tries[-1]["hostname"] != killed
    manifest = bucket.manifest(output, DAG, run_id)
    assert manifest is not None
    docs = documents(manifest)
    assert set(docs) == set(doc_ids)
    assert converted(manifest) == set(doc_ids), {uri: doc["status"] for uri, doc in docs.items()}
    assert all(doc["pages"] == 2 and doc["output_tokens"] > 0 and doc["outputs"] for doc in docs.values())
    assert manifest["counts"]["pages"] == 2 * len(doc_ids)
    assert manifest["counts"]["output_tokens"] == sum(doc["output_tokens"] for doc in docs.values())
    assert_outputs_name_their_pages(bucket, manifest, doc_ids)
