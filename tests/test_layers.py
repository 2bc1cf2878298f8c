"""The layering rule (pyproject.toml's ``[tool.importlinter]``) holds.

No lower layer of ``olmocr_tasks`` imports a higher one, nothing outside ``olmocr_tasks.provider`` imports
Airflow, nothing in the package imports its test kit (``olmocr_tasks.testing``), and no two modules of
one package import each other, directly or round a loop. ``make lint`` runs
the same check.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from importlinter.cli import lint_imports

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_the_import_contracts_hold(capsys: pytest.CaptureFixture[str]) -> None:
    code = lint_imports(config_filename=str(PYPROJECT), no_cache=True, no_logo=True)
    assert code == 0, capsys.readouterr().out
