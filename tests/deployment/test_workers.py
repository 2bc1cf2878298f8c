"""Convert instances on two Celery workers: spread over both, bounded by the pool, and surviving a lost worker.

Each worker has 2 slots (4 in all) and the ``olmocr_vllm`` pool 3, so the pool, not the workers, is
what bounds concurrent convert instances, and whenever 3 run, both workers run one. The documents
are large (over 2 MiB, several pages), so the run maps several convert instances. The stand-in
answers slowly enough (and each instance sends one page at a time) that instances overlap.
"""

from __future__ import annotations

import contextlib
import signal
from datetime import datetime
from typing import Any

import pytest

from olmocr_testkit.bucket import Bucket
from olmocr_testkit.cluster import POOL, Deployment, signal_each, wait_until
from tests.deployment.published import (
    assert_outputs_name_their_pages,
    converted,
    documents,
    not_converted,
    sources,
)

pytestmark = [pytest.mark.deployment, pytest.mark.timeout(1500)]

DAG = "olmocr_ingest"
LARGE = 2 * 1024 * 1024 + 4096


def _put_documents(bucket: Bucket, prefix: str, count: int, pages: int, first_id: int) -> dict[str, int]:
    return {
        bucket.put_pdf(f"{prefix}input/doc-{n:02d}.pdf", pages=pages, doc_id=first_id + n, min_bytes=LARGE): first_id
        + n
        for n in range(count)
    }


def test_convert_instances_run_on_both_workers_and_never_beyond_the_pool(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None, prefix: str
) -> None:
    doc_ids = _put_documents(bucket, prefix, count=8, pages=3, first_id=160)
    output = bucket.uri(prefix + "output/")
    conf = {"input_uri": bucket.uri(prefix + "input/"), "output_uri": output, "max_concurrent_requests": 1}
    slots = deployment.api.ok("GET", f"/api/v2/pools/{POOL}")["slots"]

    with deployment.slow_server(latency_s=1.0):
        response = deployment.api.trigger(DAG, conf)
        assert response.status_code == 200, response.text
        run_id = response.json()["dag_run_id"]
        run = deployment.api.wait_for_run(DAG, run_id, timeout=1200)

    assert run["state"] == "success"
    instances = [ti for ti in deployment.api.task_instances(DAG, run_id) if ti["task_id"] == "convert"]
    assert len(instances) > 1, "the run mapped a single convert instance: nothing to spread"
    assert {ti["hostname"] for ti in instances} == set(deployment.cluster.worker_names())
    # The pool's bound from Airflow's own record of every instance that ran in it meanwhile (any run's),
    # each from its start to its end: no moment is missed, as sampling the running ones could.
    most, at = _most_at_once(_pool_instances(deployment, run["start_date"], run["end_date"]))
    assert most <= slots, f"{most} instances ran at once in the pool of {slots} at {at}"
    assert most > 1, "no two instances ever ran at once: the run proves nothing about the pool"
    manifest = bucket.manifest(output, DAG, run_id)
    assert manifest is not None
    assert sources(manifest) == converted(manifest) == sorted(doc_ids), not_converted(manifest)
    assert_outputs_name_their_pages(bucket, manifest, doc_ids)


def _pool_instances(deployment: Deployment, start: str, end: str) -> list[dict[str, Any]]:
    """Every task instance of the vLLM pool (any DAG, any run) that was running between ``start`` and ``end``."""
    params = {"pool": POOL, "start_date_lte": end, "limit": 1000}
    found = deployment.api.ok("GET", "/api/v2/dags/~/dagRuns/~/taskInstances", params=params)["task_instances"]
    return [
        ti
        for ti in found
        if ti["start_date"] is not None and (ti["end_date"] is None or _at(ti["end_date"]) > _at(start))
    ]


