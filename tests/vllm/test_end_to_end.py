"""Conversions through the real vLLM: generated PDFs, the tiny random model, the page ladder, the CLI and
one Airflow run.

The model answers nothing when unconstrained (its front matter fails the parser, every attempt, so its
pages fall back and the documents fail over olmOCR's page error rate); with guided decoding it can only
answer olmOCR's front matter, so the same pages are converted on the first attempt. The manifest's token
counts are the server's own: they equal what its ``/metrics`` counters grew by during the run; its cost
is the GPU-busy time the client measured from those ``/metrics``. A page whose prompt is longer than the
server's context is refused with a 400 and falls back, on the real server as on the stand-in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from olmocr_tasks.inference.vllm_metrics import GENERATION_TOKENS_METRIC, PROMPT_TOKENS_METRIC
from olmocr_tasks.location.manifest import COST_BASIS_METRICS, manifest_uri
from olmocr_testkit import pdfgen
from olmocr_testkit.airflow_env import AirflowEnv, vllm_connection
from olmocr_testkit.cpu_vllm.server import MAX_MODEL_LEN, MODEL_NAME, RunningVllm, metric_total, metrics_text
from tests.fixtures.cli_process import run_cli
from tests.fixtures.manifests import load_whole
from tests.vllm.conftest import ContractServer

PAGES = 3
# A cold page (image encoding, first grammar compile) takes seconds on a busy 2-core machine.
CLI_TIMEOUTS = ["--read-timeout", "300", "--ready-timeout", "60", "--outage-window", "120"]
# At 4,000 px a square page is 16,000,000 pixels. Qwen2.5-VL's image processor (the tiny model's, as
# olmOCR's model's) scales it to its 12,845,056-pixel limit, 3,584 px square: 16,384 image tokens, so
# with the prompt's text the request is over the 16,384-token context (the stand-in counts 20,408
# image tokens, over it too). A page 8.5 x 1 inches fits at the same size.
OVERSIZED_DIM = 4000
OVERSIZED_FLAGS = ["--target-longest-image-dim", str(OVERSIZED_DIM), "--max-render-pixels", str(OVERSIZED_DIM**2)]


def _token_growth(before: str, after: str) -> tuple[float, float]:
    """What the server's prompt and generation token counters grew by between two readings."""
    prompt, generation = (
        metric_total(after, name) - metric_total(before, name)
        for name in (PROMPT_TOKENS_METRIC, GENERATION_TOKENS_METRIC)
    )
    return prompt, generation


def _convert(base_url: str, source: Path, out: Path, run_id: str, *flags: str) -> dict[str, Any]:
    result = run_cli(
        "convert",
        str(source),
        str(out),
        "--server",
        base_url,
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
        real_vllm.base_url, source, tmp_path / "guided", "guided", "--guided-decoding", "--gpu-hour-price", "1"
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
    assert (guided["input_tokens"], guided["output_tokens"]) == _token_growth(before, after)
    assert guided["input_tokens"] > 100 * PAGES

    unguided = _convert(real_vllm.base_url, source, tmp_path / "free", "free")
    assert (unguided["counts"]["converted"], unguided["counts"]["failed"]) == (0, 2)
    for document in unguided["documents"]:
        assert document["error_class"] == "error_rate_exceeded"
        assert "answer does not start with a front matter block" in document["error"]


def test_an_airflow_run_with_guided_decoding_converts_through_the_real_server(
    real_vllm: RunningVllm, airflow_home: AirflowEnv, tmp_path: Path
) -> None:
    """``dag.test()`` of ``olmocr_ingest`` with the connection's ``guided_decoding`` extra: the convert
    tasks read the server's version at the readiness check, constrain every page and record the
    server's token counts."""
    inbox, output = tmp_path / "in", tmp_path / "out"
    pdfgen.write_pdf(inbox / "a.pdf", pdfgen.text_pdf(2, doc_id=11))
    pdfgen.write_pdf(inbox / "b.pdf", pdfgen.text_pdf(1, doc_id=12))
    connection = vllm_connection(
        real_vllm.base_url,
        MODEL_NAME,
        guided_decoding=True,
        # As the CLI runs above: every request a page attempt, and room for a cold page.
        hedge_requests=False,
        read_timeout_s=300,
        outage_window_s=120,
        readiness_timeout_s=60,
    )
    airflow = airflow_home.with_env(AIRFLOW_CONN_OLMOCR_VLLM=connection)

    before = metrics_text(real_vllm.root_url)
    result = airflow.dag_test("olmocr_ingest", conf={"input_uri": str(inbox), "output_uri": str(output)}, timeout=900)
    after = metrics_text(real_vllm.root_url)
    assert result.succeeded, result.tail()
    manifest = load_whole(manifest_uri(str(output), f"olmocr_ingest__{result.run_id}"))
    counts = manifest["counts"]
    assert (counts["converted"], counts["pages"], counts["fallback_pages"], counts["attempts"]) == (2, PAGES, 0, PAGES)
    assert (counts["input_tokens"], counts["output_tokens"]) == _token_growth(before, after)
    assert counts["input_tokens"] > 100 * PAGES
    assert {(doc["status"], doc["task"]["dag_id"], doc["task"]["run_id"]) for doc in manifest["documents"]} == {
        ("converted", "olmocr_ingest", result.run_id)
    }


def test_a_page_longer_than_the_context_falls_back_on_the_servers_400(server: ContractServer, tmp_path: Path) -> None:
    """The server refuses the oversized page's request (400) at every attempt, so the page falls back
    and its one-page document fails over the page error rate, naming the refusal; the page of the
    same run that fits is converted."""
    source = tmp_path / "in"
    pdfgen.write_pdf(source / "square.pdf", pdfgen.text_pdf(1, doc_id=21, page_size=(612, 612)))
    pdfgen.write_pdf(source / "strip.pdf", pdfgen.text_pdf(1, doc_id=22, page_size=(612, 72)))
    manifest = _convert(server.base_url, source, tmp_path / "out", "oversized", "--guided-decoding", *OVERSIZED_FLAGS)
    documents = {Path(doc["source"]).name: doc for doc in manifest["documents"]}
    assert documents["strip.pdf"]["status"] == "converted"
    square = documents["square.pdf"]
    assert (square["status"], square["error_class"]) == ("failed", "error_rate_exceeded")
    assert "1 of 1 pages fell back" in square["error"] and "HTTP 400" in square["error"]
    assert f"exceeds model's maximum context length ({MAX_MODEL_LEN})" in square["error"]
