"""The compose stack's secrets, without Docker: init's refusals, the generator, what each container holds.

airflow-init and s3-users run ``docker/check-secrets.sh`` before anything else; here the same scripts
run with a POSIX shell against the values a user could leave in docker/.env. ``tests/compose`` runs
the stack itself with the generator's secrets.
"""

from __future__ import annotations

import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography.fernet import Fernet

from tests.docker.test_docker_files import _interpolate, _resolved

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
GENERATOR = ROOT / "scripts" / "docker-env.py"
HOW = "make docker-env"


def generate(env_file: Path) -> dict[str, str]:
    result = subprocess.run(
        [sys.executable, str(GENERATOR), "--env-file", str(env_file)], capture_output=True, text=True, check=True
    )
    values = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if line and line[0] != "#")
    assert not any(len(value) > 8 and value in result.stdout + result.stderr for value in values.values())
    return values


def init_checks() -> list[str]:
    """The arguments airflow-init.sh gives check-secrets.sh, read from the script itself."""
    text = (DOCKER / "airflow-init.sh").read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if "check-secrets.sh" in line)
    return shlex.split(line)[2:]


def run_script(script: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(DOCKER / script), *args],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def generated(tmp_path: Path) -> dict[str, str]:
    return generate(tmp_path / ".env")


def test_init_starts_with_generated_secrets(generated: dict[str, str]) -> None:
    checks = init_checks()
    assert {check.split(":")[0] for check in checks} >= {
        "AIRFLOW_JWT_SECRET",
        "AIRFLOW_ADMIN_PASSWORD",
        "AIRFLOW_FERNET_KEY",
        "REDIS_PASSWORD",
    }
    result = run_script("check-secrets.sh", generated, *checks)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("AIRFLOW_JWT_SECRET", "change-me-jwt-secret", "placeholder"),
        ("AIRFLOW_JWT_SECRET", "", "empty"),
        ("AIRFLOW_JWT_SECRET", "s3cr3t-but-only-20ch", "too short"),
        ("AIRFLOW_ADMIN_PASSWORD", "change-me-admin", "placeholder"),
        ("AIRFLOW_ADMIN_PASSWORD", "admin", "too short"),
        ("AIRFLOW_FERNET_KEY", "", "empty"),
        ("AIRFLOW_FERNET_KEY", "change-me-fernet-key", "placeholder"),
        ("AIRFLOW_FERNET_KEY", "not-a-fernet-key-but-long-enough-to-be-one-0", "not a Fernet key"),
        ("REDIS_PASSWORD", "change-me-redis", "placeholder"),
    ],
)
def test_init_refuses_an_empty_placeholder_or_weak_secret_and_says_how_to_make_one(
    generated: dict[str, str], name: str, value: str, problem: str
) -> None:
    result = run_script("check-secrets.sh", {**generated, name: value}, *init_checks())
    assert result.returncode == 1
    assert f"{name} " in result.stderr and problem in result.stderr, result.stderr
    assert HOW in result.stderr  # the sentence that says how to make one
    assert not value or value not in result.stderr  # never echoed
    # Only the bad one is named.
    named = set(re.findall(r"refusing to start: (\w+)", result.stderr))
    assert named == {name}


