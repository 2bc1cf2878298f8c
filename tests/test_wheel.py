"""The wheel ships the product only: ``olmocr_tasks`` with its schemas, never the test kit.

Built with the virtualenv's pip from a copy of the working tree (what ``git ls-files`` lists, as a fresh
clone with these changes would hold), so a ``build/`` folder left in the checkout by an earlier build
cannot add stale files, and without build isolation, so no index is needed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from olmocr_testkit import REPO_ROOT

pytestmark = pytest.mark.slow


def _working_tree_copy(target: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO_ROOT / name
        if source.is_file():  # a file deleted in the working tree is still listed until committed
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    source = _working_tree_copy(tmp_path_factory.mktemp("checkout"))
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-w", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = out.glob("olmocr_airflow-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def test_the_wheel_holds_no_test_kit(wheel_names: list[str]) -> None:
    assert (REPO_ROOT / "olmocr_testkit" / "standin").is_dir()  # in the checkout, beside the package
    kit = [name for name in wheel_names if name.startswith(("olmocr_testkit/", "olmocr_tasks/testing/"))]
    assert kit == []
    assert "olmocr_tasks/provider/testing.py" not in wheel_names


def test_the_wheel_holds_the_package_its_schemas_and_nothing_of_the_checkout(wheel_names: list[str]) -> None:
    top_level = {name.split("/", 1)[0] for name in wheel_names}
    assert {name for name in top_level if not name.endswith(".dist-info")} == {"olmocr_tasks"}
    schemas = sorted(path.name for path in (REPO_ROOT / "olmocr_tasks" / "schemas").glob("*.json"))
    assert schemas and all(f"olmocr_tasks/schemas/{name}" in wheel_names for name in schemas)
    for module in ("provider/__init__.py", "provider/tasks.py", "provider/flow.py", "public.py", "cli.py", "py.typed"):
        assert f"olmocr_tasks/{module}" in wheel_names
