"""One convert instance per document versus the page rule, through a real Celery deployment.

Starts the deployment tier's cluster (``olmocr_testkit.cluster``: api-server, scheduler,
dag-processor, triggerer, two Celery workers with 2 slots each, a pool of 3, PostgreSQL, Redis, moto
S3, the vLLM stand-in) and runs ``olmocr_ingest`` by REST on two corpora, each twice: with
``batch_pages=1`` (every document its own instance) and with the default rule
(``olmocr_tasks.run.batching``). PDFs are padded to 64 KiB per page (``OLMOCR_BYTES_PER_PAGE``'s default)
so that the plan's page estimate is the true page count, as it is for typical real PDFs.

Reported per run: wall time from the REST trigger to the run's end (the manifest is published before
it), convert instances, pages/s, and how many instances each worker ran.

    .venv/bin/python -m bench.mapping            # ~20 minutes on a loaded 2-core machine
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from collections import Counter
from typing import Any

from olmocr_tasks.run.batching import DEFAULT_BYTES_PER_PAGE

DAG = "olmocr_ingest"


def _corpora(small: int, mixed: bool) -> dict[str, list[int]]:
    import random

    rng = random.Random(7)
    corpora = {f"{small} documents of 1-2 pages": [rng.randint(1, 2) for _ in range(small)]}
    if mixed:
        # ~150 pages in 16 documents: a long one, some medium, many short (the bench corpus's shape).
        lengths = [60] + [rng.randint(10, 20) for _ in range(3)] + [rng.randint(1, 5) for _ in range(12)]
        corpora[f"16 documents, {sum(lengths)} pages"] = lengths
    return corpora


def _run(deployment: Any, bucket: Any, prefix: str, batch_pages: int | None) -> dict[str, Any]:
    output = bucket.uri(f"{prefix}output-{batch_pages or 'rule'}/")
    conf: dict[str, Any] = {"input_uri": bucket.uri(prefix + "input/"), "output_uri": output, "scope": "all"}
    if batch_pages is not None:
        conf["batch_pages"] = batch_pages
    started = time.monotonic()
    response = deployment.api.trigger(DAG, conf)
    response.raise_for_status()
    run_id = response.json()["dag_run_id"]
    run = deployment.api.wait_for_run(DAG, run_id, timeout=3600)
    seconds = time.monotonic() - started
    manifest = bucket.manifest(output, DAG, run_id)
    instances = [ti for ti in deployment.api.task_instances(DAG, run_id) if ti["task_id"] == "convert"]
    converted = [doc for doc in (manifest or {}).get("documents", []) if doc["status"] == "converted"]
    pages = sum(doc["pages"] for doc in converted)
    return {
        "batch_pages": batch_pages or "default rule",
        "state": run["state"],
        "seconds": round(seconds, 1),
        "instances": len(instances),
        "documents": len(converted),
        "pages": pages,
        "pages_per_s": round(pages / seconds, 2),
        "instances_per_worker": dict(Counter(str(ti.get("hostname")).split("@")[0] for ti in instances)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=24, help="documents in the small-document corpus")
    parser.add_argument("--no-mixed", action="store_true", help="skip the mixed corpus")
    parser.add_argument("--rule-first", action="store_true", help="run the default rule before one per document")
    args = parser.parse_args()

    from moto.server import ThreadedMotoServer

    from olmocr_testkit import cluster
    from olmocr_testkit.bucket import Bucket
    from olmocr_testkit.cluster import deployment as start_deployment

    # The rule must know how many convert instances run at once: the harness's pool has 3 slots.
    cluster_env = cluster.AirflowCluster.env
    cluster.AirflowCluster.env = lambda self: {**cluster_env(self), "OLMOCR_CONVERT_SLOTS": "3"}  # type: ignore[method-assign]

    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    results = []
    try:
        with start_deployment(f"http://{host}:{port}") as running:
            running.api.set_paused(DAG, False)
            bucket = Bucket(running.moto_url, running.bucket)
            for name, lengths in _corpora(args.small, not args.no_mixed).items():
                prefix = f"mapping-{uuid.uuid4().hex[:8]}/"
                for index, pages in enumerate(lengths):
                    bucket.put_pdf(
                        f"{prefix}input/d{index:04d}.pdf",
                        pages=pages,
                        doc_id=index + 1,
                        min_bytes=pages * DEFAULT_BYTES_PER_PAGE - 2048,
                    )
                for batch_pages in (None, 1) if args.rule_first else (1, None):
                    row = {"corpus": name, **_run(running, bucket, prefix, batch_pages)}
                    print(json.dumps(row), flush=True)
                    results.append(row)
    finally:
        moto.stop()
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