def test_the_examples_placeholders_are_each_refused(tmp_path: Path) -> None:
    example = dict(
        line.split("=", 1)
        for line in (DOCKER / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    result = run_script("check-secrets.sh", example, *init_checks())
    named = set(re.findall(r"refusing to start: (\w+)", result.stderr))
    assert result.returncode == 1
    assert named == {check.split(":")[0] for check in init_checks()}


def test_s3_users_refuses_minios_placeholder_root_password_and_handing_airflow_the_root_account(
    generated: dict[str, str],
) -> None:
    placeholder = run_script("s3-users.sh", {**generated, "MINIO_ROOT_PASSWORD": "change-me-minio"})
    assert placeholder.returncode == 1 and "MINIO_ROOT_PASSWORD" in placeholder.stderr
    assert HOW in placeholder.stderr
    root = run_script("s3-users.sh", {**generated, "OLMOCR_S3_ACCESS_KEY_ID": generated["MINIO_ROOT_USER"]})
    assert root.returncode == 1 and "root user" in root.stderr, root.stderr


def test_generator_fills_placeholders_keeps_set_values_and_writes_owner_only(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("# mine\nAIRFLOW_ADMIN_PASSWORD=my-own-long-password\nREDIS_PASSWORD=change-me-redis\n")
    first = generate(env_file)
    assert first["AIRFLOW_ADMIN_PASSWORD"] == "my-own-long-password"
    assert "# mine" in env_file.read_text()
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    placeholders = {
        key for key, value in generate(tmp_path / "fresh.env").items() if key in first and value.startswith("change-me")
    }
    assert not placeholders
    for key, value in first.items():
        assert not value.startswith(("change-me", "-")), key
    Fernet(first["AIRFLOW_FERNET_KEY"].encode())  # a key cryptography accepts
    assert len(first["AIRFLOW_JWT_SECRET"]) >= 32 and len(first["REDIS_PASSWORD"]) >= 16
    # Run again: nothing changes.
    assert generate(env_file) == first
    # Two stacks never share a secret.
    other = generate(tmp_path / "other.env")
    assert first["AIRFLOW_JWT_SECRET"] != other["AIRFLOW_JWT_SECRET"]


def test_docker_env_is_ignored_by_git() -> None:
    result = subprocess.run(["git", "check-ignore", "--quiet", "docker/.env"], cwd=ROOT, check=False)
    assert result.returncode == 0


def test_only_minio_and_s3_users_are_given_the_root_account_and_redis_needs_a_password(
    generated: dict[str, str],
) -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = _resolved(compose["services"], generated)
    root_password = generated["MINIO_ROOT_PASSWORD"]
    holders = {name for name, service in services.items() if root_password in str(service)}
    assert holders == {"minio", "s3-users"}
    worker = services["airflow-worker"]["environment"]
    assert worker["AWS_SECRET_ACCESS_KEY"] == generated["OLMOCR_S3_SECRET_ACCESS_KEY"]
    assert f":{generated['REDIS_PASSWORD']}@redis:" in worker["AIRFLOW__CELERY__BROKER_URL"]
    assert worker["AIRFLOW__CORE__FERNET_KEY"] == generated["AIRFLOW_FERNET_KEY"]
    redis = services["redis"]
    assert generated["REDIS_PASSWORD"] not in " ".join(redis["command"][:2] + redis["command"][2].split("|")[1:])
    assert "requirepass" in redis["command"][2] and "PONG" in " ".join(redis["healthcheck"]["test"])
    with pytest.raises(AssertionError, match="AIRFLOW_FERNET_KEY"):
        _interpolate(compose["x-airflow-common"]["environment"]["AIRFLOW__CORE__FERNET_KEY"], {})


def test_no_secret_is_put_on_a_command_line() -> None:
    """ps shows every process's arguments to every user of the host: the admin password reaches
    `airflow users create` on stdin, MinIO's root account reaches mc through MC_HOST_*."""
    init = (DOCKER / "airflow-init.sh").read_text()
    assert not any("--password" in line for line in init.splitlines() if not line.lstrip().startswith("#"))
    assert re.search(r"printf '%s\\n%s\\n' \"\$\{AIRFLOW_ADMIN_PASSWORD[^\n]*\|\s*\n\s*airflow users create", init)
    users = (DOCKER / "s3-users.sh").read_text()
    # Each mc invocation (what follows a pipe into it is its command line; printf before it is a builtin).
    mc_commands = [
        segment
        for line in users.splitlines()
        if not line.lstrip().startswith("#")
        for segment in line.split("|")
        if re.match(r"\s*(if !\s*)?mc\b", segment)
    ]
    assert len(mc_commands) == 5, mc_commands
    assert not any("SECRET" in command or "PASSWORD" in command for command in mc_commands), mc_commands
    assert 'printf \'%s\\n%s\\n\' "$user" "$OLMOCR_S3_SECRET_ACCESS_KEY" | mc admin user add store' in users
    compose = (DOCKER / "compose.yaml").read_text()
    assert "mc alias set" not in compose
