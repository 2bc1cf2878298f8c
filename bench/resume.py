"""Resumable documents (issue 13): SIGKILL the CLI when half of a long document's pages are answered,
rerun it, and report how many pages the rerun sent and what it cost against an uninterrupted run.

    .venv/bin/python bench/resume.py [--pages 400] [--regime server-bound|cpu-bound]

Target: the rerun sends at most 55 % of the document's pages. The kill is timed by the stand-in's own
counter of answered pages, so the measurement does not depend on this machine's speed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import CPU_BOUND, MODEL, RESULTS_DIR, SERVER_BOUND, VENV_BIN, fresh_dir, standin, subprocess_env
from bench.corpus import single_document
from bench.measure import run_measured

TARGET_SHARE = 0.55


def _command(source: Path, output: Path, server: str, run_id: str) -> list[str]:
    return [
        str(VENV_BIN / "olmocr-tasks"), "--log-level", "WARNING", "convert", str(source), str(output),
        "--server", server, "--model", MODEL, "--run-id", run_id,
    ]  # fmt: skip


def _kill_at_half(command: list[str], server: Any, pages: int, log: Path) -> dict[str, Any]:
    """Start the CLI, SIGKILL its whole process group once half the pages are answered."""
    with open(log, "wb") as sink:
        process = subprocess.Popen(
            command, env=subprocess_env(), stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    started = time.perf_counter()
    try:
        while server.stats()["completed"] < pages // 2:
            if process.poll() is not None:
                raise RuntimeError(f"the CLI ended (exit {process.returncode}) before half its pages; see {log}")
            time.sleep(0.005)
        still_running = process.poll() is None
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return {
        "answered_at_kill": server.stats()["completed"],
        "killed_after_s": round(time.perf_counter() - started, 3),
        "was_running": still_running,
    }


def measure_resume(pages: int, regime_name: str, work: Path) -> dict[str, Any]:
    regime = SERVER_BOUND if regime_name == SERVER_BOUND.name else CPU_BOUND
    corpus = single_document(pages)
    (source,) = corpus.paths()
    with standin(regime) as server:
        reference_out = fresh_dir(work / "uninterrupted")
        reference = run_measured(
            _command(source, reference_out, server.url, "uninterrupted"),
            label="uninterrupted",
            env=subprocess_env(),
            log_path=work / "uninterrupted.log",
        )
        server.reset(keep_config=True)
        output = fresh_dir(work / "resumed")
        kill = _kill_at_half(_command(source, output, server.url, "killed"), server, pages, work / "killed.log")
        server.reset(keep_config=True)
        rerun = run_measured(
            _command(source, output, server.url, "killed"),
            label="rerun after SIGKILL",
            env=subprocess_env(),
            log_path=work / "rerun.log",
        )
        sent = server.stats()["total"]
    share = sent / pages
    return {
        "regime": regime.name,
        "pages": pages,
        **kill,
        "rerun_sent_pages": sent,
        "rerun_sent_share": round(share, 3),
        "target_share": TARGET_SHARE,
        "met": share <= TARGET_SHARE and rerun.returncode == 0 and reference.returncode == 0,
        "uninterrupted_wall_s": round(reference.wall_s, 3),
        "rerun_wall_s": round(rerun.wall_s, 3),
        "rerun_exit": rerun.returncode,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=400)
    parser.add_argument("--regime", choices=[SERVER_BOUND.name, CPU_BOUND.name], default=CPU_BOUND.name)
    args = parser.parse_args(argv)
    work = fresh_dir(RESULTS_DIR / "resume-work")
    result = measure_resume(args.pages, args.regime, work)
    print(json.dumps(result, indent=1))
    print(
        f"| SIGKILL at {result['answered_at_kill']}/{result['pages']} pages answered ({result['regime']}) "
        f"| rerun sent {result['rerun_sent_pages']} pages = {result['rerun_sent_share']:.1%} "
        f"(target ≤ {TARGET_SHARE:.0%}) | rerun {result['rerun_wall_s']} s vs uninterrupted "
        f"{result['uninterrupted_wall_s']} s | {'met' if result['met'] else 'not met'} |"
    )
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
