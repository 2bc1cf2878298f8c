"""The S3 top-up over a big history (issue 34, "Storage at scale"): what a run that finds 20 new documents
beside N converted ones asks of S3, and how long its listings take, at N = 1,000 / 10,000 / 100,000.

A converted history is not converted here document by document (100,000 one-page documents take ~27
minutes locally and far longer over moto): it is **replicated from a real one**. A template history
of ``--template`` documents is converted first with the real CLI into the store; every object it
wrote is read back and sorted by the document it belongs to, found by that document's identifiers in
the key (its output stem, source id, fingerprint, content SHA-256, owner-record hash and run-folder
entry hash). Each document owns the same six objects (Dolma, markdown, content record, owner record,
source marker, run-folder entry); the plan's batch file, part and start mark repeat per batch of
2,000 (the CLI's batch size); the plan and the manifest are the run's own. Document ``i`` of a
history of N gets the template document's objects with every identifier replaced by its own (key and
contents; sizes stay within a few bytes), and its source PDF is the same generator's
(``bench.scale.one_page_pdf``, 3 lines), so its fingerprint is what the input listing will show. The
pattern is checked on the template itself (rebuilt for the template's documents it must give exactly
the keys the CLI wrote), and every top-up must report ``already_converted == N``: the planner saw the
replicated history as converted.

Then 20 new PDFs are added and ``olmocr-tasks convert`` runs over HTTP (the top-up, the real CLI
against the CPU-bound stand-in, as ``bench.scale --s3`` runs it): its manifest's
``metrics.storage_requests`` (planning, the batches, publishing, run total; by kind) and its wall time
are recorded, as is how long planning took (the CLI's own INFO line after planning, from launch).
One more new PDF is then converted by a run that names it alone (the CLI's single-PDF input): what
planning asks of storage for a run of one document over the same history (REST and S3-event runs name
their documents and plan through the same ``iter_plan``). A child process then times the planner's
two listings alone (``Ledger.snapshot`` and ``iter_documents``, the first thing ``iter_plan`` does),
counting their pages; best of ``--probe-repeats``.

Stores:

* ``--store moto`` (default): moto's server in this process; the history is put through moto's
  in-process backend (fast), the measured runs go over HTTP. moto lists by scanning and sorting the
  whole bucket for every ListObjectsV2 page, so its listing time grows with the bucket per page
  (quadratic over a listing): its times say nothing about S3, its request counts do.
* ``--store endpoint --endpoint URL``: any S3-compatible server, the history put over HTTP (32
  threads). Used with a single-node Ceph RADOS Gateway from Debian's packages
  (``bench/rgw_single_node.sh``), whose bucket index is a sorted key-value map: a page costs O(page),
  as on S3.

Each size gets a bucket of its own (moto's is dropped afterwards, to free its memory). The raw result goes to
``bench/records/s3_topup-<UTC>.json`` with the commit, the machine, the settings, and a model of the
top-up's time on S3 from the request counts (``model_s3``; latencies below). Run it alone::

    flock /tmp/olmocr-bench.lock .venv/bin/python -m bench.s3_topup [--history 1000 10000 100000]
    flock /tmp/olmocr-bench.lock .venv/bin/python -m bench.s3_topup --store endpoint --endpoint http://127.0.0.1:7480
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import re
import subprocess
import sys
import threading
import time
import unicodedata
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import (
    CPU_BOUND,
    MODEL,
    RECORDS_DIR,
    RESULTS_DIR,
    VENV_BIN,
    MotoBucket,
    code_version,
    fresh_dir,
    standin,
    subprocess_env,
)
from bench.measure import run_measured
from bench.scale import one_page_pdf

REPO = Path(__file__).resolve().parents[1]
NEW_DOCUMENTS = 20
LINES = 3
# The CLI converts (and a history's run folder holds) batches of this many documents.
BATCH_DOCUMENTS = 2_000
HISTORY_RUN = "history"
INPUT, OUTPUT = "input", "output"
KEY, SECRET, REGION = MotoBucket.KEY, MotoBucket.SECRET, MotoBucket.REGION

# Per-request latencies of S3 Standard for the model (seconds), from an EC2 client in the bucket's region.
# AWS: small requests (< 512 KB) have "median latencies ... often in the tens of milliseconds" (S3
# performance whitepaper, "Timeouts and Retries for Latency-Sensitive Applications"). A ListObjectsV2
# page of 1,000 keys is a larger answer (~250-300 KB of XML) that S3 assembles from its index: users
# report ~0.2 s a page (aws/aws-sdk-cpp#369: "with a latency of 0.2 secs", 1e6 keys in ~200 s) to
# ~0.33 s (nicprov/cryptzilla#33: ~90,000 keys in ~30 s), and far more from far away
# (aws/aws-sdk-js#252: 0.8-0.9 s a page with boto, 2014). Typical: those reports; low and high bracket them
# (assumptions, not measurements):
LIST_PAGE_S = {"low": 0.1, "typical": 0.2, "high": 0.35}
SMALL_REQUEST_S = {"low": 0.02, "typical": 0.03, "high": 0.06}
# S3 Standard request prices (USD per 1,000; us-east-1 list prices): PUT, COPY, POST, LIST $0.005;
# GET and other reads (HEAD) $0.0004; DELETE free. ``create`` is a conditional PUT.
PRICE_PER_1000 = {"list": 0.005, "write": 0.005, "create": 0.005, "read": 0.0004, "stat": 0.0004, "delete": 0.0}
_PLAN_LINE = re.compile(r"^(\S+ \S+) INFO olmocr_tasks\.run\.planning: run \S+ \(.*\): (\d+) to convert")


# --------------------------------------------------------------------------------------------- stores


class MotoStore:
    """moto's server in this process (``MotoBucket``); history objects through its in-process backend."""

    name = "moto"

    def __init__(self) -> None:
        self._bucket = MotoBucket("s3-topup-probe")
        self.endpoint, self.env, self.backend = self._bucket.endpoint, self._bucket.env, self._bucket.backend
        import moto

        self.version = f"moto {moto.__version__}"

    def create_bucket(self, bucket: str) -> None:
        self.backend.create_bucket(bucket, REGION)

    def put_many(self, bucket: str, items: Iterable[tuple[str, bytes]]) -> int:
        count = 0
        for key, body in items:
            self.backend.put_object(bucket, key, body)
            count += 1
        return count

    def drop_bucket(self, bucket: str) -> None:
        self.backend.buckets.pop(bucket, None)  # frees the keys at once (a real delete is per key)

    def stop(self) -> None:
        self._bucket.stop()


