"""Resumable documents: a CLI SIGKILLed half-way through a large document sends only the missing pages
on its rerun, and the outputs equal an uninterrupted run's (issue 13).

The kill is timed by the stand-in's own counter of answered pages, not by sleeping.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from olmocr_testkit import pdfgen
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.cli_process import descendants, kill_and_reap, run_cli, start_cli
from tests.fixtures.manifests import load_whole
from tests.fixtures.reader_view import assert_reader_view_consistent

PAGES = 400
DOC_ID = 77
FAST = ["--read-timeout", "30", "--outage-window", "30", "--ready-timeout", "10", "--target-longest-image-dim", "512"]
# Answers the stand-in has sent but the CLI has not yet processed when it is killed are lost with it;
# a small window bounds them, so a CPU-starved CLI on a loaded machine cannot push the rerun past 55 %.
WINDOW = ["--max-concurrent-requests", "8"]


def _convert(source: Path, out: Path, standin: StandinServer, run_id: str) -> dict[str, Any]:
    command = ["convert", str(source), str(out), "--server", standin.url, "--run-id", run_id, *FAST, *WINDOW]
    result = run_cli(*command, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return load_whole(str(out / "manifests" / f"{run_id}.json"))


def _outputs(out: Path) -> tuple[str, dict[str, Any]]:
    (markdown,) = (out / "markdown").rglob("*.md")
    (dolma,) = (out / "dolma").rglob("*.jsonl")
    record = json.loads(dolma.read_text())
    # What differs between any two runs of the same document: when, and how fast each page was answered.
    del record["added"], record["created"], record["metadata"]["conversion-seconds"]
    assert len(record["attributes"].pop("latency_ms")) == PAGES
    return markdown.read_text(), record


def _saved_pages(out: Path) -> list[Path]:
    return sorted(out.glob("_state/*/pages/*/*.json"))


@pytest.mark.slow
def test_sigkill_half_way_through_a_document_resends_only_its_missing_pages(
    tmp_path: Path, standin: StandinServer
) -> None:
    source = pdfgen.write_pdf(tmp_path / "in" / "big.pdf", pdfgen.text_pdf(PAGES, doc_id=DOC_ID))
    # A little latency keeps pages in flight at the kill, as on a real server.
    standin.configure(latency_s=0.02)
    reference = _convert(source, tmp_path / "reference", standin, "uninterrupted")
    assert reference["counts"]["converted"] == 1 and standin.stats()["total"] == PAGES
    standin.reset(keep_config=True)

    out = tmp_path / "out"
    process = start_cli(
        "convert", str(source), str(out), "--server", standin.url, "--run-id", "killed", *FAST, *WINDOW,
        log=tmp_path / "killed.log",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300  # a hang guard; the half takes seconds
        while standin.stats()["completed"] < PAGES // 2:
            assert process.poll() is None, (tmp_path / "killed.log").read_text()
            assert time.monotonic() < deadline, "half the pages were never answered"
            time.sleep(0.005)
    finally:
        survivors = kill_and_reap(process, descendants(process.pid))
    assert process.returncode == -signal.SIGKILL, "the run must still have been running when killed"
    assert survivors == []
    answered = standin.stats()["completed"]
    assert PAGES // 2 <= answered < PAGES
    saved = _saved_pages(out)
    assert len(saved) >= answered - 20, "answered pages must be saved as they complete"
    assert not (out / "dolma").exists()

    standin.reset(keep_config=True)
    resumed = _convert(source, out, standin, "killed")
    sent = [record["marker"]["page_number"] for record in standin.requests()]
    assert len(sent) <= 0.55 * PAGES, f"the rerun sent {len(sent)} of {PAGES} pages"
    assert len(set(sent)) == len(sent), "each missing page is asked for once"
    saved_numbers = {int(path.stem) for path in saved}
    assert saved_numbers.isdisjoint(sent), "no saved page is asked for again"
    assert saved_numbers | set(sent) == set(range(1, PAGES + 1)), "no page is lost"

    assert resumed["counts"]["converted"] == 1 and resumed["counts"]["pages"] == PAGES
    (entry,) = resumed["documents"]
    (reference_entry,) = reference["documents"]
    for key in ("pages", "fallback_pages", "input_tokens", "output_tokens", "attempts"):
        assert entry[key] == reference_entry[key], key
    assert _outputs(out) == _outputs(tmp_path / "reference")
    assert_reader_view_consistent(str(out), doc_ids={"big.pdf": DOC_ID})
    assert _saved_pages(out) == [], "page records are removed once the outputs are committed"