def _most_at_once(instances: list[dict[str, Any]]) -> tuple[int, str | None]:
    """The most instances running at one moment, and that moment (each runs from start_date to end_date).

    At equal times an end counts before a start: Airflow gives a slot to the next instance only once
    the one holding it has ended."""
    events = sorted(
        [(_at(ti["start_date"]), 1) for ti in instances]
        + [(_at(ti["end_date"]), -1) for ti in instances if ti["end_date"] is not None]
    )
    most, running, moment = 0, 0, None
    for when, step in events:
        running += step
        if running > most:
            most, moment = running, when.isoformat()
    return most, moment


def _at(timestamp: str) -> datetime:
    return datetime.fromisoformat(timestamp)


def _planned_batches(deployment: Deployment, run_id: str) -> list[dict[str, Any]] | None:
    """The batches ``plan`` mapped ``convert`` over, by map index (its XCom), once it has succeeded."""
    path = f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/plan/xcomEntries/return_value"
    response = deployment.api.request("GET", path, params={"map_index": -1})
    return response.json()["value"] if response.status_code == 200 else None


def _packed_run(deployment: Deployment, bucket: Bucket, prefix: str, first_id: int) -> tuple[str, dict[str, int], str]:
    """Trigger a run of 8 two-page documents packed four to a convert instance; return run id, ids, output."""
    doc_ids = {
        bucket.put_pdf(f"{prefix}input/doc-{n:02d}.pdf", pages=2, doc_id=first_id + n): first_id + n for n in range(8)
    }
    output = bucket.uri(prefix + "output/")
    conf = {
        "input_uri": bucket.uri(prefix + "input/"),
        "output_uri": output,
        "max_concurrent_requests": 1,
        "batch_pages": 8,
    }
    response = deployment.api.trigger(DAG, conf)
    assert response.status_code == 200, response.text
    return response.json()["dag_run_id"], doc_ids, output


def _attempt_midway(deployment: Deployment, bucket: Bucket, prefix: str, run_id: str) -> dict[str, Any]:
    """A running first attempt of a convert instance that has finished some of its documents, not all.

    Finished documents are the entries its attempt saved (``_runs/.../attempts/<batch>/try-0001/entries/``).
    """
    batches = wait_until(lambda: _planned_batches(deployment, run_id), timeout=600, interval=1, what="the plan")
    assert all(batch["documents"] > 1 for batch in batches), batches

    def midway() -> dict[str, Any] | None:
        keys = bucket.keys(prefix + "output/_runs/")
        for ti in (ti for ti in deployment.running_converts() if ti["dag_run_id"] == run_id):
            batch = batches[ti["map_index"]]
            finished = [key for key in keys if f"/attempts/{batch['batch']}/try-0001/entries/" in key]
            if ti["try_number"] == 1 and 0 < len(finished) < batch["documents"]:
                return ti
        return None

    return wait_until(midway, timeout=600, interval=0.5, what="a convert attempt midway through its batch")


def _assert_every_page_counted_once(bucket: Bucket, output: str, run_id: str, doc_ids: dict[str, int]) -> None:
    manifest = bucket.manifest(output, DAG, run_id)
    assert manifest is not None, "the run published no manifest"
    assert sources(manifest) == sorted(doc_ids), "each document listed exactly once"
    assert converted(manifest) == sorted(doc_ids), not_converted(manifest)
    docs = documents(manifest)
    assert all(doc["pages"] == 2 and doc["output_tokens"] > 0 and doc["outputs"] for doc in docs.values())
    assert manifest["counts"]["pages"] == 2 * len(doc_ids)
    assert manifest["counts"]["output_tokens"] == sum(doc["output_tokens"] for doc in docs.values())
    assert_outputs_name_their_pages(bucket, manifest, doc_ids)


