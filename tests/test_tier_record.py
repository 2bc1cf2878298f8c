"""The check make test runs after the suite: a solo tier in one process, its deployment started once.

The checker on hand-written records, then ``scripts/run-tests.sh`` itself on a tiny suite with the real
tier hooks of ``tests/conftest.py``: a run whose record cannot vouch for its tiers must fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from olmocr_testkit import REPO_ROOT, tier_record


def _write(path: Path, entries: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(entry) + "\n" for entry in entries))


def _check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "olmocr_testkit.tier_record", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_one_process_and_one_start_pass(tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    _write(
        record,
        [
            {"kind": "start", "tier": "deployment", "pid": 11},
            {"kind": "test", "tier": "deployment", "pid": 11, "test": "a"},
            {"kind": "test", "tier": "deployment", "pid": 11, "test": "b"},
        ],
    )
    result = _check(record)
    assert result.returncode == 0, result.stderr
    assert "deployment: 2 tests in process 11, deployment started 1x" in result.stdout


def test_tests_in_two_processes_fail(tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    _write(
        record,
        [
            {"kind": "test", "tier": "deployment", "pid": 11, "test": "a"},
            {"kind": "test", "tier": "deployment", "pid": 12, "test": "b"},
        ],
    )
    result = _check(record)
    assert result.returncode == 1
    assert "the deployment tier ran in 2 processes ([11, 12]), not one" in result.stderr


def test_two_starts_in_one_process_fail(tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    _write(record, [{"kind": "start", "tier": "deployment", "pid": 11}] * 2)
    result = _check(record)
    assert result.returncode == 1
    assert "the deployment tier started its deployment 2 times, not once" in result.stderr


def test_record_appends_this_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv(tier_record.RECORD_ENV, str(record))
    tier_record.record(tier_record.START, "deployment", session="s")
    tier_record.record(tier_record.TEST, "deployment", test="t")
    entries = tier_record.read(record)
    assert [(entry["kind"], entry["pid"]) for entry in entries] == [("start", os.getpid()), ("test", os.getpid())]


def test_nothing_recorded_without_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tier_record.RECORD_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    tier_record.record(tier_record.START, "deployment")
    assert list(tmp_path.iterdir()) == []


def test_an_empty_record_fails_for_a_tier_that_passed(tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    record.write_text("")
    result = _check_with(record, "--ran", "deployment")
    assert result.returncode == 1
    assert "the deployment tier passed but recorded no test" in result.stderr


def _check_with(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "olmocr_testkit.tier_record", str(path), *args],
        capture_output=True,
        text=True,
        check=False,
    )


# -- scripts/run-tests.sh end to end, on a suite of a few trivial tests -------------------------------------

# The recording line of tests/conftest.py, removed by one case: the script must notice.
RECORDING = "tier_record.record(tier_record.TEST, marker, test=item.nodeid)"
PYTEST_INI = """[pytest]
markers =
    deployment: the fake solo tier
    compose: the fake later tier
addopts = -p no:cacheprovider
"""
# A tier's shared deployment, started by a module fixture as tests/deployment's is; FAKE_STARTS says how
# often (the later tier's starts once at most).
SOLO_TESTS = """import os
import pytest
from olmocr_testkit import tier_record

pytestmark = pytest.mark.deployment


@pytest.fixture(scope="module")
def deployment():
    for _ in range(int(os.environ.get("FAKE_STARTS", "1"))):
        tier_record.record(tier_record.START, "deployment")


def test_one(deployment):
    assert deployment is None


def test_two(deployment):
    assert deployment is None
"""
LATER_TESTS = """import os
import pytest
from olmocr_testkit import tier_record

pytestmark = pytest.mark.compose


@pytest.fixture(scope="module")
def stack():
    for _ in range(min(1, int(os.environ.get("FAKE_STARTS", "1")))):
        tier_record.record(tier_record.START, "compose")


def test_stack(stack):
    assert stack is None
"""
REST_TESTS = """def test_rest():
    assert 1 + 1 == 2
"""


def _fake_suite(tmp_path: Path, *, conftest: str, solo: bool = True) -> Path:
    """A project holding the real scripts/run-tests.sh, this checkout's virtualenv and tests/conftest.py's
    tier hooks (``conftest``: its text, maybe changed), with a solo tier, a later tier and one other test."""
    root = tmp_path / "suite"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "scripts" / "run-tests.sh", root / "scripts" / "run-tests.sh")
    (root / ".venv").symlink_to(Path(sys.executable).parent.parent, target_is_directory=True)
    (root / "pytest.ini").write_text(PYTEST_INI)
    (root / "conftest.py").write_text(conftest)
    if solo:
        (root / "test_solo.py").write_text(SOLO_TESTS)
    (root / "test_later.py").write_text(LATER_TESTS)
    (root / "test_rest.py").write_text(REST_TESTS)
    return root


def _tier_hooks(*, record_tests: bool = True) -> str:
    """tests/conftest.py without its fixture plugins (its tier hooks only); without the recording if asked."""
    text = (REPO_ROOT / "tests" / "conftest.py").read_text()
    text, plugins = re.subn(r"pytest_plugins = \[[^\]]*\]\n", "", text)
    assert plugins == 1, "tests/conftest.py changed shape: update this test"
    if not record_tests:
        assert text.count(RECORDING) == 1, "tests/conftest.py changed shape: update this test"
        text = text.replace(RECORDING, "pass")
    return text


def _run_tests(root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST_", "OLMOCR_"))}
    environment |= {"SOLO_TIERS": "deployment", "LATER_TIERS": "compose", "TEST_WORKERS": "0", **env}
    return subprocess.run(
        ["scripts/run-tests.sh"], cwd=root, env=environment, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.mark.slow
def test_run_tests_passes_a_whole_suite_whose_tiers_recorded_their_tests_and_one_start(tmp_path: Path) -> None:
    result = _run_tests(_fake_suite(tmp_path, conftest=_tier_hooks()))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "compose: 1 tests in process" in result.stdout and "deployment: 2 tests in process" in result.stdout
    assert "deployment started 1x" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("recording removed", "the compose tier passed but recorded no test"),
        ("empty record", "the deployment tier passed but recorded no test"),
        ("a tier selects nothing", "the deployment tier selected no test"),
        ("a second deployment start", "the deployment tier started its deployment 2 times, not once"),
        ("no deployment start", "the deployment tier passed but recorded no start of its deployment"),
    ],
)
def test_run_tests_fails_a_suite_whose_record_cannot_vouch_for_its_tiers(
    tmp_path: Path, case: str, expected: str
) -> None:
    conftest, env, solo = _tier_hooks(), {}, True
    if case == "recording removed":
        conftest = _tier_hooks(record_tests=False)
    elif case == "empty record":
        # Nothing recorded at all: no test line, and the (fake) deployment records no start either.
        conftest, env = _tier_hooks(record_tests=False), {"FAKE_STARTS": "0"}
    elif case == "a tier selects nothing":
        solo = False
    elif case == "a second deployment start":
        env = {"FAKE_STARTS": "2"}
    else:
        env = {"FAKE_STARTS": "0"}
    root = _fake_suite(tmp_path, conftest=conftest, solo=solo)
    result = _run_tests(root, **env)
    assert result.returncode != 0, result.stdout + result.stderr
    assert expected in result.stderr, result.stdout + result.stderr
    if case == "empty record":
        assert (root / "test-output" / "tiers" / "record.jsonl").read_text() == ""
