"""Priority classes through the deployment: a one-page REST ``documents`` run beside a saturating
low-priority run (issue 21's targets: within 1.5x its time on the idle deployment; the big run loses
at most 5 % of its throughput).

    .venv/bin/python -m bench.priority [--quick]

The deployment is the one the deployment tests run (``olmocr_testkit/cluster.py``: api-server,
scheduler, dag-processor, triggerer, two Celery workers) with the defaults a user gets, except what the
scenario names: the ``olmocr_vllm`` pool at 2 slots and ``OLMOCR_CONVERT_SLOTS=2`` (beside it the
1-slot ``olmocr_vllm_high`` pool compose's init creates, ``--high-priority-slots``); the stand-in at
8 concurrent x 0.5 s (16 pages/s) with ``--scheduling-policy priority`` and the connection saying so;
the cluster policy of ``plugins/airflow_local_settings.py`` loaded as any deployment of this plugins
folder loads it. Runs, one after the other, on local folders:

1. the one-page run alone (idle deployment), after a warm-up run that is not counted, and again at the
   end: the mean of the two is the reference;
2. the big run alone: the 1,002-page corpus (226 with ``--quick``), ``scope=all`` (class low), and
   again at the end: the mean of the two is the reference;
3. the big run again, with the one-page run triggered once both pool slots are busy and the server has
   a queue (classes as chosen: high for the one-page run);
4. as 3, with the one-page run's ``priority_class`` forced to low: classes switched off.

A run's time is its DAG run's start to end in Airflow; the big run's throughput is its pages over that.
For each one-page run beside the big run the bench also says where its time went, from its task
instances' times over REST (per task: waiting for the scheduler after its upstream ended, ready to
queued, i.e. the pool slot and the scheduler's loop, queued to running, i.e. Celery and the worker's
start-up, and running) and from the stand-in's request log (its page's wait in the server's queue),
beside how the big run was planned (its convert instances and how long each held a slot).
Run it under ``flock /tmp/olmocr-bench.lock``. Prints a markdown table, writes
``bench/results/priority-<UTC>/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import BACKPRESSURE, MODEL, RESULTS_DIR, fresh_dir, standin
from bench.corpus import Corpus, mixed_corpus
from olmocr_tasks.inference.priority import HIGH, VLLM_PRIORITY

DAG_ID = "olmocr_ingest"
POOL_SLOTS = 2


def _seconds(run: dict[str, Any]) -> float:
    return (datetime.fromisoformat(run["end_date"]) - datetime.fromisoformat(run["start_date"])).total_seconds()


def _trigger(api: Any, conf: dict[str, Any]) -> str:
    response = api.trigger(DAG_ID, conf)
    response.raise_for_status()
    return str(response.json()["dag_run_id"])


def _finished(api: Any, run_id: str) -> dict[str, Any]:
    run = api.wait_for_run(DAG_ID, run_id, timeout=1800)
    if run["state"] != "success":
        raise RuntimeError(f"run {run_id} ended {run['state']}")
    return dict(run)


def _urgent_conf(work: Path, name: str, priority_class: str) -> dict[str, Any]:
    from olmocr_testkit.pdfgen import text_pdf

    folder = fresh_dir(work / f"urgent-{name}")
    pdf = folder / f"{name}.pdf"
    pdf.write_bytes(text_pdf(1, 7, body_lines=30))
    return {
        "input_uri": str(folder),
        "output_uri": str(work / f"urgent-{name}-out"),
        "documents": [str(pdf)],
        "priority_class": priority_class,
    }


def _big_conf(corpus: Corpus, work: Path, name: str) -> dict[str, Any]:
    return {"input_uri": str(corpus.folder), "output_uri": str(fresh_dir(work / f"big-{name}-out")), "scope": "all"}


def _converts(api: Any, run_id: str) -> list[dict[str, Any]]:
    return [ti for ti in api.task_instances(DAG_ID, run_id) if ti["task_id"] == "convert"]


def _wait_saturated(api: Any, server: Any, run_id: str) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        running = [ti for ti in _converts(api, run_id) if ti["state"] == "running"]
        if len(running) == POOL_SLOTS and server.stats()["waiting"] > 0:
            return
        time.sleep(0.5)
    raise TimeoutError("the big run never held both slots with a server queue")


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value)


def _span(start: str | None, end: str | None) -> float | None:
    return None if start is None or end is None else round((_at(end) - _at(start)).total_seconds(), 2)


def breakdown(api: Any, server: Any, urgent: dict[str, Any], big_id: str | None, since_seq: int) -> dict[str, Any]:
    """Where the one-page run's time went: per task instance, its page at the server, the big run's slots."""
    tis = sorted(api.task_instances(DAG_ID, urgent["dag_run_id"]), key=lambda ti: ti["start_date"] or "")
    tasks, previous_end = [], urgent["start_date"]
    for ti in tis:
        tasks.append(
            {
                "task": ti["task_id"],
                "after_upstream_s": _span(previous_end, ti["scheduled_when"]),
                "ready_to_queued_s": _span(ti["scheduled_when"], ti["queued_when"]),
                "queued_to_running_s": _span(ti["queued_when"], ti["start_date"]),
                "running_s": _span(ti["start_date"], ti["end_date"]),
            }
        )
        previous_end = ti["end_date"]
    result: dict[str, Any] = {"tasks": tasks, "after_last_task_s": _span(previous_end, urgent["end_date"])}
    pages = [r for r in server.requests(since_seq) if r.get("priority") == VLLM_PRIORITY[HIGH] and r.get("started")]
    if pages:
        page = min(pages, key=lambda r: r["seq"])
        result["page_server_queue_s"] = round(page["started"] - page["queued"], 3)
        result["page_answer_s"] = round(page["finished"] - page["started"], 3)
    result["load_average"] = round(os.getloadavg()[0], 2)  # the machine is shared: how busy it was
    if big_id is None:
        return result
    big = _converts(api, big_id)
    held = [_span(ti["start_date"], ti["end_date"]) for ti in big if ti["start_date"] and ti["end_date"]]
    result["big_instances"] = len(big)
    result["big_instance_s"] = {"min": min(held), "median": sorted(held)[len(held) // 2], "max": max(held)}
    (convert,) = [ti for ti in tis if ti["task_id"] == "convert"]
    ready = _at(convert["scheduled_when"])
    # The big run's instances holding a slot when the urgent instance became ready: how long each still held it.
    remaining = [
        (_at(ti["end_date"]) - ready).total_seconds()
        for ti in big
        if ti["start_date"] and ti["end_date"] and _at(ti["start_date"]) <= ready < _at(ti["end_date"])
    ]
    result["big_slots_held_at_ready_s"] = sorted(round(value, 2) for value in remaining)
    return result


def _idle_run(api: Any, server: Any, work: Path, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    since_seq = int(server.stats()["total"])
    run = _finished(api, _trigger(api, _urgent_conf(work, name, "auto")))
    return run, breakdown(api, server, run, None, since_seq)


def beside_big_run(api: Any, server: Any, corpus: Corpus, work: Path, name: str, urgent_class: str) -> dict[str, Any]:
    big_id = _trigger(api, _big_conf(corpus, work, name))
    _wait_saturated(api, server, big_id)
    since_seq = int(server.stats()["total"])  # the stand-in's request count: the urgent page comes later
    urgent = _finished(api, _trigger(api, _urgent_conf(work, name, urgent_class)))
    big = _finished(api, big_id)
    return {
        "urgent_s": round(_seconds(urgent), 2),
        "big_s": round(_seconds(big), 2),
        "breakdown": breakdown(api, server, urgent, big_id, since_seq),
    }


def _describe(found: dict[str, Any]) -> str:
    lines = [
        "| task | after upstream s | ready → queued s | queued → running s | running s |",
        "|---|---|---|---|---|",
    ]
    for task in found["tasks"]:
        lines.append(
            f"| {task['task']} | {task['after_upstream_s']} | {task['ready_to_queued_s']} | "
            f"{task['queued_to_running_s']} | {task['running_s']} |"
        )
    lines += [
        "",
        f"after the last task {found['after_last_task_s']} s; its page waited "
        f"{found.get('page_server_queue_s')} s in the server's queue, answered in {found.get('page_answer_s')} s; "
        f"load average {found['load_average']}",
    ]
    if "big_instances" in found:
        lines[-1] += (
            f"; the big run ran {found['big_instances']} convert instances holding a slot {found['big_instance_s']} s;"
            f" those holding one when the urgent instance became ready: {found['big_slots_held_at_ready_s']} s more"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the 226-page corpus instead of 1,002 pages")
    parser.add_argument(
        "--high-priority-slots",
        type=int,
        default=1,
        metavar="SLOTS",
        help="slots of the olmocr_vllm_high pool reserved for high-priority runs (default 1, as compose's init "
        "creates it; 0: none, high runs wait in olmocr_vllm first in its queue)",
    )
    parser.add_argument(
        "--low-class-waves",
        type=int,
        metavar="N",
        help="plan low-class runs into at least N waves of convert instances (OLMOCR_LOW_CLASS_WAVES; default: 8)",
    )
    parser.add_argument(
        "--low-priority-nice",
        type=int,
        metavar="N",
        help="nice low-class render workers by N (OLMOCR_LOW_PRIORITY_NICE; default: 10; 0 turns it off)",
    )
    args = parser.parse_args(argv)

    from olmocr_testkit.airflow_env import vllm_connection
    from olmocr_testkit.cluster import ADMIN_USER, AirflowApi, AirflowCluster, ClusterSettings

    corpus = mixed_corpus(quick=args.quick)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    work = fresh_dir(RESULTS_DIR / f"priority-{stamp}")
    results: dict[str, Any] = {"regime": BACKPRESSURE.description, "pages": corpus.pages, "pool_slots": POOL_SLOTS}
    with standin(BACKPRESSURE, scheduling_policy="priority") as server:
        env = {
            "AIRFLOW_CONN_OLMOCR_VLLM": vllm_connection(server.url, MODEL, scheduling_policy="priority"),
            "OLMOCR_CONVERT_SLOTS": str(POOL_SLOTS),
            "OLMOCR_ALLOWED_INPUTS": "*",
            "OLMOCR_ALLOWED_OUTPUTS": "*",
            "OLMOCR_INPUT_URI": str(fresh_dir(work / "scheduled-input")),
            "OLMOCR_OUTPUT_URI": str(work / "scheduled-output"),
        }
        # Only what the command line names differs from the defaults a user gets; the results say it.
        if args.low_class_waves is not None:
            env["OLMOCR_LOW_CLASS_WAVES"] = str(args.low_class_waves)
        if args.low_priority_nice is not None:
            env["OLMOCR_LOW_PRIORITY_NICE"] = str(args.low_priority_nice)
        results["settings"] = {key: value for key, value in env.items() if key.startswith("OLMOCR_")}
        settings = ClusterSettings(
            work_dir=work / "cluster", pool_slots=POOL_SLOTS, high_priority_slots=args.high_priority_slots, env=env
        )
        cluster = AirflowCluster(settings)
        try:
            cluster.start()
            api = AirflowApi(cluster.api_url, ADMIN_USER, cluster.admin_password)
            api.wait_for_dag(DAG_ID)
            api.set_paused(DAG_ID, False)
            results["high_priority_slots"] = args.high_priority_slots
            # A fresh deployment's first runs pay for warming up (workers importing, DAG parsing): not counted.
            _finished(api, _trigger(api, _urgent_conf(work, "warm-up", "auto")))
            idle_runs = [_idle_run(api, server, work, "idle-1")]
            big_alone = [_seconds(_finished(api, _trigger(api, _big_conf(corpus, work, "alone-1"))))]
            results["classes_on"] = beside_big_run(api, server, corpus, work, "on", "auto")
            results["classes_off"] = beside_big_run(api, server, corpus, work, "off", "low")
            idle_runs.append(_idle_run(api, server, work, "idle-2"))
            big_alone.append(_seconds(_finished(api, _trigger(api, _big_conf(corpus, work, "alone-2")))))
            # Alone before and after the runs beside it: a 70 s run varies by a few seconds pass to pass.
            results["big_alone_runs_s"] = [round(value, 2) for value in big_alone]
            results["big_alone_s"] = round(sum(big_alone) / len(big_alone), 2)
            idle = [_seconds(run) for run, _ in idle_runs]
            results["idle_breakdowns"] = [found for _, found in idle_runs]
            # Idle before and after the big runs: their mean is the reference.
            results["idle_urgent_runs_s"] = [round(value, 2) for value in idle]
            results["idle_urgent_s"] = round(sum(idle) / len(idle), 2)
            api.close()
        finally:
            cluster.stop()
    (work / "results.json").write_text(json.dumps(results, indent=1))
    idle, alone = results["idle_urgent_s"], results["big_alone_s"]
    lines = [
        f"Priority classes, deployment (pool {POOL_SLOTS} slots, OLMOCR_CONVERT_SLOTS={POOL_SLOTS}), "
        f"stand-in {BACKPRESSURE.description}, scheduling_policy priority; big run {corpus.pages} pages, class low; "
        f"olmocr_vllm_high slots: {args.high_priority_slots}; low-class waves: "
        f"{args.low_class_waves if args.low_class_waves is not None else 'default'}, low-priority nice: "
        f"{args.low_priority_nice if args.low_priority_nice is not None else 'default'}",
        "",
        "| one-page REST documents run | its run s | ÷ idle (target <= 1.5) | big run s | big run throughput "
        "÷ alone (target >= 0.95) |",
        "|---|---|---|---|---|",
        f"| alone, idle deployment (mean of {results['idle_urgent_runs_s']}) | {idle} | 1.00 | | |",
        f"| (big run alone, mean of {results['big_alone_runs_s']}) | | | {alone} | 1.000 |",
    ]
    for label, key in (("class high (auto), beside the big run", "classes_on"), ("class low (off)", "classes_off")):
        row = results[key]
        lines.append(
            f"| {label} | {row['urgent_s']} | {row['urgent_s'] / idle:.2f} | {row['big_s']} | "
            f"{alone / row['big_s']:.3f} |"
        )
    lines += ["", "Where the one-page run's time went, idle (first reference run):", ""]
    lines.append(_describe(results["idle_breakdowns"][0]))
    for label, key in (("class high", "classes_on"), ("class low", "classes_off")):
        lines += ["", f"Where the one-page run's time went ({label}):", "", _describe(results[key]["breakdown"])]
    print("\n".join(lines))
    (work / "results.md").write_text("\n".join(lines) + "\n")
    on = results["classes_on"]
    return 0 if on["urgent_s"] <= 1.5 * idle and alone / on["big_s"] >= 0.95 else 1


if __name__ == "__main__":
    sys.exit(main())
