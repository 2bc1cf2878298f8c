"""GPU-busy seconds as a value: what a batch was charged, summed over a run, stored in its manifest.

Measured by ``olmocr_tasks.inference.gpu_busy.GpuBusyMeter`` from vLLM's ``/metrics``; kept here, below
every layer, because the run folder and the manifest (``location``) store it and must not depend on
the client that measures it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GpuBusy:
    """GPU-busy seconds charged to a batch (or a run), and whether vLLM's ``/metrics`` measured all of them.

    ``measured`` False means some of the work went unmeasured (no ``/metrics``, polling off, an attempt
    that died before reporting): ``seconds`` is then a lower bound and the cost falls back to wall clock.
    """

    seconds: float
    measured: bool

    def plus(self, other: GpuBusy) -> GpuBusy:
        return GpuBusy(self.seconds + other.seconds, self.measured and other.measured)

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": round(self.seconds, 3), "measured": self.measured}

    @classmethod
    def from_dict(cls, data: Any) -> GpuBusy | None:
        """The report written by ``to_dict``; None for anything else (reports from before the measurement)."""
        if not isinstance(data, dict) or not isinstance(data.get("seconds"), int | float):
            return None
        return cls(seconds=float(data["seconds"]), measured=data.get("measured") is True)


# A batch that sent the server nothing: no GPU time, and that is exact.
NOTHING_SENT = GpuBusy(0.0, measured=True)


def total_gpu_busy(reports: Iterable[GpuBusy | None]) -> GpuBusy | None:
    """A run's GPU-busy time from its batches' reports (None: a batch that did not report one).

    Measured only if every batch measured its own; None when there are no batches at all.
    """
    total: GpuBusy | None = None
    for report in reports:
        report = report or GpuBusy(0.0, measured=False)
        total = report if total is None else total.plus(report)
    return total
