"""Static checks of the compose deployment (no Docker engine is needed or used)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from olmocr_tasks.config import DEFAULT_MODEL
from olmocr_tasks.cpu_engine import CPU_ENGINE_MODEL
from olmocr_tasks.vllm_launcher import LIMIT_MM_PER_PROMPT

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
COMPOSE_FILE = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"
ENV_EXAMPLE = DOCKER / ".env.example"

REQUIRED_SERVICES = {
    "postgres",
    "redis",
    "airflow-init",
    "airflow-apiserver",
    "airflow-scheduler",
    "airflow-dag-processor",
    "airflow-triggerer",
    "airflow-worker",
    "minio",
    "minio-init",
    "vllm",
}
ONE_SHOT = {"airflow-init", "minio-init"}

# ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, ${VAR?err}, ${VAR:+alt}; $$ is a literal $.
_INTERPOLATION = re.compile(
    r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>(?:[^{}]|\{[^{}]*\})*))?\}"
    r"|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)"
)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict[str, dict[str, Any]]:
    return compose["services"]


@pytest.fixture(scope="module")
def env_example() -> dict[str, str]:
    values: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"not KEY=VALUE: {line!r}"
            values[key.strip()] = value.strip()
    return values


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, Mapping):
        for key, value in node.items():
            yield from _strings(key)
            yield from _strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item)


def _variables_without_default(text: str) -> set[str]:
    required: set[str] = set()
    for match in _INTERPOLATION.finditer(text):
        if match.group(0) == "$$":
            continue
        name = match.group("name") or match.group("bare")
        op = match.group("op")
        if op is None or op.endswith("?"):
            required.add(name)
        if match.group("arg"):
            required |= _variables_without_default(match.group("arg"))
    return required


def _interpolate(text: str, env: Mapping[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group("name") or match.group("bare")
        op = match.group("op") or ""
        value = env.get(name)
        if op in (":-", "-"):
            if value is None or (op == ":-" and value == ""):
                return _interpolate(match.group("arg") or "", env)
        elif op.endswith("?") and not value:
            raise AssertionError(f"{name} is required: {match.group('arg')}")
        return value or ""

    return _INTERPOLATION.sub(replace, text)


def _resolved(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return _interpolate(node, env)
    if isinstance(node, Mapping):
        return {key: _resolved(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [_resolved(item, env) for item in node]
    return node


def _dockerfile_stages() -> list[tuple[str, str | None]]:
    stages = []
    for line in DOCKERFILE.read_text().splitlines():
        match = re.match(r"^\s*FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", line, re.IGNORECASE)
        if match:
            stages.append((match.group(1), match.group(2)))
    return stages


# -- services and health ---------------------------------------------------------------------------


def test_required_services_exist(services):
    assert set(services) >= REQUIRED_SERVICES


def test_every_long_running_service_has_a_healthcheck(services):
    assert {name for name, svc in services.items() if svc.get("restart") == "no"} == ONE_SHOT
    for name, service in services.items():
        if name in ONE_SHOT:
            continue
        check = service.get("healthcheck")
        assert check and check.get("test") and not check.get("disable"), f"{name} has no healthcheck"
        assert check["test"] != ["NONE"], name


def test_airflow_healthchecks_are_the_documented_ones(services):
    assert "http://localhost:8080/api/v2/version" in services["airflow-apiserver"]["healthcheck"]["test"]
    assert "http://localhost:8974/health" in services["airflow-scheduler"]["healthcheck"]["test"]
    assert "DagProcessorJob" in " ".join(services["airflow-dag-processor"]["healthcheck"]["test"])
    assert "TriggererJob" in " ".join(services["airflow-triggerer"]["healthcheck"]["test"])
    assert "inspect ping" in " ".join(services["airflow-worker"]["healthcheck"]["test"])
    environment = services["airflow-scheduler"]["environment"]
    assert environment["AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK"] == "true"
    assert environment["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"


def test_airflow_components_wait_for_init_and_the_worker_for_the_bucket(services):
    for name in ("airflow-apiserver", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"):
        assert services[name]["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"
    worker = services["airflow-worker"]["depends_on"]
    assert worker["minio-init"]["condition"] == "service_completed_successfully"
    assert services["minio-init"]["depends_on"]["minio"]["condition"] == "service_healthy"


def test_vllm_service_serves_olmocr_on_a_gpu(services, env_example):
    vllm = _resolved(services["vllm"], env_example)
    assert vllm["image"].startswith("vllm/vllm-openai:")
    assert not vllm["image"].endswith(":latest")
    command = [str(part) for part in vllm["command"]]
    assert command[0] == DEFAULT_MODEL
    assert command[command.index("--served-model-name") + 1] == DEFAULT_MODEL
    assert command[command.index("--max-model-len") + 1] == "16384"
    limit = command[command.index("--limit-mm-per-prompt") + 1]
    assert json.loads(limit) == {"video": 0, "image": 1}
    assert limit == LIMIT_MM_PER_PROMPT  # same arguments as serve-vllm
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert any(device["driver"] == "nvidia" and "gpu" in device["capabilities"] for device in devices)
    test = " ".join(vllm["healthcheck"]["test"])
    assert "/health" in test or "/v1/models" in test
    assert any(str(volume).endswith(":/root/.cache/huggingface") for volume in vllm["volumes"])
    assert "hf-cache" in yaml.safe_load(COMPOSE_FILE.read_text())["volumes"]


def test_airflow_services_use_the_built_image(services):
    airflow = {name: svc for name, svc in services.items() if name.startswith("airflow-")}
    assert set(airflow) >= {name for name in REQUIRED_SERVICES if name.startswith("airflow-")}
    images = {svc["image"] for svc in airflow.values()}
    assert len(images) == 1
    for name, service in airflow.items():
        build = service["build"]
        assert (DOCKER / build["context"]).resolve() == ROOT, name
        assert build["dockerfile"] == "docker/Dockerfile", name
        assert build["target"] == "airflow", name


def test_database_urls_name_their_driver(services):
    """The metadata DB and Celery's result backend say psycopg2, as the deployment tests run them."""
    env = services["airflow-scheduler"]["environment"]
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
    assert env["AIRFLOW__CELERY__RESULT_BACKEND"].startswith("db+postgresql+psycopg2://")
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"


