"""``olmocr-tasks serve-vllm`` supervising the real vLLM: a killed server is restarted, SIGTERM stops it all.

Last in the tier (it stops the server the other files used).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx

from olmocr_tasks.testing.cpu_vllm.server import VllmServers
from tests.vllm.conftest import wait_for


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


def test_a_killed_vllm_is_restarted_and_sigterm_stops_the_launcher_and_vllm(vllm_servers: VllmServers) -> None:
    running = vllm_servers.serve(vllm_servers.current.policy if vllm_servers.current else "fcfs")
    (server_pid,) = [pid for pid in _vllm_processes(vllm_servers.model_dir) if _parent(pid) == running.launcher.pid]

    os.kill(server_pid, signal.SIGKILL)
    wait_for(lambda: server_pid not in _vllm_processes(vllm_servers.model_dir), timeout_s=60)
    wait_for(lambda: _serves(running.root_url), timeout_s=600, interval_s=1.0)
    assert running.launcher.poll() is None
    assert "restart 1 of 1" in running.log.read_text()

    assert vllm_servers.stop() == 0
    assert _vllm_processes(vllm_servers.model_dir) == []
    assert not _serves(running.root_url)
