"""A retried Airflow try resumes its document: only the pages the failed try did not finish are sent (issue 13).

Through the real ``olmocr_ingest`` DAG with ``dag.test()`` (SQLite, the vLLM stand-in, Airflow's own
retry of the ``convert`` task after its retry delay). The first try of ``convert`` loses the server
half-way through a document: once the stand-in has answered half the pages (its own counter, not a
timer) it refuses connections for longer than the connection's outage window, so the try fails with a
retryable error. The server is back before Airflow's retry, which must ask only for the missing pages
and publish outputs equal to an uninterrupted run's.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from olmocr_testkit.airflow_env import AirflowEnv, DagTestResult, vllm_connection
from olmocr_testkit.pdfgen import text_pdf
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.manifests import load_whole

PAGES = 120
DOC_ID = 91
# Pages in flight per convert task: bounds the answers lost with the failed try's in-flight requests.
WINDOW = 8
OUTAGE_S = 15.0
DAG = "olmocr_ingest"


def _run(airflow: AirflowEnv, inbox: Path, output: Path) -> DagTestResult:
    conf = {"input_uri": str(inbox), "output_uri": str(output), "max_concurrent_requests": WINDOW}
    return airflow.dag_test(DAG, conf=conf, timeout=900)


def _manifest(output: Path, result: DagTestResult) -> dict[str, Any]:
    (path,) = (output / "manifests").glob("*.json")
    manifest = load_whole(str(path))
    assert manifest["run_id"].endswith(result.run_id or "")
    return manifest


def _outputs(output: Path) -> tuple[str, dict[str, Any]]:
    (markdown,) = (output / "markdown").rglob("*.md")
    (dolma,) = (output / "dolma").rglob("*.jsonl")
    record = json.loads(dolma.read_text())
    # What differs between any two runs of the same document: when, and how fast each page was answered.
    del record["added"], record["created"], record["metadata"]["conversion-seconds"]
    assert len(record["attributes"].pop("latency_ms")) == PAGES
    return markdown.read_text(), record


def _convert_tries(airflow: AirflowEnv, run_id: str) -> int:
    with sqlite3.connect(airflow.home / "airflow.db") as db:
        (tries,) = db.execute(
            "SELECT try_number FROM task_instance WHERE run_id = ? AND task_id = 'convert'", (run_id,)
        ).fetchone()
    return int(tries)


def _answered_pages(standin: StandinServer, since: int = 0, until: int | None = None) -> list[int]:
    return [
        record["marker"]["page_number"]
        for record in standin.requests(since)
        if record.get("marker") and record.get("outcome") == "ok" and (until is None or record["seq"] < until)
    ]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_retried_convert_try_sends_only_the_pages_the_failed_try_did_not_finish(
    airflow_env: AirflowEnv, standin: StandinServer, tmp_path: Path
) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "long.pdf").write_bytes(text_pdf(PAGES, doc_id=DOC_ID))
    # A short outage window so the try gives up within seconds of losing the server; some latency
    # keeps pages in flight when it goes, as on a real server.
    airflow = airflow_env.with_env(
        AIRFLOW_CONN_OLMOCR_VLLM=vllm_connection(
            standin.url, standin.model, standin.api_key, outage_window_s=2, read_timeout_s=10, readiness_timeout_s=2
        ),
        # Airflow waits one to two times this before the retry: the server is back by then.
        OLMOCR_CONVERT_RETRY_DELAY=str(OUTAGE_S + 5),
    )
    standin.configure(latency_s=0.02)

    reference = _run(airflow, inbox, tmp_path / "reference")
    assert reference.succeeded, reference.tail()
    assert standin.stats()["completed"] == PAGES
    standin.reset(keep_config=True)

    results: list[DagTestResult] = []
    runner = threading.Thread(target=lambda: results.append(_run(airflow, inbox, tmp_path / "out")))
    runner.start()
    deadline = time.monotonic() + 600  # a hang guard: Airflow's start-up plus half the pages
    while standin.stats()["completed"] < PAGES // 2:
        assert runner.is_alive(), results[0].tail() if results else "the run ended"
        assert time.monotonic() < deadline, "half the pages were never answered"
        time.sleep(0.005)
    standin.refuse_for(OUTAGE_S, drop_inflight=True)
    outage_seq = standin.stats()["total"]
    runner.join(timeout=900)
    assert not runner.is_alive(), "the run did not finish"
    (result,) = results
    assert result.succeeded, result.tail()

    # The first try failed retryably and Airflow's second try finished the document.
    assert _convert_tries(airflow, result.run_id or "") == 2
    assert "server or storage unavailable" in result.output or "unavailable" in result.output
    first_try = set(_answered_pages(standin, until=outage_seq))
    retry = _answered_pages(standin, since=outage_seq)
    assert PAGES // 2 <= len(first_try) < PAGES, "the try must have died half-way"
    assert len(retry) == len(set(retry)), "each missing page is asked for once"
    assert set(retry) | first_try == set(range(1, PAGES + 1)), "no page is lost"
    # Only answers still on their way when the server went can be asked for again.
    assert len(first_try & set(retry)) <= WINDOW, sorted(first_try & set(retry))
    assert len(retry) <= PAGES - len(first_try) + WINDOW

    manifest = _manifest(tmp_path / "out", result)
    expected = _manifest(tmp_path / "reference", reference)
    (entry,) = manifest["documents"]
    (reference_entry,) = expected["documents"]
    assert entry["status"] == "converted" and entry["task"]["try_number"] == 2
    for key in ("pages", "fallback_pages", "input_tokens", "output_tokens", "attempts"):
        assert entry[key] == reference_entry[key], key
    assert _outputs(tmp_path / "out") == _outputs(tmp_path / "reference")
    assert not list((tmp_path / "out").glob("_state/*/pages/*/*.json")), "page records go once outputs are committed"
