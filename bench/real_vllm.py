"""The real-server row: our CLI, olmOCR 0.4.27's pipeline and the bare pypdfium2+httpx client against one
CPU vLLM serving the tiny random model, in one run.

    .venv/bin/python -m bench.real_vllm [--seed N]

The server is the vllm test tier's (``olmocr_testkit.cpu_vllm``: vLLM 0.32's CPU build from its own
cached virtualenv, the ~1 M-parameter random olmOCR-shaped model built offline, started through
``olmocr-tasks serve-vllm``), so its figures say what each client costs a real vLLM, not what a GPU
would give: the tiny model answers a page in a fraction of a second, and every system shares the
machine's cores with it. Each system converts the same generated corpus (``CORPUS``: 17 pages in 6
documents with seed 1) after an unrecorded two-page warm-up of all three (bytecode, the server's
first grammar compile):

* ours: ``olmocr-tasks convert --guided-decoding`` (every other setting its default: hedging on,
  adaptive concurrency);
* the bare client (``bench/floor.py pipeline --guided``): olmOCR's page query plus the same
  ``structured_outputs`` constraint, no retries;
* olmOCR 0.4.27 with its README's command for an external vLLM (``--server URL --model NAME
  --markdown``) and ``--guided_decoding``, which sends ``guided_regex``: vLLM 0.32 ignores that field
  (0.12 replaced it), so its pages are unconstrained; the record keeps the server's log lines saying so.

Every request carries ``max_tokens`` 8000 (each system's default, olmOCR's), page images are rendered
at 1,288 px. Requests per page come from the server's own ``vllm:request_success_total`` (by finish
reason, so aborted hedges and cancelled retries count) over the system's run; tokens from its token
counters. The raw record goes to ``bench/records/real_vllm-<UTC>.json``; logs to
``bench/results/real_vllm-<UTC>/``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import RECORDS_DIR, REPO_ROOT, RESULTS_DIR, Row, code_version, fresh_dir
from bench.corpus import Corpus, CorpusSpec, mixed_corpus, single_document
from bench.floor import measure_floor
from bench.run_all import _machine
from bench.run_cli import measure_cli
from bench.run_olmocr import OLMOCR_VERSION, ensure_olmocr, measure_olmocr
from olmocr_tasks.inference.vllm_metrics import GENERATION_TOKENS_METRIC, PROMPT_TOKENS_METRIC, SUCCESS_METRIC
from olmocr_testkit.cpu_vllm import environment
from olmocr_testkit.cpu_vllm.server import (
    MAX_MODEL_LEN,
    MODEL_NAME,
    RunningVllm,
    VllmServers,
    build_tiny_model,
    by_label,
    metric_total,
    metrics_text,
)

REGIME = "real-vllm"
CORPUS = CorpusSpec(
    "real-vllm", huge_pages=6, long_documents=0, long_range=(0, 0), short_documents=4, short_range=(1, 4),
    min_pages=16,
)  # fmt: skip
MAX_TOKENS = 8000
TARGET_LONGEST_IMAGE_DIM = 1288
OURS = "ours: CLI"
BARE = "floor: pypdfium2+httpx pipeline"
OLMOCR = f"olmOCR {OLMOCR_VERSION} (README, external server)"
SETTINGS = {
    "max_tokens": MAX_TOKENS,
    "target_longest_image_dim": TARGET_LONGEST_IMAGE_DIM,
    "temperature": "each system's first attempt: 0.1 (olmOCR's ladder; ours follows it, the bare client sends 0.1)",
    OURS: "olmocr-tasks convert CORPUS OUT --server URL --model NAME --run-id ID --guided-decoding "
    "(sends structured_outputs; hedging, adaptive concurrency and retries at their defaults)",
    BARE: "python -m bench.floor pipeline --server URL --model NAME --guided PDF... "
    "(structured_outputs; 64 requests in flight, one render process per core, no retries)",
    OLMOCR: "python -m olmocr.pipeline WS --pdfs LIST --server URL --model NAME --markdown --guided_decoding "
    "(README's external-server command; guided_decoding sends guided_regex)",
}


def _server_reading(running: RunningVllm) -> dict[str, Any]:
    text = metrics_text(running.root_url)
    return {
        "finished": by_label(text, SUCCESS_METRIC, "finished_reason"),
        "prompt_tokens": metric_total(text, PROMPT_TOKENS_METRIC),
        "generation_tokens": metric_total(text, GENERATION_TOKENS_METRIC),
    }


def _server_delta(before: dict[str, Any], after: dict[str, Any], pages: int) -> dict[str, Any]:
    reasons = sorted(set(before["finished"]) | set(after["finished"]))
    finished = {reason: after["finished"].get(reason, 0.0) - before["finished"].get(reason, 0.0) for reason in reasons}
    requests = sum(finished.values())
    return {
        "requests": int(requests),
        "requests_per_page": round(requests / pages, 3),
        "finished_by_reason": {reason: int(count) for reason, count in finished.items() if count},
        "prompt_tokens": int(after["prompt_tokens"] - before["prompt_tokens"]),
        "generation_tokens": int(after["generation_tokens"] - before["generation_tokens"]),
    }


def _measure(system: str, corpus: Corpus, running: RunningVllm, work: Path, regime: str) -> Row:
    if system == OURS:
        row = measure_cli(corpus, running.base_url, work, regime, model=MODEL_NAME, extra_args=["--guided-decoding"])
    elif system == BARE:
        row = measure_floor("pipeline", corpus, work, regime, running.base_url, model=MODEL_NAME, guided=True)
    else:
        flags = ("--guided_decoding",)
        row = measure_olmocr(corpus, running.base_url, work, regime, model=MODEL_NAME, extra_flags=flags)
    row.system = system  # the names SETTINGS describes
    return row


def _row_record(row: Row, server: dict[str, Any]) -> dict[str, Any]:
    wall = row.measurement.wall_s if row.measurement else None
    return {
        **row.to_dict(),
        # By process wall time, start-up included, whether or not every page was a model answer ("ok").
        "pages_per_s_any_outcome": round(row.pages / wall, 3) if wall else None,
        "server": server,
    }


def _ignored_field_lines(log: Path) -> list[str]:
    """The server's log lines about the guided-decoding field it ignored (olmOCR's guided_regex)."""
    return [line for line in log.read_text(errors="replace").splitlines() if "guided_regex" in line][:3]


def _olmocr_outcome(log: Path) -> dict[str, Any]:
    """What olmOCR's own log says of its pages: pages that exhausted their attempts, documents discarded
    over its page error rate, and the first such line of each."""
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    failed = [line for line in lines if "Failed " in line and " attempts" in line]
    discarded = [line for line in lines if "discarding document" in line]
    return {
        "pages_failed_after_all_attempts": len(failed),
        "documents_discarded": len(discarded),
        "first_failed_page_line": failed[0] if failed else None,
        "first_discarded_document_line": discarded[0] if discarded else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=1, help="the corpus's seed (default 1)")
    args = parser.parse_args(argv)

    started = datetime.now(UTC)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    work = fresh_dir(RESULTS_DIR / f"real_vllm-{stamp}")
    corpus = mixed_corpus(seed=args.seed, spec=CORPUS)
    warm = single_document(2)
    olmocr_problem = ensure_olmocr(work / "olmocr-install.log")
    venv = environment.ensure_venv()
    model_dir = build_tiny_model(venv, work / "tiny-model")
    servers = VllmServers(venv, model_dir, work)
    record: dict[str, Any] = {
        "record": "real_vllm",
        "started": started.isoformat(),
        "code": code_version(),
        "machine": _machine(),
        "server": {
            "vllm": f"{environment.DISTRIBUTION}=={environment.pinned_version(environment.DISTRIBUTION)}",
            "model": f"{MODEL_NAME}: tiny random Qwen2_5_VLForConditionalGeneration "
            "(olmocr_testkit/cpu_vllm/tiny_model.py)",
            "max_model_len": MAX_MODEL_LEN,
            "launcher": "olmocr-tasks serve-vllm ... -- --dtype bfloat16 --enforce-eager (scheduling fcfs)",
        },
        "corpus": corpus.describe(),
        "settings": SETTINGS,
        "warm_up": [],
        "systems": [],
    }
    systems = [OURS, BARE] + ([OLMOCR] if olmocr_problem is None else [])
    try:
        running = servers.serve("fcfs")
        for system in systems:
            row = _measure(system, warm, running, work, "warmup")
            record["warm_up"].append({"system": system, "ok": row.ok, "note": row.note})
        for system in systems:
            print(f"[real_vllm] {system} on {corpus.pages} pages", file=sys.stderr, flush=True)
            before = _server_reading(running)
            row = _measure(system, corpus, running, work, REGIME)
            server = _server_delta(before, _server_reading(running), corpus.pages)
            record["systems"].append(_row_record(row, server))
            if system == OLMOCR:
                record["systems"][-1]["olmocr_log"] = _olmocr_outcome(work / f"olmocr-default-{REGIME}.log")
        if olmocr_problem is not None:
            record["systems"].append({"system": OLMOCR, "ok": False, "note": olmocr_problem})
        record["server_log_on_guided_regex"] = _ignored_field_lines(running.log)
    finally:
        servers.stop()
    record["load_average_end"] = [round(value, 2) for value in os.getloadavg()]
    RECORDS_DIR.mkdir(exist_ok=True)
    path = RECORDS_DIR / f"real_vllm-{stamp}.json"
    # Committed with the code: the checkout's own path (process command lines, olmOCR's log) as <repo>.
    path.write_text(json.dumps(record, indent=1).replace(str(REPO_ROOT), "<repo>") + "\n")
    (work / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    print("| system | pages/s | requests/page | ok | note |\n|---|---|---|---|---|")
    for row in record["systems"]:
        server = row.get("server", {})
        print(
            f"| {row['system']} | {row.get('pages_per_s_any_outcome')} | {server.get('requests_per_page')} | "
            f"{row['ok']} | {row['note']} |"
        )
    print(f"raw record: {path.relative_to(RECORDS_DIR.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
