"""The figures in the docs stay traceable: each names a raw result or a test, and that exists.

README.md, RELIABILITY.md and bench/README.md back every measured figure either with a raw result
committed under ``bench/records/`` or with the test that asserts it. These checks fail when a doc
names a record file that is not committed (or a pattern such as ``priority-*.json``, which does not
say which record a figure comes from), or a test (``tests/x.py::test_name``, or a bare
``test_name`` as the fault matrix writes them under a heading naming the file) that no test file
defines, e.g. after a rename.
"""

from __future__ import annotations

import ast
import re
import tempfile
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "RELIABILITY.md", "bench/README.md")
# A record path as the docs write it; ``*`` and ``?`` are caught so that a pattern fails as a name.
RECORD = re.compile(r"bench/records/[^\s`'\"()\[\],;]*")
# ``tests/location/test_claims.py::test_what_claims_cost`` (also ``::Class::test``, with a parameter id).
TEST_REFERENCE = re.compile(r"(tests/[\w/]+\.py)((?:::\w+)+)")
# A test function's name on its own, not part of a path or a file name (``test_layers.py``).
BARE_TEST_NAME = re.compile(r"(?<![\w/.:-])(test_\w+)(?![\w.])")


def _doc_text(doc: str) -> str:
    return (REPO / doc).read_text(encoding="utf-8")


@cache
def _names_defined_in(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return frozenset(node.name for node in ast.walk(tree) if isinstance(node, kinds))


@cache
def _test_names_anywhere() -> frozenset[str]:
    names: set[str] = set()
    for path in (REPO / "tests").rglob("test_*.py"):
        names |= _names_defined_in(path)
    return frozenset(names)


def missing_records(text: str) -> list[str]:
    """Record paths named in ``text`` that are not one committed file each."""
    missing = []
    for match in RECORD.finditer(text):
        named = match.group(0).rstrip(".:")
        if named == "bench/records/" or not named.endswith(".json"):
            continue  # the folder itself ("records in `bench/records/`"), not a figure's source
        if any(char in named for char in "*?") or not (REPO / named).is_file():
            missing.append(named)
    return missing


def missing_tests(text: str) -> list[str]:
    """``file::name`` references whose file or names do not exist, and bare ``test_*`` names no test file defines."""
    missing = []
    for match in TEST_REFERENCE.finditer(text):
        path, names = REPO / match.group(1), match.group(2).split("::")[1:]
        if not path.is_file() or not set(names) <= _names_defined_in(path):
            missing.append(match.group(0))
    for match in BARE_TEST_NAME.finditer(text):
        if match.group(1) not in _test_names_anywhere():
            missing.append(match.group(1))
    return missing


@pytest.mark.parametrize("doc", DOCS)
def test_every_record_a_doc_names_is_committed(doc: str) -> None:
    assert missing_records(_doc_text(doc)) == []


@pytest.mark.parametrize("doc", DOCS)
def test_every_test_a_doc_names_exists(doc: str) -> None:
    assert missing_tests(_doc_text(doc)) == []


def test_committed_records_name_no_folder_of_the_machine_that_measured() -> None:
    # A bench writes its records from some checkout (a worktree beside this one, a fresh clone in the
    # temp folder): none of those folders, nor the home folder, may reach a committed file.
    machine_folders = {str(REPO.parent), str(Path.home()), tempfile.gettempdir()}
    records = {path.name: path.read_text(encoding="utf-8") for path in sorted(REPO.glob("bench/records/*.json"))}
    leaks = [
        f"{name}: {folder}"
        for name, text in records.items()
        for folder in machine_folders
        if f"{folder.rstrip('/')}/" in text
    ]
    assert leaks == []


def test_a_measured_command_keeps_only_the_last_part_of_each_path() -> None:
    from bench.measure import short_command

    checkout = str(REPO.parent / "some-worktree")
    command = [f"{checkout}/.venv/bin/python", f"{checkout}/.venv/bin/olmocr-tasks", "convert", "/data/in", "out"]
    assert short_command(command) == "python olmocr-tasks convert in out"


def test_the_checks_catch_what_they_are_for() -> None:
    """The patterns find a missing or vague reference among ones that exist."""
    record = next((REPO / "bench" / "records").glob("*.json")).relative_to(REPO).as_posix()
    text = (
        f"from `{record}`, from `bench/records/priority-*.json` and from bench/records/gone-20990101T000000Z.json; "
        "records in `bench/records/`. Asserted by tests/test_docs_figures.py::test_every_test_a_doc_names_exists, "
        "tests/test_docs_figures.py::test_renamed_away, tests/no_such_file.py::test_x and "
        "(`test_the_checks_catch_what_they_are_for`, "
        "`test_sigkill_mid_write_leaves_nothing_partial_for_readers[.jsonl]`, `test_never_written`); "
        "tests/test_layers.py is a file, not a test."
    )
    assert missing_records(text) == ["bench/records/priority-*.json", "bench/records/gone-20990101T000000Z.json"]
    assert missing_tests(text) == [
        "tests/test_docs_figures.py::test_renamed_away",
        "tests/no_such_file.py::test_x",
        "test_never_written",
    ]
