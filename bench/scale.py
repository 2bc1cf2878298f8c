"""The growth curve of one CLI run: N distinct one-page PDFs through ``olmocr-tasks convert``.

For each N (default 1,000 / 10,000 / 100,000) the harness writes N one-page PDFs, each with its own
text (no two documents share content, so none is deduplicated), runs the CLI against the stand-in in
the CPU-bound regime (rendering is the limit, as in the other benches) and records wall time,
pages/s, the peak RSS of the CLI's process tree (``bench.measure``: summed over the CLI and its render
workers, sampled every 50 ms), the manifest's summary and shard bytes, the objects the run wrote per
document, and then the wall time of a second run that finds 20 new documents over that history.

The PDFs are written by hand (a few hundred bytes each, ~20 µs a document) rather than with
reportlab: 100,000 documents would otherwise take minutes to generate. Each page holds 30 lines of
text in Helvetica, so rendering it costs what a short text page costs.

    python -m bench.scale [--documents 1000 10000 100000] [--lines 30] [--work DIR]

With ``--s3`` the same runs go to a moto S3 server over HTTP instead (input and output in one bucket;
the PDFs are put through moto's in-process backend, the runs' own reads and writes go over HTTP), and
each row adds what the manifest counted: storage requests per document for the run and for the top-up
over that history. moto answers far slower than S3 (~1 s per 1,000-key listing page), so on S3 the
request counts carry over and the wall times do not.

Results: one JSON line per N in ``bench/results/scale.jsonl`` (``storage``: ``local`` or ``s3``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

from bench.common import CPU_BOUND, MODEL, RESULTS_DIR, VENV_BIN, MotoBucket, fresh_dir, standin, subprocess_env
from bench.measure import run_measured
from olmocr_tasks.location.layout import SHARD_SUFFIX, OutputLocation, shards_folder
from olmocr_tasks.location.manifest_reader import open_manifest
from olmocr_testkit.pdfgen import assemble_pdf

RESULT_FILE = RESULTS_DIR / "scale.jsonl"
NEW_DOCUMENTS = 20
# Lines of text per page: 30 is a short text page (~50 ms of rendering here); fewer make rendering
# cheaper, so that the per-document costs this bench is about (state, outputs, manifest) weigh more.
DEFAULT_LINES = 30


def one_page_pdf(doc_id: int, lines_per_page: int = DEFAULT_LINES) -> bytes:
    """A valid one-page PDF whose text names ``doc_id`` on every line (so its bytes are its own)."""
    lines = [b"BT /F1 11 Tf 54 740 Td 14 TL"]
    for line in range(lines_per_page):
        lines.append(
            b"(Document %d, line %d: the quick brown fox jumps over the lazy dog %d.) '"
            % (doc_id, line, doc_id * 31 + line)
        )
    lines.append(b"ET")
    stream = b"\n".join(lines)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R"
        b" /Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    return assemble_pdf(objects)


def write_corpus(folder: Path, start: int, count: int, lines_per_page: int = DEFAULT_LINES) -> None:
    """Documents ``start .. start+count-1``, 1,000 to a sub-folder (as an archive would nest them)."""
    for doc_id in range(start, start + count):
        sub = folder / f"part{doc_id // 1000:04d}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"doc{doc_id:07d}.pdf").write_bytes(one_page_pdf(doc_id, lines_per_page))


def _convert(
    input_uri: str | Path,
    output_uri: str | Path,
    run_id: str,
    server: str,
    log: Path,
    env: dict[str, str] | None = None,
) -> Any:
    command = [
        str(VENV_BIN / "olmocr-tasks"), "--log-level", "WARNING", "convert", str(input_uri), str(output_uri),
        "--server", server, "--model", MODEL, "--run-id", run_id,
    ]  # fmt: skip
    return run_measured(command, label=run_id, env=env or subprocess_env(), log_path=log, timeout_s=4 * 3600)


def _files(root: Path) -> list[Path]:
    return [Path(base) / name for base, _, names in os.walk(root) for name in names]


def _manifest_figures(output: Path, run_id: str) -> dict[str, Any]:
    summary_path = Path(OutputLocation(str(output)).manifest(run_id))
    if not summary_path.is_file():
        return {"summary_bytes": None, "shard_bytes": None, "counts": None}
    summary = open_manifest(str(summary_path)).summary
    shard_dir = Path(shards_folder(str(summary_path)))
    shards = [path for path in _files(shard_dir) if path.name.endswith(SHARD_SUFFIX)] if shard_dir.is_dir() else []
    return {
        "summary_bytes": summary_path.stat().st_size,
        "shard_bytes": sum(path.stat().st_size for path in shards),
        "shards": len(shards),
        "counts": summary["counts"],
        "in_run_pages_per_s": summary["metrics"].get("pages_per_second"),
        # What the run's batches asked of storage (the manifest's own count, by kind and per document).
        "storage_requests": summary["metrics"].get("storage_requests"),
    }


def measure(documents: int, work: Path, server: str, lines_per_page: int = DEFAULT_LINES) -> dict[str, Any]:
    root = fresh_dir(work / f"scale-{documents}")
    input_dir, output = root / "input", root / "output"
    started = time.perf_counter()
    write_corpus(input_dir, 0, documents, lines_per_page)
    generated_s = time.perf_counter() - started
    run_id = f"scale-{documents}"
    first = _convert(input_dir, output, run_id, server, root / "first.log")
    figures = _manifest_figures(output, run_id)
    objects = len(_files(output))
    runs = Path(OutputLocation(str(output)).runs_uri)
    run_folder_objects = len(_files(runs)) if runs.is_dir() else 0
    # The top-up: 20 new documents in the same input, converted over the whole history.
    write_corpus(input_dir, documents, NEW_DOCUMENTS, lines_per_page)
    top_up_id = f"scale-{documents}-topup"
    second = _convert(input_dir, output, top_up_id, server, root / "second.log")
    top_up = _manifest_figures(output, top_up_id)
    counts = figures["counts"] or {}
    ok = first.returncode == 0 and counts.get("converted") == documents and not counts.get("failed")
    ok_top_up = second.returncode == 0 and (top_up["counts"] or {}).get("converted") == NEW_DOCUMENTS
    return {
        "documents": documents,
        "ok": ok,
        "top_up_ok": ok_top_up,
        "generate_s": round(generated_s, 2),
        "wall_s": round(first.wall_s, 2),
        "pages_per_s": round(documents / first.wall_s, 2),
        "cpu_s": round(first.cpu_s, 2),
        "peak_rss_mib": round(first.peak_rss_bytes / 2**20, 1),
        "peak_processes": first.peak_processes,
        "summary_bytes": figures["summary_bytes"],
        "shard_bytes": figures["shard_bytes"],
        "shards": figures.get("shards"),
        "objects_after_run": objects,
        "objects_per_document": round(objects / documents, 3),
        "run_folder_objects": run_folder_objects,
        "storage_requests": figures.get("storage_requests"),
        "top_up_storage_requests": top_up.get("storage_requests"),
        "counts": counts,
        "in_run_pages_per_s": figures.get("in_run_pages_per_s"),
        "top_up_documents": NEW_DOCUMENTS,
        "top_up_wall_s": round(second.wall_s, 2),
        "top_up_peak_rss_mib": round(second.peak_rss_bytes / 2**20, 1),
        "load_before": first.load_before,
        "load_after": first.load_after,
    }


def _put_corpus(bucket: MotoBucket, prefix: str, start: int, count: int, lines_per_page: int) -> None:
    """``write_corpus``'s documents, put under ``prefix`` of the bucket."""
    for doc_id in range(start, start + count):
        bucket.put(f"{prefix}part{doc_id // 1000:04d}/doc{doc_id:07d}.pdf", one_page_pdf(doc_id, lines_per_page))


