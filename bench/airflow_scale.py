"""Large runs through the Celery deployment, as users run them, against the CLI (issue 34, items 2 and 3).

    flock /tmp/olmocr-bench.lock .venv/bin/python -m bench.airflow_scale \
        [--documents 10000 100000] [--skip-cli | --cli-max N]

The deployment is the deployment tests' (``olmocr_testkit/cluster.py``: api-server, scheduler,
dag-processor, triggerer, two Celery workers x 2, a fresh PostgreSQL database, Redis) with the
``olmocr_vllm`` pool at ``--pool-slots`` (``OLMOCR_CONVERT_SLOTS`` set to match, as compose does) beside
the 1-slot ``olmocr_vllm_high``. The stand-in runs in the CPU-bound regime (512 x 0.01 s: rendering is
the limit). For each N: N distinct one-page PDFs (``bench.scale``'s hand-written generator, 30 text
lines each, 1,000 to a sub-folder), ``olmocr-tasks convert`` on them (unless ``--skip-cli``; up to
``--cli-max`` documents) before the deployment starts (an idle deployment's components take CPU the
CLI would otherwise have), then one
``scope=all`` REST run of ``olmocr_ingest`` over the same folder (its class is ``auto``: low, a backfill),
and what the run cost:

a. throughput: ``POST .../dagRuns`` until the manifest exists, against the CLI's process wall;
b. the mapped convert instances: count, documents each (the plan's descriptors in XCom), running
   seconds, their map-index labels, against Airflow's ``[core] max_map_length``;
c. XCom rows and bytes of the run and the metadata-database rows and bytes it added (psycopg2 on the
   deployment's database: row counts of the main tables and ``pg_database_size`` before the trigger and
   after the run ended; the rows of the run itself where a table has ``run_id``);
d. each task's exact peak RSS: the ``peak memory: self X MiB, children Y MiB`` line
   (``olmocr_tasks.provider.resources``) in every attempt's log under the cluster's log folder;
e. publish_manifest's running time, and time to first byte through the api-server (bearer token) of
   the OCR runs pages (the list, the run, its documents table: a late page, a name search, the JSON
   API) and Airflow's own grid calls for the DAG (``/ui/grid/...``, the run's gantt, the mapped
   instances list), once cold and then warm;
f. at 100,000: the plan within ``max_map_length``, and each task's peak against the latest 10,000 record.

Documents of successive N in one invocation are distinct (they go to one output location, which the
runs page reads), so none is skipped as already converted; a later N's plan sizes its instances from
the measured cost of the earlier runs there, as a user's next run would (each row keeps the plan's own
lines, with its rule). The warm-up run has a location of its own. Writes one raw record per
invocation, ``bench/records/airflow_scale-<UTC>.json``, also when interrupted (Ctrl-C, SIGTERM, a
timeout): ``complete`` false, and the interrupted run's rows, XCom, database growth and peaks as they
stood. Run it alone (``flock /tmp/olmocr-bench.lock``): it takes about 10 minutes at 10,000 documents
on 2 cores, and an hour or more at 100,000.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import statistics
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from bench.common import CPU_BOUND, MODEL, RECORDS_DIR, RESULTS_DIR, code_version, fresh_dir, standin
from bench.corpus import Corpus
from bench.run_cli import manifest_check, measure_cli
from bench.scale import DEFAULT_LINES, write_corpus
from olmocr_tasks.location.manifest import manifest_uri
from olmocr_tasks.location.manifest_reader import open_manifest
from olmocr_tasks.provider.resources import PEAK_MEMORY_EVENT

DAG_ID = "olmocr_ingest"
WORK = RESULTS_DIR / "airflow-scale"
# The metadata tables a run writes to (celery_taskmeta: the Celery result backend, in the same database).
TABLES = (
    "dag_run",
    "task_instance",
    "task_instance_history",
    "xcom",
    "log",
    "rendered_task_instance_fields",
    "task_map",
    "job",
    "celery_taskmeta",
)
# A yearly schedule: unpausing makes one (empty) scheduled run at start-up, none during a measured run.
SCHEDULE = "0 0 1 1 *"
# Rows of the runs page's documents table (plugins/olmocr_runs/paging.py PAGE_SIZE).
RUNS_PAGE_ROWS = 100
PEAK_LINE = re.compile(re.escape(PEAK_MEMORY_EVENT) + r" self ([\d.]+) MiB, children ([\d.]+) MiB")
# Each page is fetched once cold, then this many times more.
WARM_FETCHES = 3


def _load() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def _stats(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0}
    ordered = sorted(values)
    return {
        "count": len(ordered),
        "min": round(ordered[0], 2),
        "median": round(statistics.median(ordered), 2),
        "max": round(ordered[-1], 2),
        "sum": round(sum(ordered), 1),
    }


def one_page_corpus(folder: Path, start: int, count: int, lines: int) -> Corpus:
    """``count`` distinct one-page PDFs, documents ``start ..`` (``bench.scale``'s generator)."""
    fresh_dir(folder)
    write_corpus(folder, start, count, lines)
    names = tuple((f"part{doc_id // 1000:04d}/doc{doc_id:07d}.pdf", 1) for doc_id in range(start, start + count))
    return Corpus(folder, names)


# ------------------------------------------------------------------------------------ the database


class MetadataDb:
    """The deployment's PostgreSQL database, read directly."""

    def __init__(self, host: str, port: int, database: str) -> None:
        import psycopg2

        self.connection = psycopg2.connect(host=host, port=port, user="postgres", dbname=database)
        self.connection.autocommit = True
        self.tables = [table for table in TABLES if self._one("SELECT to_regclass(%s)", (table,)) is not None]
        self.run_id_tables = [
            table
            for table in self.tables
            if self._one(
                "SELECT 1 FROM information_schema.columns WHERE table_name = %s AND column_name = 'run_id'", (table,)
            )
        ]

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self.connection.cursor() as cursor:
            cursor.execute(sql, args)
            return cursor.fetchall()

    def _one(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        rows = self._rows(sql, args)
        return rows[0][0] if rows else None

    def snapshot(self) -> dict[str, Any]:
        """Rows and bytes (table, indexes and TOAST) of each table, and the database's size."""
        tables = {}
        for table in self.tables:
            rows = self._one(f'SELECT count(*) FROM "{table}"')
            tables[table] = {"rows": rows, "bytes": self._one("SELECT pg_total_relation_size(%s)", (table,))}
        return {"tables": tables, "database_bytes": self._one("SELECT pg_database_size(current_database())")}

    def run_rows(self, run_id: str) -> dict[str, int]:
        """Rows that name the run, per table with a ``run_id`` column (every DAG's run of that id)."""
        return {
            table: self._one(f'SELECT count(*) FROM "{table}" WHERE run_id = %s', (run_id,))
            for table in self.run_id_tables
        }

    def xcom(self, dag_id: str, run_id: str) -> dict[str, Any]:
        """The run's XCom rows: JSON text bytes (what a reader gets) and stored bytes (JSONB, compressed)."""
        rows = self._rows(
            "SELECT task_id, key, count(*), coalesce(sum(octet_length(value::text)), 0),"
            " coalesce(max(octet_length(value::text)), 0), coalesce(sum(pg_column_size(value)), 0)"
            " FROM xcom WHERE dag_id = %s AND run_id = %s GROUP BY task_id, key ORDER BY task_id, key",
            (dag_id, run_id),
        )
        by_key = {
            f"{task}/{key}": {
                "rows": count,
                "json_bytes": int(text),
                "largest_json_bytes": int(largest),
                "stored_bytes": int(stored),
            }
            for task, key, count, text, largest, stored in rows
        }
        return {
            "rows": sum(item["rows"] for item in by_key.values()),
            "json_bytes": sum(item["json_bytes"] for item in by_key.values()),
            "stored_bytes": sum(item["stored_bytes"] for item in by_key.values()),
            "by_task_and_key": by_key,
        }

    def plan_descriptors(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        value = self._one(
            "SELECT value FROM xcom WHERE dag_id = %s AND run_id = %s AND task_id = 'plan' AND key = 'return_value'",
            (dag_id, run_id),
        )
        return value if isinstance(value, list) else []

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        columns = ("task_id", "map_index", "state", "try_number", "pool", "rendered_map_index", "start_date",
                   "end_date", "queued_dttm", "scheduled_dttm")  # fmt: skip
        rows = self._rows(
            f"SELECT {', '.join(columns)} FROM task_instance WHERE dag_id = %s AND run_id = %s"
            " ORDER BY task_id, map_index",
            (dag_id, run_id),
        )
        return [dict(zip(columns, row, strict=True)) for row in rows]

    def converts_done(self, dag_id: str, run_id: str) -> tuple[int, int]:
        rows = self._rows(
            "SELECT count(*) FILTER (WHERE state IN ('success', 'failed', 'skipped', 'upstream_failed')), count(*)"
            " FROM task_instance WHERE dag_id = %s AND run_id = %s AND task_id = 'convert'",
            (dag_id, run_id),
        )
        return rows[0] if rows else (0, 0)

    def close(self) -> None:
        self.connection.close()


def _growth(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {
        "database_bytes": after["database_bytes"] - before["database_bytes"],
        "tables": {
            table: {
                "rows": after["tables"][table]["rows"] - before["tables"][table]["rows"],
                "bytes": after["tables"][table]["bytes"] - before["tables"][table]["bytes"],
            }
            for table in after["tables"]
        },
    }


# -------------------------------------------------------------------------------- what the run did


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else round((end - start).total_seconds(), 2)


def mapped_instances(
    tis: list[dict[str, Any]], descriptors: list[dict[str, Any]], max_map_length: int
) -> dict[str, Any]:
    """Item b: the convert instances, their documents (the plan's descriptors) and running seconds."""
    converts = [ti for ti in tis if ti["task_id"] == "convert"]
    running = [_seconds(ti["start_date"], ti["end_date"]) for ti in converts]
    waits = [_seconds(ti["queued_dttm"], ti["start_date"]) for ti in converts]
    documents = [int(item.get("documents") or 0) for item in descriptors]
    labels = [ti["rendered_map_index"] for ti in converts]
    return {
        "instances": len(converts),
        "descriptors": len(descriptors),
        "max_map_length": max_map_length,
        "within_max_map_length": len(converts) <= max_map_length,
        "states": {
            state: sum(1 for ti in converts if ti["state"] == state) for state in {ti["state"] for ti in converts}
        },
        "pools": sorted({ti["pool"] for ti in converts}),
        "retried": sum(1 for ti in converts if (ti["try_number"] or 0) > 1),
        "documents_per_instance": _stats([float(count) for count in documents]),
        "running_s": _stats([value for value in running if value is not None]),
        "queued_to_running_s": _stats([value for value in waits if value is not None]),
        "labels_first": labels[:3],
        "labels_last": labels[-3:],
        "descriptor_example": descriptors[0] if descriptors else None,
    }


def task_timeline(tis: list[dict[str, Any]], started: datetime) -> dict[str, Any]:
    """Each unmapped task's offsets from the trigger, and the span of the convert instances."""
    tasks: dict[str, Any] = {}
    for ti in tis:
        if ti["task_id"] == "convert":
            continue
        tasks[ti["task_id"]] = {
            "state": ti["state"],
            "started_at_s": _seconds(started, ti["start_date"]),
            "ended_at_s": _seconds(started, ti["end_date"]),
            "running_s": _seconds(ti["start_date"], ti["end_date"]),
        }
    converts = [ti for ti in tis if ti["task_id"] == "convert" and ti["start_date"] and ti["end_date"]]
    if converts:
        tasks["convert (all instances)"] = {
            "started_at_s": _seconds(started, min(ti["start_date"] for ti in converts)),
            "ended_at_s": _seconds(started, max(ti["end_date"] for ti in converts)),
        }
    return tasks


def peak_memory(log_root: Path, run_id: str) -> dict[str, Any]:
    """Item d: the ``peak memory`` line of every attempt's log of the run, per task."""
    run_dir = log_root / f"dag_id={DAG_ID}" / f"run_id={run_id}"
    found: dict[str, list[dict[str, Any]]] = {}
    missing: list[str] = []
    for path in sorted(run_dir.rglob("attempt=*.log")):
        parts = {part.split("=", 1)[0]: part.split("=", 1)[1] for part in path.relative_to(run_dir).parts}
        task = parts["task_id"]
        line = _peak_line(path)
        if line is None:
            if task in ("plan", "convert", "publish_manifest"):
                missing.append(str(path.relative_to(run_dir)))
            continue
        found.setdefault(task, []).append(
            {"map_index": int(parts.get("map_index", -1)), "attempt": parts["attempt"].removesuffix(".log"), **line}
        )
    result: dict[str, Any] = {"attempt_logs_without_the_line": missing}
    for task, rows in found.items():
        own = [row["self_mib"] for row in rows]
        children = [row["children_mib"] for row in rows]
        result[task] = {
            "attempts": len(rows),
            "self_mib": {"max": max(own), "median": round(statistics.median(own), 1), "min": min(own)},
            "children_mib": {"max": max(children), "median": round(statistics.median(children), 1)},
        }
    return result


def _peak_line(path: Path) -> dict[str, float] | None:
    with path.open(errors="replace") as lines:
        for raw in lines:
            if PEAK_MEMORY_EVENT not in raw:
                continue
            try:
                event = json.loads(raw).get("event", "")
            except ValueError:
                event = raw
            match = PEAK_LINE.search(event)
            if match:
                return {"self_mib": float(match[1]), "children_mib": float(match[2])}
    return None


# --------------------------------------------------------------------------------------- the pages


def fetch_timed(client: httpx.Client, url: str) -> tuple[dict[str, Any], bytes]:
    """One GET: seconds to the first byte of the body and to the last, the status, the bytes on the
    wire and decoded; and the body."""
    started = time.perf_counter()
    first = None
    body = bytearray()
    with client.stream("GET", url) as response:
        for chunk in response.iter_bytes():
            if first is None:
                first = time.perf_counter() - started
            body += chunk
        total = time.perf_counter() - started
        wire = response.num_bytes_downloaded
    figures = {
        "status": response.status_code,
        "ttfb_s": round(first or total, 3),
        "total_s": round(total, 3),
        "bytes": len(body),
        "wire_bytes": wire,
    }
    return figures, bytes(body)


def time_pages(api_url: str, token: str, urls: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """Each URL once cold (the first request after the run), then ``WARM_FETCHES`` times; each answer
    is checked for a text it must hold (``urls``: name -> (path, expected text))."""
    results = {}
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {token}"}, timeout=300) as client:
        for name, (url, expected) in urls.items():
            cold, body = fetch_timed(client, url)
            warm = [fetch_timed(client, url)[0] for _ in range(WARM_FETCHES)]
            results[name] = {
                "url": url,
                "status": cold["status"],
                "holds_expected_text": expected.encode() in body,
                "bytes": cold["bytes"],
                "wire_bytes": cold["wire_bytes"],
                "cold_ttfb_s": cold["ttfb_s"],
                "cold_total_s": cold["total_s"],
                "warm_ttfb_s_median": round(statistics.median(item["ttfb_s"] for item in warm), 3),
                "warm_total_s_median": round(statistics.median(item["total_s"] for item in warm), 3),
                "statuses": sorted({cold["status"], *(item["status"] for item in warm)}),
            }
    return results


def page_urls(run_id: str, run_key: str, documents: int, last_source: str) -> dict[str, tuple[str, str]]:
    """The pages timed after a run: path and a text the answer must hold."""
    key, run = quote(run_key, safe=""), quote(run_id, safe="")
    shown = f"{DAG_ID}__{run_id}"  # the run id in its manifest, as the runs page shows it
    last_page = max(1, math.ceil(documents / RUNS_PAGE_ROWS))
    name = Path(last_source).stem
    mapped = f"/api/v2/dags/{DAG_ID}/dagRuns/{run}/taskInstances/convert/listMapped"
    return {
        "runs page: list": ("/olmocr/", shown),
        "runs page: the run": (f"/olmocr/runs/{key}", shown),
        "runs page: documents, last page": (f"/olmocr/runs/{key}?page={last_page}", ">converted<"),
        "runs page: documents, failed only": (f"/olmocr/runs/{key}?state=failed", "No document is failed"),
        "runs page: documents, name of the last document": (f"/olmocr/runs/{key}?q={quote(name)}", name),
        "runs API: last 100 documents": (
            f"/olmocr/api/runs/{key}/documents?offset={max(0, documents - 100)}&limit=100",
            '"status":"converted"',
        ),
        "grid: structure": (f"/ui/grid/structure/{DAG_ID}?limit=10&order_by=-run_after", "publish_manifest"),
        "grid: runs": (f"/ui/grid/runs/{DAG_ID}?limit=10&order_by=-run_after", run_id),
        "grid: task summaries of the run": (f"/ui/grid/ti_summaries/{DAG_ID}?run_ids={run}", "convert"),
        # The gantt leaves mapped tasks to the grid's summaries.
        "gantt of the run": (f"/ui/gantt/{DAG_ID}/{run}", "publish_manifest"),
        "mapped convert instances, first 50": (f"{mapped}?limit=50&offset=0&order_by=map_index", "total_entries"),
    }


# --------------------------------------------------------------------------------------- one run


def _wait_idle(api: Any, timeout: float = 900) -> None:
    """No run of the DAG queued or running (the scheduled run unpausing made, the warm-up)."""
    deadline = time.monotonic() + timeout
    while any(run["state"] in ("queued", "running") for run in api.dag_runs(DAG_ID)):
        if time.monotonic() > deadline:
            raise TimeoutError("olmocr_ingest still has active runs")
        time.sleep(2)


def measure_run(
    api: Any,
    db: MetadataDb,
    cluster: Any,
    corpus: Corpus,
    output: Path,
    max_map_length: int,
    progress: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Trigger one scope=all run over ``corpus`` and measure items a-e. ``progress`` gets the run's id
    and start as soon as it is triggered, for ``run_costs`` when the measurement is interrupted."""
    progress = {} if progress is None else progress
    _wait_idle(api)
    progress["before"] = db.snapshot()
    load_before = _load()
    conf = {"input_uri": str(corpus.folder), "output_uri": str(output), "scope": "all"}
    progress["started_at"] = datetime.now(UTC)
    progress["started"] = started = time.monotonic()
    response = api.trigger(DAG_ID, conf)
    response.raise_for_status()
    progress["run_id"] = run_id = response.json()["dag_run_id"]
    manifest_path = Path(manifest_uri(str(output), f"{DAG_ID}__{run_id}"))
    timeout = max(1800.0, 0.2 * corpus.pages)
    state, last_check, last_report = "queued", 0.0, started
    while not manifest_path.exists() and state != "failed":
        now = time.monotonic()
        if now - started > timeout:
            raise TimeoutError(f"no manifest after {timeout:.0f} s")
        if now - last_check > 5:
            state, last_check = api.dag_run(DAG_ID, run_id)["state"], now
        if now - last_report > 60:
            done, instances = db.converts_done(DAG_ID, run_id)
            print(f"  {now - started:6.0f} s: {done}/{instances} convert instances done, load {_load()}", flush=True)
            last_report = now
        time.sleep(0.2)
    wall = time.monotonic() - started
    run = api.wait_for_run(DAG_ID, run_id, timeout=timeout)
    run_end_s = round(time.monotonic() - started, 2)
    costs = run_costs(db, cluster, progress, max_map_length)
    summary = open_manifest(str(manifest_path)).summary if manifest_path.exists() else None
    ok, note, details = manifest_check(summary, corpus)
    publish = costs["tasks"].get("publish_manifest") or {}
    run_key = manifest_path.name.removesuffix(".json")
    pages = time_pages(
        cluster.api_url, api.token, page_urls(run_id, run_key, len(corpus.documents), corpus.documents[-1][0])
    )
    return {
        "run_id": run_id,
        "ok": ok and run["state"] == "success",
        "state": run["state"],
        "note": note,
        "counts": details.get("counts"),
        "in_run_pages_per_s": details.get("in_run_pages_per_s"),
        "trigger_to_manifest_s": round(wall, 2),
        "trigger_to_run_end_s": run_end_s,
        "pages_per_s": round(corpus.pages / wall, 2) if ok else None,
        "load_before": load_before,
        "load_after": _load(),
        "publish_manifest_running_s": publish.get("running_s"),
        **costs,
        "pages": pages,
    }


def run_costs(db: MetadataDb, cluster: Any, progress: dict[str, Any], max_map_length: int) -> dict[str, Any]:
    """Items b, c and d of the run in ``progress`` as they stand (the whole run once it has ended)."""
    run_id = progress["run_id"]
    after = db.snapshot()
    tis = db.task_instances(DAG_ID, run_id)
    return {
        "plan_log": plan_log(cluster.log_dir / "tasks", run_id),
        "convert": mapped_instances(tis, db.plan_descriptors(DAG_ID, run_id), max_map_length),
        "tasks": task_timeline(tis, progress["started_at"]),
        "xcom": db.xcom(DAG_ID, run_id),
        "database": {
            "before": progress["before"],
            "after": after,
            "added": _growth(progress["before"], after),
            "rows_of_the_run": db.run_rows(run_id),
        },
        "peak_memory": peak_memory(cluster.log_dir / "tasks", run_id),
    }


def plan_log(log_root: Path, run_id: str) -> list[str]:
    """What the plan said about the run (how many to convert, how it packed them and by which rule)."""
    lines = []
    for path in sorted((log_root / f"dag_id={DAG_ID}" / f"run_id={run_id}" / "task_id=plan").glob("attempt=*.log")):
        with path.open(errors="replace") as log:
            for raw in log:
                try:
                    event = json.loads(raw)
                except ValueError:
                    continue
                if str(event.get("logger", "")).startswith("olmocr_tasks.run"):
                    lines.append(str(event.get("event", ""))[:1000])
    return lines


# ------------------------------------------------------------------------------------- comparison


def _records() -> Iterator[dict[str, Any]]:
    for path in sorted(RECORDS_DIR.glob("airflow_scale-*.json"), reverse=True):
        try:
            yield json.loads(path.read_text()) | {"path": path.name}
        except ValueError:
            continue


def _peaks(row: dict[str, Any]) -> dict[str, float]:
    memory = row.get("airflow", {}).get("peak_memory", {})
    figures = {}
    for task in ("plan", "convert", "publish_manifest"):
        if task in memory:
            figures[f"{task} self max"] = memory[task]["self_mib"]["max"]
            if task == "convert":
                figures["convert self median"] = memory[task]["self_mib"]["median"]
                figures["convert children max"] = memory[task]["children_mib"]["max"]
    return figures


def compare_to_reference(
    row: dict[str, Any], runs: list[dict[str, Any]], reference_documents: int
) -> dict[str, Any] | None:
    """Item f: each task's peak against the same N-``reference_documents`` run, this invocation's or
    the latest record's."""
    reference = next(
        (other for other in runs if other["documents"] == reference_documents and other.get("airflow")), None
    )
    source = "this invocation"
    if reference is None:
        for record in _records():
            reference = next(
                (
                    other
                    for other in record.get("runs", [])
                    if other["documents"] == reference_documents and other.get("airflow")
                ),
                None,
            )
            if reference is not None:
                source = f"{record['path']} ({record['commit']['commit']})"
                break
    if reference is None:
        return None
    ours, theirs = _peaks(row), _peaks(reference)
    ratios = {name: round(ours[name] / theirs[name], 3) for name in ours if theirs.get(name)}
    return {
        "reference": source,
        "reference_documents": reference_documents,
        "peaks_mib": ours,
        "reference_peaks_mib": theirs,
        "ratios": ratios,
        "all_within_1.25": all(value <= 1.25 for value in ratios.values()) if ratios else None,
    }


# ------------------------------------------------------------------------------------------- main


def _max_map_length(cluster: Any) -> int:
    return int(cluster.airflow("config", "get-value", "core", "max_map_length").stdout.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--documents", type=int, nargs="+", default=[10_000], help="one-page documents per run")
    parser.add_argument("--skip-cli", action="store_true", help="leave out the CLI reference run")
    parser.add_argument(
        "--cli-max", type=int, default=None, metavar="N", help="measure the CLI only for runs of at most N documents"
    )
    parser.add_argument("--pool-slots", type=int, default=2, help="olmocr_vllm slots (and OLMOCR_CONVERT_SLOTS)")
    parser.add_argument("--lines", type=int, default=DEFAULT_LINES, help="text lines on each page")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="extra component env")
    args = parser.parse_args(argv)
    # SIGTERM ends it like Ctrl-C: the record of what was measured is written, the cluster stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    from olmocr_testkit.airflow_env import vllm_connection
    from olmocr_testkit.cluster import ADMIN_USER, AirflowApi, AirflowCluster, ClusterSettings

    work = fresh_dir(WORK)
    output = work / "airflow-output"  # every Airflow run's output: the location the runs page reads
    extra_env = dict(item.split("=", 1) for item in args.env)
    record: dict[str, Any] = {
        "bench": "airflow_scale",
        "commit": code_version(),
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "load_average_at_start": _load()},
        "settings": {
            "regime": CPU_BOUND.name,
            "server": CPU_BOUND.description,
            **CPU_BOUND.settings(),
            "pages_per_document": 1,
            "lines_per_page": args.lines,
            "workers": "2 Celery workers x 2",
            "pool_slots": args.pool_slots,
            "high_priority_slots": 1,
            "scope": "all",
            "priority_class": "auto (low)",
            "schedule": SCHEDULE,
            "env": args.env,
            # The components get no OLMOCR_ variable of this shell (the cluster leaves them out): only --env.
            "batch_env": {
                name: extra_env.get(name)
                for name in ("OLMOCR_BATCH_PAGES", "OLMOCR_BYTES_PER_PAGE", "OLMOCR_LOW_CLASS_WAVES")
            },
        },
        "runs": [],
    }
    with standin(CPU_BOUND) as server:
        env = {
            "AIRFLOW_CONN_OLMOCR_VLLM": vllm_connection(server.url, MODEL),
            "OLMOCR_ALLOWED_INPUTS": "*",
            "OLMOCR_ALLOWED_OUTPUTS": "*",
            "OLMOCR_INPUT_URI": str(fresh_dir(work / "scheduled-input")),
            "OLMOCR_OUTPUT_URI": str(output),
            "OLMOCR_SCHEDULE": SCHEDULE,
            "OLMOCR_CONVERT_SLOTS": str(args.pool_slots),
            **extra_env,
        }
        # The CLI references run before the deployment starts: an idle scheduler, dag-processor and
        # workers take CPU the CLI would otherwise have (a 10,000-document CLI pass beside the idle
        # cluster once took 325 s against 199 s alone), which would flatter the ratio.
        rows: list[dict[str, Any]] = []
        corpora: list[Corpus] = []
        start = 0
        for documents in args.documents:
            generating = time.perf_counter()
            corpus = one_page_corpus(work / f"input-{documents}", start, documents, args.lines)
            start += documents
            row: dict[str, Any] = {
                "documents": documents,
                "corpus": corpus.describe() | {"generate_s": round(time.perf_counter() - generating, 1)},
            }
            if not args.skip_cli and (args.cli_max is None or documents <= args.cli_max):
                cli = measure_cli(corpus, server.url, work, CPU_BOUND.name)
                row["cli"] = {
                    "wall_s": round(cli.measurement.wall_s, 2) if cli.measurement else None,
                    "pages_per_s": round(cli.pages_per_s, 2) if cli.pages_per_s else None,
                    "peak_rss_mib": round(cli.peak_rss_mib, 1) if cli.peak_rss_mib else None,  # sampled tree sum
                    "max_rss_mib": round(cli.max_rss_mib, 1) if cli.max_rss_mib else None,  # kernel: exact
                    "ok": cli.ok,
                    "note": cli.note,
                    "load_before": cli.measurement.load_before if cli.measurement else None,
                    "deployment_running": False,
                }
                print(f"{documents}: CLI {row['cli']}", flush=True)
            rows.append(row)
            corpora.append(corpus)
        cluster = AirflowCluster(ClusterSettings(work_dir=work / "cluster", pool_slots=args.pool_slots, env=env))
        db: MetadataDb | None = None
        try:
            cluster.start()
            api = AirflowApi(cluster.api_url, ADMIN_USER, cluster.admin_password)
            assert cluster.postgres is not None
            db = MetadataDb(cluster.postgres.host, cluster.postgres.port, cluster.database)
            max_map_length = _max_map_length(cluster)
            record["settings"]["max_map_length"] = max_map_length
            api.wait_for_dag(DAG_ID)
            api.set_paused(DAG_ID, False)
            # A warm-up run: the first run after start pays the workers' first imports. Its own output
            # location: a plan sizes instances from the measured cost of earlier runs in its location.
            warm = one_page_corpus(work / "warm-up", 90_000_000, 8, args.lines)
            warm_row = measure_run(api, db, cluster, warm, work / "warm-up-output", max_map_length)
            print(f"warm-up: ok {warm_row['ok']}, {warm_row['trigger_to_manifest_s']} s", flush=True)
            for row, corpus in zip(rows, corpora, strict=True):
                documents = row["documents"]
                progress: dict[str, Any] = {}
                try:
                    airflow = measure_run(api, db, cluster, corpus, output, max_map_length, progress)
                except BaseException as exc:
                    # Interrupted (Ctrl-C, SIGTERM, a timeout): what the run had done, from the
                    # database and the task logs, before the cluster and its database go.
                    row["airflow"] = {"interrupted": repr(exc), **_partial(db, cluster, progress, max_map_length)}
                    record["runs"].append(row)
                    raise
                row["airflow"] = airflow
                if airflow["pages_per_s"] and row.get("cli", {}).get("pages_per_s"):
                    row["ratio_to_cli"] = round(airflow["pages_per_s"] / row["cli"]["pages_per_s"], 3)
                if documents > 10_000:
                    row["peaks_against_10000"] = compare_to_reference(row, record["runs"], 10_000)
                record["runs"].append(row)
                _print_row(row)
            api.close()
            record["complete"] = True
        finally:
            if db is not None:
                db.close()
            cluster.stop()
            _write(record)
    return 0


def _partial(db: MetadataDb, cluster: Any, progress: dict[str, Any], max_map_length: int) -> dict[str, Any]:
    if "run_id" not in progress:
        return {}
    try:
        costs = run_costs(db, cluster, progress, max_map_length)
    except Exception as exc:  # the database may be gone: keep what the logs say
        costs = {"costs_error": repr(exc), "peak_memory": peak_memory(cluster.log_dir / "tasks", progress["run_id"])}
    return {"run_id": progress["run_id"], "elapsed_s": round(time.monotonic() - progress["started"], 1), **costs}


def _write(record: dict[str, Any]) -> None:
    """The raw record, complete or not (``complete``: the invocation measured every N to the end)."""
    record["ended"] = datetime.now(UTC).isoformat(timespec="seconds")
    record.setdefault("complete", False)
    RECORDS_DIR.mkdir(exist_ok=True)
    path = RECORDS_DIR / f"airflow_scale-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(f"raw: {path}", flush=True)


def _print_row(row: dict[str, Any]) -> None:
    airflow = row["airflow"]
    convert = airflow["convert"]
    print(
        json.dumps(
            {
                "documents": row["documents"],
                "ok": airflow["ok"],
                "cli_s": row.get("cli", {}).get("wall_s"),
                "airflow_s": airflow["trigger_to_manifest_s"],
                "ratio_to_cli": row.get("ratio_to_cli"),
                "instances": convert["instances"],
                "documents_per_instance": convert["documents_per_instance"],
                "instance_running_s": convert["running_s"],
                "xcom_json_bytes": airflow["xcom"]["json_bytes"],
                "database_bytes_added": airflow["database"]["added"]["database_bytes"],
                "publish_manifest_running_s": airflow["publish_manifest_running_s"],
            }
        ),
        flush=True,
    )
    print(json.dumps(airflow["peak_memory"]), flush=True)
    for name, page in airflow["pages"].items():
        cold, warm = page["cold_ttfb_s"], page["warm_ttfb_s_median"]
        checked = "" if page["holds_expected_text"] else " (NOT the expected content)"
        print(f"  {name}: {page['status']} first byte cold {cold} s, warm {warm} s, {page['bytes']} B{checked}")
    if row.get("peaks_against_10000"):
        print(json.dumps(row["peaks_against_10000"]), flush=True)


if __name__ == "__main__":
    sys.exit(main())
