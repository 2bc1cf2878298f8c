"""Retention (``olmocr_tasks.location.retention`` and ``olmocr-tasks clean``) on real runs, local folders and moto S3.

Each scenario makes real runs against the stand-in: one where a document fails (its page always gets
an unreadable answer) and a rerun where it converts, so the ledger holds a failure marker of a
version that is now done; a leftover saved page of a converted document (what a crash between committing outputs and
discarding pages leaves) and one of a document never converted; a run that planned and never
published; and a published run that was cleared and planned again afterwards. Locally the files are
made old with ``os.utime`` and the CLI cleans with the real clock; on S3, where LastModified cannot be
set, the clean-up is given a clock ten days ahead.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from olmocr_tasks.location.layout import safe_run_id
from olmocr_tasks.location.ledger import Ledger
from olmocr_tasks.location.page_store import PageStore
from olmocr_tasks.location.retention import clean_output
from olmocr_tasks.location.run_folders import RunFolder, new_plan_id
from olmocr_tasks.run.pipeline import run_conversion
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.storage.store import Storage
from olmocr_tasks.storage.uri import join_uri
from olmocr_testkit.pdfgen import text_pdf
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.pages import page_result
from tests.fixtures.plans import plan_held_whole
from tests.fixtures.reader_view import quick_settings

RETENTION = timedelta(days=7)


@dataclass
class Scenario:
    output: str
    request: RunRequest
    keep_pages: str  # a saved page of content never converted
    drop_pages: str  # a saved page of a converted document
    failure_marker: str  # of a version converted since

    def objects(self, storage: Storage) -> set[str]:
        return {info.uri for info in storage.list_objects(self.output)}


def _runs(scenario_output: str, inbox: str, storage: Storage, standin: StandinServer) -> Scenario:
    settings = quick_settings(standin.url)
    standin.configure(always={"62:1": "garbage"})
    request = RunRequest(inbox, scenario_output, "first", settings=settings)
    first, _ = run_conversion(request, storage)
    assert sorted(doc.status for doc in first.documents) == ["converted", "failed"]
    standin.configure(always={"62:1": None})
    second, _ = run_conversion(RunRequest(inbox, scenario_output, "second", settings=settings), storage)
    assert [doc.status for doc in second.documents] == ["converted"] and second.counts()["already_converted"] == 1

    ledger = Ledger(scenario_output, storage, request.conversion_key)
    pages = PageStore(storage, ledger.state)
    converted_sha = second.documents[0].sha256
    assert converted_sha is not None
    pages.save(converted_sha, page_result(1, "left over after a crash"))
    pages.save("ab" * 32, page_result(1, "a document that will resume"))
    # A run that planned and never published (its worker died), with the same inbox.
    RunFolder(storage, scenario_output, "abandoned").write_plan(plan_held_whole(request, storage))
    [marker] = [
        info.uri
        for info in storage.list_objects(ledger.state.sources_uri)
        if (found := ledger.state.marker(info.uri)) and not found.done
    ]
    return Scenario(
        output=scenario_output,
        request=request,
        keep_pages=ledger.state.page("ab" * 32, 1),
        drop_pages=ledger.state.page(converted_sha, 1),
        failure_marker=marker,
    )


def _rerun_after_publishing(scenario: Scenario, storage: Storage) -> str:
    """The 'first' run cleared in Airflow and planning again after its manifest was published."""
    folder = RunFolder(storage, scenario.output, "first", new_plan_id("p2"))
    folder.write_plan(plan_held_whole(scenario.request, storage))
    return folder.run_uri


def _inbox(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "steady.pdf").write_bytes(text_pdf(1, 61))
    (folder / "flaky.pdf").write_bytes(text_pdf(1, 62))


def _check_cleaned(scenario: Scenario, before: set[str], after: set[str], rerun_folder: str) -> None:
    runs = join_uri(scenario.output, "_runs")
    removed = before - after
    # Exactly the published, settled run's folder, the obsolete marker and the leftover page.
    assert {uri for uri in removed if uri.startswith(runs)} == {
        uri for uri in before if uri.startswith(join_uri(runs, safe_run_id("second")) + "/")
    }
    assert removed - {uri for uri in removed if uri.startswith(runs)} == {scenario.failure_marker, scenario.drop_pages}
    assert scenario.keep_pages in after
    for kept in ("first", "abandoned"):
        assert any(uri.startswith(join_uri(runs, kept) + "/") for uri in after), kept
    assert any(uri.startswith(rerun_folder + "/") for uri in after)
    # Outputs, manifests, done markers and content records are all still there: a new run converts nothing.
    assert all(uri in after for uri in before if "/_runs/" not in uri and uri not in removed)


def test_clean_a_local_output_through_the_cli(tmp_path: Path, standin: StandinServer) -> None:
    storage = Storage()
    _inbox(tmp_path / "in")
    scenario = _runs(str(tmp_path / "out"), str(tmp_path / "in"), storage, standin)
    old = time.time() - timedelta(days=10).total_seconds()
    for path in (tmp_path / "out").rglob("*"):
        os.utime(path, (old, old), follow_symlinks=False)
    rerun_folder = _rerun_after_publishing(scenario, storage)
    # A published run that finished recently is kept too.
    run_conversion(
        RunRequest(str(tmp_path / "in"), scenario.output, "recent", settings=scenario.request.settings), storage
    )
    before = scenario.objects(storage)

    command = [sys.executable, "-m", "olmocr_tasks.cli", "clean", scenario.output, "--older-than-days", "7"]
    dry = subprocess.run([*command, "--dry-run"], capture_output=True, text=True, timeout=120, check=False)
    assert dry.returncode == 0, dry.stderr
    assert "would remove 1 run folders, 1 failure markers" in dry.stdout
    assert scenario.objects(storage) == before
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert f"removed\t{join_uri(scenario.output, '_runs', 'second')}" in result.stdout
    assert "no published manifest" in result.stdout and "written after its manifest" in result.stdout
    assert "changed within the retention period" in result.stdout
    after = scenario.objects(storage)
    recent = join_uri(scenario.output, "_runs", "recent")
    _check_cleaned(
        scenario,
        before - {u for u in before if u.startswith(recent)},
        after - {u for u in after if u.startswith(recent)},
        rerun_folder,
    )
    assert any(uri.startswith(recent + "/") for uri in after)

    again, _ = run_conversion(
        RunRequest(str(tmp_path / "in"), scenario.output, "again", settings=scenario.request.settings), storage
    )
    assert again.documents == [] and again.counts()["already_converted"] == 2


def test_clean_an_s3_output(
    standin: StandinServer, s3_bucket: str, s3_storage_options: dict[str, Any], tmp_path: Path
) -> None:
    storage = Storage(s3_storage_options)
    _inbox(tmp_path / "in")
    scenario = _runs(f"s3://{s3_bucket}/out", str(tmp_path / "in"), storage, standin)
    # S3 stamps LastModified to the second: the re-planning must come visibly after the manifest.
    time.sleep(1.1)
    rerun_folder = _rerun_after_publishing(scenario, storage)
    before = scenario.objects(storage)
    later = datetime.now(UTC) + timedelta(days=10)

    dry = clean_output(scenario.output, storage, older_than=RETENTION, now=later, dry_run=True)
    assert dry.objects > 0 and scenario.objects(storage) == before
    report = clean_output(scenario.output, storage, older_than=RETENTION, now=later)
    assert report.removed_runs == [join_uri(scenario.output, "_runs", "second")]
    assert report.failure_markers == 1 and report.page_records == 1
    assert set(report.kept_runs) == {join_uri(scenario.output, "_runs", name) for name in ("abandoned", "first")}
    _check_cleaned(scenario, before, scenario.objects(storage), rerun_folder)
    # Nothing is old enough with the real clock: a second clean-up removes nothing.
    assert clean_output(scenario.output, storage, older_than=RETENTION).objects == 0