def _summary(bucket: MotoBucket, key: str) -> dict[str, Any] | None:
    data = bucket.get(key)  # None when the run published no manifest
    return None if data is None else json.loads(data)


def _run_figures(summary: dict[str, Any] | None, expected: int, measured: Any) -> dict[str, Any]:
    counts = (summary or {}).get("counts") or {}
    return {
        "ok": measured.returncode == 0 and counts.get("converted") == expected and not counts.get("failed"),
        "wall_s": round(measured.wall_s, 2),
        "peak_rss_mib": round(measured.peak_rss_bytes / 2**20, 1),
        "counts": counts,
        "storage_requests": ((summary or {}).get("metrics") or {}).get("storage_requests"),
    }


def measure_s3(documents: int, bucket: MotoBucket, work: Path, server: str, lines_per_page: int) -> dict[str, Any]:
    """N documents converted into moto S3, then 20 new ones over that history: requests and times."""
    root = fresh_dir(work / f"scale-s3-{documents}")
    prefix = f"n{documents}/"
    input_uri, output_uri = f"s3://{bucket.name}/{prefix}input/", f"s3://{bucket.name}/{prefix}output"
    _put_corpus(bucket, f"{prefix}input/", 0, documents, lines_per_page)
    run_id = f"scale-s3-{documents}"
    first = _convert(input_uri, output_uri, run_id, server, root / "first.log", bucket.env)
    first_figures = _run_figures(_summary(bucket, f"{prefix}output/manifests/{run_id}.json"), documents, first)
    _put_corpus(bucket, f"{prefix}input/", documents, NEW_DOCUMENTS, lines_per_page)
    top_up_id = f"{run_id}-topup"
    second = _convert(input_uri, output_uri, top_up_id, server, root / "second.log", bucket.env)
    top_up = _run_figures(_summary(bucket, f"{prefix}output/manifests/{top_up_id}.json"), NEW_DOCUMENTS, second)
    return {
        "documents": documents,
        "storage": "s3",
        "ok": first_figures["ok"],
        "top_up_ok": top_up["ok"],
        "wall_s": first_figures["wall_s"],
        "pages_per_s": round(documents / first.wall_s, 2),
        "peak_rss_mib": first_figures["peak_rss_mib"],
        "counts": first_figures["counts"],
        "storage_requests": first_figures["storage_requests"],
        "top_up_documents": NEW_DOCUMENTS,
        "top_up_wall_s": top_up["wall_s"],
        "top_up_counts": top_up["counts"],
        "top_up_storage_requests": top_up["storage_requests"],
        "load_before": first.load_before,
        "load_after": second.load_after,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--work", type=Path, default=RESULTS_DIR / "scale-work")
    parser.add_argument("--keep", action="store_true", help="keep each N's input and output folders")
    parser.add_argument("--lines", type=int, default=DEFAULT_LINES, help="lines of text on each page")
    parser.add_argument("--s3", action="store_true", help="input and output in a moto S3 server over HTTP")
    args = parser.parse_args(argv)
    machine = {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()}
    settings = {"regime": CPU_BOUND.name, **CPU_BOUND.settings(), "pages_per_document": 1, "lines_per_page": args.lines}
    bucket = MotoBucket("bench-scale") if args.s3 else None
    with standin(CPU_BOUND) as server:
        for documents in args.documents:
            if bucket is not None:
                row = measure_s3(documents, bucket, args.work, server.url, args.lines)
            else:
                row = measure(documents, args.work, server.url, args.lines) | {"storage": "local"}
            row |= {"settings": settings, "host": machine}
            row["at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            RESULT_FILE.parent.mkdir(parents=True, exist_ok=True)
            with RESULT_FILE.open("a") as sink:
                sink.write(json.dumps(row) + "\n")
            shown = ("documents", "storage", "ok", "wall_s", "pages_per_s", "peak_rss_mib", "summary_bytes",
                     "shard_bytes", "objects_per_document", "top_up_wall_s", "top_up_storage_requests")  # fmt: skip
            print(json.dumps({key: row.get(key) for key in shown}), flush=True)
            if not args.keep:
                fresh_dir(args.work / f"scale-{documents}")
    if bucket is not None:
        bucket.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
