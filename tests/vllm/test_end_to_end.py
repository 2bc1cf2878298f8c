"""``olmocr-tasks convert`` through the real vLLM: generated PDFs, the tiny random model, the page ladder.

The model answers nothing when unconstrained (its front matter fails the parser, every attempt, so its
pages fall back and the documents fail over olmOCR's page error rate); with guided decoding it can only
answer olmOCR's front matter, so the same pages are converted on the first attempt. The manifest's token
counts are the server's own: they equal what its ``/metrics`` counters grew by during the run; its cost
is the GPU-busy time the client measured from those ``/metrics``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from olmocr_tasks.inference.vllm_metrics import GENERATION_TOKENS_METRIC, PROMPT_TOKENS_METRIC
from olmocr_tasks.location.manifest import COST_BASIS_METRICS
from olmocr_tasks.location.manifest_reader import load_whole
from olmocr_tasks.testing import pdfgen
from olmocr_tasks.testing.cpu_vllm.server import MODEL_NAME, RunningVllm, metrics_text
from tests.fixtures.cli_process import run_cli

PAGES = 3
# A cold page (image encoding, first grammar compile) takes seconds on a busy 2-core machine.
CLI_TIMEOUTS = ["--read-timeout", "300", "--ready-timeout", "60", "--outage-window", "120"]


def _counter(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def _convert(real_vllm: RunningVllm, source: Path, out: Path, run_id: str, *flags: str) -> dict[str, Any]:
    result = run_cli(
        "convert",
        str(source),
        str(out),
        "--server",
        real_vllm.base_url,
        "--model",
        MODEL_NAME,
        "--run-id",
        run_id,
        # Every request a page attempt: a hedge would add server tokens no attempt reports.
        "--no-hedging",
        "--max-page-retries",
        "2",
        *CLI_TIMEOUTS,
        *flags,
        timeout=900,
    )
    # Exit 0, or 1 when fallback pages put documents over the error budget; never an outage or usage error.
    assert result.returncode in (0, 1), result.stderr[-3000:]
    return load_whole(str(out / "manifests" / f"{run_id}.json"))


def test_guided_decoding_turns_the_random_models_answers_into_converted_pages(
    real_vllm: RunningVllm, tmp_path: Path
) -> None:
    source = tmp_path / "in"
    pdfgen.write_pdf(source / "a.pdf", pdfgen.text_pdf(2, doc_id=1))
    pdfgen.write_pdf(source / "b.pdf", pdfgen.text_pdf(1, doc_id=2))

    before = metrics_text(real_vllm.root_url)
    guided_run = _convert(
        real_vllm, source, tmp_path / "guided", "guided", "--guided-decoding", "--gpu-hour-price", "1"
    )
    after = metrics_text(real_vllm.root_url)
    # The cost is GPU-busy time the client measured from the real server's /metrics, not wall clock. It
    # may be 0: the tiny model answers a page faster than the metrics poll interval, and a burst between
    # two polls is missed (olmocr_tasks/inference/gpu_busy.py says so), so only its bound is asserted.
    cost = guided_run["metrics"]["cost"]
    assert cost["basis"] == COST_BASIS_METRICS and 0 <= cost["gpu_seconds"] <= guided_run["metrics"]["elapsed_s"]
    guided = guided_run["counts"]
    assert (guided["converted"], guided["pages"], guided["fallback_pages"]) == (2, PAGES, 0)
    assert guided["attempts"] == PAGES
    # Prompt tokens of a page image are the server's count (hundreds per page), not an estimate.
    assert guided["input_tokens"] == _counter(after, PROMPT_TOKENS_METRIC) - _counter(before, PROMPT_TOKENS_METRIC)
    assert guided["output_tokens"] == _counter(after, GENERATION_TOKENS_METRIC) - _counter(
        before, GENERATION_TOKENS_METRIC
    )
    assert guided["input_tokens"] > 100 * PAGES

    unguided = _convert(real_vllm, source, tmp_path / "free", "free")
    assert (unguided["counts"]["converted"], unguided["counts"]["failed"]) == (0, 2)
    for document in unguided["documents"]:
        assert document["error_class"] == "error_rate_exceeded"
        assert "answer does not start with a front matter block" in document["error"]
