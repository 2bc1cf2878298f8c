"""Hung requests with the hedging defaults, in two regimes (issue 21's targets), one pass each.

    .venv/bin/python -m bench.hung_requests [--regime fast|gpu|cold|both|all] [--quick] [--seed N]

* ``fast``: the stand-in at 8 concurrent x 0.5 s (16 pages/s), the 1,002-page corpus (226 with
  ``--quick``): a fault-free pass, then 1 % and 5 % of requests accepted and never answered; targets
  one pass <= 1.3x and <= 1.6x the fault-free one.
* ``gpu``: a GPU-like stand-in, 64 concurrent x 20-40 s (uniform jitter, ~2.1 pages/s), the 600-page
  corpus (about five minutes a pass), and a client window of 96 so that a queue stands at the server
  (the adaptive window keeps 16-32 requests waiting): hedging off, hedging on, and 1 % hung with
  hedging on. Targets: with nothing hung, hedged requests <= 1 % of pages and throughput within 2 % of
  hedging off; with 1 % hung, <= 1.3x the hedging-on fault-free pass.
* ``cold``: small runs, where a hung request comes before the client has timed the 8 answers its
  percentile needs (cold start): one document of 1 page and one of 3 pages, each fault-free and with
  its first page's first request hung (the stand-in reads the pages' markers to hang exactly that
  one), on both servers; on the fast server also the 1-page run without ``/metrics``, where only the
  read-timeout prior is left. Target: each hung run is hedged and finishes in under half the 300-s
  read timeout (so no read timeout fired).

``both`` runs fast and gpu, ``all`` (the default) all three. Every pass uses the client's defaults
(read timeout 300 s, hedging knobs of ``ServerSettings``); only the server, the pages and (gpu) the
window differ. Each pass is a measured child process running the engine the CLI runs
(``run_conversion``), against the stand-in in its own process with ``fault_rates={"hang": rate}``
(cold: a script hanging one page's first request). Checks per pass: exit status 0, every document converted with all its
pages, no fallback page, and each document's Dolma record spans its pages 1..N exactly once. Prints a
markdown table and writes ``bench/results/hung_requests-<UTC>/``. Run it under
``flock /tmp/olmocr-bench.lock``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import BACKPRESSURE, MODEL, RESULTS_DIR, Regime, fresh_dir, standin, subprocess_env
from bench.corpus import MEDIUM, Corpus, mixed_corpus, single_document
from bench.measure import run_measured
from bench.run_cli import read_manifest

GPU_LIKE = Regime("gpu-like", 64, 20.0, "64 concurrent x 20-40 s (uniform) = ~2.1 pages/s")
GPU_JITTER_S = 20.0
GPU_WINDOW = 96
# Cold start: a hung small run must finish in under this share of the read timeout (default 300 s).
COLD_TARGET_FRACTION = 0.5


@dataclass(frozen=True)
class Pass:
    """One measured pass: the fraction of hung requests and whether the client hedges."""

    rate: float
    hedging: bool = True

    @property
    def slug(self) -> str:
        return f"hung-{self.rate:g}" + ("" if self.hedging else "-nohedge")


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


def run_pass(
    corpus: Corpus,
    work: Path,
    regime: Regime,
    spec: Pass,
    seed: int,
    *,
    server: dict[str, Any] | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """One pass; ``server`` adds stand-in settings, ``name`` replaces the pass's slug."""
    slug = f"{regime.name}-{name or spec.slug}"
    output = fresh_dir(work / slug)
    overrides: dict[str, Any] = {"fault_rates": {"hang": spec.rate} if spec.rate else {}, "seed": seed}
    overrides.update(server or {})
    child_args: list[str] = []
    if regime is GPU_LIKE:
        overrides["jitter_s"] = GPU_JITTER_S
        child_args += ["--max-concurrent-requests", str(GPU_WINDOW)]
    if not spec.hedging:
        child_args.append("--no-hedging")
    with standin(regime, **overrides) as stand_in:
        command = [
            sys.executable, "-m", "bench.hung_requests", "--child", str(corpus.folder), str(output),
            "--server", stand_in.url, "--run-id", slug, *child_args,
        ]  # fmt: skip
        measurement = run_measured(command, label=slug, env=subprocess_env(), log_path=work / f"{slug}.log")
        server_stats = stand_in.stats()
    ok, note, details = check_outputs(output, corpus)
    if measurement.returncode != 0:
        ok, note = False, f"exit {measurement.returncode}; see {slug}.log"
    return {
        "regime": regime.name,
        "rate": spec.rate,
        "hedging": spec.hedging,
        "ok": ok,
        "note": note,
        "exit": measurement.returncode,
        "wall_s": round(measurement.wall_s, 2),
        "hung_requests": server_stats["by_outcome"].get("hang", 0),
        "requests": server_stats["total"],
        "max_waiting": server_stats.get("max_waiting"),
        "hedged": details.get("counts", {}).get("hedged", 0),
        **details,
    }


