"""Discovery of 100,000 objects: ``iter_documents`` + an empty ``Ledger.snapshot()`` versus bare boto3.

A moto server runs in this (harness) process and is filled through moto's in-process backend (100,000
PUTs over HTTP would take far longer than the listing under test); both listings then go over HTTP
from a measured child process, so each one's wall time, CPU and peak RSS are its own. The bare side is
the minimum any implementation must do: a paginated ``list_objects_v2`` loop that counts ``.pdf`` keys.
The two are run alternately, twice each, and the faster run of each is compared (the server is shared
and the machine may be busy).

    python -m bench.discovery_scale list {ours,bare} --endpoint URL --bucket B --prefix P --result FILE
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import MotoBucket, subprocess_env
from bench.measure import run_measured

# The child processes reach the harness's bucket with its credentials.
REGION, KEY, SECRET = MotoBucket.REGION, MotoBucket.KEY, MotoBucket.SECRET
PREFIX = "inbox/"


def _key(index: int) -> str:
    # Nested prefixes and mixed letter case, like a real inbox; one object in 20 is not a PDF.
    folder = f"batch{index // 1000:03d}/part{index % 7}"
    if index % 20 == 19:
        return f"{PREFIX}{folder}/notes{index:06d}.txt"
    extension = ".PDF" if index % 10 == 3 else ".pdf"
    return f"{PREFIX}{folder}/doc{index:06d}{extension}"


def expected_pdfs(objects: int) -> int:
    return sum(1 for index in range(objects) if not _key(index).endswith(".txt"))


def _storage_options(endpoint: str) -> dict[str, Any]:
    return {
        "key": KEY,
        "secret": SECRET,
        "client_kwargs": {"endpoint_url": endpoint, "region_name": REGION},
        "config_kwargs": {"s3": {"addressing_style": "path"}},
    }


def list_ours(endpoint: str, bucket: str, prefix: str) -> int:
    from olmocr_tasks.location.ledger import Ledger
    from olmocr_tasks.run.discovery import iter_documents
    from olmocr_tasks.storage.store import Storage

    storage = Storage(_storage_options(endpoint))
    # What a plan does first: the state of the output prefix (empty here), then the input listing.
    Ledger(f"s3://{bucket}/output", storage, "benchkey").snapshot()
    return sum(1 for _ in iter_documents(f"s3://{bucket}/{prefix}", storage))


def list_bare(endpoint: str, bucket: str, prefix: str) -> int:
    import boto3
    from botocore.config import Config

    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=KEY,
        aws_secret_access_key=SECRET,
        config=Config(s3={"addressing_style": "path"}),
    )
    count = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            if item["Key"].lower().endswith(".pdf"):
                count += 1
    return count


def child_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.discovery_scale list")
    parser.add_argument("impl", choices=["ours", "bare"])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--prefix", default=PREFIX)
    parser.add_argument("--result", required=True)
    args = parser.parse_args(argv)
    # Imports are paid before the clock starts: the comparison is about listing, not start-up.
    if args.impl == "ours":
        import s3fs  # noqa: F401

        from olmocr_tasks.location import ledger  # noqa: F401
        from olmocr_tasks.run import discovery  # noqa: F401
    else:
        import boto3  # noqa: F401
    started, cpu = time.perf_counter(), time.process_time()
    count = (list_ours if args.impl == "ours" else list_bare)(args.endpoint, args.bucket, args.prefix)
    result = {"pdfs": count, "seconds": time.perf_counter() - started, "cpu_s": time.process_time() - cpu}
    Path(args.result).write_text(json.dumps(result))
    return 0


# ---------------------------------------------------------------------------- harness side


def _populate(objects: int) -> MotoBucket:
    bucket = MotoBucket("bench-discovery")
    body = b"%PDF-1.4\n% bench placeholder\n%%EOF\n"
    for index in range(objects):
        bucket.put(_key(index), body)
    return bucket


def measure_discovery(work: Path, objects: int = 100_000, repeats: int = 2) -> dict[str, Any]:
    started = time.perf_counter()
    bucket = _populate(objects)
    endpoint = bucket.endpoint
    populate_s = time.perf_counter() - started
    runs: dict[str, list[dict[str, Any]]] = {"bare": [], "ours": []}
    try:
        for attempt in range(repeats):
            for impl in ("bare", "ours"):
                result_path = work / f"discovery-{impl}-{attempt}.json"
                result_path.unlink(missing_ok=True)
                command = [
                    sys.executable, "-m", "bench.discovery_scale", "list", impl, "--endpoint", endpoint,
                    "--bucket", bucket.name, "--result", str(result_path),
                ]  # fmt: skip
                measurement = run_measured(
                    command, label=f"discovery {impl}", env=subprocess_env(), log_path=work / f"discovery-{impl}.log"
                )
                inner = json.loads(result_path.read_text()) if result_path.exists() else {}
                runs[impl].append(
                    {
                        "ok": measurement.returncode == 0 and inner.get("pdfs") == expected_pdfs(objects),
                        "listing_s": round(inner.get("seconds", float("nan")), 3),
                        "listing_cpu_s": round(inner.get("cpu_s", float("nan")), 3),
                        "process_wall_s": round(measurement.wall_s, 3),
                        "peak_rss_mib": round(measurement.max_rss_bytes / 2**20, 1),  # kernel max RSS: exact
                        "pdfs": inner.get("pdfs"),
                    }
                )
    finally:
        bucket.stop()
    best = {impl: min(items, key=lambda item: item["listing_s"]) for impl, items in runs.items()}
    return {
        "objects": objects,
        "pdfs": expected_pdfs(objects),
        "populate_s": round(populate_s, 1),
        "runs": runs,
        "best": best,
        "ok": all(item["ok"] for items in runs.values() for item in items),
        "ratio": round(best["ours"]["listing_s"] / best["bare"]["listing_s"], 3),
        "rss_ratio": round(best["ours"]["peak_rss_mib"] / best["bare"]["peak_rss_mib"], 3),
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["list"]:
        sys.exit(child_main(sys.argv[2:]))
    sys.exit("usage: python -m bench.discovery_scale list ... (the harness runs the rest via bench/run_all.py)")
