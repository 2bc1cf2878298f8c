"""Trigger → published manifest through the multi-process Celery deployment, against the CLI.

    .venv/bin/python -m bench.run_deployment [--quick] [--json PATH]

Both systems convert the same corpus against the same vLLM stand-in (a separate process, the
server-bound regime: 16 concurrent requests x 1.0 s = 16 pages/s):

* (a) the benchmark's mixed corpus, ≥ 1,000 pages in ≥ 100 documents;
* (b) 500 documents of 1-2 pages, where per-instance overhead dominates.

The deployment is the one the deployment tests run (``olmocr_testkit/cluster.py``): api-server,
scheduler, dag-processor, triggerer and two Celery workers on the local PostgreSQL and Redis, started
once; each scenario is one REST-triggered run of ``olmocr_ingest`` on a local input folder, timed from
``POST .../dagRuns`` until the run's manifest exists. The CLI row is ``olmocr-tasks convert`` on the
same folder. Per mapped instance, the script reports how long convert instances waited between
queued and running and how long each ran, from the task instances' own timestamps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import MODEL, RESULTS_DIR, SERVER_BOUND, fresh_dir, run_to_manifest, standin
from bench.corpus import CORPUS_ROOT, Corpus, mixed_corpus
from bench.run_cli import manifest_check, measure_cli

DAG_ID = "olmocr_ingest"


def small_documents(count: int = 500) -> Corpus:
    """``count`` documents of 1 or 2 pages (alternating), cached under bench/results/corpus/.

    The page marker holds at most 250 document ids and the stand-in does not read it here
    (``identify=False``), so ids repeat; the body text length differs instead, so that no two files
    are equal (identical bytes would be converted once and the copies skipped as duplicates).
    """
    from olmocr_testkit.pdfgen import text_pdf

    folder = CORPUS_ROOT / f"small-{count}-distinct"
    documents = tuple((f"small{index:04d}.pdf", 1 + index % 2) for index in range(count))
    if not all((folder / name).is_file() for name, _ in documents):
        folder.mkdir(parents=True, exist_ok=True)
        for index, (name, pages) in enumerate(documents):
            (folder / name).write_bytes(text_pdf(pages, 1 + index % 250, body_lines=20 + index // 250))
    return Corpus(folder, documents)


def _seconds(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def _instance_figures(instances: list[dict[str, Any]]) -> dict[str, Any]:
    waits = [w for ti in instances if (w := _seconds(ti.get("queued_when"), ti.get("start_date"))) is not None]
    runs = [r for ti in instances if (r := _seconds(ti.get("start_date"), ti.get("end_date"))) is not None]
    return {
        "convert_instances": len(instances),
        "queued_to_running_s_median": round(statistics.median(waits), 2) if waits else None,
        "running_s_median": round(statistics.median(runs), 2) if runs else None,
        "running_s_sum": round(sum(runs), 1),
    }


def measure_deployment(api: Any, corpus: Corpus, output: Path) -> dict[str, Any]:
    conf = {"input_uri": str(corpus.folder), "output_uri": str(output), "scope": "all"}
    measured = run_to_manifest(api, DAG_ID, conf, output)
    run_id, run, wall, manifest = measured["run_id"], measured["run"], measured["wall_s"], measured["manifest"]
    ok, note, details = manifest_check(manifest, corpus)
    instances = [ti for ti in api.task_instances(DAG_ID, run_id) if ti["task_id"] == "convert"]
    return {
        "system": "ours: Airflow deployment (Celery, 2 workers)",
        "pages": corpus.pages,
        "documents": len(corpus.documents),
        "wall_s": round(wall, 1),
        "pages_per_s": round(corpus.pages / wall, 2) if ok else None,
        "ok": ok and run["state"] == "success",
        "note": note or ("" if run["state"] == "success" else f"run {run['state']}"),
        "instances": _instance_figures(instances),
        "details": details,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the quick corpus and 100 small documents")
    parser.add_argument("--json", type=Path, help="write the results here too")
    args = parser.parse_args(argv)

    from olmocr_testkit.airflow_env import vllm_connection
    from olmocr_testkit.cluster import ADMIN_USER, AirflowApi, AirflowCluster, ClusterSettings

    scenarios = {
        "a: mixed documents": mixed_corpus(quick=args.quick),
        "b: small documents": small_documents(100 if args.quick else 500),
    }
    work = fresh_dir(RESULTS_DIR / "deployment")
    results: dict[str, Any] = {"regime": SERVER_BOUND.description, "scenarios": {}}
    with standin(SERVER_BOUND) as server:
        env = {
            "AIRFLOW_CONN_OLMOCR_VLLM": vllm_connection(server.url, MODEL),
            # The benchmark reads and writes its own local folders.
            "OLMOCR_ALLOWED_INPUTS": "*",
            "OLMOCR_ALLOWED_OUTPUTS": "*",
            # The hourly scheduled runs of the unpaused DAG find nothing here and cost little.
            "OLMOCR_INPUT_URI": str(fresh_dir(work / "scheduled-input")),
            "OLMOCR_OUTPUT_URI": str(work / "scheduled-output"),
        }
        cluster = AirflowCluster(ClusterSettings(work_dir=work / "cluster", pool_slots=4, env=env))
        try:
            cluster.start()
            api = AirflowApi(cluster.api_url, ADMIN_USER, cluster.admin_password)
            api.wait_for_dag(DAG_ID)
            api.set_paused(DAG_ID, False)
            for name, corpus in scenarios.items():
                cli = measure_cli(corpus, server.url, work, SERVER_BOUND.name)
                deployed = measure_deployment(api, corpus, fresh_dir(work / f"deployment-{corpus.folder.name}"))
                cli_pps = cli.pages_per_s
                ratio = deployed["pages_per_s"] / cli_pps if cli_pps and deployed["pages_per_s"] else None
                overhead = None
                if cli.measurement is not None and deployed["instances"]["convert_instances"]:
                    extra = deployed["wall_s"] - cli.measurement.wall_s
                    overhead = round(extra / deployed["instances"]["convert_instances"], 2)
                results["scenarios"][name] = {
                    "corpus": corpus.describe(),
                    "cli": cli.to_dict(),
                    "deployment": deployed,
                    "ratio_deployment_to_cli": round(ratio, 3) if ratio else None,
                    "extra_wall_s_per_convert_instance": overhead,
                }
                print(json.dumps({name: results["scenarios"][name] | {"cli": {"pages_per_s": cli_pps}}}, indent=1))
            api.close()
        finally:
            cluster.stop()
    for name, scenario in results["scenarios"].items():
        deployed, cli = scenario["deployment"], scenario["cli"]
        print(
            f"{name}: {deployed['pages']} pages in {deployed['documents']} documents; "
            f"CLI {cli['pages_per_s']} pages/s, "
            f"deployment {deployed['pages_per_s']} pages/s (ratio {scenario['ratio_deployment_to_cli']}); "
            f"{deployed['instances']['convert_instances']} convert instances, "
            f"+{scenario['extra_wall_s_per_convert_instance']} s wall per instance"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