def test_published_ports_bind_loopback(services):
    for name, service in services.items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"


# -- referenced files ------------------------------------------------------------------------------


def test_every_referenced_local_path_exists(services):
    for name, service in services.items():
        build = service.get("build")
        if build is not None:
            context = DOCKER / (build if isinstance(build, str) else build.get("context", "."))
            assert context.is_dir(), f"{name}: build context {context} is missing"
            if isinstance(build, Mapping) and "dockerfile" in build:
                assert (context / build["dockerfile"]).is_file(), f"{name}: {build['dockerfile']} is missing"
        for volume in service.get("volumes", []):
            source = volume.get("source") if isinstance(volume, Mapping) else str(volume).split(":", 1)[0]
            if source and source.startswith((".", "/")):
                assert (DOCKER / source).exists(), f"{name}: mounted {source} is missing"
        env_files = service.get("env_file", [])
        for entry in [env_files] if isinstance(env_files, str | Mapping) else env_files:
            path = entry["path"] if isinstance(entry, Mapping) else entry
            required = entry.get("required", True) if isinstance(entry, Mapping) else True
            assert not required or (DOCKER / path).is_file(), f"{name}: env file {path} is missing"


def test_dockerfile_copy_sources_exist():
    for line in DOCKERFILE.read_text().splitlines():
        match = re.match(r"^\s*(?:COPY|ADD)\s+(.*)$", line)
        if not match or "--from=" in line:
            continue
        parts = [part for part in match.group(1).split() if not part.startswith("--")]
        for source in parts[:-1]:
            if any(char in source for char in "*?["):
                continue  # optional globs (README.md*) may match nothing
            assert (ROOT / source).exists(), f"Dockerfile copies missing {source}"


def test_dockerfile_builds_on_airflow_3_3_2():
    stages = _dockerfile_stages()
    images = [image for image, _ in stages]
    airflow = [image for image, name in stages if name == "airflow"]
    assert airflow and re.fullmatch(r"apache/airflow:3\.3\.2(-python3\.\d+)?", airflow[0])
    # The airflow stage is the last one, so a plain `docker build` produces the Airflow image.
    assert stages[-1][1] == "airflow"
    for image in images:
        assert ":" in image and not image.endswith(":latest"), f"unpinned base image {image}"
    text = DOCKERFILE.read_text()
    assert re.search(r"\[airflow,deploy,s3\]", text), "the image installs the package with its Celery pins"
    assert re.search(r"COPY .*\bdags\b\s+/opt/airflow/dags", text)
    assert re.search(r"COPY .*\bplugins\b\s+/opt/airflow/plugins", text)


