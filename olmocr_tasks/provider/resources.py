"""A task's exact peak memory, logged once at its end.

Sampling a task process from outside misses short peaks and cannot tell the task from the Celery
process that forked it; the kernel keeps the exact figure: ``getrusage(RUSAGE_SELF).ru_maxrss`` is
the largest resident set this process has had (a forked process starts its own count; pages it still
shares with the process it was forked from are resident in it too, as ``ps`` counts them).
``RUSAGE_CHILDREN`` is the largest of the children it has reaped (the render workers, once their pool
is closed), reported apart. On Linux that figure is at least this process's own resident size when it
started the child: exec records the high-water mark of the memory it replaces, which for a child
started by ``subprocess`` is its parent's. So it bounds a render worker's peak from above and grows
only when a worker outgrows the task process.

The tasks call ``log_peak_memory`` last, so the line in each attempt's log is the attempt's whole
peak; ``bench/airflow_scale.py`` reads it from the task logs to compare runs of 10,000 and 100,000
documents.
"""

from __future__ import annotations

import logging
import resource
import sys
from dataclasses import dataclass

log = logging.getLogger(__name__)

# The line's prefix, for whoever reads it back from the task logs.
PEAK_MEMORY_EVENT = "peak memory:"
# ru_maxrss is in KiB on Linux, in bytes on macOS.
_MAXRSS_UNIT = 1 if sys.platform == "darwin" else 1024


@dataclass(frozen=True)
class PeakMemory:
    """Peak resident set sizes in MiB: this process's, and the largest of its reaped children's."""

    self_mib: float
    children_mib: float


def peak_memory() -> PeakMemory:
    def mib(who: int) -> float:
        return round(resource.getrusage(who).ru_maxrss * _MAXRSS_UNIT / 2**20, 1)

    return PeakMemory(self_mib=mib(resource.RUSAGE_SELF), children_mib=mib(resource.RUSAGE_CHILDREN))


def log_peak_memory() -> PeakMemory:
    """Log ``peak memory: self X MiB, children Y MiB`` at INFO and return the figures."""
    peak = peak_memory()
    log.info("%s self %.1f MiB, children %.1f MiB", PEAK_MEMORY_EVENT, peak.self_mib, peak.children_mib)
    return peak
