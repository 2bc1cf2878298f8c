"""``make bench``: every measurement in one session, one JSON file and one markdown table.

    .venv/bin/python bench/run_all.py [--quick] [--seed N] [--skip olmocr,airflow,backpressure,discovery]

Results go to ``bench/results/<UTC timestamp>/`` (logs of every run, ``results.json``, ``results.md``),
copied to ``bench/results/latest.json`` and ``latest.md``; the markdown is also printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # Run as a script (``python bench/run_all.py``): make the checkout importable as packages.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.backpressure import measure_backpressure
from bench.common import (
    BACKPRESSURE,
    CPU_BOUND,
    RECORDS_DIR,
    RESULTS_DIR,
    SERVER_BOUND,
    Regime,
    Row,
    code_version,
    fresh_dir,
    standin,
)
from bench.corpus import Corpus, mixed_corpus, single_document, subset
from bench.discovery_scale import measure_discovery
from bench.floor import measure_floor
from bench.run_airflow import AirflowHome, measure_airflow
from bench.run_cli import measure_cli
from bench.run_olmocr import OLMOCR_VERSION, SETTINGS, ensure_olmocr, measure_olmocr

SKIPPABLE = ("olmocr", "airflow", "backpressure", "discovery", "rss")
OLMOCR_SUBSET_EVERY = 4


def _log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')} load {os.getloadavg()[0]:.2f}] {message}", file=sys.stderr, flush=True)


def _machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cores": len(os.sched_getaffinity(0)),
        "cpu": model,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def _regime_rows(
    regime: Regime,
    corpus: Corpus,
    olmocr_corpus: Corpus | None,
    work: Path,
    args: argparse.Namespace,
    airflow_home: AirflowHome,
    olmocr_problem: str | None,
) -> list[Row]:
    rows: list[Row] = []
    with standin(regime) as server:
        if regime is CPU_BOUND:
            _log(f"{regime.name}: bare pypdfium2+httpx pipeline")
            rows.append(measure_floor("pipeline", corpus, work, regime.name, server.url))
        _log(f"{regime.name}: our CLI on {corpus.pages} pages")
        rows.append(measure_cli(corpus, server.url, work, regime.name))
        if "airflow" not in args.skip:
            _log(f"{regime.name}: our Airflow path")
            rows.append(measure_airflow(corpus, server.url, work, regime.name, airflow_home))
        if "olmocr" not in args.skip and olmocr_corpus is not None:
            if olmocr_corpus is not corpus:
                _log(f"{regime.name}: our CLI on the olmOCR subset ({olmocr_corpus.pages} pages)")
                rows.append(measure_cli(olmocr_corpus, server.url, work, regime.name, system="ours: CLI (subset)"))
            for setting in args.olmocr_settings:
                name = f"olmOCR {OLMOCR_VERSION} ({setting})"
                if olmocr_problem:
                    rows.append(Row(name, regime.name, olmocr_corpus.pages, None, False, olmocr_problem))
                    continue
                _log(f"{regime.name}: {name} on {olmocr_corpus.pages} pages")
                rows.append(measure_olmocr(olmocr_corpus, server.url, work, regime.name, setting))
    return rows


def _warm_up(
    work: Path, args: argparse.Namespace, airflow_home: AirflowHome, olmocr_problem: str | None
) -> list[dict[str, Any]]:
    """One unrecorded run of each system, so no measured run pays for first-time compilation."""
    tiny = single_document(2)
    fresh_dir(work)
    rows = [measure_floor("render", tiny, work, "warmup")]
    with standin(CPU_BOUND) as server:
        rows.append(measure_floor("pipeline", tiny, work, "warmup", server.url))
        rows.append(measure_cli(tiny, server.url, work, "warmup"))
        if "airflow" not in args.skip:
            rows.append(measure_airflow(tiny, server.url, work, "warmup", airflow_home))
        if "olmocr" not in args.skip and olmocr_problem is None:
            rows.append(measure_olmocr(tiny, server.url, work, "warmup"))
    return [{"system": row.system, "ok": row.ok, "note": row.note,
             "wall_s": row.measurement and round(row.measurement.wall_s, 2)} for row in rows]  # fmt: skip


def _find(rows: list[Row], system: str, regime: str) -> Row | None:
    for row in rows:
        if row.system == system and row.regime == regime:
            return row
    return None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _target(name: str, value: float | None, op: str, bound: float, basis: str) -> dict[str, Any]:
    if value is None:
        verdict = "n/a"
    elif op == ">=":
        verdict = "PASS" if value >= bound else "FAIL"
    else:
        verdict = "PASS" if value <= bound else "FAIL"
    return {"target": name, "value": None if value is None else round(value, 3), "op": op, "bound": bound,
            "verdict": verdict, "basis": basis}  # fmt: skip


def compute_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[Row] = results["_rows"]
    targets = []
    server, cpu = SERVER_BOUND.name, CPU_BOUND.name
    cli_server = _find(rows, "ours: CLI", server)
    if cli_server is not None and cli_server.ok:
        capacity = SERVER_BOUND.server_pages_per_s
        targets.append(_target("server-bound CLI pages/s / server capacity", _ratio(cli_server.pages_per_s,
                       capacity), ">=", 0.97, "process wall time, start-up included"))  # fmt: skip
        # Issue 2's form: against min(server capacity, what our rendering can feed), the latter being
        # the CLI's own CPU-bound throughput in this session.
        cli_cpu = _find(rows, "ours: CLI", cpu)
        if cli_cpu is not None and cli_cpu.pages_per_s:
            ceiling = min(capacity, cli_cpu.pages_per_s)
            targets.append(_target("server-bound CLI pages/s / min(capacity, CLI render ceiling)", _ratio(
                           cli_server.pages_per_s, ceiling), ">=", 0.97, f"ceiling {ceiling:.2f} p/s"))  # fmt: skip
        in_run = cli_server.details.get("in_run_pages_per_s")
        targets.append(_target("server-bound CLI pages/s / server capacity (in-run)", _ratio(in_run,
                       capacity), ">=", 0.97, "manifest: run start to finish"))  # fmt: skip
    for regime, bound in ((server, 1.7), (cpu, 4.0)):
        ours = _find(rows, "ours: CLI (subset)", regime) or _find(rows, "ours: CLI", regime)
        # Against olmOCR's best setting of those tried, not its defaults: the ratio a user who tunes
        # olmOCR would see.
        tried = [row for row in rows if row.system.startswith(f"olmOCR {OLMOCR_VERSION} (") and row.regime == regime]
        theirs = max((row for row in tried if row.ok and row.pages_per_s), key=lambda row: row.pages_per_s or 0.0,
                     default=None)  # fmt: skip
        basis = f"same documents, same stand-in; olmOCR's best setting: {theirs.system}" if theirs else "no olmOCR row"
        targets.append(_target(f"{regime} ours / olmOCR pages/s", _ratio(ours and ours.pages_per_s,
                       theirs and theirs.pages_per_s), ">=", bound, basis))  # fmt: skip
    floor = _find(rows, "floor: render+encode loop", "-")
    for regime in (cpu, server):
        cli = _find(rows, "ours: CLI", regime)
        ratio = _ratio(cli and cli.cpu_ms_per_page, floor and floor.cpu_ms_per_page)
        targets.append(_target(f"CPU/page ours / floor ({regime})", ratio, "<=", 1.15, "process-tree CPU"))
    for regime in (server, cpu):
        cli, airflow = _find(rows, "ours: CLI", regime), _find(rows, "ours: Airflow (dags test)", regime)
        targets.append(_target(f"Airflow / CLI pages/s ({regime})", _ratio(airflow and airflow.pages_per_s,
                       cli and cli.pages_per_s), ">=", 0.9, "process wall: includes Airflow start-up"))  # fmt: skip
        dag_run = airflow.details.get("dag_run_s") if airflow and airflow.ok else None
        dag_pps = airflow.pages / dag_run if airflow and dag_run else None
        targets.append(_target(f"Airflow / CLI pages/s ({regime}, DAG run)", _ratio(dag_pps,
                       cli and cli.pages_per_s), ">=", 0.9, "Airflow's run_duration vs CLI process wall"))  # fmt: skip
        # The tasks after check_server: what a run costs once Airflow is up. ``dags test`` builds its
        # in-process Execution API (Cadwyn's versioned routers) inside the first task, which a
        # deployment does once when its API server starts.
        tasks = airflow.details.get("task_s", {}) if airflow and airflow.ok else {}
        work_s = sum(seconds for task, seconds in tasks.items() if task != "check_server")
        targets.append(_target(f"Airflow / CLI pages/s ({regime}, tasks after check_server)", _ratio(
                       airflow.pages / work_s if airflow and work_s else None, cli and cli.pages_per_s), ">=",
                       0.9, "plan+convert+publish+budget task time vs CLI process wall"))  # fmt: skip
    rss = results.get("rss")
    if rss:
        targets.append(_target(f"peak RSS {rss['long_pages']}-page doc / {rss['short_pages']}-page doc", rss["ratio"],
                               "<=", 1.5, "exact peak (kernel max RSS) of the CLI tree's largest process"))  # fmt: skip
    discovery = results.get("discovery")
    if discovery:
        targets.append(_target(f"discovery of {discovery['objects']:,} objects: ours / bare ListObjectsV2",
                               discovery["ratio"], "<=", 1.5, "listing time, best of runs"))  # fmt: skip
    backpressure = results.get("backpressure")
    if backpressure:
        adaptive = next(mode for mode in backpressure["modes"] if mode["mode"] == "adaptive")
        targets.append(_target("shared server: adaptive utilisation while busy", adaptive["queue"].get(
                       "server_utilisation"), ">=", 0.95, "stand-in running/capacity, 100 ms samples"))  # fmt: skip
        targets.append(_target("shared server: adaptive settled max waiting", adaptive["queue"].get(
                       "settled_max_waiting"), "<=", 2 * BACKPRESSURE.capacity, "after the first quarter"))  # fmt: skip
    return targets


def _fmt(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def render_markdown(results: dict[str, Any]) -> str:
    rows: list[Row] = results["_rows"]
    machine = results["machine"]
    loads = [row.measurement.load_before[0] for row in rows if row.measurement]
    busy = " (above the core count: other work competed, absolute numbers are noisy)"
    lines = [
        f"## Benchmark {results['started_at']} ({'quick' if results['quick'] else 'full'})",
        "",
        f"Machine: {machine['cores']} cores ({machine['cpu']}), {machine['memory_gib']} GiB, Python "
        f"{machine['python']}. Load average (1 min) at start {results['load_start'][0]:.2f}, at end "
        f"{results['load_end'][0]:.2f}, mean over the runs {sum(loads) / max(1, len(loads)):.2f}"
        # The benchmark itself keeps up to about one core busy; more than the core count means other
        # work competed for the CPU during some runs.
        f"{busy if loads and max(loads) > machine['cores'] else ''}.",
        f"Corpus: {results['corpus']['documents']} documents, {results['corpus']['pages']} pages (largest "
        f"{results['corpus']['largest']}, median {results['corpus']['median']}), seed {results['seed']}. "
        f"Stand-in regimes: {SERVER_BOUND.name} = {SERVER_BOUND.description}; {CPU_BOUND.name} = "
        f"{CPU_BOUND.description}.",
        "",
        "| system | regime | pages | pages/s | CPU ms/page | max RSS MiB (kernel, largest process) | "
        "tree RSS MiB (sampled sum) | wall s | note |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        wall = row.measurement.wall_s if row.measurement else None
        note = row.note
        if row.details.get("in_run_pages_per_s") is not None:
            note = (note + "; " if note else "") + f"in-run {row.details['in_run_pages_per_s']:.2f} p/s"
        if row.details.get("dag_run_s") is not None:
            note = (note + "; " if note else "") + f"DAG run {row.details['dag_run_s']:.1f} s"
        lines.append(
            f"| {row.system} | {row.regime} | {row.pages} | {_fmt(row.pages_per_s, 2)} | "
            f"{_fmt(row.cpu_ms_per_page)} | {_fmt(row.max_rss_mib)} | {_fmt(row.peak_rss_mib)} | "
            f"{_fmt(wall)} | {note} |"
        )
    lines += ["", "| target | measured | bound | verdict | basis |", "|---|---:|---:|---|---|"]
    for target in results["targets"]:
        lines.append(
            f"| {target['target']} | {_fmt(target['value'], 3)} | {target['op']} {target['bound']} | "
            f"**{target['verdict']}** | {target['basis']} |"
        )
    backpressure = results.get("backpressure")
    if backpressure:
        lines += [
            "",
            f"Shared server ({backpressure['regime']}), {backpressure['modes'][0]['runs']} concurrent runs on the "
            "light corpus:",
            "",
            "| adaptive window | pages | total pages/s | share of capacity | utilisation while busy | max waiting | "
            "mean waiting | settled max / mean waiting |",
            "|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for mode in backpressure["modes"]:
            queue = mode["queue"]
            lines.append(
                f"| {'on' if mode['mode'] == 'adaptive' else 'off (fixed 64)'} | {mode['pages']} | "
                f"{mode['total_pages_per_s']:.2f} | {mode['share_of_capacity']:.3f} | "
                f"{queue.get('server_utilisation')} | {mode['max_waiting']} | {queue.get('mean_waiting')} | "
                f"{queue.get('settled_max_waiting')} / {queue.get('settled_mean_waiting')} |"
            )
    discovery = results.get("discovery")
    if discovery:
        best = discovery["best"]
        lines += [
            "",
            f"Discovery of {discovery['objects']:,} objects ({discovery['pdfs']:,} PDFs) on a moto server: ours "
            f"{best['ours']['listing_s']:.1f} s, {best['ours']['peak_rss_mib']:.0f} MiB peak; bare boto3 "
            f"{best['bare']['listing_s']:.1f} s, {best['bare']['peak_rss_mib']:.0f} MiB peak.",
        ]
    rss = results.get("rss")
    if rss:
        lines += [
            "",
            f"Memory versus document length (CLI, {CPU_BOUND.name}, exact peaks): {rss['long_pages']} pages "
            f"{rss['long_mib']:.0f} MiB, {rss['short_pages']} pages {rss['short_mib']:.0f} MiB.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/run_all.py", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a ~230-page corpus and smaller scale tests")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip", type=lambda text: [item for item in text.split(",") if item], default=[],
                        help=f"comma-separated: {', '.join(SKIPPABLE)}")  # fmt: skip
    parser.add_argument("--olmocr-settings", type=lambda text: text.split(","), default=None,
                        help=f"olmOCR settings ({', '.join(SETTINGS)}); the first also runs CPU-bound")  # fmt: skip
    parser.add_argument("--olmocr-full", action="store_true", help="run olmOCR on the whole corpus, not 1 in 4 docs")
    parser.add_argument("--discovery-objects", type=int, default=None)
    args = parser.parse_args(argv)
    unknown = set(args.skip) - set(SKIPPABLE)
    if unknown:
        parser.error(f"unknown --skip item(s): {', '.join(sorted(unknown))}")
    if args.olmocr_settings is None:
        args.olmocr_settings = ["default"] if args.quick else list(SETTINGS)
    started = datetime.now(UTC)
    work = fresh_dir(RESULTS_DIR / started.strftime("%Y%m%dT%H%M%SZ"))
    results: dict[str, Any] = {
        "started_at": started.isoformat(timespec="seconds"),
        "quick": args.quick,
        "seed": args.seed,
        "machine": _machine(),
        "load_start": os.getloadavg(),
    }
    _log(f"results in {work.relative_to(RESULTS_DIR.parent.parent)}")
    corpus = mixed_corpus(args.seed, quick=args.quick)
    results["corpus"] = corpus.describe()
    olmocr_corpus: Corpus | None = None
    olmocr_problem: str | None = None
    if "olmocr" not in args.skip:
        _log(f"checking olmOCR {OLMOCR_VERSION} in bench/results/olmocr-venv (installing on first use)")
        olmocr_problem = ensure_olmocr(work / "olmocr-install.log")
        olmocr_corpus = corpus if args.olmocr_full else subset(corpus, OLMOCR_SUBSET_EVERY, work / "olmocr-subset")
        results["olmocr_corpus"] = olmocr_corpus.describe()
    airflow_home = AirflowHome(work / "airflow-home")

    _log("warm-up: every system once on a 2-page document (fills bytecode and page caches)")
    results["warmup"] = _warm_up(work / "warmup", args, airflow_home, olmocr_problem)

    rows: list[Row] = []
    _log(f"floor: render+encode loop over {corpus.pages} pages")
    rows.append(measure_floor("render", corpus, work, "-"))
    for regime in (SERVER_BOUND, CPU_BOUND):
        rows += _regime_rows(regime, corpus, olmocr_corpus, work, args, airflow_home, olmocr_problem)
    results["_rows"] = rows

    if "rss" not in args.skip:
        long_pages, short_pages = (150, 10) if args.quick else (400, 10)
        long_doc, short_doc = single_document(long_pages), single_document(short_pages)
        with standin(CPU_BOUND) as server:
            _log(f"memory: {long_pages}-page and {short_pages}-page documents")
            long_row = measure_cli(long_doc, server.url, work, CPU_BOUND.name,
                                   system=f"ours: CLI, {long_pages}-page doc")  # fmt: skip
            short_row = measure_cli(short_doc, server.url, work, CPU_BOUND.name,
                                    system=f"ours: CLI, {short_pages}-page doc")  # fmt: skip
        rows += [long_row, short_row]
        if long_row.max_rss_mib and short_row.max_rss_mib and long_row.ok and short_row.ok:
            results["rss"] = {"long_pages": long_pages, "short_pages": short_pages, "long_mib": long_row.max_rss_mib,
                              "short_mib": short_row.max_rss_mib, "source": "kernel max RSS (wait4 ru_maxrss)",
                              "ratio": long_row.max_rss_mib / short_row.max_rss_mib}  # fmt: skip
    if "backpressure" not in args.skip:
        light = mixed_corpus(args.seed, quick=args.quick, light=True)
        _log(f"backpressure: 3 runs sharing one server, {light.pages} light pages, adaptive on then off")
        results["backpressure"] = measure_backpressure(light, work)
    if "discovery" not in args.skip:
        objects = args.discovery_objects or (10_000 if args.quick else 100_000)
        _log(f"discovery: {objects:,} objects in moto")
        results["discovery"] = measure_discovery(work, objects, repeats=2 if args.quick else 1)

    results["load_end"] = os.getloadavg()
    results["targets"] = compute_targets(results)
    markdown = render_markdown(results)
    results["rows"] = [row.to_dict() for row in results.pop("_rows")]
    (work / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (work / "results.md").write_text(markdown)
    # The raw result kept with the code (bench/results/ is git-ignored): the commit it measured.
    results["code"] = code_version()
    RECORDS_DIR.mkdir(exist_ok=True)
    record = RECORDS_DIR / f"run_all-{'quick-' if args.quick else ''}{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    record.write_text(json.dumps(results, indent=1, default=str))
    _log(f"raw result: {record.relative_to(RECORDS_DIR.parent.parent)}")
    shutil.copyfile(work / "results.json", RESULTS_DIR / "latest.json")
    shutil.copyfile(work / "results.md", RESULTS_DIR / "latest.md")
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
