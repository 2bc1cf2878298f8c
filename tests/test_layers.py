"""The layering rule (pyproject.toml's ``[tool.importlinter]``) holds.

No lower layer of ``olmocr_tasks`` imports a higher one, nothing outside ``olmocr_tasks.provider`` imports
Airflow, nothing in the package imports its test kit (``olmocr_testkit``), and no two modules of
one package import each other, directly or round a loop. ``make lint`` runs
the same check.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from importlinter.application import use_cases
from importlinter.configuration import configure

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_the_import_contracts_hold(capsys: pytest.CaptureFixture[str]) -> None:
    # The use case, not the CLI's ``lint_imports``: that one reconfigures logging for the whole process
    # (``dictConfig`` disables every logger that exists by then), which silences the records later
    # tests in this process assert on.
    configure()
    assert use_cases.lint_imports(config_filename=str(PYPROJECT), cache_dir=None, no_logo=True), capsys.readouterr().out
