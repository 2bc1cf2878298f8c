"""`make demo`: run the olmocr_ingest DAG end to end on examples/ with the local CPU OCR engine.

Embedded defaults: local folders, SQLite Airflow under .airflow/, Tesseract instead of a GPU.
A second run finds nothing new to convert.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_airflow import AIRFLOW_HOME, ROOT, airflow, airflow_env, prepare

from olmocr_tasks.location.manifest_reader import open_manifest
from olmocr_tasks.servers.cpu_engine import start_cpu_engine_in_thread

OUTPUT = ROOT / "demo-output"


def main() -> int:
    if shutil.which("tesseract") is None:
        print("error: the tesseract binary is missing; install it with: sudo apt-get install tesseract-ocr")
        return 1
    engine = start_cpu_engine_in_thread(host="127.0.0.1", port=0)
    try:
        # The connection names the model the engine serves: outputs are recorded under the model
        # that produced them, so a later olmOCR run on a GPU converts these documents again.
        print(f"local CPU OCR engine (Tesseract) serving {engine.served_model_name} at {engine.url}")
        env = airflow_env(vllm_url=engine.url, model=engine.served_model_name)
        print(f"embedded Airflow (SQLite) in {AIRFLOW_HOME.relative_to(ROOT)}/ ...")
        prepare(env)
        conf = {"input_uri": str(ROOT / "examples"), "output_uri": str(OUTPUT), "scope": "all"}
        print(f"running DAG olmocr_ingest on {conf['input_uri']} ...")
        started = time.monotonic()
        log_path = AIRFLOW_HOME / "demo-last-run.log"
        result = airflow("dags", "test", "olmocr_ingest", "-c", json.dumps(conf), env=env)
        log_path.write_text(result.stdout + result.stderr)
        print(f"DAG run finished in {time.monotonic() - started:.0f} s (log: {log_path.relative_to(ROOT)})")
    finally:
        engine.stop()
    return summarize()


def summarize() -> int:
    manifests = sorted((OUTPUT / "manifests").glob("*.json"), key=lambda path: path.stat().st_mtime)
    if not manifests:
        print("error: the run published no manifest")
        return 1
    reader = open_manifest(str(manifests[-1]))
    manifest = reader.summary
    counts, metrics = manifest["counts"], manifest["metrics"]
    print()
    print(f"run {manifest['run_id']}")
    print(
        f"  converted {counts['converted']}, failed {counts['failed']}, skipped {counts['skipped']}, "
        f"already converted {counts['already_converted']}; {counts['pages']} pages "
        f"({counts['fallback_pages']} fallback), {counts['output_tokens']} output tokens, "
        f"{metrics['pages_per_second']} pages/s"
    )
    for doc in reader.iter_documents():
        detail = doc.get("error") or f"{doc['pages']} pages"
        source = doc["source"].removeprefix(str(ROOT) + "/")
        print(f"  {doc['status']:<9} {source}: {detail}")
    if counts["documents"] == 0:
        print("  nothing new to convert: every sample PDF was already converted with this model and prompt")
    print()
    print(f"markdown:      {OUTPUT / 'markdown'}")
    print(f"Dolma records: {OUTPUT / 'dolma'}")
    print(f"manifest:      {manifests[-1]}")
    first_markdown = sorted((OUTPUT / "markdown").rglob("*.md"))
    if first_markdown:
        text = first_markdown[0].read_text()
        print(f"\n--- {first_markdown[0].relative_to(OUTPUT)} ---\n{text[:600]}")
    return 0 if counts["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
