"""The embedded default end to end: Tesseract behind the chat-completions protocol, through the DAG.

The DAG and the engine do not know they are talking to a CPU engine: only the connection changes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from olmocr_tasks.core.config import DEFAULT_MODEL
from olmocr_tasks.location.ledger import conversion_key
from olmocr_tasks.location.manifest_reader import open_manifest
from olmocr_tasks.page.protocol import PROMPT_VERSION
from olmocr_tasks.servers.cpu_engine import start_cpu_engine_in_thread
from olmocr_testkit.airflow_env import REPO_ROOT, AirflowEnv, vllm_connection

pytestmark = pytest.mark.slow


def test_sample_pdfs_come_back_as_their_real_text_through_the_dag(airflow_home: AirflowEnv, tmp_path: Path) -> None:
    assert shutil.which("tesseract"), "install the tesseract-ocr package (make test does it)"
    inbox = tmp_path / "in"
    shutil.copytree(REPO_ROOT / "examples", inbox, ignore=shutil.ignore_patterns("*.py"))
    output = tmp_path / "out"
    with start_cpu_engine_in_thread(host="127.0.0.1", port=0) as engine:
        env = airflow_home.with_env(AIRFLOW_CONN_OLMOCR_VLLM=vllm_connection(engine.url, engine.served_model_name))
        result = env.dag_test("olmocr_ingest", conf={"input_uri": str(inbox), "output_uri": str(output)})
    assert result.succeeded, result.tail()

    (manifest_path,) = (output / "manifests").glob("*.json")
    manifest = open_manifest(str(manifest_path)).summary
    assert manifest["counts"]["converted"] == 4 and manifest["counts"]["failed"] == 0
    # Tesseract's output is keyed under the engine's own model name, so a later GPU run converts again.
    assert manifest["model"] == engine.served_model_name == "olmocr-cpu-tesseract"
    key = conversion_key(engine.served_model_name, PROMPT_VERSION, 1288)
    assert key != conversion_key(DEFAULT_MODEL, PROMPT_VERSION, 1288) and (output / "_state" / key).is_dir()

    def text(name: str) -> str:
        return " ".join((output / "markdown" / name).read_text().split())

    assert "The quick brown fox jumps over the lazy dog." in text("annual-report.md")
    assert "dividend of forty cents per share" in text("annual-report.md")
    # Image-only page: there is no text layer, so only OCR could have read it.
    assert "replacement parts were shipped today" in text("scanned-letter.md")
    # Stored with /Rotate 90: the engine reports the rotation, the page is re-rendered upright.
    assert "cafeteria will be closed on Friday" in text("rotated-memo.md")
    assert "Blue chair" in text("nested/Price List.md")
    record = json.loads((output / "dolma" / "rotated-memo.jsonl").read_text())
    assert record["attributes"]["is_rotation_valid"] == [True]
