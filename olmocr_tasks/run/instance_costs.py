"""What a convert instance costs beside its pages, measured from a run's instances, and the size that pays for it.

Every mapped convert instance pays a fixed cost that converts nothing: the scheduler's turn and the
worker's process start-up before it, its DAG parse, request and storage set-up, and the slot standing
empty between it and the next instance. Sized by pages alone (a request window), instances of a fast
server are over in a few seconds and that cost is most of their slot's time (bench/README Run 17:
32 instances of 15 one-page documents ran at 0.56x of the CLI). So the plan sizes instances by time:
an instance should convert for long enough that its fixed cost is at most ``overhead_fraction`` of its
slot's time, i.e. for ``fixed_cost_s * (1 - f) / f`` seconds (at most ``MAX_CONVERTING_S``), at the
rate an instance converts.

Both figures are measured, not guessed: ``publish_manifest`` measures the run's instances
(``measure``) and keeps the result beside the conversion key's state; the next run's plan reads it.
A run on an output location with no measurement yet (its first) sizes by the request window as before;
a run whose instances were too small to measure a rate by keeps the last measurements. The plan takes
the median of the last ``RECENT_RUNS`` measurements, so one run that shared its slots or its machine
does not resize the next.

* ``concurrency``: the most instances that ran at once (a sweep over their start and end times);
* ``pages_per_s``: pages per second of converting, per instance (its share of the server);
* ``fixed_cost_s``: slot time not spent converting, per instance: ``(concurrency * span - sum of
  converting seconds) / instances``. It includes the start-up inside the task before the batch
  starts, the turnover between instances and the wait for the last one: all of what more instances
  would cost more of.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

from olmocr_tasks.core.clock import utc_now
from olmocr_tasks.location.layout import ConversionState
from olmocr_tasks.storage.store import ReadLimitExceeded, Storage

# An instance's fixed cost should be at most this share of its slot's time: with the ~2 s an instance
# costs under Celery (bench/README Run 17: 1.99 s), 38 s of converting. A tenth would leave about 0.88x
# of the CLI's throughput at 10,000 one-page documents once the run's own fixed cost (plan, publish)
# is added, under the 0.9 the project aims for.
DEFAULT_OVERHEAD_FRACTION = 0.05
# The longest an instance is sized to convert, whatever the measurement: a run that shared its slots
# with another run measures the other's instances as its own turnover, and instances of hours would
# make a retry repeat hours and an urgent run beyond the reserved slot wait for hours.
MAX_CONVERTING_S = 600.0
# A run whose instances converted fewer pages than this on average measures nothing: such an instance
# never fills its request window, and its set-up inside the batch (render workers, readiness) counts
# as converting, so its rate is far below the server's (an 8-document warm-up measured 5.2 pages/s
# per instance where 26.9 is true, and sized the next run's instances at 151 pages instead of ~1,000).
MIN_PAGES_PER_INSTANCE = 64
# The runs whose measurements the plan takes the median of.
RECENT_RUNS = 5
# The measurements the plan reads are a small JSON object; anything bigger is not ours.
_MAX_BYTES = 4096


@dataclass(frozen=True)
class InstanceTiming:
    """One convert instance: when it started running and ended (epoch seconds), how long it converted."""

    started: float
    ended: float
    converting_s: float
    pages: int


@dataclass(frozen=True)
class InstanceCosts:
    fixed_cost_s: float
    pages_per_s: float
    concurrency: int
    instances: int
    measured_at: str = ""

    def min_pages(self, overhead_fraction: float = DEFAULT_OVERHEAD_FRACTION) -> int:
        """Pages an instance needs for its fixed cost to be at most ``overhead_fraction`` of its slot time."""
        if not 0 < overhead_fraction < 1:
            raise ValueError(f"overhead_fraction must be between 0 and 1, not {overhead_fraction}")
        converting_s = min(self.fixed_cost_s * (1 - overhead_fraction) / overhead_fraction, MAX_CONVERTING_S)
        return max(1, math.ceil(self.pages_per_s * converting_s))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> InstanceCosts | None:
        """None for anything that is not a sane measurement (a tampered or foreign object is ignored)."""
        if not isinstance(data, dict):
            return None
        try:
            costs = cls(
                fixed_cost_s=float(data["fixed_cost_s"]),
                pages_per_s=float(data["pages_per_s"]),
                concurrency=int(data["concurrency"]),
                instances=int(data["instances"]),
                measured_at=str(data.get("measured_at", "")),
            )
        except (KeyError, TypeError, ValueError, OverflowError):
            return None
        finite = all(math.isfinite(value) for value in (costs.fixed_cost_s, costs.pages_per_s))
        # Bounds that no real deployment reaches: an hour of fixed cost, a million pages a second.
        if not finite or not (0 <= costs.fixed_cost_s <= 3600 and 0 < costs.pages_per_s <= 1e6):
            return None
        return costs


def measure(timings: Iterable[InstanceTiming]) -> InstanceCosts | None:
    """The costs of a run's instances; None when they converted too little to measure a rate by
    (nothing, or fewer than ``MIN_PAGES_PER_INSTANCE`` pages an instance on average)."""
    items = [timing for timing in timings if timing.ended >= timing.started and timing.converting_s >= 0]
    converting = sum(timing.converting_s for timing in items)
    pages = sum(timing.pages for timing in items)
    if not items or converting <= 0 or pages < MIN_PAGES_PER_INSTANCE * len(items):
        return None
    span = max(timing.ended for timing in items) - min(timing.started for timing in items)
    concurrency = _most_at_once(items)
    fixed = max(0.0, (concurrency * span - converting) / len(items))
    return InstanceCosts(
        fixed_cost_s=round(fixed, 3),
        pages_per_s=round(pages / converting, 3),
        concurrency=concurrency,
        instances=len(items),
        measured_at=utc_now(),
    )


def _most_at_once(items: list[InstanceTiming]) -> int:
    # Ends sort before starts at the same instant: an instance that starts as another ends reuses its slot.
    events = sorted([(timing.started, 1) for timing in items] + [(timing.ended, -1) for timing in items])
    running = most = 0
    for _, change in events:
        running += change
        most = max(most, running)
    return most


def load(storage: Storage, state: ConversionState) -> InstanceCosts | None:
    """What the plan sizes by: the median fixed cost and rate of the last ``RECENT_RUNS`` measured runs
    of this conversion key (one run that shared the server or the machine moves neither), or None."""
    recent = _recent(storage, state)
    if not recent:
        return None
    last = recent[-1]
    return replace(
        last,
        fixed_cost_s=statistics.median(costs.fixed_cost_s for costs in recent),
        pages_per_s=statistics.median(costs.pages_per_s for costs in recent),
    )


def save(storage: Storage, state: ConversionState, costs: InstanceCosts) -> None:
    """Keep this run's measurement beside the last ones (at most ``RECENT_RUNS``)."""
    recent = [*_recent(storage, state), costs][-RECENT_RUNS:]
    body = {"recent": [item.to_dict() for item in recent]}
    storage.write_bytes_atomic(state.instance_costs, json.dumps(body, sort_keys=True).encode())


def _recent(storage: Storage, state: ConversionState) -> list[InstanceCosts]:
    """The kept measurements, oldest first; none when the object is missing, too big or not all sane."""
    try:
        reader = storage.open_read_or_none(state.instance_costs, max_bytes=_MAX_BYTES)
        if reader is None:
            return []
        with reader:
            data = json.loads(reader.read())
    except (ReadLimitExceeded, ValueError):
        return []
    # A single measurement: what this module kept before it kept several.
    items = data.get("recent") if isinstance(data, dict) and "recent" in data else [data]
    if not isinstance(items, list) or len(items) > RECENT_RUNS:
        return []
    recent = [InstanceCosts.from_dict(item) for item in items]
    return [] if any(costs is None for costs in recent) else [costs for costs in recent if costs is not None]