class EndpointStore:
    """Any S3-compatible server at ``endpoint`` (e.g. a local Ceph RADOS Gateway); everything over HTTP."""

    name = "endpoint"

    def __init__(self, endpoint: str, threads: int = 32) -> None:
        import boto3
        from botocore.config import Config

        self.endpoint, self.threads = endpoint, threads
        self.env = subprocess_env(
            AWS_ACCESS_KEY_ID=KEY,
            AWS_SECRET_ACCESS_KEY=SECRET,
            AWS_DEFAULT_REGION=REGION,
            AWS_ENDPOINT_URL=endpoint,
            AWS_EC2_METADATA_DISABLED="true",
        )
        self.client = boto3.client(
            "s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
            config=Config(max_pool_connections=threads * 2, retries={"mode": "standard", "max_attempts": 8}),
        )  # fmt: skip
        server = self.client.list_buckets()["ResponseMetadata"]["HTTPHeaders"].get("server", "")
        self.version = f"S3-compatible server at {endpoint} ({server or 'unnamed'})"

    def create_bucket(self, bucket: str) -> None:
        self.client.create_bucket(Bucket=bucket)

    def put_many(self, bucket: str, items: Iterable[tuple[str, bytes]]) -> int:
        count = 0
        lock = threading.Lock()

        def put(item: tuple[str, bytes]) -> None:
            nonlocal count
            self.client.put_object(Bucket=bucket, Key=item[0], Body=item[1])
            with lock:
                count += 1

        with ThreadPoolExecutor(self.threads) as pool:
            # Bounded in flight: the generator makes bodies as the pool takes them.
            pending: list[Any] = []
            for item in items:
                pending.append(pool.submit(put, item))
                if len(pending) >= self.threads * 8:
                    for done in pending:
                        done.result()
                    pending.clear()
            for done in pending:
                done.result()
        return count

    def drop_bucket(self, bucket: str) -> None:
        # Left in place: deleting 700,000 objects a batch of 1,000 at a time takes longer than the
        # measurement, other buckets do not change a bucket's listing, and a bench server is thrown away.
        pass

    def stop(self) -> None:
        pass


