"""Run one command and measure what it costs: wall time, CPU of its whole process tree, peak RSS.

CPU comes from ``wait4``: on Linux the rusage of a reaped child includes every descendant it reaped in
turn (render workers, poppler subprocesses, Airflow task processes), so nothing that exits cleanly is
missed and nothing outside the tree (the stand-in, this harness) is counted. As a cross-check the
sampler also keeps the last CPU reading of every process it saw; the larger of the two is reported, so
an orphan that was never reaped still counts. Memory is reported twice: ``max_rss_bytes``, the
kernel's exact peak from the same ``wait4`` (``ru_maxrss``: the largest peak of any one process of
the tree, the measured command or a descendant it reaped), and ``peak_rss_bytes``, the largest *sum*
of RSS over the tree seen by a sampler that walks it every ``interval`` seconds (a sample: it can miss
a short peak).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

SAMPLE_INTERVAL_S = 0.05


@dataclass
class Measurement:
    """What one command cost. ``cpu_s`` is user + system of the whole tree."""

    label: str
    wall_s: float
    cpu_user_s: float
    cpu_system_s: float
    cpu_sampled_s: float
    peak_rss_bytes: int
    max_rss_bytes: int
    peak_processes: int
    returncode: int
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    samples: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cpu_s(self) -> float:
        return max(self.cpu_user_s + self.cpu_system_s, self.cpu_sampled_s)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["cpu_s"] = round(self.cpu_s, 3)
        data["peak_rss_mib"] = round(self.peak_rss_bytes / 2**20, 1)
        data["max_rss_mib"] = round(self.max_rss_bytes / 2**20, 1)
        return data


class TreeSampler:
    """Samples RSS (summed) and CPU (per process) of a process and all its descendants."""

    def __init__(self, root_pid: int, interval: float = SAMPLE_INTERVAL_S) -> None:
        self.root_pid = root_pid
        self.interval = interval
        self.peak_rss = 0
        self.peak_processes = 0
        self.samples = 0
        self._cpu_by_pid: dict[tuple[int, float], float] = {}
        self._names: dict[tuple[int, float], str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-sampler", daemon=True)
        self._known: dict[int, psutil.Process] = {}

    def start(self) -> TreeSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def cpu_s(self) -> float:
        return sum(self._cpu_by_pid.values())

    def breakdown(self, top: int = 6) -> list[dict[str, Any]]:
        """The processes that used the most CPU (last reading), to tell a main process from its workers."""
        ranked = sorted(self._cpu_by_pid.items(), key=lambda item: -item[1])[:top]
        return [{"process": self._names.get(key, "?"), "cpu_s": round(cpu, 2)} for key, cpu in ranked]

    def _processes(self) -> list[psutil.Process]:
        # psutil.Process objects are cached by pid so that CPU readings stay attached to the same
        # process (a recycled pid gets a new create_time and therefore a new key).
        try:
            root = self._known.get(self.root_pid) or psutil.Process(self.root_pid)
            self._known[self.root_pid] = root
            found = [root]
            for child in root.children(recursive=True):
                found.append(self._known.setdefault(child.pid, child))
            return found
        except psutil.Error:
            return []

    def sample_once(self) -> None:
        rss = 0
        alive = 0
        for process in self._processes():
            try:
                with process.oneshot():
                    rss += process.memory_info().rss
                    times = process.cpu_times()
                    key = (process.pid, process.create_time())
                    self._cpu_by_pid[key] = times.user + times.system
                    if key not in self._names:
                        self._names[key] = _short_name(process)
                alive += 1
            except psutil.Error:
                continue
        self.samples += 1
        if rss > self.peak_rss:
            self.peak_rss = rss
        self.peak_processes = max(self.peak_processes, alive)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval)


def run_measured(
    command: Sequence[str],
    *,
    label: str,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout_s: float = 1800.0,
    log_path: Path | None = None,
    interval: float = SAMPLE_INTERVAL_S,
) -> Measurement:
    """Run ``command`` to completion (killing its process group after ``timeout_s``) and measure it.

    stdout and stderr go to ``log_path`` (or are discarded) so that a chatty command never blocks on a
    pipe and printing costs the same for every system.
    """
    sink: Any = subprocess.DEVNULL
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        sink = open(log_path, "wb")  # noqa: SIM115 - closed below, after the child has it
    load_before = os.getloadavg()
    started = time.perf_counter()
    try:
        # A session of its own so that a timeout can end exactly this tree and nothing else.
        process = subprocess.Popen(
            list(command),
            env=dict(env) if env is not None else None,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT if log_path is not None else subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        if log_path is not None:
            sink.close()
    sampler = TreeSampler(process.pid, interval).start()
    timer = threading.Timer(timeout_s, _kill_group, args=(process.pid,))
    timer.daemon = True
    timer.start()
    try:
        _, status, rusage = os.wait4(process.pid, 0)
    finally:
        timer.cancel()
        sampler.stop()
    wall = time.perf_counter() - started
    # Popen did not reap the child itself; tell it, so it never tries to wait for a reused pid.
    process.returncode = os.waitstatus_to_exitcode(status)
    return Measurement(
        label=label,
        wall_s=wall,
        cpu_user_s=rusage.ru_utime,
        cpu_system_s=rusage.ru_stime,
        cpu_sampled_s=sampler.cpu_s,
        peak_rss_bytes=sampler.peak_rss,
        max_rss_bytes=rusage.ru_maxrss * 1024,  # KiB on Linux
        peak_processes=sampler.peak_processes,
        returncode=process.returncode,
        load_before=load_before,
        load_after=os.getloadavg(),
        samples=sampler.samples,
        extra={"cpu_by_process": sampler.breakdown()},
    )


def _short_name(process: psutil.Process) -> str:
    try:
        parts = process.cmdline()
    except psutil.Error:
        return "?"
    return short_command(parts)


def short_command(parts: Sequence[str]) -> str:
    """Enough of a command line to recognise the role (CLI, render worker, poppler, task runner); a path
    keeps only its last part, so a committed record names no folder of the machine that measured it."""
    words = [Path(part).name if part.startswith("/") else part for part in parts[:6]]
    return " ".join(words)[:100]


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
