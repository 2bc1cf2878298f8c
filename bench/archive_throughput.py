"""Backfills of small documents through the Celery deployment against the CLI (issue 34's scenario).

    .venv/bin/python -m bench.archive_throughput [--classes low,normal] [--pool-slots 2 4] [--repeat N]

The deployment is the one the deployment tests run (``olmocr_testkit/cluster.py``: api-server,
scheduler, dag-processor, triggerer, two Celery workers x 2) with the defaults a user gets except the
``olmocr_vllm`` pool's slots (``--pool-slots``; 2 is the scenario's, the first value given; further values
are set through the REST API between passes, e.g. 4 to match ``OLMOCR_CONVERT_SLOTS``' default) and
the 1-slot ``olmocr_vllm_high`` pool compose's init creates. The stand-in serves 8 concurrent x 0.5 s
(16 pages/s). Two corpora:

* 480 distinct one-page documents;
* 689 pages in 25 documents (seeded lengths).

For each corpus: ``olmocr-tasks convert`` on the folder (the CLI, process wall from start to exit),
then one ``scope=all`` REST run per class (``auto`` is what a manual run over everything gets: low),
timed from ``POST .../dagRuns`` until its manifest exists. Per run the bench also records where the
time went (each task's start, queued → running and running, from the task instances over REST) and
how the plan cut the run (convert instances, the documents and seconds of each).

Run it alone (``flock /tmp/olmocr-bench.lock``); writes ``bench/records/archive_throughput-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import (
    BACKPRESSURE,
    MODEL,
    RECORDS_DIR,
    RESULTS_DIR,
    code_version,
    fresh_dir,
    run_to_manifest,
    standin,
)
from bench.corpus import CORPUS_ROOT, Corpus
from bench.run_cli import manifest_check, measure_cli

DAG_ID = "olmocr_ingest"


def one_page_documents(count: int) -> Corpus:
    from olmocr_testkit.pdfgen import text_pdf

    folder = CORPUS_ROOT / f"one-page-{count}"
    documents = tuple((f"page{index:05d}.pdf", 1) for index in range(count))
    if not all((folder / name).is_file() for name, _ in documents):
        folder.mkdir(parents=True, exist_ok=True)
        for index, (name, _) in enumerate(documents):
            # Distinct bytes per file (body length and marker), so none is skipped as a duplicate.
            (folder / name).write_bytes(text_pdf(1, 1 + index % 250, body_lines=20 + index // 250))
    return Corpus(folder, documents)


def mixed_documents(pages: int = 689, count: int = 25, seed: int = 34) -> Corpus:
    """``count`` documents of seeded lengths summing to ``pages``."""
    from olmocr_testkit.pdfgen import text_pdf

    rng = random.Random(seed)
    weights = [rng.uniform(0.2, 3.0) for _ in range(count)]
    lengths = [max(1, int(pages * weight / sum(weights))) for weight in weights]
    lengths[0] += pages - sum(lengths)
    folder = CORPUS_ROOT / f"mixed-{pages}-{count}-s{seed}"
    documents = tuple((f"doc{index:03d}.pdf", length) for index, length in enumerate(lengths))
    if not all((folder / name).is_file() for name, _ in documents):
        folder.mkdir(parents=True, exist_ok=True)
        for index, (name, length) in enumerate(documents):
            (folder / name).write_bytes(text_pdf(length, 1 + index, body_lines=24))
    return Corpus(folder, documents)


def _at(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _span(start: str | None, end: str | None) -> float | None:
    a, b = _at(start), _at(end)
    return None if a is None or b is None else round((b - a).total_seconds(), 2)


def timeline(api: Any, run: dict[str, Any]) -> dict[str, Any]:
    """Each task's offsets from the run's start; convert instances summarised."""
    tis = api.task_instances(DAG_ID, run["dag_run_id"])
    start = run["start_date"]
    tasks: dict[str, Any] = {}
    for ti in sorted(tis, key=lambda item: item["start_date"] or ""):
        if ti["task_id"] == "convert":
            continue
        tasks[ti["task_id"]] = {
            "ready_at_s": _span(start, ti["scheduled_when"]),
            "queued_at_s": _span(start, ti["queued_when"]),
            "started_at_s": _span(start, ti["start_date"]),
            "ended_at_s": _span(start, ti["end_date"]),
            "running_s": _span(ti["start_date"], ti["end_date"]),
        }
    converts = [ti for ti in tis if ti["task_id"] == "convert" and ti["start_date"] and ti["end_date"]]
    held = sorted(_span(ti["start_date"], ti["end_date"]) or 0.0 for ti in converts)
    waits = sorted(_span(ti["queued_when"], ti["start_date"]) or 0.0 for ti in converts)
    first = min((ti["start_date"] for ti in converts), default=None)
    last = max((ti["end_date"] for ti in converts), default=None)
    return {
        "tasks": tasks,
        "convert": {
            "instances": len(converts),
            "pools": sorted({ti.get("pool") for ti in converts}),
            "first_started_at_s": _span(start, first),
            "last_ended_at_s": _span(start, last),
            "running_s": {
                "min": held[0] if held else None,
                "median": statistics.median(held) if held else None,
                "max": held[-1] if held else None,
                "sum": round(sum(held), 1),
            },
            "queued_to_running_s_median": statistics.median(waits) if waits else None,
        },
        "run_s": _span(run["start_date"], run["end_date"]),
    }


def measure_run(api: Any, corpus: Corpus, output: Path, priority_class: str) -> dict[str, Any]:
    conf = {"input_uri": str(corpus.folder), "output_uri": str(output), "scope": "all"}
    if priority_class != "auto":
        conf["priority_class"] = priority_class
    measured = run_to_manifest(api, DAG_ID, conf, output, poll_s=0.2)
    run, wall, manifest = measured["run"], measured["wall_s"], measured["manifest"]
    ok, note, _ = manifest_check(manifest, corpus)
    return {
        "class": priority_class,
        "wall_s": round(wall, 2),
        "pages_per_s": round(corpus.pages / wall, 2) if ok else None,
        "ok": ok and run["state"] == "success",
        "note": note or ("" if run["state"] == "success" else f"run {run['state']}"),
        "timeline": timeline(api, run),
        "load_average": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--classes", default="auto,normal", help="priority classes to run (auto: low for scope=all)")
    parser.add_argument("--pool-slots", type=int, nargs="+", default=[2], help="olmocr_vllm slots, one pass each")
    parser.add_argument("--repeat", type=int, default=1, help="runs per class and pool (CLI once per corpus)")
    parser.add_argument("--corpora", default="one-page,mixed", help="one-page (480 x 1 page), mixed (689 in 25)")
    parser.add_argument("--one-page", type=int, default=480, help="documents of the one-page corpus")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="extra component env")
    args = parser.parse_args(argv)

    from olmocr_testkit.airflow_env import vllm_connection
    from olmocr_testkit.cluster import ADMIN_USER, AirflowApi, AirflowCluster, ClusterSettings

    chosen = set(args.corpora.split(","))
    corpora = {}
    if "one-page" in chosen:
        corpora["one-page"] = one_page_documents(args.one_page)
    if "mixed" in chosen:
        corpora["mixed"] = mixed_documents()
    work = fresh_dir(RESULTS_DIR / "archive-throughput")
    record: dict[str, Any] = {
        "bench": "archive_throughput",
        "commit": code_version(),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()},
        "settings": {
            "server": BACKPRESSURE.description,
            "workers": "2 Celery workers x 2",
            "pool_slots": args.pool_slots,
            "high_priority_slots": 1,
            "scope": "all",
            "env": args.env,
        },
        "corpora": {name: corpus.describe() for name, corpus in corpora.items()},
        "cli": {},
        "airflow": [],
    }
    extra_env = dict(item.split("=", 1) for item in args.env)
    with standin(BACKPRESSURE) as server:
        env = {
            "AIRFLOW_CONN_OLMOCR_VLLM": vllm_connection(server.url, MODEL),
            "OLMOCR_ALLOWED_INPUTS": "*",
            "OLMOCR_ALLOWED_OUTPUTS": "*",
            # --classes may name any class, high included: the bench compares them.
            "OLMOCR_ALLOW_HIGH_PRIORITY": "true",
            "OLMOCR_INPUT_URI": str(fresh_dir(work / "scheduled-input")),
            "OLMOCR_OUTPUT_URI": str(work / "scheduled-output"),
            **extra_env,
        }
        settings = ClusterSettings(work_dir=work / "cluster", pool_slots=args.pool_slots[0], env=env)
        cluster = AirflowCluster(settings)
        try:
            cluster.start()
            api = AirflowApi(cluster.api_url, ADMIN_USER, cluster.admin_password)
            api.wait_for_dag(DAG_ID)
            api.set_paused(DAG_ID, False)
            # A warm-up run: the first run after start pays the workers' first imports.
            measure_run(api, mixed_documents(6, 3, seed=1), fresh_dir(work / "warm-up"), "normal")
            for name, corpus in corpora.items():
                cli = measure_cli(corpus, server.url, work, BACKPRESSURE.name)
                record["cli"][name] = {
                    "wall_s": round(cli.measurement.wall_s, 2) if cli.measurement else None,
                    "pages_per_s": cli.pages_per_s,
                    "ok": cli.ok,
                    "note": cli.note,
                }
                print(f"{name}: CLI {record['cli'][name]}", flush=True)
                for slots in args.pool_slots:
                    api.ok(
                        "PATCH",
                        "/api/v2/pools/olmocr_vllm",
                        params={"update_mask": "slots"},
                        json={"pool": "olmocr_vllm", "slots": slots, "include_deferred": False},
                    )
                    for priority_class in args.classes.split(","):
                        for attempt in range(args.repeat):
                            output = fresh_dir(work / f"out-{name}-{slots}-{priority_class}-{attempt}")
                            row = measure_run(api, corpus, output, priority_class)
                            row |= {"corpus": name, "pool_slots": slots}
                            if row["pages_per_s"] and cli.pages_per_s:
                                row["ratio_to_cli"] = round(row["pages_per_s"] / cli.pages_per_s, 3)
                            record["airflow"].append(row)
                            print(json.dumps({key: row[key] for key in row if key != "timeline"}), flush=True)
                            print(json.dumps(row["timeline"]), flush=True)
            api.close()
        finally:
            cluster.stop()
    record["ended"] = datetime.now(UTC).isoformat(timespec="seconds")
    RECORDS_DIR.mkdir(exist_ok=True)
    path = RECORDS_DIR / f"archive_throughput-{record['started'].replace(':', '')}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print("| corpus | pool | class | CLI s | Airflow s | ratio | instances |\n|---|--:|---|--:|--:|--:|--:|")
    for row in record["airflow"]:
        print(
            f"| {row['corpus']} | {row['pool_slots']} | {row['class']} | {record['cli'][row['corpus']]['wall_s']} | "
            f"{row['wall_s']} | {row.get('ratio_to_cli')} | {row['timeline']['convert']['instances']} |"
        )
    print(f"raw: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
