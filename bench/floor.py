"""The floors our engine is compared with, run as measured child processes.

``render``    one loop over every page: ``render_page_png_sync`` (pypdfium2 render + Pillow PNG at
              the engine's compression level) and base64. Nothing else: the CPU-per-page floor.
``pipeline``  the bare throughput reference: pypdfium2 rendering in a process pool with one process
              per core, and an asyncio httpx loop posting olmOCR's page query to the server. No
              retries, no outputs, no ledger: what a minimal script could reach on this machine.
              ``--guided`` adds guided decoding as vLLM >= 0.12 reads it (``structured_outputs``).

Run by the harness as ``python -m bench.floor MODE --result FILE [--server URL] [--model NAME] [--guided] PDF...``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import MODEL, Row, subprocess_env
from bench.corpus import Corpus
from bench.measure import run_measured

PNG_COMPRESS_LEVEL = 1  # the engine's PageSettings default, so both encode the same way
TARGET_DIM = 1288


def render_loop(paths: list[str]) -> int:
    import pypdfium2

    from olmocr_tasks.page.render_worker import render_page_png_sync

    pages = 0
    for path in paths:
        pdf = pypdfium2.PdfDocument(path)
        try:
            for index in range(len(pdf)):
                png = render_page_png_sync(pdf, index, TARGET_DIM, PNG_COMPRESS_LEVEL)
                base64.b64encode(png)
                pages += 1
        finally:
            pdf.close()
    return pages


# ------------------------------------------------------------------------------ bare pipeline

_open: dict[str, Any] = {}


def _render_b64(path: str, index: int) -> bytes:
    import pypdfium2

    from olmocr_tasks.page.render_worker import render_page_png_sync

    pdf = _open.get(path)
    if pdf is None:
        for old in _open.values():
            old.close()
        _open.clear()
        pdf = _open[path] = pypdfium2.PdfDocument(path)
    return base64.b64encode(render_page_png_sync(pdf, index, TARGET_DIM, PNG_COMPRESS_LEVEL))


def _page_counts(paths: list[str]) -> list[int]:
    import pypdfium2

    counts = []
    for path in paths:
        pdf = pypdfium2.PdfDocument(path)
        counts.append(len(pdf))
        pdf.close()
    return counts


async def pipeline(paths: list[str], server: str, model: str = MODEL, guided: bool = False, in_flight: int = 64) -> int:
    import httpx

    from olmocr_tasks.page.protocol import OLMOCR_FRONT_MATTER_REGEX
    from olmocr_testkit.page_query import build_page_query

    constraint = {"structured_outputs": {"regex": OLMOCR_FRONT_MATTER_REGEX}} if guided else {}

    workers = len(os.sched_getaffinity(0))
    loop = asyncio.get_running_loop()
    renders = asyncio.Semaphore(2 * workers)  # keep every render process busy, no more
    requests = asyncio.Semaphore(in_flight)
    done = 0
    with ProcessPoolExecutor(workers) as pool:
        async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=in_flight)) as client:

            async def page(path: str, index: int) -> None:
                nonlocal done
                async with renders:
                    b64 = await loop.run_in_executor(pool, _render_b64, path, index)
                async with requests:
                    body = json.dumps(build_page_query(model, b64.decode("ascii"), 0.1) | constraint)
                    response = await client.post(
                        server + "/chat/completions", content=body, headers={"Content-Type": "application/json"}
                    )
                response.raise_for_status()
                content = response.json()["choices"][0]["message"]["content"]
                if content.startswith("---"):
                    done += 1

            async with asyncio.TaskGroup() as group:
                for path, count in zip(paths, _page_counts(paths), strict=True):
                    for index in range(count):
                        group.create_task(page(path, index))
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor")
    parser.add_argument("mode", choices=["render", "pipeline"])
    parser.add_argument("--result", required=True)
    parser.add_argument("--server")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--guided", action="store_true")
    parser.add_argument("paths", nargs="+")
    args = parser.parse_args(argv)
    # Imports are paid before the clock starts (the harness's process measurement still counts them).
    import pypdfium2  # noqa: F401

    import olmocr_tasks.page.render_pool  # noqa: F401

    cpu, wall = time.process_time(), time.perf_counter()
    if args.mode == "render":
        pages = render_loop(args.paths)
    else:
        pages = asyncio.run(pipeline(args.paths, args.server, args.model, args.guided))
    # The loop's own cost, without interpreter start-up and imports (process CPU only: the
    # pipeline's workers are counted by the harness, not here).
    result = {"pages": pages, "loop_cpu_s": time.process_time() - cpu, "loop_wall_s": time.perf_counter() - wall}
    Path(args.result).write_text(json.dumps(result))
    return 0


# ---------------------------------------------------------------------------- harness side


def measure_floor(
    mode: str,
    corpus: Corpus,
    work: Path,
    regime: str,
    server: str | None = None,
    *,
    model: str = MODEL,
    guided: bool = False,
) -> Row:
    result_path = work / f"floor-{mode}-{regime}.json"
    result_path.unlink(missing_ok=True)
    command = [sys.executable, "-m", "bench.floor", mode, "--result", str(result_path)]
    if server:
        command += ["--server", server, "--model", model, *(["--guided"] if guided else [])]
    command += [str(path) for path in corpus.paths()]
    system = "floor: render+encode loop" if mode == "render" else "floor: pypdfium2+httpx pipeline"
    measurement = run_measured(
        command, label=f"{system} / {regime}", env=subprocess_env(), log_path=work / f"floor-{mode}-{regime}.log"
    )
    details: dict[str, Any] = {}
    ok = measurement.returncode == 0 and result_path.exists()
    if ok:
        details = json.loads(result_path.read_text())
        ok = details["pages"] == corpus.pages
    note = "" if ok else f"see floor-{mode}-{regime}.log"
    return Row(system, regime, corpus.pages, measurement, ok, note, details)


if __name__ == "__main__":
    sys.exit(main())