Store = MotoStore | EndpointStore


def _http_client(store: Store) -> Any:
    import boto3

    return boto3.client(
        "s3", endpoint_url=store.endpoint, region_name=REGION, aws_access_key_id=KEY, aws_secret_access_key=SECRET
    )


def _all_objects(store: Store, bucket: str, prefix: str = "") -> dict[str, bytes]:
    """Every object under ``prefix`` with its bytes, over HTTP (the template only: a few hundred)."""
    client = _http_client(store)
    found: dict[str, bytes] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for item in page.get("Contents", []):
            found[item["Key"]] = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
    return found


# ------------------------------------------------------------------------------------ the documents


def input_key(doc_id: int) -> str:
    """``bench.scale``'s layout: 1,000 documents to a sub-folder, as an archive would nest them."""
    return f"{INPUT}/part{doc_id // 1000:04d}/doc{doc_id:07d}.pdf"


def identifiers(bucket: str, doc_id: int) -> dict[str, str]:
    """What names document ``doc_id`` in the keys and contents of its objects (none is a substring of another's)."""
    from olmocr_tasks.location.ledger import fingerprint, source_id
    from olmocr_tasks.location.outputs import output_stem
    from olmocr_tasks.storage.store import ObjectInfo

    pdf = one_page_pdf(doc_id, LINES)
    uri = f"s3://{bucket}/{input_key(doc_id)}"
    stem = output_stem(uri, f"s3://{bucket}/{INPUT}/")
    # The input listing's ETag of a single-part PUT is the MD5 of the bytes (moto and S3 alike).
    info = ObjectInfo(uri, len(pdf), hashlib.md5(pdf).hexdigest(), datetime.now(UTC))
    return {
        "stem": stem,
        "source_id": source_id(uri),
        "fingerprint": fingerprint(info),
        "sha256": hashlib.sha256(pdf).hexdigest(),
        "owner": hashlib.sha256(unicodedata.normalize("NFC", stem).casefold().encode()).hexdigest(),
        "entry": hashlib.sha1(uri.encode()).hexdigest(),
    }


