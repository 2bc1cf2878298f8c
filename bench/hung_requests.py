"""Hung requests, server-bound: one pass with 1 % and 5 % of requests accepted and never answered,
against the same pass with none (issue 13's targets: wall time ratio <= 1.3 and <= 1.6, exit 0, no
page lost or duplicated).

    .venv/bin/python -m bench.hung_requests [--quick] [--rates 0.01,0.05] [--seed N]

Each pass is a measured child process running the engine the CLI runs (``run_conversion``), against
the stand-in in its own process with ``fault_rates={"hang": rate}``. The stand-in's pages take 1 s,
so the timing settings are scaled to it, as the defaults are to real pages of tens of seconds: a
60-s read timeout and a 5-s hedge floor (the defaults are 300 s and 120 s).

Checks per pass: exit status 0, every document converted with all its pages, no fallback page, and
each document's Dolma record spans its pages 1..N exactly once. Prints a markdown table and writes
``bench/results/hung_requests-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import MODEL, RESULTS_DIR, SERVER_BOUND, fresh_dir, standin, subprocess_env
from bench.corpus import Corpus, mixed_corpus
from bench.measure import run_measured
from bench.run_cli import read_manifest

TARGETS = {0.01: 1.3, 0.05: 1.6}
READ_TIMEOUT_S = 60.0
HEDGE_FLOOR_S = 5.0


def check_outputs(output: Path, corpus: Corpus) -> tuple[bool, str, dict[str, Any]]:
    """Every document converted once, every page present exactly once, no fallback page."""
    manifest = read_manifest(output)
    if manifest is None:
        return False, "no manifest", {}
    counts = manifest["counts"]
    details: dict[str, Any] = {"counts": counts, "metrics": manifest.get("metrics", {})}
    if counts["failed"] or counts["fallback_pages"] or counts["pages"] != corpus.pages:
        return False, f"pages {counts['pages']}/{corpus.pages}, failed {counts['failed']}", details
    expected = dict(corpus.documents)
    seen: dict[str, int] = {}
    for record_path in sorted((output / "dolma").glob("*.jsonl")):
        lines = record_path.read_text().splitlines()
        if len(lines) != 1:
            return False, f"{record_path.name} holds {len(lines)} records", details
        record = json.loads(lines[0])
        name = Path(record["metadata"]["Source-File"]).name
        pages = [span[2] for span in record["attributes"]["pdf_page_numbers"]]
        if sorted(pages) != list(range(1, expected.get(name, -1) + 1)):
            return False, f"{name}: pages {pages[:5]}... do not span 1..{expected.get(name)} once", details
        seen[name] = seen.get(name, 0) + 1
    if seen != dict.fromkeys(expected, 1):
        missing = sorted(set(expected) - set(seen))
        return False, f"documents without exactly one record: {missing[:5]}", details
    return True, "", details


def run_pass(corpus: Corpus, work: Path, rate: float, seed: int) -> dict[str, Any]:
    slug = f"hung-{rate:g}"
    output = fresh_dir(work / slug)
    faults = {"hang": rate} if rate else {}
    with standin(SERVER_BOUND, fault_rates=faults, seed=seed) as server:
        command = [
            sys.executable, "-m", "bench.hung_requests", "--child", str(corpus.folder), str(output),
            "--server", server.url, "--run-id", slug,
        ]  # fmt: skip
        measurement = run_measured(command, label=slug, env=subprocess_env(), log_path=work / f"{slug}.log")
        server_stats = server.stats()
    ok, note, details = check_outputs(output, corpus)
    if measurement.returncode != 0:
        ok, note = False, f"exit {measurement.returncode}; see {slug}.log"
    return {
        "rate": rate,
        "ok": ok,
        "note": note,
        "exit": measurement.returncode,
        "wall_s": round(measurement.wall_s, 2),
        "hung_requests": server_stats["by_outcome"].get("hang", 0),
        "requests": server_stats["total"],
        **details,
    }


def child(argv: list[str]) -> int:
    """One conversion pass, as ``olmocr-tasks convert`` runs it, with the bench's timing settings."""
    parser = argparse.ArgumentParser(prog="python -m bench.hung_requests --child")
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--server", required=True)
    parser.add_argument("--run-id", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from olmocr_tasks.config import ConversionSettings, ServerSettings
    from olmocr_tasks.errors import InfrastructureError
    from olmocr_tasks.pipeline import RunRequest, run_conversion
    from olmocr_tasks.storage import Storage

    settings = ConversionSettings(
        server=ServerSettings(
            base_urls=(args.server.rstrip("/"),),
            model=MODEL,
            read_timeout_s=READ_TIMEOUT_S,
            hedge_min_delay_s=HEDGE_FLOOR_S,
        )
    )
    request = RunRequest(input_uri=args.input, output_uri=args.output, run_id=args.run_id, settings=settings)
    try:
        manifest, _ = run_conversion(request, Storage(), progress_stream=None)
    except InfrastructureError as exc:
        print(f"retryable failure: {exc}", file=sys.stderr)
        return 3
    return 1 if manifest.counts()["failed"] else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m bench.hung_requests")
    parser.add_argument("--quick", action="store_true", help="the 226-page corpus instead of 1,002 pages")
    parser.add_argument("--rates", default="0.01,0.05", help="hung-request fractions to compare with 0")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    rates = [float(rate) for rate in args.rates.split(",") if rate]
    corpus = mixed_corpus(seed=args.seed, quick=args.quick)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    work = fresh_dir(RESULTS_DIR / f"hung_requests-{stamp}")

    baseline = run_pass(corpus, work, 0.0, args.seed)
    passes = [run_pass(corpus, work, rate, args.seed) for rate in rates]
    all_ok = baseline["ok"]
    lines = [
        f"Hung requests, server-bound ({SERVER_BOUND.description}), {corpus.pages} pages, one pass each",
        "",
        "| hung | hung requests seen | wall s | ratio | target | pages ok | requests beyond one per page |",
        "|---|---|---|---|---|---|---|",
        f"| 0 % | 0 | {baseline['wall_s']} | 1.00 | | {baseline['ok']} | {baseline['requests'] - corpus.pages} |",
    ]
    for result in passes:
        ratio = result["wall_s"] / baseline["wall_s"]
        target = TARGETS.get(result["rate"])
        result["ratio"] = round(ratio, 3)
        met = result["ok"] and (target is None or ratio <= target)
        all_ok = all_ok and met
        verdict = f"{result['ok']} ({result['note']})" if result["note"] else str(result["ok"])
        lines.append(
            f"| {result['rate']:.0%} | {result['hung_requests']} | {result['wall_s']} | {ratio:.2f} | "
            f"{'<= ' + str(target) if target else ''} | {verdict} | {result['requests'] - corpus.pages} |"
        )
    table = "\n".join(lines)
    print(table)
    (work / "results.json").write_text(json.dumps({"baseline": baseline, "passes": passes}, indent=2, default=str))
    (work / "results.md").write_text(table + "\n")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
