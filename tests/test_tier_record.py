"""The check make test runs after the suite: a solo tier in one process, its deployment started once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from olmocr_tasks.testing import tier_record


def _write(path: Path, entries: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(entry) + "\n" for entry in entries))


def _check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "olmocr_tasks.testing.tier_record", str(path)],
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
