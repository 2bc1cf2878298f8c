"""``olmocr-tasks serve-vllm`` supervising the real vLLM: a vLLM killed in the middle of a run is restarted
and the run finishes, a run started while it is down waits for it; SIGTERM stops the launcher and vLLM.

Last in the tier (it stops the server the other files used). The stand-in's counterpart of the outage
is ``tests/inference/test_server_faults.py::test_outage_shorter_than_the_window_is_ridden_out_without_fallbacks``.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from olmocr_tasks.inference.vllm_metrics import SUCCESS_METRIC
from olmocr_testkit import pdfgen
from olmocr_testkit.cpu_vllm.server import MODEL_NAME, RunningVllm, VllmServers, metric_total, metrics_text
from tests.fixtures.cli_process import start_cli
from tests.fixtures.manifests import load_whole
from tests.vllm.conftest import wait_for

# Pages enough that the run is far from done when its first page is answered and vLLM is killed.
KILLED_RUN_DOCUMENTS = {31: 8, 32: 8, 33: 8}
LATE_RUN_DOCUMENTS = {41: 2}
# A restart takes ~40 s alone and minutes on a loaded machine: the runs wait that long for it.
RESTART_WAIT_S = 600


def _vllm_processes(model_dir: Path) -> list[int]:
    """Processes whose command line names the tier's model: the vLLM server (its engine core is a child)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in argv and str(model_dir).encode() in argv:
            found.append(int(entry.name))
    return found


def _parent(pid: int) -> int:
    # /proc/<pid>/stat: "pid (name) state ppid ..."; the name may hold spaces, the last ")" ends it.
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def _serves(root_url: str) -> bool:
    try:
        return httpx.get(root_url + "/v1/models", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _answered(root_url: str) -> float:
    """Requests the server (this process of it) has finished: its success counter, 0 while it is down."""
    try:
        return metric_total(metrics_text(root_url), SUCCESS_METRIC)
    except httpx.HTTPError:
        return 0.0


def _start_run(running: RunningVllm, folder: Path, documents: dict[int, int], run_id: str) -> subprocess.Popen[bytes]:
    for doc_id, pages in documents.items():
        pdfgen.write_pdf(folder / "in" / f"doc{doc_id}.pdf", pdfgen.text_pdf(pages, doc_id=doc_id))
    window = str(RESTART_WAIT_S)
    return start_cli(
        *("convert", str(folder / "in"), str(folder / "out"), "--run-id", run_id, "--guided-decoding"),
        *("--server", running.base_url, "--model", MODEL_NAME, "--read-timeout", "300"),
        *("--outage-window", window, "--ready-timeout", window),
        log=folder / "cli.log",
    )


def _finished_run(process: subprocess.Popen[bytes], folder: Path, run_id: str, documents: dict[int, int]) -> str:
    """Wait for the run; check it converted every page from the model; return its log."""
    returncode = process.wait(timeout=2 * RESTART_WAIT_S)
    log = (folder / "cli.log").read_text(errors="replace")
    assert returncode == 0, log[-3000:]
    counts = load_whole(str(folder / "out" / "manifests" / f"{run_id}.json"))["counts"]
    assert (counts["converted"], counts["failed"], counts["fallback_pages"]) == (len(documents), 0, 0)
    assert counts["pages"] == sum(documents.values())
    return log


@pytest.mark.timeout(4 * RESTART_WAIT_S)
def test_a_vllm_killed_mid_run_is_restarted_the_runs_finish_and_sigterm_stops_everything(
    vllm_servers: VllmServers, tmp_path: Path
) -> None:
    running = vllm_servers.serve(vllm_servers.current.policy if vllm_servers.current else "fcfs")
    (server_pid,) = [pid for pid in _vllm_processes(vllm_servers.model_dir) if _parent(pid) == running.launcher.pid]
    answered_before = _answered(running.root_url)
    killed = _start_run(running, tmp_path / "killed", KILLED_RUN_DOCUMENTS, "killed")
    late: subprocess.Popen[bytes] | None = None
    try:
        # The run is under way (a page answered); vLLM is killed under it.
        wait_for(lambda: _answered(running.root_url) > answered_before, timeout_s=300)
        os.kill(server_pid, signal.SIGKILL)
        wait_for(lambda: server_pid not in _vllm_processes(vllm_servers.model_dir), timeout_s=60)
        # A run started while vLLM is down waits for it at its readiness check.
        late = _start_run(running, tmp_path / "late", LATE_RUN_DOCUMENTS, "late")
        wait_for(lambda: _serves(running.root_url), timeout_s=RESTART_WAIT_S, interval_s=1.0)
        killed_log = _finished_run(killed, tmp_path / "killed", "killed", KILLED_RUN_DOCUMENTS)
        _finished_run(late, tmp_path / "late", "late", LATE_RUN_DOCUMENTS)
    finally:
        for process in (killed, late):
            if process is not None and process.poll() is None:
                process.kill()
    assert running.launcher.poll() is None
    assert "restart 1 of 1" in running.log.read_text()
    # The killed run saw the outage and went on once vLLM answered again ...
    assert "inference server is up" in killed_log
    # ... and the restarted vLLM (its counters start at 0) answered the late run's pages and some of it.
    assert _answered(running.root_url) > sum(LATE_RUN_DOCUMENTS.values())

    assert vllm_servers.stop() == 0
    assert _vllm_processes(vllm_servers.model_dir) == []
    assert not _serves(running.root_url)
