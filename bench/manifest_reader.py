"""Peak RSS of ``olmocr-tasks manifest OUT RUN --documents`` at 1,000 and 10,000 documents (issue 34).

For each N a manifest of N entries is written with the real writer (``ManifestWriter``, shards of
10,000) into a temp folder; each entry is a converted 400-page document of about 3.3 KB of JSON
(Airflow task context, per-page latencies, outputs), about the size of the entries the issue measured. Then
``olmocr-tasks manifest OUT RUN --documents > /dev/null`` runs as a child process, ``--repeat`` times
per N, interleaved, and the kernel's exact peak RSS of each child is read from ``os.wait4`` (the
child's own ``ru_maxrss``; the command starts no processes of its own), in a small launcher process
that forks the command: Linux counts the forking process's RSS in the child's ``ru_maxrss``, so forked
from this harness every child would read at least the harness's 70 MB. The summary alone (no
``--documents``) is measured the same way: the command's floor (interpreter and imports) without any
entry read. One run per N also counts the lines the command wrote, to show it streamed them all.

The raw result goes to ``bench/records/manifest_reader-<UTC timestamp>.json`` (``bench/results/`` is
git-ignored; these records are committed). Goal: the 10,000-document peak within 1.25x of the
1,000-document peak.

    .venv/bin/python -m bench.manifest_reader
    .venv/bin/python -m bench.manifest_reader --checkout ../other-worktree   # measure another checkout's reader
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.measure import launcher_command

REPO = Path(__file__).resolve().parents[1]
# Standalone (it also measures other checkouts), so it names the records folder itself.
RECORDS_DIR = REPO / "bench" / "records"
RUN_ID = "bench-manifest-reader"
GOAL = 1.25


def _entry(index: int, output: str) -> Any:
    """A converted document of 400 pages (about 3.3 KB as a manifest line), converted by an Airflow task."""
    from olmocr_tasks.location.manifest import DocumentEntry

    name = f"collection-{index // 1000:04d}/scan-{index:07d}"
    pages = 400
    return DocumentEntry(
        source=f"s3://archive/in/{name}.pdf",
        status="converted",
        size=2_400_000 + index,
        sha256=f"{index:064x}",
        pages=pages,
        input_tokens=1784 * pages,
        output_tokens=610 * pages + index % 97,
        attempts=pages,
        seconds=31.7,
        outputs={"dolma": f"{output}/dolma/{name}.jsonl", "markdown": f"{output}/markdown/{name}.md"},
        page_latencies_s=[round(0.3 + ((index + page) % 97) / 100, 3) for page in range(pages)],
        accepted_attempt_histogram={"1": pages - 2, "2": 2},
        server_input_tokens=1784 * pages,
        server_output_tokens=612 * pages,
        task={
            "dag_id": "olmocr_ingest",
            "run_id": "scheduled__2026-12-01T10:00:00+00:00",
            "task_id": "convert",
            "map_index": index // 20,
            "try_number": 1,
        },
    )


def _write_manifest(output: Path, documents: int) -> dict[str, Any]:
    from olmocr_tasks.location.manifest import Manifest, ManifestWriter
    from olmocr_tasks.storage.store import Storage

    writer = ManifestWriter(Storage(), str(output), RUN_ID)
    for index in range(documents):
        writer.add(_entry(index, str(output)))
    header = Manifest(
        run_id=RUN_ID,
        started_at="2026-12-01T10:00:00.000Z",
        finished_at="2026-12-01T11:00:00.000Z",
        server={"base_urls": ["http://vllm:8000/v1"]},
        model="allenai/olmOCR-2-7B-1025-FP8",
        prompt_version="olmocr-v4",
        package_version="bench",
        settings={},
        input_uri="s3://archive/in/",
        output_uri=str(output),
    )
    summary = writer.commit(header)
    shards = sorted((output / "manifests").rglob("*.jsonl.gz"))
    entry_bytes = len(json.dumps(_entry(0, str(output)).to_dict(), ensure_ascii=False).encode()) + 1
    return {
        "documents": documents,
        "summary_bytes": os.path.getsize(summary),
        "shards": len(shards),
        "shard_bytes": sum(path.stat().st_size for path in shards),
        "entry_bytes": entry_bytes,
        "decompressed_bytes_about": entry_bytes * documents,
    }


class Command:
    """The manifest command to measure: this repo's installed script, or another checkout's package
    (``python -m`` run in that checkout, which puts it first on ``sys.path``)."""

    def __init__(self, checkout: Path | None) -> None:
        self.env = dict(os.environ)
        self.cwd = None if checkout is None else str(checkout.resolve())
        if checkout is None:
            self.argv = [str(Path(sys.executable).parent / "olmocr-tasks"), "manifest"]
        else:
            self.argv = [sys.executable, "-m", "olmocr_tasks.cli", "manifest"]


def _peak_rss(command: Command, args: list[str], stdout: Any, work: Path) -> dict[str, Any]:
    """Run the command once to its end through the launcher: its peak RSS (KiB), the launcher's, seconds."""
    argv = [*command.argv, *args]
    report = work / "launcher.json"
    # Through the launcher: forked from this harness (about 70 MB once the manifests are written) every
    # child's ru_maxrss would read at least that (``bench.measure``).
    done = subprocess.run(
        launcher_command(report, argv), stdout=stdout, stderr=subprocess.PIPE, env=command.env, cwd=command.cwd
    )
    measured = json.loads(report.read_text())
    report.unlink()
    if done.returncode != 0 or measured["exit"] != 0:
        raise SystemExit(f"{' '.join(argv)} exited {measured['exit']}: {done.stderr.decode(errors='replace')[-2000:]}")
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, nargs="+", default=[1000, 10_000])
    parser.add_argument("--repeat", type=int, default=5, help="children per N and command (interleaved)")
    parser.add_argument("--checkout", type=Path, help="measure the olmocr_tasks of this checkout (default: this one)")
    parser.add_argument("--label", default="", help="a note stored with the result (e.g. 'before', 'after')")
    parser.add_argument("--out", type=Path, help="the result file (default: bench/records/manifest_reader-<UTC>.json)")
    args = parser.parse_args()

    command = Command(args.checkout)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    with tempfile.TemporaryDirectory(prefix="manifest-reader-") as work:
        outputs = {n: Path(work) / f"out-{n}" for n in args.documents}
        manifests = {n: _write_manifest(outputs[n], n) for n in args.documents}
        # One run per N into a file: every entry came out, one line each.
        for n in args.documents:
            listing = Path(work) / f"documents-{n}.jsonl"
            with listing.open("wb") as sink:
                _peak_rss(command, [str(outputs[n]), RUN_ID, "--documents"], sink, Path(work))
            with listing.open("rb") as written:
                manifests[n]["lines_written"] = sum(1 for _ in written)
            listing.unlink()
            if manifests[n]["lines_written"] != n:
                raise SystemExit(f"--documents wrote {manifests[n]['lines_written']} lines for {n} documents")
        runs: list[dict[str, Any]] = []
        with open(os.devnull, "wb") as devnull:
            for repeat in range(args.repeat):
                for n in args.documents:
                    for what, extra in (("documents", ["--documents"]), ("summary", [])):
                        measured = _peak_rss(command, [str(outputs[n]), RUN_ID, *extra], devnull, Path(work))
                        row = {"documents": n, "command": what, "repeat": repeat}
                        row |= {key: measured[key] for key in ("peak_rss_kib", "launcher_rss_kib")}
                        row["seconds"] = round(measured["seconds"], 3)
                        runs.append(row)
                        print(json.dumps(row), flush=True)

    def peaks(n: int, what: str) -> list[int]:
        return [run["peak_rss_kib"] for run in runs if run["documents"] == n and run["command"] == what]

    per_n = {
        str(n): {
            "documents_peak_rss_mib_median": round(statistics.median(peaks(n, "documents")) / 1024, 1),
            "documents_peak_rss_mib_max": round(max(peaks(n, "documents")) / 1024, 1),
            "summary_peak_rss_mib_median": round(statistics.median(peaks(n, "summary")) / 1024, 1),
        }
        for n in args.documents
    }
    smallest, largest = min(args.documents), max(args.documents)
    ratio = statistics.median(peaks(largest, "documents")) / statistics.median(peaks(smallest, "documents"))
    result = {
        "bench": "manifest_reader",
        "label": args.label,
        "utc": stamp,
        "command": " ".join([Path(command.argv[0]).name, *command.argv[1:]]) + " OUT RUN --documents > /dev/null",
        "checkout": "this" if args.checkout is None else "other (--checkout)",
        "git_head": _git_head(args.checkout or REPO),
        "python": platform.python_version(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "peak_rss_source": "os.wait4 ru_maxrss of each child (KiB), forked by a python -I -S launcher whose "
        "RSS at the fork (launcher_rss_kib) is the lowest value ru_maxrss can show",
        "manifests": {str(n): manifests[n] for n in args.documents},
        "runs": runs,
        "per_documents": per_n,
        "ratio_documents_peak": round(ratio, 3),
        "ratio_of": f"median peak at {largest:,} / median peak at {smallest:,} documents (--documents)",
        "goal": GOAL,
        "goal_met": ratio <= GOAL,
    }
    out = args.out or RECORDS_DIR / f"manifest_reader-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({key: result[key] for key in ("per_documents", "ratio_documents_peak", "goal_met")}, indent=1))
    print(f"written to {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")


def _git_head(checkout: Path) -> str | None:
    try:
        found = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return found.stdout.strip()


if __name__ == "__main__":
    main()
