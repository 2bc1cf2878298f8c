"""Lowering the CPU priority of a whole process tree, from any thread.

``os.nice`` changes the calling *thread* on Linux (``setpriority(PRIO_PROCESS, 0)`` names a thread
id), so a watcher thread that decides a task should give way cannot use it: every thread of the
process and every descendant (render workers) is reniced by id instead. Raising niceness needs no
privilege; the change ends with the processes (Airflow forks one per task attempt).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

MAX_NICENESS = 19


def _thread_ids(pid: int) -> list[int]:
    tasks = Path(f"/proc/{pid}/task")
    try:
        return [int(entry.name) for entry in tasks.iterdir()]
    except OSError:
        return [pid]


def _renice(thread_id: int, increment: int) -> None:
    current = os.getpriority(os.PRIO_PROCESS, thread_id)
    os.setpriority(os.PRIO_PROCESS, thread_id, min(current + increment, MAX_NICENESS))


def nice_process_tree(increment: int, pid: int | None = None) -> int:
    """Add ``increment`` to the niceness of every thread of ``pid`` (default: this process) and of its
    descendants; returns how many threads were changed. Processes that end meanwhile are skipped."""
    if increment <= 0:
        return 0
    root = psutil.Process(pid or os.getpid())
    processes = [root, *root.children(recursive=True)]
    changed = 0
    for process in processes:
        for thread_id in _thread_ids(process.pid):
            try:
                _renice(thread_id, increment)
            except (ProcessLookupError, PermissionError) as exc:
                log.debug("could not renice thread %d: %s", thread_id, exc)
                continue
            changed += 1
    return changed
