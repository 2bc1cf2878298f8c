"""Several conversion runs sharing one server: adaptive concurrency on versus off.

Three runs (separate processes, as three DAG runs or CLI invocations would be) convert disjoint thirds
of the corpus against one stand-in of 8 concurrent x 0.5 s (16 pages/s). A poller reads the stand-in's
scheduler every 100 ms. With adaptive concurrency each run sizes its window from ``/metrics`` so the
waiting queue stays short; with it off each run keeps its full window of 64 requests in flight and
the queue holds everything the three runs have sent. Both should deliver the server's capacity: the
point is the queue length (and so each request's time in the queue) at the same throughput.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import BACKPRESSURE, MODEL, Regime, fresh_dir, standin, subprocess_env
from bench.corpus import Corpus, split
from bench.measure import Measurement, run_measured
from bench.run_cli import manifest_check, read_manifest

POLL_INTERVAL_S = 0.1


class QueuePoller:
    """Samples (time, running, waiting) from the stand-in's control API on a thread."""

    def __init__(self, process: Any) -> None:
        self._process = process
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="queue-poller", daemon=True)

    def __enter__(self) -> QueuePoller:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                stats = self._process.stats()
                self.samples.append((time.perf_counter(), int(stats["running"]), int(stats["waiting"])))
            except Exception:  # a missed sample is not worth failing the benchmark for
                pass
            self._stop.wait(POLL_INTERVAL_S)


def _summary(samples: list[tuple[float, int, int]], capacity: int) -> dict[str, Any]:
    # Only the busy period counts: from the first request running to the last one finishing.
    busy = [sample for sample in samples if sample[1] or sample[2]]
    if not busy:
        return {"samples": 0}
    first, last = busy[0][0], busy[-1][0]
    window = [sample for sample in samples if first <= sample[0] <= last]
    running = [sample[1] for sample in window]
    waiting = sorted(sample[2] for sample in window)
    # After the first quarter of the busy period: the queue once the windows have settled, which
    # is what a long run lives with (the start is a burst whatever the controller does).
    settled = sorted(sample[2] for sample in window if sample[0] >= first + 0.25 * (last - first))
    return {
        "samples": len(window),
        "mean_running": round(statistics.fmean(running), 2),
        "server_utilisation": round(statistics.fmean(running) / capacity, 3),
        "share_of_samples_with_idle_slots": round(sum(r < capacity for r in running) / len(running), 3),
        "mean_waiting": round(statistics.fmean(waiting), 1),
        "p95_waiting": waiting[int(0.95 * (len(waiting) - 1))],
        "max_waiting_sampled": waiting[-1],
        "settled_mean_waiting": round(statistics.fmean(settled), 1) if settled else None,
        "settled_max_waiting": settled[-1] if settled else None,
    }


def _run_mode(process: Any, parts: list[Corpus], work: Path, adaptive: bool, regime: Regime) -> dict[str, Any]:
    mode = "adaptive" if adaptive else "fixed"
    process.reset(keep_config=True)  # zero the stand-in's peak counters between modes
    measurements: list[Measurement | None] = [None] * len(parts)
    outputs = [fresh_dir(work / f"bp-{mode}-out{index}") for index in range(len(parts))]

    def one(index: int) -> None:
        command = [
            sys.executable, "-m", "bench.engine_run", str(parts[index].folder), str(outputs[index]),
            "--server", process.url, "--model", MODEL, "--run-id", f"bp-{mode}-{index}",
            "--adaptive" if adaptive else "--no-adaptive",
        ]  # fmt: skip
        measurements[index] = run_measured(
            command, label=f"backpressure {mode} run {index}", env=subprocess_env(),
            log_path=work / f"bp-{mode}-run{index}.log",
        )  # fmt: skip

    threads = [threading.Thread(target=one, args=(index,)) for index in range(len(parts))]
    with QueuePoller(process) as poller:
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - started
    stats = process.stats()
    checks = [manifest_check(read_manifest(out), part) for out, part in zip(outputs, parts, strict=True)]
    pages = sum(part.pages for part in parts)
    return {
        "mode": mode,
        "runs": len(parts),
        "pages": pages,
        "ok": all(ok for ok, _, _ in checks) and all(m is not None and m.returncode == 0 for m in measurements),
        "notes": [note for ok, note, _ in checks if not ok],
        "wall_s": round(wall, 2),
        "total_pages_per_s": round(pages / wall, 3),
        "share_of_capacity": round(pages / wall / regime.server_pages_per_s, 3),
        "max_waiting": stats["max_waiting"],
        "max_running": stats["max_running"],
        "queue": _summary(poller.samples, regime.capacity),
        "per_run": [
            {"pages": part.pages, "wall_s": round(m.wall_s, 2), "cpu_s": round(m.cpu_s, 2)} if m else None
            for part, m in zip(parts, measurements, strict=True)
        ],
    }


def measure_backpressure(corpus: Corpus, work: Path, runs: int = 3, regime: Regime = BACKPRESSURE) -> dict[str, Any]:
    parts = split(corpus, runs, fresh_dir(work / "bp-parts"))
    with standin(regime) as process:
        results = [_run_mode(process, parts, work, adaptive, regime) for adaptive in (True, False)]
    return {"regime": regime.description, "modes": results}