def batch_key(doc_id: int) -> str:
    from olmocr_tasks.run.pipeline import cli_batch_key

    return cli_batch_key(doc_id // BATCH_DOCUMENTS)


@dataclass
class HistoryPattern:
    """A converted history's objects by owner: per document, per batch, once per run (keys below the bucket)."""

    bucket: str
    doc_id: int  # the template document whose objects are the per-document pattern
    per_document: dict[str, bytes] = field(default_factory=dict)
    per_batch: dict[str, bytes] = field(default_factory=dict)
    per_run: dict[str, bytes] = field(default_factory=dict)

    @property
    def conversion_key(self) -> str:
        """The partition of the state the history was converted under (``_state/<conv>/sources/``)."""
        for key in self.per_document:
            match = re.search(r"/_state/([^/]+)/sources/", key)
            if match:
                return match[1]
        raise AssertionError("the template history has no source marker")

    def _substitutions(self, bucket: str, doc_id: int) -> list[tuple[str, str]]:
        mine, theirs = identifiers(self.bucket, self.doc_id), identifiers(bucket, doc_id)
        pairs = [(mine[name], theirs[name]) for name in mine]
        pairs += [(batch_key(self.doc_id), batch_key(doc_id)), (f"s3://{self.bucket}/", f"s3://{bucket}/")]
        # Longest first: the source id is the first 32 hex digits of the run-folder entry's SHA-1.
        return sorted(pairs, key=lambda pair: -len(pair[0]))

    def key_pattern(self, key: str) -> str:
        """A per-document key with the template document's identifiers named (``{stem}``, ``{sha256}``...)."""
        names = identifiers(self.bucket, self.doc_id) | {"batch": batch_key(self.doc_id)}
        for name, value in sorted(names.items(), key=lambda item: -len(item[1])):
            key = key.replace(value, "{" + name + "}")
        return key

    def document_objects(self, bucket: str, doc_id: int) -> Iterator[tuple[str, bytes]]:
        pairs = self._substitutions(bucket, doc_id)
        for key, body in self.per_document.items():
            text_key, text = key, body.decode("utf-8")
            for old, new in pairs:
                text_key, text = text_key.replace(old, new), text.replace(old, new)
            yield text_key, text.encode("utf-8")

    def run_objects(self, bucket: str, documents: int) -> Iterator[tuple[str, bytes]]:
        own = f"s3://{self.bucket}/"
        for key, body in self.per_run.items():
            yield key, body.replace(own.encode(), f"s3://{bucket}/".encode())
        template_batch = batch_key(self.doc_id)
        for first in range(0, documents, BATCH_DOCUMENTS):
            for key, body in self.per_batch.items():
                yield (
                    key.replace(template_batch, batch_key(first)),
                    body.replace(own.encode(), f"s3://{bucket}/".encode()),
                )

    def history(self, bucket: str, documents: int) -> Iterator[tuple[str, bytes]]:
        """Every object of a converted history of ``documents`` documents, input PDFs included."""
        yield from self.run_objects(bucket, documents)
        for doc_id in range(documents):
            yield input_key(doc_id), one_page_pdf(doc_id, LINES)
            yield from self.document_objects(bucket, doc_id)


def learn_pattern(objects: dict[str, bytes], bucket: str, documents: int) -> HistoryPattern:
    """Sort a converted template history's objects by owner and check that the pattern rebuilds it."""
    owner_of: dict[str, int] = {}
    ids = {doc_id: identifiers(bucket, doc_id) for doc_id in range(documents)}
    for key in objects:
        if key.startswith(f"{INPUT}/"):
            continue
        owners = [doc_id for doc_id, names in ids.items() if any(value in key for value in names.values())]
        if len(owners) > 1:
            raise AssertionError(f"{key} names {len(owners)} documents")
        if owners:
            owner_of[key] = owners[0]
    template = documents // 2
    pattern = HistoryPattern(bucket, template)
    batch = batch_key(template)
    for key, body in objects.items():
        if key.startswith(f"{INPUT}/"):
            continue
        if key in owner_of:
            if owner_of[key] == template:
                pattern.per_document[key] = body
        elif batch in key:
            pattern.per_batch[key] = body
        else:
            pattern.per_run[key] = body
    # Rebuilt for the template's own documents, the pattern must give exactly the keys the CLI wrote.
    rebuilt = {key for doc_id in range(documents) for key, _ in pattern.document_objects(bucket, doc_id)}
    rebuilt |= {key for key, _ in pattern.run_objects(bucket, documents)}
    written = {key for key in objects if not key.startswith(f"{INPUT}/")}
    if rebuilt != written:
        raise AssertionError(f"pattern mismatch: {sorted(rebuilt ^ written)[:10]}")
    return pattern


# --------------------------------------------------------------------------------------- the runs


def _convert(store: Store, bucket: str, run_id: str, server: str, log: Path, source: str = f"{INPUT}/") -> Any:
    """``olmocr-tasks convert`` of ``source`` (the input folder, or one PDF of it) into the bucket's output."""
    command = [
        str(VENV_BIN / "olmocr-tasks"), "--log-level", "INFO", "convert", f"s3://{bucket}/{source}",
        f"s3://{bucket}/{OUTPUT}", "--server", server, "--model", MODEL, "--run-id", run_id,
    ]  # fmt: skip
    launched = time.time()
    measured = run_measured(command, label=run_id, env=store.env, log_path=log, timeout_s=4 * 3600)
    measured.extra["launched"] = launched
    return measured


def _planned_after_s(log: Path, launched: float) -> float | None:
    """Seconds from launch to the CLI's INFO line that closes planning (None: not found)."""
    for line in log.read_text(errors="replace").splitlines():
        match = _PLAN_LINE.match(line)
        if match:
            logged = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").astimezone()
            return round(logged.timestamp() - launched, 2)
    return None


def _summary(store: Store, bucket: str, run_id: str) -> dict[str, Any] | None:
    client = _http_client(store)
    try:
        body = client.get_object(Bucket=bucket, Key=f"{OUTPUT}/manifests/{run_id}.json")["Body"].read()
    except client.exceptions.NoSuchKey:
        return None
    return json.loads(body)


def template_history(
    store: Store, work: Path, server: str, documents: int, tag: str
) -> tuple[HistoryPattern, dict[str, Any]]:
    bucket = f"s3-topup-{tag}-template"
    store.create_bucket(bucket)
    store.put_many(bucket, ((input_key(doc_id), one_page_pdf(doc_id, LINES)) for doc_id in range(documents)))
    measured = _convert(store, bucket, HISTORY_RUN, server, work / "template.log")
    summary = _summary(store, bucket, HISTORY_RUN) or {}
    if measured.returncode != 0 or (summary.get("counts") or {}).get("converted") != documents:
        raise SystemExit(f"the template history did not convert: see {work / 'template.log'}")
    objects = _all_objects(store, bucket)
    pattern = learn_pattern(objects, bucket, documents)
    store.drop_bucket(bucket)
    kinds: dict[str, int] = {}
    for key in pattern.per_document:
        parts = key.split("/")
        if "/entries/" in key:
            kind = "run-folder entry"
        elif parts[1] == "_state":
            kind = (
                "owner record" if parts[2] == "output-owners" else {"sources": "source marker"}.get(parts[3], parts[3])
            )
        else:
            kind = parts[1]
        kinds[kind] = kinds.get(kind, 0) + 1
    figures = {
        "documents": documents,
        "objects": len(objects),
        "wall_s": round(measured.wall_s, 2),
        "objects_per_document": len(pattern.per_document),
        "per_document": {pattern.key_pattern(key): len(body) for key, body in sorted(pattern.per_document.items())},
        "per_document_kinds": kinds,
        "per_batch": sorted(pattern.per_batch),
        "per_run": sorted(pattern.per_run),
        "storage_requests": ((summary.get("metrics") or {}).get("storage_requests")),
    }
    return pattern, figures


def _request_figures(summary: dict[str, Any] | None) -> dict[str, Any]:
    requests = ((summary or {}).get("metrics") or {}).get("storage_requests") or {}
    return {
        "planning": (requests.get("planning") or {}).get("by_kind"),
        "batches": requests.get("by_kind"),
        "publishing": (requests.get("publishing") or {}).get("by_kind"),
        "run_total": requests.get("run_total"),
        "per_converted_document": requests.get("per_converted_document"),
    }


def probe_listings(store: Store, bucket: str, conversion_key: str, work: Path, repeats: int) -> dict[str, Any]:
    """The planner's two listings alone, in a child process (imports paid before the clock): best of ``repeats``."""
    runs = []
    for attempt in range(repeats):
        result = work / f"listing-{bucket}-{attempt}.json"
        result.unlink(missing_ok=True)
        command = [
            sys.executable, "-m", "bench.s3_topup", "list", "--bucket", bucket, "--conversion-key", conversion_key,
            "--result", str(result),
        ]  # fmt: skip
        completed = subprocess.run(command, env=store.env, cwd=REPO, capture_output=True, text=True, timeout=3600)
        if completed.returncode != 0 or not result.exists():
            raise SystemExit(f"listing probe failed: {completed.stderr[-2000:]}")
        runs.append(json.loads(result.read_text()))
    return {"runs": runs, "best": min(runs, key=lambda run: run["total_s"])}


def listing_child(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.s3_topup list")
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--conversion-key", required=True)
    parser.add_argument("--result", required=True)
    args = parser.parse_args(argv)
    from olmocr_tasks.location.ledger import Ledger
    from olmocr_tasks.run.discovery import iter_documents
    from olmocr_tasks.storage.store import Storage

    storage = Storage()  # the AWS_* environment, as the CLI's
    conversion_key = args.conversion_key
    result: dict[str, Any] = {}
    started = time.perf_counter()
    before = storage.requests.counts()["list"]
    snapshot = Ledger(f"s3://{args.bucket}/{OUTPUT}", storage, conversion_key).snapshot()
    result["state_s"] = round(time.perf_counter() - started, 3)
    result["state_pages"] = storage.requests.counts()["list"] - before
    result["state_versions"] = len(snapshot)
    middle, before = time.perf_counter(), storage.requests.counts()["list"]
    result["input_pdfs"] = sum(1 for _ in iter_documents(f"s3://{args.bucket}/{INPUT}/", storage))
    result["input_s"] = round(time.perf_counter() - middle, 3)
    result["input_pages"] = storage.requests.counts()["list"] - before
    result["total_s"] = round(time.perf_counter() - started, 3)
    pages = result["state_pages"] + result["input_pages"]
    result["s_per_page"] = round(result["total_s"] / pages, 4) if pages else None
    Path(args.result).write_text(json.dumps(result))
    return 0


def model_s3(planning: dict[str, int], batches: dict[str, int], publishing: dict[str, int]) -> dict[str, Any]:
    """The top-up's storage time and request cost on S3 from its request counts.

    Planning's requests are sequential (each listing page needs the previous page's continuation
    token; the two listings run one after the other), so planning = LIST pages x page latency + its
    other requests x small-request latency. The new documents' requests are shown sequentially (an upper
    bound: the CLI converts documents concurrently), publishing's likewise.
    """
    out: dict[str, Any] = {"assumptions": {"list_page_s": LIST_PAGE_S, "small_request_s": SMALL_REQUEST_S}}
    for case in ("low", "typical", "high"):
        list_s, small_s = LIST_PAGE_S[case], SMALL_REQUEST_S[case]

        def seconds(counts: dict[str, int], list_s: float = list_s, small_s: float = small_s) -> float:
            return counts.get("list", 0) * list_s + sum(v for k, v in counts.items() if k != "list") * small_s

        out[case] = {
            "planning_s": round(seconds(planning), 1),
            "new_documents_sequential_s": round(seconds(batches), 1),
            "publishing_s": round(seconds(publishing), 1),
        }
    every = [planning, batches, publishing]
    out["request_cost_usd"] = round(
        sum(counts.get(kind, 0) * price / 1000 for counts in every for kind, price in PRICE_PER_1000.items()), 5
    )
    out["planning_request_cost_usd"] = round(
        sum(planning.get(kind, 0) * price / 1000 for kind, price in PRICE_PER_1000.items()), 5
    )
    return out


def measure_size(
    store: Store, pattern: HistoryPattern, documents: int, work: Path, server: str, probe_repeats: int, tag: str
) -> dict[str, Any]:
    bucket = f"s3-topup-{tag}-{documents}"
    store.create_bucket(bucket)
    started = time.perf_counter()
    put = store.put_many(bucket, pattern.history(bucket, documents))
    history_s = time.perf_counter() - started
    store.put_many(
        bucket, ((input_key(i), one_page_pdf(i, LINES)) for i in range(documents, documents + NEW_DOCUMENTS))
    )
    run_id = f"topup-{documents}"
    log = work / f"{run_id}.log"
    measured = _convert(store, bucket, run_id, server, log)
    summary = _summary(store, bucket, run_id)
    counts = (summary or {}).get("counts") or {}
    requests = _request_figures(summary)
    # One more new document, converted by a run that names it alone (the CLI's single-PDF input): what
    # planning lists for a run of one document over the same history (REST and S3-event runs, which
    # name their documents, plan through the same ``iter_plan``).
    single = documents + NEW_DOCUMENTS
    store.put_many(bucket, [(input_key(single), one_page_pdf(single, LINES))])
    single_measured = _convert(
        store, bucket, f"single-{documents}", server, work / f"single-{documents}.log", input_key(single)
    )
    single_summary = _summary(store, bucket, f"single-{documents}")
    single_counts = (single_summary or {}).get("counts") or {}
    listing = probe_listings(store, bucket, pattern.conversion_key, work, probe_repeats)
    row: dict[str, Any] = {
        "history_documents": documents,
        "ok": measured.returncode == 0
        and counts.get("converted") == NEW_DOCUMENTS
        and counts.get("already_converted") == documents
        and not counts.get("failed"),
        "history_objects_put": put,
        "history_put_s": round(history_s, 1),
        "objects_in_bucket": put + NEW_DOCUMENTS,
        "top_up_wall_s": round(measured.wall_s, 2),
        "top_up_planned_after_s": _planned_after_s(log, measured.extra["launched"]),
        "top_up_peak_rss_mib": round(measured.peak_rss_bytes / 2**20, 1),
        "counts": counts,
        "storage_requests": requests,
        "expected_planning_list_pages": {
            "input": math.ceil((documents + NEW_DOCUMENTS) / 1000),
            "state_sources": math.ceil(documents / 1000),
            "own_run_folder": 1,
        },
        "single_document_run": {
            "ok": single_measured.returncode == 0 and single_counts.get("converted") == 1,
            "wall_s": round(single_measured.wall_s, 2),
            "planned_after_s": _planned_after_s(work / f"single-{documents}.log", single_measured.extra["launched"]),
            "storage_requests": _request_figures(single_summary),
        },
        "listing_probe": listing,
        "load_before": measured.load_before,
        "load_after": measured.load_after,
    }
    if requests["planning"] and requests["batches"] and requests["publishing"]:
        row["model_s3"] = model_s3(requests["planning"], requests["batches"], requests["publishing"])
    store.drop_bucket(bucket)
    return row


def _shown_arguments(arguments: list[str]) -> list[str]:
    """The command line as recorded: ``--work`` (a path of this machine) left out."""
    shown: list[str] = []
    skip = False
    for argument in arguments:
        if skip:
            skip = False
        elif argument == "--work":
            skip = True
        elif not argument.startswith("--work="):
            shown.append(argument)
    return shown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--history", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--store", choices=["moto", "endpoint"], default="moto")
    parser.add_argument("--endpoint", help="the S3-compatible server of --store endpoint")
    parser.add_argument("--template", type=int, default=40, help="documents of the converted template history")
    parser.add_argument("--probe-repeats", type=int, default=2, help="timed runs of the planner's listings alone")
    parser.add_argument("--work", type=Path, default=RESULTS_DIR / "s3_topup-work")
    args = parser.parse_args(argv)
    if args.store == "endpoint" and not args.endpoint:
        parser.error("--store endpoint needs --endpoint URL")
    work = fresh_dir(args.work)
    utc = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    record: dict[str, Any] = {
        "bench": "s3_topup",
        "utc": utc,
        "git_head": code_version(),
        "command": "python -m bench.s3_topup " + " ".join(_shown_arguments(argv if argv is not None else sys.argv[1:])),
        "machine": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "settings": {
            "regime": CPU_BOUND.name,
            **CPU_BOUND.settings(),
            "lines_per_page": LINES,
            "new_documents": NEW_DOCUMENTS,
            "cli": "olmocr-tasks convert with its defaults",
        },
        "sizes": [],
    }
    store: Store = MotoStore() if args.store == "moto" else EndpointStore(args.endpoint)
    record["store"] = {"kind": store.name, "version": store.version}
    RECORDS_DIR.mkdir(parents=True, exist_ok=True)
    path = RECORDS_DIR / f"s3_topup-{utc}.json"
    try:
        with standin(CPU_BOUND) as server:
            # Buckets named by this invocation: a server kept from an earlier one may still hold its buckets.
            tag = utc.lower()
            pattern, record["template"] = template_history(store, work, server.url, args.template, tag)
            print(json.dumps({"template": record["template"]["per_document_kinds"]}), flush=True)
            for documents in args.history:
                row = measure_size(store, pattern, documents, work, server.url, args.probe_repeats, tag)
                row["at"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                record["sizes"].append(row)
                path.write_text(json.dumps(record, indent=1) + "\n")
                shown = {k: row[k] for k in ("history_documents", "ok", "history_put_s", "top_up_wall_s")}
                shown["planning"] = row["storage_requests"]["planning"]
                shown["listing_s"] = row["listing_probe"]["best"]["total_s"]
                shown["single_document_planning"] = row["single_document_run"]["storage_requests"]["planning"]
                print(json.dumps(shown), flush=True)
    finally:
        store.stop()
    print(path)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["list"]:
        sys.exit(listing_child(sys.argv[2:]))
    sys.exit(main())