def test_a_killed_worker_loses_no_page(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None, prefix: str
) -> None:
    """SIGKILL the worker (its whole process group) midway through a batch: retried on the other worker.

    The killed attempt has already finished some of its batch's documents; the run's manifest must
    still count every page of every document exactly once, with the tokens and outputs of those.
    """
    with deployment.slow_server(latency_s=1.5):
        run_id, doc_ids, output = _packed_run(deployment, bucket, prefix, first_id=180)
        victim = _attempt_midway(deployment, bucket, prefix, run_id)
        killed = victim["hostname"]
        deployment.cluster.kill(killed)
    run = deployment.api.wait_for_run(DAG, run_id, timeout=900)
    # Back to two workers for the tests after this one (the shared_deployment_restored fixture would
    # otherwise, after the test).
    deployment.cluster.start_worker(killed)

    assert run["state"] == "success"
    tries = deployment.api.task_tries(DAG, run_id, "convert", victim["map_index"])
    assert tries[0]["hostname"] == killed
    assert tries[-1]["state"] == "success" and tries[-1]["hostname"] != killed
    _assert_every_page_counted_once(bucket, output, run_id, doc_ids)


def _alive(pid: int) -> bool:
    import psutil

    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    return False


def _published(bucket: Bucket, output: str, run_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """What a manifest says about its documents, without the times that differ between publications."""
    manifest = bucket.manifest(output, DAG, run_id)
    assert manifest is not None, "the run published no manifest"
    docs = {
        source: {key: doc.get(key) for key in ("status", "pages", "output_tokens", "outputs", "task")}
        for source, doc in documents(manifest).items()
    }
    return docs, manifest["counts"]


def test_a_stale_attempt_that_comes_back_changes_nothing_its_retry_did(
    deployment: Deployment, bucket: Bucket, ingest_unpaused: None, prefix: str
) -> None:
    """A convert attempt stops answering (its supervisor and task process SIGSTOPped) midway through its
    batch: Airflow times out its heartbeat and retries it. While the retry runs, the stale attempt
    comes back (SIGCONT) and carries on until its supervisor learns the try is over; whatever it writes
    stays in its own try. The manifest counts every page once, and publishing again (the publish task
    cleared) once the stale attempt is gone gives the same manifest: nothing of it got in.
    """
    with deployment.slow_server(latency_s=1.5):
        run_id, doc_ids, output = _packed_run(deployment, bucket, prefix, first_id=190)
        victim = _attempt_midway(deployment, bucket, prefix, run_id)
        stale = deployment.cluster.task_attempt_processes(victim["id"])
        assert len(stale) == 2, f"no supervisor and task process found for {victim['id']}"
        signal_each(stale, signal.SIGSTOP)
        try:

            def retry_running() -> list[dict[str, Any]] | None:
                tries = deployment.api.task_tries(DAG, run_id, "convert", victim["map_index"])
                return tries if len(tries) > 1 and tries[-1]["state"] in ("running", "success") else None

            tries = wait_until(retry_running, timeout=900, interval=1, what="the retry of the silent attempt")
        finally:
            signal_each(stale, signal.SIGCONT)
        run = deployment.api.wait_for_run(DAG, run_id, timeout=900)
    # The supervisor is a Celery pool process and stays; the task process ends once it learns its try is over.
    task_process = stale[1]
    wait_until(lambda: not _alive(task_process), timeout=300, interval=1, what="the stale task process gone")

    assert tries[0]["try_number"] == 1 and tries[-1]["try_number"] >= 2
    assert run["state"] == "success"
    _assert_every_page_counted_once(bucket, output, run_id, doc_ids)
    first = _published(bucket, output, run_id)

    # Publish again now that the stale attempt has written all it ever will: the same manifest.
    path = f"/api/v2/dags/{DAG}/clearTaskInstances"
    body = {"dry_run": False, "dag_run_id": run_id, "task_ids": ["publish_manifest"], "include_downstream": True}
    deployment.api.ok("POST", path, json={**body, "only_failed": False, "reset_dag_runs": True})
    republished = deployment.api.wait_for_run(DAG, run_id, timeout=600)
    assert republished["state"] == "success"
    assert _published(bucket, output, run_id) == first
