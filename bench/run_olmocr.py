"""olmOCR 0.4.27's own pipeline against the same stand-in, installed into its own venv by this script.

``python -m olmocr.pipeline WORKSPACE --pdfs LIST.txt --server URL/v1 --model NAME --markdown``: with
``--server`` it needs neither a GPU nor torch (the 0.4.27 wheel's base dependencies are light), but it
checks for poppler's ``pdftoppm`` at start-up and renders every page with ``pdfinfo`` + ``pdftoppm``
subprocesses, so poppler-utils is installed with apt when missing. The stand-in answers with the same
YAML front matter a real olmOCR model produces, which olmOCR's parser accepts; the harness checks the
Dolma output so that a run that fell back to ``pdftotext`` for every page does not count.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import MODEL, RESULTS_DIR, VENV_BIN, Row, bytecode_env, fresh_dir
from bench.corpus import Corpus
from bench.measure import run_measured

OLMOCR_VERSION = "0.4.27"
# Its dependencies resolve as PyPI served them when Runs 1-2 of bench/README.md installed it, not as
# of today: the same versions on every machine without a lock of its own (uv's --exclude-newer).
OLMOCR_RESOLVED_AS_OF = "2026-11-30T12:49:00Z"
OLMOCR_VENV = RESULTS_DIR / "olmocr-venv"

# olmOCR renders at most max(1, cores - 2) pages at once unless BEAKER_ASSIGNED_CPU_COUNT says how many
# CPUs it has: on 2 cores that is one page at a time. Its own knob, so a fair comparison tries it.
RENDERS_PER_CORE = {"BEAKER_ASSIGNED_CPU_COUNT": str(len(os.sched_getaffinity(0)))}


@dataclass(frozen=True)
class OlmocrSetting:
    """Extra command-line flags and environment for one olmOCR run."""

    flags: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


# olmOCR's defaults (20 workers, 1600 requests); the flags its README gives for remote providers;
# each again with one render per core. The comparison takes the best of them.
SETTINGS: dict[str, OlmocrSetting] = {
    "default": OlmocrSetting(),
    "workers1-mcr20": OlmocrSetting(("--workers", "1", "--max_concurrent_requests", "20")),
    "renders-per-core": OlmocrSetting(env=RENDERS_PER_CORE),
    "workers1-mcr20-renders-per-core": OlmocrSetting(
        ("--workers", "1", "--max_concurrent_requests", "20"), env=RENDERS_PER_CORE
    ),
}


def olmocr_python() -> Path:
    return OLMOCR_VENV / "bin" / "python"


def ensure_olmocr(log: Path) -> str | None:
    """Install olmOCR and poppler-utils if needed; returns a reason when that is impossible."""
    with open(log, "a") as out:
        if shutil.which("pdftoppm") is None:
            apt = shutil.which("apt-get")
            if apt is None:
                return "pdftoppm (poppler-utils) is missing and apt-get is not available"
            subprocess.run([apt, "update", "-qq"], stdout=out, stderr=out, check=False)
            done = subprocess.run(
                [apt, "install", "-y", "-qq", "poppler-utils"],
                stdout=out,
                stderr=out,
                check=False,
                env={"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            )
            if done.returncode != 0 or shutil.which("pdftoppm") is None:
                return "could not install poppler-utils with apt-get (see the olmOCR log)"
        probe = [str(olmocr_python()), "-c", "import importlib.metadata as m; print(m.version('olmocr'))"]
        if olmocr_python().exists():
            found = subprocess.run(probe, capture_output=True, text=True, check=False)
            if found.stdout.strip() == OLMOCR_VERSION:
                return None
        # The venv is built from the harness's own interpreter (olmOCR needs Python >= 3.11, as we do).
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--clear", str(OLMOCR_VENV)], stdout=out, stderr=out, check=True)
        uv = VENV_BIN / "uv"
        if uv.exists():
            install = [str(uv), "pip", "install", "-p", str(olmocr_python()), f"olmocr=={OLMOCR_VERSION}"]
            install += ["--exclude-newer", OLMOCR_RESOLVED_AS_OF]
        else:
            return "uv is missing from the venv: run `make bench`, which installs it from the lock"
        done = subprocess.run(install, stdout=out, stderr=out, check=False)
        if done.returncode != 0:
            return f"installing olmocr=={OLMOCR_VERSION} failed (see the olmOCR log)"
        found = subprocess.run(probe, capture_output=True, text=True, check=False)
        if found.stdout.strip() != OLMOCR_VERSION:
            return f"olmocr {OLMOCR_VERSION} is not importable after installation"
    return None


def olmocr_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Its own venv only: none of our PYTHONPATH, no Beaker/AWS set-up that would change its path."""
    drop = ("PYTHONPATH", "AIRFLOW", "OLMOCR", "BEAKER", "VIRTUAL_ENV")
    env = {key: value for key, value in os.environ.items() if not key.startswith(drop)}
    env["PATH"] = os.pathsep.join([str(OLMOCR_VENV / "bin"), env.get("PATH", "")])
    env["HF_HUB_OFFLINE"] = "1"
    env.update(extra or {})
    return bytecode_env(env)


def read_results(workspace: Path) -> dict[str, Any]:
    """Pages written by olmOCR and how many of them were real model answers (not fallbacks)."""
    documents = pages = fallback = 0
    for path in (workspace / "results").glob("output_*.jsonl"):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            record = json.loads(line)
            documents += 1
            metadata = record.get("metadata", {})
            pages += int(metadata.get("pdf-total-pages", 0))
            fallback += int(metadata.get("total-fallback-pages", 0))
    return {"documents": documents, "pages": pages, "fallback_pages": fallback}


def measure_olmocr(
    corpus: Corpus,
    server: str,
    work: Path,
    regime: str,
    setting: str = "default",
    *,
    model: str = MODEL,
    extra_flags: tuple[str, ...] = (),
) -> Row:
    system = f"olmOCR {OLMOCR_VERSION} ({setting})"
    slug = f"olmocr-{setting}-{regime}"
    workspace = fresh_dir(work / slug)
    pdf_list = work / f"{slug}-pdfs.txt"
    pdf_list.write_text("".join(f"{path}\n" for path in corpus.paths()))
    command = [
        str(olmocr_python()), "-m", "olmocr.pipeline", str(workspace), "--pdfs", str(pdf_list),
        "--server", server, "--model", model, "--markdown", *SETTINGS[setting].flags, *extra_flags,
    ]  # fmt: skip
    env = olmocr_env(SETTINGS[setting].env)
    measurement = run_measured(command, label=f"{system} / {regime}", env=env, log_path=work / f"{slug}.log")
    found = read_results(workspace)
    ok = measurement.returncode == 0 and found["pages"] == corpus.pages and found["fallback_pages"] == 0
    note = "" if ok else f"exit {measurement.returncode}, {found}; see {slug}.log"
    found["flags"], found["env"] = [*SETTINGS[setting].flags, *extra_flags], SETTINGS[setting].env
    return Row(system, regime, corpus.pages, measurement, ok, note, found)
