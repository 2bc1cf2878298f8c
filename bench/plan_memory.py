"""Memory of the Airflow ``plan`` and ``publish_manifest`` tasks' engine calls at N documents, in one process.

Airflow is imported first (as in a task process: ``olmocr_tasks.provider.tasks``), then for each N a
local folder of N empty ``.pdf`` files (1,000 per sub-folder) is planned with ``plan_batches`` and the
default ``BatchingRule`` into an empty output; with ``--publish`` every batch then gets a finished part
(each document converted, ``--pages`` pages with a latency each) and ``publish_run`` writes the
manifest. For each call one JSON line gives its ``tracemalloc`` peak (Python allocations), its peak
RSS (``VmHWM``, reset before the call) and the process's max RSS so far. Run it under ``flock
/tmp/olmocr-bench.lock``; several N in one process show whether a call's peak grows with the run.

    python -m bench.plan_memory 20000 100000 --publish --work /tmp/plan-memory
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def _inbox(root: Path, documents: int) -> Path:
    inbox = root / f"in-{documents}"
    if not inbox.exists():
        for index in range(documents):
            folder = inbox / f"f{index // 1000:03d}"
            if index % 1000 == 0:
                folder.mkdir(parents=True)
            (folder / f"d{index:06d}.pdf").touch()
    return inbox


def _reset_peak_rss() -> bool:
    """Reset this process's peak RSS (``VmHWM``), so the next reading is one call's; False where Linux refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _peak_rss_mib() -> float | None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return None


def _measured(name: str, documents: int, call: Callable[..., T], *args: Any) -> T:
    peak_resets = _reset_peak_rss()
    tracemalloc.start()
    tracemalloc.reset_peak()
    started = time.perf_counter()
    result = call(*args)
    seconds = time.perf_counter() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    row = {
        "call": name,
        "documents": documents,
        "seconds": round(seconds, 1),
        "traced_peak_mib": round(peak / 2**20, 1),
        # The call's own peak RSS where Linux lets a process reset it; the process's max RSS in any case.
        "peak_rss_mib": _peak_rss_mib() if peak_resets else None,
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(json.dumps(row), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("documents", type=int, nargs="+")
    parser.add_argument("--work", type=Path, required=True, help="a scratch folder (inboxes are kept for reuse)")
    parser.add_argument("--publish", action="store_true", help="also publish each planned run")
    parser.add_argument("--pages", type=int, default=1, help="converted pages per document when publishing")
    args = parser.parse_args()
    start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    import olmocr_tasks.provider.tasks  # noqa: F401  (what a task process has imported)
    from olmocr_tasks.core.config import ConversionSettings, ServerSettings
    from olmocr_tasks.location.manifest import DocumentEntry
    from olmocr_tasks.run.batching import BatchingRule
    from olmocr_tasks.run.planning import plan_batches
    from olmocr_tasks.run.request import RunRequest
    from olmocr_tasks.storage.store import Storage

    print(
        json.dumps(
            {
                "start_rss_mib": round(start_rss, 1),
                "imported_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            }
        ),
        flush=True,
    )
    settings = ConversionSettings(server=ServerSettings(base_urls=("http://127.0.0.1:9",), model="bench"))
    storage = Storage()
    for documents in args.documents:
        inbox, output = _inbox(args.work, documents), args.work / f"out-{documents}"
        shutil.rmtree(output, ignore_errors=True)
        request = RunRequest(str(inbox), str(output), f"bench-{documents}", settings=settings)
        folder = request.run_folder(storage, "p1-bench")
        descriptors = _measured("plan_batches", documents, plan_batches, request, storage, folder, BatchingRule())
        if not args.publish:
            continue
        for descriptor in descriptors:
            attempt = folder.attempt(descriptor["batch"], 1)
            attempt.start()
            entries = [
                DocumentEntry(
                    source=source.uri,
                    status="converted",
                    pages=args.pages,
                    page_latencies_s=[random.uniform(0.5, 30.0) for _ in range(args.pages)],
                )
                for source in folder.read_batch(descriptor["batch"])
            ]
            attempt.write_part(entries)
        _measured("publish_run", documents, _publish, request, storage, folder)


def _publish(request: Any, storage: Any, folder: Any) -> Any:
    """What the publish_manifest task calls: the plan read back, then the manifest written."""
    from olmocr_tasks.run.publishing import publish_run

    return publish_run(request, storage, folder, folder.read_plan())


if __name__ == "__main__":
    main()
