"""What every benchmark script shares: paths, stand-in regimes and the shape of a result row."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.measure import Measurement

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "bench" / "results"
# Raw results kept with the code (bench/results/ is git-ignored scratch): every figure quoted in a README
# names one of these files.
RECORDS_DIR = REPO_ROOT / "bench" / "records"
# The interpreter running the harness is the project's venv; its console scripts sit beside it.
VENV_BIN = Path(sys.executable).parent
MODEL = "allenai/olmOCR-2-7B-1025-FP8"


@dataclass(frozen=True)
class Regime:
    """A stand-in configuration. ``capacity / latency_s`` is the most pages/s the server can give."""

    name: str
    capacity: int
    latency_s: float
    description: str

    @property
    def server_pages_per_s(self) -> float:
        return self.capacity / self.latency_s

    def settings(self) -> dict[str, Any]:
        # identify=False: the stand-in does not decode the PNG, so its CPU stays small and equal for
        # every system; it still answers with olmOCR's front matter.
        return {"capacity": self.capacity, "latency_s": self.latency_s, "identify": False, "model": MODEL}


SERVER_BOUND = Regime("server-bound", 16, 1.0, "16 concurrent x 1.0 s = 16 pages/s")
BACKPRESSURE = Regime("shared-server", 8, 0.5, "8 concurrent x 0.5 s = 16 pages/s")
CPU_BOUND = Regime("cpu-bound", 512, 0.01, "512 concurrent x 0.01 s: rendering is the bottleneck")


@dataclass
class Row:
    """One system in one regime."""

    system: str
    regime: str
    pages: int
    measurement: Measurement | None
    ok: bool
    note: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def pages_per_s(self) -> float | None:
        if not self.ok or self.measurement is None or not self.pages:
            return None
        return self.pages / self.measurement.wall_s

    @property
    def cpu_ms_per_page(self) -> float | None:
        if not self.ok or self.measurement is None or not self.pages:
            return None
        return 1000 * self.measurement.cpu_s / self.pages

    @property
    def peak_rss_mib(self) -> float | None:
        """The largest sampled sum of RSS over the process tree."""
        if self.measurement is None:
            return None
        return self.measurement.peak_rss_bytes / 2**20

    @property
    def max_rss_mib(self) -> float | None:
        """The kernel's exact peak of the tree's largest process (``ru_maxrss``)."""
        if self.measurement is None:
            return None
        return self.measurement.max_rss_bytes / 2**20

    def to_dict(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "regime": self.regime,
            "pages": self.pages,
            "ok": self.ok,
            "note": self.note,
            "pages_per_s": _round(self.pages_per_s),
            "cpu_ms_per_page": _round(self.cpu_ms_per_page),
            "peak_rss_mib": _round(self.peak_rss_mib),
            "max_rss_mib": _round(self.max_rss_mib),
            "measurement": self.measurement.to_dict() if self.measurement else None,
            "details": self.details,
        }


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


# Bytecode caches for every measured interpreter, kept out of the source tree and the venvs. A shell
# that sets PYTHONDONTWRITEBYTECODE would otherwise make every run compile all it imports from source
# (seconds for the CLI, tens of seconds for Airflow), which no deployment pays.
PYCACHE_DIR = RESULTS_DIR / "pycache"


def bytecode_env(env: dict[str, str]) -> dict[str, str]:
    env = {key: value for key, value in env.items() if key != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE_DIR)
    return env


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment of measured commands: this checkout importable, no stray Airflow or AWS setup."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AIRFLOW", "OLMOCR_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env.update(extra)
    return bytecode_env(env)


def fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


@contextmanager
def standin(regime: Regime, **overrides: Any) -> Iterator[Any]:
    """The vLLM stand-in as a separate process (its CPU is not ours), stopped on exit."""
    from olmocr_testkit.standin.process import start_standin_process

    process = start_standin_process(**(regime.settings() | overrides))
    try:
        yield process
    finally:
        process.stop()


class MotoBucket:
    """A moto S3 server in this (harness) process with one bucket. Objects the bench sets up go through
    moto's in-process backend (far faster than PUTs over HTTP); what is measured goes over HTTP."""

    REGION = "us-east-1"
    KEY, SECRET = "bench-access-key", "bench-secret-key"

    def __init__(self, name: str) -> None:
        import logging

        import boto3
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.name = name
        # The environment of a measured command that reads and writes this bucket (the AWS SDK's own).
        self.env = subprocess_env(
            AWS_ACCESS_KEY_ID=self.KEY,
            AWS_SECRET_ACCESS_KEY=self.SECRET,
            AWS_DEFAULT_REGION=self.REGION,
            AWS_ENDPOINT_URL=self.endpoint,
            AWS_EC2_METADATA_DISABLED="true",
        )
        boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=self.REGION,
            aws_access_key_id=self.KEY, aws_secret_access_key=self.SECRET,
        ).create_bucket(Bucket=name)  # fmt: skip
        self.backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]

    def put(self, key: str, body: bytes) -> None:
        self.backend.put_object(self.name, key, body)

    def get(self, key: str) -> bytes | None:
        stored = self.backend.get_object(self.name, key)  # None when there is no such object
        return None if stored is None else stored.value

    def stop(self) -> None:
        self.server.stop()


def run_to_manifest(api: Any, dag_id: str, conf: dict[str, Any], output: Path, poll_s: float = 0.5) -> dict[str, Any]:
    """Trigger ``dag_id`` with ``conf`` over REST and time it until its manifest exists under ``output``
    (or the run failed); then wait for the run to end. Returns the run, the wall seconds and the
    manifest's summary (None when none was published)."""
    import time

    from olmocr_tasks.location.manifest import manifest_uri
    from olmocr_tasks.location.manifest_reader import open_manifest

    started = time.monotonic()
    response = api.trigger(dag_id, conf)
    response.raise_for_status()
    run_id = response.json()["dag_run_id"]
    manifest_path = Path(manifest_uri(str(output), f"{dag_id}__{run_id}"))
    while not manifest_path.exists():
        if api.dag_run(dag_id, run_id)["state"] == "failed":
            break
        time.sleep(poll_s)
    wall = time.monotonic() - started
    run = api.wait_for_run(dag_id, run_id, timeout=1800)
    summary = open_manifest(str(manifest_path)).summary if manifest_path.exists() else None
    return {"run_id": run_id, "run": run, "wall_s": wall, "manifest": summary}


def code_version() -> dict[str, Any]:
    """The commit a record measured, and the tracked files that differed from it while it ran."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True).stdout.rstrip("\n")

    dirty = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines()]
    return {"commit": git("rev-parse", "--short", "HEAD"), "modified_tracked_files": dirty}
