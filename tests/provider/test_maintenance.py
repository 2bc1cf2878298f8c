"""The ``olmocr_maintenance`` DAG through Airflow (``dag.test()``): retention of a real output folder.

A real run publishes (its ``_runs/`` folder may go once old), another plans and never publishes (its
folder must stay); every file is backdated 40 days. A dry run removes nothing; a real one removes the
published run's folder only, and the task's XCom holds counts.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import pytest

from olmocr_tasks.location.layout import OutputLocation, safe_run_id
from olmocr_tasks.location.run_folders import RunFolder
from olmocr_tasks.run.pipeline import run_conversion
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.storage.store import Storage
from olmocr_testkit.airflow_env import AirflowEnv
from olmocr_testkit.pdfgen import text_pdf
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.plans import plan_held_whole
from tests.fixtures.reader_view import quick_settings

DAG = "olmocr_maintenance"


def _files(folder: Path) -> set[Path]:
    return {path for path in folder.rglob("*") if path.is_file()}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_maintenance_removes_an_old_published_run_folder_and_keeps_an_unpublished_one(
    airflow_home: AirflowEnv, standin: StandinServer, tmp_path: Path
) -> None:
    inbox, output = tmp_path / "in", tmp_path / "out"
    inbox.mkdir()
    (inbox / "a.pdf").write_bytes(text_pdf(1, 71))
    storage = Storage()
    request = RunRequest(str(inbox), str(output), "published", settings=quick_settings(standin.url))
    manifest, _ = run_conversion(request, storage)
    assert manifest.counts()["converted"] == 1
    # A run whose worker died after planning: no manifest, so its folder is still needed.
    RunFolder(storage, str(output), "unpublished").write_plan(plan_held_whole(request, storage))
    old = time.time() - timedelta(days=40).total_seconds()
    for path in output.rglob("*"):
        os.utime(path, (old, old), follow_symlinks=False)
    published, unpublished = (
        Path(OutputLocation(str(output)).run_folder(safe_run_id(name))) for name in ("published", "unpublished")
    )
    assert _files(published) and _files(unpublished)
    before = _files(output)

    conf = {"output_uri": str(output), "older_than_days": 30}
    dry = airflow_home.dag_test(DAG, conf={**conf, "dry_run": True})
    assert dry.succeeded, dry.tail()
    assert _files(output) == before
    assert f"would remove {published}" in dry.output

    result = airflow_home.dag_test(DAG, conf=conf)
    assert result.succeeded, result.tail()
    after = _files(output)
    assert not _files(published)
    assert after == before - {path for path in before if published in path.parents}
    assert _files(unpublished) and list((output / "manifests").glob("*.json"))
    assert "no published manifest" in result.output
    # Counts only in XCom: no folder names.
    assert "'removed_runs': 1" in result.output and "'kept_runs': 1" in result.output


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_maintenance_refuses_an_output_outside_the_allow_list(airflow_home: AirflowEnv, tmp_path: Path) -> None:
    (tmp_path / "allowed").mkdir()
    airflow = airflow_home.with_env(OLMOCR_ALLOWED_OUTPUTS=str(tmp_path / "allowed"))
    result = airflow.dag_test(DAG, conf={"output_uri": str(tmp_path / "elsewhere")})
    assert result.state == "failed"
    assert "configuration error" in result.output
