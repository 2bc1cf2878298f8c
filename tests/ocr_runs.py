"""Run manifests produced by real runs, for the tests of the "OCR runs" pages.

One output location receives:

* a manual Airflow run of ``olmocr_ingest`` (``dag.test()`` with a logical date, so Airflow gives it
  the data interval its timetable infers) over a folder holding good PDFs, a non-PDF and a PDF whose
  name is an HTML script tag: two of four documents fail, so the publish task's error-budget verdict
  says the budget was exceeded; its documents carry the real DAG, run and task ids;
* three CLI runs (``olmocr-tasks convert``): one where every document converts (with a GPU price,
  so it has a cost), one where a corrupt file fails (one of two documents: its verdict says the
  budget was exceeded, as an Airflow run's would), and a rerun in which that file is a dead letter.

Producing them costs about a minute, so ``real_runs`` does it once per pytest session and both plugin
test modules share the result (a marker file in the session's base temp folder).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from olmocr_tasks.manifest import safe_run_id
from olmocr_tasks.manifest_reader import load_whole
from tests.airflow_env import AirflowEnv, aws_connection, vllm_connection
from tests.fixtures.s3 import DUMMY_KEY, DUMMY_SECRET, REGION
from tests.pdfgen import not_a_pdf, text_pdf
from tests.standin.server import StandinServer

XSS = "<script>alert(1)</script>"
DAG_ID = "olmocr_ingest"
CLEAN_RUN = "cli-clean"
FAILING_RUN = "cli-failing"
DEAD_LETTER_RUN = "cli-dead-letter"
GPU_HOUR_PRICE = 2.5


@dataclass(frozen=True)
class RealRuns:
    output: Path
    # Folders the runs read; the CLI runs' inputs are shared by the failing and dead-letter runs.
    airflow_input: Path
    cli_input: Path
    clean_input: Path
    airflow_run_id: str  # Airflow's own run id (dag_run.run_id)
    airflow_data_interval: tuple[str, str]

    @property
    def airflow_manifest_run_id(self) -> str:
        return f"{DAG_ID}__{self.airflow_run_id}"

    def key(self, run_id: str) -> str:
        """The manifest's file name without ``.json``: what the pages use in their URLs."""
        return safe_run_id(run_id)

    def manifest(self, run_id: str) -> dict[str, Any]:
        return load_whole(str(self.output / "manifests" / f"{self.key(run_id)}.json"))

    @property
    def hostile_source(self) -> str:
        return str(self.airflow_input / f"{XSS}.pdf")


def _cli(standin: StandinServer, source: Path, output: Path, run_id: str, *extra: str) -> None:
    command = [
        *(sys.executable, "-m", "olmocr_tasks.cli", "convert", str(source), str(output)),
        *("--server", standin.url, "--model", standin.model, "--run-id", run_id),
        *("--target-longest-image-dim", "512", "--max-failed-attempts", "1", *extra),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    # 0: within the error budget; 1: over it (the manifest says which documents failed and the verdict).
    assert result.returncode in (0, 1), result.stderr[-4000:]


def _produce(base: Path, airflow_home: AirflowEnv, moto_server: str) -> RealRuns:
    output = base / "output"
    airflow_input, cli_input, clean_input = base / "airflow-inbox", base / "cli-inbox", base / "clean-inbox"
    for folder in (airflow_input, cli_input, clean_input):
        folder.mkdir(parents=True)
    (airflow_input / "scan-1.pdf").write_bytes(text_pdf(2, 61))
    (airflow_input / "scan-2.pdf").write_bytes(text_pdf(1, 62))
    (airflow_input / "broken.pdf").write_bytes(not_a_pdf())
    hostile = airflow_input / f"{XSS}.pdf"  # the "/" of "</script>" makes it a folder and a file
    hostile.parent.mkdir(parents=True, exist_ok=True)
    hostile.write_bytes(not_a_pdf())
    (clean_input / "annual-report.pdf").write_bytes(text_pdf(3, 71))
    (clean_input / "memo.pdf").write_bytes(text_pdf(1, 72))
    (cli_input / "letter.pdf").write_bytes(text_pdf(2, 73))
    (cli_input / "corrupt.pdf").write_bytes(not_a_pdf())

    with StandinServer() as standin:
        airflow = airflow_home.with_env(
            AIRFLOW_CONN_OLMOCR_VLLM=vllm_connection(standin.url, standin.model, standin.api_key),
            AIRFLOW_CONN_AWS_DEFAULT=aws_connection(moto_server, DUMMY_KEY, DUMMY_SECRET, REGION),
        )
        result = airflow.dag_test(
            DAG_ID, logical_date="now", conf={"input_uri": str(airflow_input), "output_uri": str(output)}
        )
        # Two of four documents failed: over the default budget, so the run fails after publishing.
        assert result.state == "failed" and result.run_id, result.tail()
        interval = _data_interval(airflow, result.run_id)
        # The stand-in answers at once, so vLLM's /metrics would show no GPU-busy time and the cost would be
        # 0; with polling off the run is charged its wall-clock time, a cost the pages have to show.
        _cli(
            standin, clean_input, output, CLEAN_RUN, "--gpu-hour-price", str(GPU_HOUR_PRICE),
            "--no-adaptive-concurrency",
        )  # fmt: skip
        _cli(standin, cli_input, output, FAILING_RUN)
        _cli(standin, cli_input, output, DEAD_LETTER_RUN)
    return RealRuns(output, airflow_input, cli_input, clean_input, result.run_id, interval)


def _data_interval(airflow: AirflowEnv, run_id: str) -> tuple[str, str]:
    """The data interval Airflow recorded for the run in its metadata DB (ISO, UTC)."""
    with sqlite3.connect(airflow.home / "airflow.db") as db:
        (row,) = db.execute(
            "SELECT data_interval_start, data_interval_end FROM dag_run WHERE dag_id = ? AND run_id = ?",
            (DAG_ID, run_id),
        ).fetchall()
    start, end = (datetime.fromisoformat(stamp).replace(tzinfo=UTC).isoformat() for stamp in row)
    return start, end


def real_runs(base_temp: Path, airflow_home: AirflowEnv, moto_server: str) -> RealRuns:
    """The runs above, produced on first use in this pytest session and reused afterwards."""
    base = base_temp / "ocr-real-runs"
    marker = base / "runs.json"
    if marker.exists():
        saved = json.loads(marker.read_text())
        return RealRuns(
            Path(saved["output"]),
            Path(saved["airflow_input"]),
            Path(saved["cli_input"]),
            Path(saved["clean_input"]),
            saved["airflow_run_id"],
            tuple(saved["airflow_data_interval"]),
        )
    runs = _produce(base, airflow_home, moto_server)
    marker.write_text(
        json.dumps(
            {
                "output": str(runs.output),
                "airflow_input": str(runs.airflow_input),
                "cli_input": str(runs.cli_input),
                "clean_input": str(runs.clean_input),
                "airflow_run_id": runs.airflow_run_id,
                "airflow_data_interval": list(runs.airflow_data_interval),
            }
        )
    )
    return runs
