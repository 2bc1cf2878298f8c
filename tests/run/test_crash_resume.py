"""Crashes: the CLI process SIGKILLed mid-document and mid-write, and overlapping concurrent runs.

Each test runs ``python -m olmocr_tasks.cli convert`` as a real process against the in-process vLLM
stand-in, kills it with SIGKILL (no cleanup handler runs), and then checks what a reader of the output
prefix sees (``tests.fixtures.reader_view``): no temp or partial file, every Dolma file one valid line
naming the right document and pages, every "done" marker backed by its outputs. A rerun must then
finish the work with a manifest that agrees with the files on disk.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from olmocr_tasks.storage.store import TEMP_SUFFIX
from olmocr_testkit import pdfgen
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.cli_process import cli_env, descendants, kill_and_reap, run_cli, start_cli
from tests.fixtures.client import requests_for
from tests.fixtures.manifests import load_whole
from tests.fixtures.reader_view import assert_manifest_matches_outputs, assert_reader_view_consistent

# A short claim expiry: the run after a kill (another run id) takes the killed run's claims over
# once they expire (``wait_for_claims_to_expire``), instead of skipping those documents as claimed.
CLAIM_EXPIRY_S = 2.0
FAST = [
    "--read-timeout", "5", "--outage-window", "5", "--ready-timeout", "5", "--target-longest-image-dim", "512",
    "--claim-expiry", str(CLAIM_EXPIRY_S),
]  # fmt: skip


def write_documents(folder: Path, pages: dict[int, int]) -> dict[str, int]:
    for doc_id, count in pages.items():
        pdfgen.write_pdf(folder / f"doc{doc_id}.pdf", pdfgen.text_pdf(count, doc_id=doc_id))
    return {f"doc{doc_id}.pdf": doc_id for doc_id in pages}


def wait_until(condition: object, timeout: float, what: str) -> None:
    """Poll until ``condition()``; ``timeout`` is a hang guard, far above what the wait normally takes."""
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def wait_for_claims_to_expire(out: Path) -> None:
    """Until every claim a killed run left has expired, as the claims themselves state.

    A kill between a claim's temporary file and its hard link leaves that temporary file (maybe empty)
    beside the claims: it is no claim (a later run's create ignores it), so it is not read as one.
    """
    claims = [path for path in out.rglob("*.claim*") if not path.name.endswith(TEMP_SUFFIX)]
    expiries = [datetime.fromisoformat(json.loads(path.read_text())["expires_at"]) for path in claims]
    if expiries:
        time.sleep(max(0.0, (max(expiries) - datetime.now(UTC)).total_seconds()) + 0.1)


def finish_and_check(tmp_path: Path, standin: StandinServer, doc_ids: dict[str, int], run_id: str) -> dict:
    """Rerun to completion; the final state must account for every document exactly once."""
    out = tmp_path / "out"
    wait_for_claims_to_expire(out)
    result = run_cli("convert", str(tmp_path / "in"), str(out), "--server", standin.url, "--run-id", run_id, *FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    manifest = load_whole(str(out / "manifests" / f"{run_id}.json"))
    assert manifest["counts"]["failed"] == 0
    assert manifest["counts"]["already_converted"] + len(manifest["documents"]) == len(doc_ids)
    for doc in manifest["documents"]:
        # A document whose earlier run died after writing its outputs is already converted, not a
        # duplicate of itself.
        assert doc["status"] == "converted" or doc["skip_reason"] == "already_converted", doc
        assert doc["duplicate_of"] is None
    assert_manifest_matches_outputs(manifest)
    view = assert_reader_view_consistent(str(out), doc_ids=doc_ids)
    sources = sorted(Path(record["metadata"]["Source-File"]).name for record in view.dolma.values())
    assert sources == sorted(doc_ids), "one Dolma record per document, no more, no less"
    assert len(view.done_markers) == len(doc_ids) and view.failed_markers == []
    return manifest


@pytest.mark.slow
def test_sigkill_mid_document_then_rerun(tmp_path: Path, standin: StandinServer) -> None:
    doc_ids = write_documents(tmp_path / "in", {41: 6, 42: 6, 43: 6})
    # Slow answers keep pages in flight, so the kill lands with documents half converted.
    standin.configure(latency_s=0.5, capacity=4)
    out = tmp_path / "out"
    process = start_cli(
        "convert", str(tmp_path / "in"), str(out), "--server", standin.url, "--run-id", "killed",
        "--max-concurrent-requests", "4", *FAST, log=tmp_path / "killed.log",
    )  # fmt: skip
    try:
        wait_until(lambda: len(standin.requests()) >= 6, 60, "pages in flight")
        workers = descendants(process.pid)
        assert workers, "the render workers should be running"
    finally:
        survivors = kill_and_reap(process, descendants(process.pid))
    assert process.returncode == -signal.SIGKILL, "the run must still have been running when killed"
    assert survivors == [], f"render workers outlived their killed parent: {survivors}"
    assert any(record["outcome"] == "client_gone" or record["outcome"] is None for record in standin.requests())

    view = assert_reader_view_consistent(str(out), doc_ids=doc_ids)
    assert view.manifests == {} and len(view.dolma) < len(doc_ids)
    standin.configure(latency_s=0.0)
    finish_and_check(tmp_path, standin, doc_ids, "after-kill")


# Runs the CLI with one atomic write paused half-way: the first write of a file whose name ends with
# OLMOCR_TEST_PAUSE_SUFFIX. The window between creating a temp file and renaming it lasts microseconds,
# so without the pause a kill would land in it only by luck. The pause truncates the temp file to half
# its bytes first, leaving exactly the state a crash mid-write leaves behind. With
# OLMOCR_TEST_PAUSE_FOLDER only a file directly in a folder of that name pauses.
_PAUSE_MID_WRITE = """
import os, sys, time
import olmocr_tasks.storage.backends.local as storage
from olmocr_tasks.cli import main

flag = os.environ["OLMOCR_TEST_PAUSED_FLAG"]
suffix = os.environ["OLMOCR_TEST_PAUSE_SUFFIX"]
folder = os.environ.get("OLMOCR_TEST_PAUSE_FOLDER")
original = storage._atomic_local

def paused(path, fill, *, make_dirs=True):
    def half_then_pause(temp):
        fill(temp)
        if not path.endswith(suffix) or (folder and os.path.basename(os.path.dirname(path)) != folder):
            return
        try:  # exactly one write pauses, however many threads get here at once
            fd = os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.truncate(temp, os.path.getsize(temp) // 2)
        os.write(fd, path.encode())
        os.close(fd)
        time.sleep(300)
    return original(path, half_then_pause, make_dirs=make_dirs)

storage._atomic_local = paused
sys.exit(main(sys.argv[1:]))
"""


def kill_paused_run(
    tmp_path: Path, standin: StandinServer, run_id: str, suffix: str, folder: str | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    """Convert ``tmp_path/in`` into ``tmp_path/out`` with one write paused (``_PAUSE_MID_WRITE``), then SIGKILL it.

    Returns the killed process and the file whose write was paused; no process of the run survives.
    """
    flag = tmp_path / "paused"
    command = [
        sys.executable, "-c", _PAUSE_MID_WRITE, "convert", str(tmp_path / "in"), str(tmp_path / "out"),
        "--server", standin.url, "--run-id", run_id, *FAST,
    ]  # fmt: skip
    pause = {"OLMOCR_TEST_PAUSED_FLAG": str(flag), "OLMOCR_TEST_PAUSE_SUFFIX": suffix, "TMPDIR": str(tmp_path)}
    if folder is not None:
        pause["OLMOCR_TEST_PAUSE_FOLDER"] = folder
    with open(tmp_path / f"{run_id}.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=cli_env(pause))
    try:
        wait_until(lambda: flag.exists() and flag.read_text(), 60, "the paused write")
    finally:
        survivors = kill_and_reap(process, descendants(process.pid))
    assert survivors == [], f"processes of the killed run survived it: {survivors}"
    return process, Path(flag.read_text())


@pytest.mark.slow
@pytest.mark.parametrize(
    "suffix",
    [
        ".jsonl",  # the Dolma file itself, after its markdown
        ".done",  # the ledger's done marker, after the outputs and the content record
    ],
)
def test_sigkill_mid_write_leaves_nothing_partial_for_readers(
    tmp_path: Path, standin: StandinServer, suffix: str
) -> None:
    doc_ids = write_documents(tmp_path / "in", {51: 2, 52: 2, 53: 2})
    out = tmp_path / "out"
    process, target = kill_paused_run(tmp_path, standin, "paused", suffix)
    assert process.returncode == -signal.SIGKILL, "the run must still have been paused in its write when killed"
    leftovers = [path for path in target.parent.iterdir() if path.name.endswith(TEMP_SUFFIX)]
    assert leftovers and leftovers[0].stat().st_size > 0, "the kill should have left a half-written temp file"
    assert not target.exists(), "the half-written file must not be visible under its name"
    view = assert_reader_view_consistent(str(out), doc_ids=doc_ids)
    assert str(target) not in view.dolma

    manifest = finish_and_check(tmp_path, standin, doc_ids, "after-paused-kill")
    assert target.is_file()
    written = json.loads(target.read_text())
    paused_source = written["metadata"]["Source-File"] if suffix == ".jsonl" else written["source"]
    (entry,) = [doc for doc in manifest["documents"] if doc["source"] == paused_source]
    if suffix == ".jsonl":
        assert entry["status"] == "converted"  # its outputs were never complete: converted again
    else:
        # Killed before its done marker but after its content record: recognised as already converted.
        assert (entry["status"], entry["skip_reason"]) == ("skipped", "already_converted")


@pytest.mark.slow
def test_a_run_killed_before_saving_an_entry_reports_that_document_converted_when_it_resumes(
    tmp_path: Path, standin: StandinServer
) -> None:
    """Killed after a document's outputs and ledger records, while its attempt saved its entry.

    The same run resumed (its next attempt, as a retried Airflow task is) finds the conversion this run
    recorded: the document is this run's ``converted`` one, with the totals its Dolma record holds, not
    ``already_converted``, and none of its pages is sent again.
    """
    doc_ids = write_documents(tmp_path / "in", {54: 2, 55: 2, 56: 2})
    out = tmp_path / "out"
    process, entry = kill_paused_run(tmp_path, standin, "resumed", ".json", folder="entries")
    assert process.returncode == -signal.SIGKILL
    assert not entry.exists(), "the paused entry must not have been saved"
    converted_before = {
        record["metadata"]["Source-File"]: record["metadata"]
        for record in assert_reader_view_consistent(str(out), doc_ids=doc_ids).dolma.values()
    }
    assert converted_before, "the killed attempt had converted the paused entry's document"
    pages_sent = {
        doc_id: len(requests_for(standin, doc_id, 1) + requests_for(standin, doc_id, 2)) for doc_id in doc_ids.values()
    }

    wait_for_claims_to_expire(out)
    result = run_cli("convert", str(tmp_path / "in"), str(out), "--server", standin.url, "--run-id", "resumed", *FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    manifest = load_whole(str(out / "manifests" / "resumed.json"))
    assert {doc["status"] for doc in manifest["documents"]} == {"converted"}, manifest["documents"]
    assert len(manifest["documents"]) == len(doc_ids) and manifest["counts"]["already_converted"] == 0
    for doc in manifest["documents"]:
        metadata = converted_before.get(doc["source"])
        if metadata is None:
            continue  # converted by the resumed attempt
        assert (doc["pages"], doc["input_tokens"], doc["output_tokens"]) == (
            metadata["pdf-total-pages"],
            metadata["total-input-tokens"],
            metadata["total-output-tokens"],
        )
        doc_id = doc_ids[Path(doc["source"]).name]
        sent = len(requests_for(standin, doc_id, 1) + requests_for(standin, doc_id, 2))
        assert sent == pages_sent[doc_id], f"pages of {doc['source']} were sent again"
    assert manifest["counts"]["pages"] == 2 * len(doc_ids)
    assert_manifest_matches_outputs(manifest)


@pytest.mark.slow
def test_sigkill_at_random_moments_repeatedly_then_rerun(tmp_path: Path, standin: StandinServer) -> None:
    # Many one-page documents at no latency: outputs and ledger objects are written all the time, so
    # the kills land between and inside writes at random.
    doc_ids = write_documents(tmp_path / "in", {doc_id: 1 for doc_id in range(60, 160)})
    out = tmp_path / "out"
    chooser = random.Random(20240611)
    for round_number in range(3):
        seen = len(standin.requests())
        target = seen + chooser.randint(3, 12)
        process = start_cli(
            "convert", str(tmp_path / "in"), str(out), "--server", standin.url, "--run-id", f"kill{round_number}",
            *FAST, log=tmp_path / f"kill{round_number}.log",
        )  # fmt: skip
        try:
            wait_until(lambda: len(standin.requests()) >= target or process.poll() is not None, 60, "progress")  # noqa: B023
            workers = descendants(process.pid)
        finally:
            survivors = kill_and_reap(process, descendants(process.pid))
        # The kill must land in a running conversion: a run that had already finished (exit 0) or
        # failed would make this round test nothing. 100 documents leave plenty unconverted after three
        # rounds of at most 12 requests each, even if a busy machine is slow to deliver the kill.
        assert process.returncode == -signal.SIGKILL, (process.returncode, (tmp_path / f"kill{round_number}.log"))
        assert survivors == [] and all(not w.is_running() for w in workers)
        assert_reader_view_consistent(str(out), doc_ids=doc_ids)
    finish_and_check(tmp_path, standin, doc_ids, "after-random-kills")


@pytest.mark.slow
def test_two_overlapping_runs_at_once_leave_one_correct_result_per_document(
    tmp_path: Path, standin: StandinServer
) -> None:
    doc_ids = write_documents(tmp_path / "in", {doc_id: 2 for doc_id in range(110, 122)})
    standin.configure(latency_s=0.05)
    out = tmp_path / "out"

    def start(run_id: str) -> subprocess.Popen[bytes]:
        return start_cli(
            "convert", str(tmp_path / "in"), str(out), "--server", standin.url, "--run-id", run_id,
            "--max-concurrent-requests", "4", *FAST, log=tmp_path / f"{run_id}.log",
        )  # fmt: skip

    processes = {run_id: start(run_id) for run_id in ("left", "right")}
    for run_id, process in processes.items():
        # A hang guard: both runs finish in seconds.
        assert process.wait(timeout=120) == 0, (tmp_path / f"{run_id}.log").read_text()
    for run_id in ("left", "right"):
        manifest = load_whole(str(out / "manifests" / f"{run_id}.json"))
        assert manifest["counts"]["failed"] == 0
        assert manifest["counts"]["already_converted"] + len(manifest["documents"]) == len(doc_ids)
        assert_manifest_matches_outputs(manifest)
    view = assert_reader_view_consistent(str(out), doc_ids=doc_ids)
    sources = sorted(Path(record["metadata"]["Source-File"]).name for record in view.dolma.values())
    assert sources == sorted(doc_ids)
    assert len(view.done_markers) == len(doc_ids) and view.failed_markers == []
    assert not list(out.rglob(f"*{TEMP_SUFFIX}")), "finished runs leave no temp files behind"