def child(argv: list[str]) -> int:
    """One conversion pass, as ``olmocr-tasks convert`` runs it, with the bench's timing settings."""
    parser = argparse.ArgumentParser(prog="python -m bench.hung_requests --child")
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--server", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--max-concurrent-requests", type=int, default=64)
    parser.add_argument("--no-hedging", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from olmocr_tasks.core.config import ConversionSettings, ServerSettings
    from olmocr_tasks.core.errors import InfrastructureError
    from olmocr_tasks.run.pipeline import run_conversion
    from olmocr_tasks.run.request import RunRequest
    from olmocr_tasks.storage.store import Storage

    settings = ConversionSettings(
        server=ServerSettings(
            base_urls=(args.server.rstrip("/"),),
            model=MODEL,
            max_concurrent_requests=args.max_concurrent_requests,
            hedge_requests=not args.no_hedging,
        )
    )
    request = RunRequest(input_uri=args.input, output_uri=args.output, run_id=args.run_id, settings=settings)
    try:
        manifest, _ = run_conversion(request, Storage(), progress_stream=None)
    except InfrastructureError as exc:
        print(f"retryable failure: {exc}", file=sys.stderr)
        return 3
    return 1 if manifest.counts()["failed"] else 0


def _table(regime: Regime, corpus: Corpus, baseline: dict[str, Any], passes: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"Hung requests, {regime.name} ({regime.description}), {corpus.pages} pages in "
        f"{len(corpus.documents)} documents, one pass each, hedging defaults",
        "",
        "| pass | hung requests seen | wall s | ratio | target | hedged (% of pages) | pages ok | server queue peak |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for result in passes:
        ratio = result["wall_s"] / baseline["wall_s"]
        result["ratio"] = round(ratio, 3)
        verdict = f"{result['ok']} ({result['note']})" if result["note"] else str(result["ok"])
        name = f"{result['rate']:.0%} hung" + ("" if result["hedging"] else ", hedging off")
        share = 100 * result["hedged"] / corpus.pages
        lines.append(
            f"| {name} | {result['hung_requests']} | {result['wall_s']} | {ratio:.3f} | {result.get('target', '')} | "
            f"{result['hedged']} ({share:.2f} %) | {verdict} | {result['max_waiting']} |"
        )
    return lines


def fast_regime(work: Path, seed: int, quick: bool) -> tuple[list[str], bool, list[dict[str, Any]]]:
    corpus = mixed_corpus(seed=seed, quick=quick)
    baseline = run_pass(corpus, work, BACKPRESSURE, Pass(0.0), seed)
    passes = [baseline]
    all_ok = baseline["ok"]
    for rate, target in ((0.01, 1.3), (0.05, 1.6)):
        result = run_pass(corpus, work, BACKPRESSURE, Pass(rate), seed)
        result["target"] = f"<= {target}"
        all_ok = all_ok and result["ok"] and result["wall_s"] / baseline["wall_s"] <= target
        passes.append(result)
    return _table(BACKPRESSURE, corpus, baseline, passes), all_ok, passes


def gpu_regime(work: Path, seed: int) -> tuple[list[str], bool, list[dict[str, Any]]]:
    corpus = mixed_corpus(seed=seed, spec=MEDIUM)
    off = run_pass(corpus, work, GPU_LIKE, Pass(0.0, hedging=False), seed)
    on = run_pass(corpus, work, GPU_LIKE, Pass(0.0), seed)
    hung = run_pass(corpus, work, GPU_LIKE, Pass(0.01), seed)
    on["target"] = "throughput >= 0.98 of hedging off; hedged <= 1 %"
    hung["target"] = "<= 1.3 of hedging on, fault-free"
    all_ok = off["ok"] and on["ok"] and hung["ok"]
    all_ok = all_ok and off["wall_s"] / on["wall_s"] >= 0.98 and on["hedged"] <= 0.01 * corpus.pages
    all_ok = all_ok and hung["wall_s"] / on["wall_s"] <= 1.3
    lines = _table(GPU_LIKE, corpus, off, [off, on])
    lines += ["", f"1 % hung against the hedging-on fault-free pass ({on['wall_s']} s):", ""]
    lines += _table(GPU_LIKE, corpus, on, [hung])[2:]
    return lines, all_ok, [off, on, hung]


@dataclass(frozen=True)
class SmallRun:
    """One document of ``pages`` pages, its first page's first request hung or not."""

    pages: int
    hung: bool
    metrics: bool = True

    @property
    def slug(self) -> str:
        return f"small-{self.pages}p" + ("-hung" if self.hung else "") + ("" if self.metrics else "-nometrics")

    def server(self) -> dict[str, Any]:
        # identify: the stand-in reads each page's marker, so that exactly document 1's page 1 hangs.
        return {"identify": True, "metrics": self.metrics, "scripts": {"1:1": ["hang"]} if self.hung else {}}


def cold_regime(work: Path, seed: int) -> tuple[list[str], bool, list[dict[str, Any]]]:
    from olmocr_tasks.core.config import TimeoutSettings

    limit = COLD_TARGET_FRACTION * TimeoutSettings.read_timeout_s
    lines = [
        "Cold start: one-document runs whose first page's first request hangs before the client has timed",
        f"any answer (defaults: read timeout {TimeoutSettings.read_timeout_s:g} s); target: hung run < {limit:g} s",
        "",
        "| server | pages | /metrics | fault-free wall s | hung wall s | extra s | hung requests | hedged | "
        "requests | pages ok |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    all_ok = True
    results: list[dict[str, Any]] = []
    cases = [(BACKPRESSURE, 1, True), (BACKPRESSURE, 3, True), (BACKPRESSURE, 1, False)]
    cases += [(GPU_LIKE, 1, True), (GPU_LIKE, 3, True)]
    for regime, pages, metrics in cases:
        corpus = single_document(pages)
        clean, hung = SmallRun(pages, False, metrics), SmallRun(pages, True, metrics)
        base = run_pass(corpus, work, regime, Pass(0.0), seed, server=clean.server(), name=clean.slug)
        result = run_pass(corpus, work, regime, Pass(0.0), seed, server=hung.server(), name=hung.slug)
        for run in (base, result):
            run.update(pages=pages, metrics_endpoint=metrics, small_run=True)
        ok = base["ok"] and result["ok"] and result["wall_s"] < limit and result["hedged"] >= 1
        all_ok = all_ok and ok
        results += [base, result]
        verdict = f"{ok} ({result['note']})" if result["note"] else str(ok)
        lines.append(
            f"| {regime.name} | {pages} | {'yes' if metrics else 'no'} | {base['wall_s']} | {result['wall_s']} | "
            f"{result['wall_s'] - base['wall_s']:.2f} | {result['hung_requests']} | {result['hedged']} | "
            f"{result['requests']} | {verdict} |"
        )
    return lines, all_ok, results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m bench.hung_requests")
    parser.add_argument("--regime", choices=("fast", "gpu", "cold", "both", "all"), default="all")
    parser.add_argument("--quick", action="store_true", help="fast regime: the 226-page corpus instead of 1,002")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    work = fresh_dir(RESULTS_DIR / f"hung_requests-{stamp}")
    lines: list[str] = []
    results: dict[str, Any] = {}
    all_ok = True
    if args.regime in ("fast", "both", "all"):
        table, ok, results["fast"] = fast_regime(work, args.seed, args.quick)
        lines += [*table, ""]
        all_ok = all_ok and ok
    if args.regime in ("gpu", "both", "all"):
        table, ok, results["gpu"] = gpu_regime(work, args.seed)
        lines += [*table, ""]
        all_ok = all_ok and ok
    if args.regime in ("cold", "all"):
        table, ok, results["cold"] = cold_regime(work, args.seed)
        lines += [*table, ""]
        all_ok = all_ok and ok
    lines.append(f"all targets met: {all_ok}")
    text = "\n".join(lines)
    print(text)
    (work / "results.json").write_text(json.dumps(results, indent=2, default=str))
    (work / "results.md").write_text(text + "\n")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
