"""Our CLI, ``olmocr-tasks convert``, as a measured subprocess (render workers included in its tree)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.common import MODEL, VENV_BIN, Row, fresh_dir, subprocess_env
from bench.corpus import Corpus
from bench.measure import run_measured
from olmocr_tasks.location.layout import OutputLocation
from olmocr_tasks.location.manifest_reader import open_manifest


def read_manifest(output: Path) -> dict[str, Any] | None:
    """The run manifest under ``output/manifests/`` (one run per output folder here)."""
    manifests = Path(OutputLocation(str(output)).manifests_uri)
    found = sorted(manifests.glob("*.json")) if manifests.is_dir() else []
    return open_manifest(str(found[-1])).summary if found else None


def manifest_check(manifest: dict[str, Any] | None, corpus: Corpus) -> tuple[bool, str, dict[str, Any]]:
    """Did the run convert every page of the corpus, with no fallback page?"""
    if manifest is None:
        return False, "no manifest", {}
    counts, metrics = manifest["counts"], manifest["metrics"]
    details = {"counts": counts, "in_run_pages_per_s": metrics.get("pages_per_second")}
    if counts["pages"] != corpus.pages or counts["failed"] or counts["fallback_pages"]:
        return False, f"converted {counts['pages']}/{corpus.pages} pages, {counts['failed']} failed", details
    return True, "", details


def measure_cli(
    corpus: Corpus,
    server: str,
    work: Path,
    regime: str,
    *,
    system: str = "ours: CLI",
    extra_args: list[str] | None = None,
    model: str = MODEL,
) -> Row:
    slug = f"cli-{regime}-{corpus.folder.name}"
    output = fresh_dir(work / slug)
    command = [
        str(VENV_BIN / "olmocr-tasks"), "--log-level", "WARNING", "convert", str(corpus.folder), str(output),
        "--server", server, "--model", model, "--run-id", slug, *(extra_args or []),
    ]  # fmt: skip
    log = work / f"{slug}.log"
    measurement = run_measured(command, label=f"{system} / {regime}", env=subprocess_env(), log_path=log)
    ok, note, details = manifest_check(read_manifest(output), corpus)
    if measurement.returncode != 0:
        ok, note = False, f"exit {measurement.returncode}; see {slug}.log"
    return Row(system, regime, corpus.pages, measurement, ok, note, details)
