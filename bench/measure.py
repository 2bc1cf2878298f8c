"""Run one command and measure what it costs: wall time, CPU of its whole process tree, peak RSS.

CPU comes from ``wait4``: on Linux the rusage of a reaped child includes every descendant it reaped in
turn (render workers, poppler subprocesses, Airflow task processes), so nothing that exits cleanly is
missed and nothing outside the tree (the stand-in, this harness) is counted. As a cross-check the
sampler also keeps the last CPU reading of every process it saw; the larger of the two is reported, so
an orphan that was never reaped still counts. Memory is reported twice: ``max_rss_bytes``, the
kernel's exact peak (``ru_maxrss``: the largest peak of any one process of the tree, the measured
command or a descendant it reaped), and ``peak_rss_bytes``, the largest *sum* of RSS over the tree
seen by a sampler that walks it every ``interval`` seconds (a sample: it can miss a short peak).

The command is started by a small launcher (``LAUNCHER``, ``python -I -S``, about 9 MB) that forks
it, waits for it and reports its ``wait4`` rusage: Linux counts in a child's ``ru_maxrss`` the RSS
its process had when it forked (the copied address space, until exec replaces it), so forked straight
from a harness of 70 MB or more every command would read at least that. The launcher's own RSS at
the fork (``launcher_rss_bytes``) is the lowest value the exact peak can show.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
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


# Forks ``argv`` in a fresh session-less child, waits for it and writes its wait4 rusage to ``result``.
LAUNCHER = """
import json, os, sys, time
result, argv = sys.argv[1], sys.argv[2:]
with open("/proc/self/statm") as statm:
    floor_kib = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 1024
started = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execvp(argv[0], argv)
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
seconds = time.perf_counter() - started
with open(result, "w") as out:
    json.dump({"peak_rss_kib": usage.ru_maxrss, "launcher_rss_kib": floor_kib, "seconds": seconds,
               "user_s": usage.ru_utime, "system_s": usage.ru_stime,
               "exit": os.waitstatus_to_exitcode(status)}, out)
"""


def launcher_command(report: Path, command: Sequence[str]) -> list[str]:
    """``command`` started through ``LAUNCHER``, which writes its exact rusage to ``report`` (JSON)."""
    return [sys.executable, "-I", "-S", "-c", LAUNCHER, str(report), *command]


class TreeSampler:
    """Samples RSS (summed) and CPU (per process) of a process and all its descendants (with
    ``include_root=False``, of the descendants only: a launcher's)."""

    def __init__(self, root_pid: int, interval: float = SAMPLE_INTERVAL_S, *, include_root: bool = True) -> None:
        self.root_pid = root_pid
        self.include_root = include_root
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
            found = [root] if self.include_root else []
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
    report_fd, report_name = tempfile.mkstemp(prefix="measured-", suffix=".json")
    os.close(report_fd)
    report = Path(report_name)
    load_before = os.getloadavg()
    started = time.perf_counter()
    try:
        # A session of its own so that a timeout can end exactly this tree and nothing else.
        process = subprocess.Popen(
            launcher_command(report, command),
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
    sampler = TreeSampler(process.pid, interval, include_root=False).start()
    timer = threading.Timer(timeout_s, _kill_group, args=(process.pid,))
    timer.daemon = True
    timer.start()
    try:
        _, status, launcher_usage = os.wait4(process.pid, 0)
    finally:
        timer.cancel()
        sampler.stop()
    wall = time.perf_counter() - started
    # Popen did not reap the child itself; tell it, so it never tries to wait for a reused pid.
    process.returncode = os.waitstatus_to_exitcode(status)
    try:
        exact = json.loads(report.read_text() or "{}")
    finally:
        report.unlink(missing_ok=True)
    if "exit" not in exact:
        # The launcher was killed (timeout) before it could report: no exact figures for this run.
        exact = {"exit": process.returncode, "user_s": launcher_usage.ru_utime, "system_s": launcher_usage.ru_stime,
                 "peak_rss_kib": 0, "launcher_rss_kib": 0}  # fmt: skip
    return Measurement(
        label=label,
        wall_s=wall,
        cpu_user_s=exact["user_s"],
        cpu_system_s=exact["system_s"],
        cpu_sampled_s=sampler.cpu_s,
        peak_rss_bytes=sampler.peak_rss,
        max_rss_bytes=exact["peak_rss_kib"] * 1024,
        peak_processes=sampler.peak_processes,
        returncode=exact["exit"],
        load_before=load_before,
        load_after=os.getloadavg(),
        samples=sampler.samples,
        extra={"cpu_by_process": sampler.breakdown(), "launcher_rss_bytes": exact["launcher_rss_kib"] * 1024},
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