def test_build_context_ignores_local_state():
    ignored = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert {".venv", ".git", "docker/.env"} <= set(ignored)


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_init_scripts_parse_and_create_the_pool():
    for script in ("airflow-init.sh", "minio-init.sh"):
        result = subprocess.run(["bash", "-n", str(DOCKER / script)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
    init = (DOCKER / "airflow-init.sh").read_text()
    assert "airflow db migrate" in init
    assert "airflow users create" in init
    assert re.search(r"airflow pools set olmocr_vllm \"\$\{slots\}\"", init)
    assert "OLMOCR_VLLM_POOL_SLOTS" in init
    assert 'mc mb --ignore-existing "local/${OLMOCR_BUCKET}"' in (DOCKER / "minio-init.sh").read_text()


# -- environment -----------------------------------------------------------------------------------


def test_env_example_defines_every_variable_without_default(compose, env_example):
    required = set()
    for text in _strings(compose):
        required |= _variables_without_default(text)
    assert required, "the compose file takes its secrets from the environment"
    missing = sorted(required - set(env_example))
    assert not missing, f".env.example lacks {missing}"


def test_env_example_has_placeholders_not_secrets(env_example):
    for key, value in env_example.items():
        if any(word in key for word in ("PASSWORD", "SECRET", "TOKEN")):
            assert value.startswith("change-me"), f"{key} should be a change-me placeholder"


def test_connections_resolve_to_valid_json(services, env_example):
    environment = _resolved(services["airflow-worker"]["environment"], env_example)
    vllm = json.loads(environment["AIRFLOW_CONN_OLMOCR_VLLM"])
    assert vllm["conn_type"] == "olmocr_vllm"
    assert vllm["host"] == "vllm" and vllm["port"] == 8000 and vllm["schema"] == "http"
    assert vllm["extra"]["model"] == DEFAULT_MODEL
    aws = json.loads(environment["AIRFLOW_CONN_AWS_DEFAULT"])
    assert aws["conn_type"] == "aws"
    assert aws["extra"]["endpoint_url"] == "http://minio:9000"
    assert aws["login"] == env_example["MINIO_ROOT_USER"]
    for key in ("OLMOCR_INPUT_URI", "OLMOCR_OUTPUT_URI", "OLMOCR_SQS_QUEUE_URL"):
        assert key in environment
    assert environment["OLMOCR_INPUT_URI"].startswith("s3://")
    # The CPU-engine profile changes the host and the model, to the only name the engine answers to.
    cpu_env = {**env_example, "OLMOCR_VLLM_HOST": "cpu-engine", "OLMOCR_MODEL": CPU_ENGINE_MODEL}
    cpu = json.loads(_resolved(services["airflow-worker"]["environment"], cpu_env)["AIRFLOW_CONN_OLMOCR_VLLM"])
    assert (cpu["host"], cpu["extra"]["model"]) == ("cpu-engine", CPU_ENGINE_MODEL)
    # The engine keeps its own name whatever OLMOCR_MODEL says (no --served-model-name override).
    engine = _resolved(services["cpu-engine"], cpu_env)
    assert "--served-model-name" not in [str(part) for part in engine.get("command") or []]
    assert "OLMOCR_MODEL=olmocr-cpu-tesseract" in ENV_EXAMPLE.read_text()
    assert f"OLMOCR_MODEL={CPU_ENGINE_MODEL}" in (DOCKER / "README.md").read_text()


def test_interpolation_helper_understands_compose_syntax():
    env = {"A": "1", "EMPTY": ""}
    assert _interpolate("${A}-${B:-x}-${EMPTY:-y}-${EMPTY-z}-$${A}", env) == "1-x-y--${A}"
    assert _interpolate("${B:-${A}}", env) == "1"
    assert _variables_without_default("${A:?set} ${B:-${C}} ${D-d} $${E} $F") == {"A", "C", "F"}
