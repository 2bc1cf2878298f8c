"""The layering rule (pyproject.toml's ``[tool.importlinter]``) holds.

No lower layer of ``olmocr_tasks`` imports a higher one, nothing outside ``olmocr_tasks.provider`` imports
Airflow, nothing of the product (``olmocr_tasks``, ``dags/``, ``plugins/``) imports the test kit
(``olmocr_testkit``), ``dags/`` and ``plugins/`` import the engine only through ``olmocr_tasks.provider``
and ``olmocr_tasks.public``, and no two modules of one package import each other, directly or round a
loop. ``make lint`` runs the same check.
"""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import pytest
from importlinter.application import use_cases
from importlinter.configuration import configure

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
# What dags/ and plugins/ may import of the engine.
PUBLIC = {"olmocr_tasks.provider", "olmocr_tasks.public"}


def _lint(capsys: pytest.CaptureFixture[str]) -> tuple[bool, str]:
    # The use case, not the CLI's ``lint_imports``: that one reconfigures logging for the whole process
    # (``dictConfig`` disables every logger that exists by then), which silences the records later
    # tests in this process assert on.
    configure()
    kept = use_cases.lint_imports(config_filename=str(PYPROJECT), cache_dir=None, no_logo=True)
    return kept, capsys.readouterr().out


def _contract(name_start: str) -> dict:
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    (contract,) = [contract for contract in contracts if contract["name"].startswith(name_start)]
    return contract


def test_the_import_contracts_hold(capsys: pytest.CaptureFixture[str]) -> None:
    kept, output = _lint(capsys)
    assert kept, output


def test_dags_and_plugins_are_kept_from_every_layer_but_provider_and_public() -> None:
    layers = _contract("a lower layer never imports a higher one")["layers"]
    every_layer = {f"olmocr_tasks.{name.strip('() ')}" for layer in layers for name in layer.split("|")}
    forbidden = set(_contract("dags and plugins import")["forbidden_modules"])
    assert every_layer >= PUBLIC
    assert forbidden == every_layer - PUBLIC


@pytest.mark.parametrize("folder", ["dags", "plugins"])
def test_a_dag_or_plugin_importing_engine_internals_breaks_the_contract(
    folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # One more portion of the namespace package, as if the file were in the checkout's dags/ or plugins/.
    (tmp_path / folder).mkdir()
    (tmp_path / folder / "reaches_in.py").write_text("from olmocr_tasks.run.conversion import ConversionEngine\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()

    kept, output = _lint(capsys)

    assert not kept
    assert f"{folder}.reaches_in -> olmocr_tasks.run.conversion" in output
    assert "dags and plugins import olmocr_tasks.provider and olmocr_tasks.public only BROKEN" in output
