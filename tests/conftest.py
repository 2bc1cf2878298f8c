"""Shared fixtures. Each fixtures module owns one real component the tests start themselves."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from olmocr_testkit import tier_record

# Property tests check what redaction and parsing return, not how fast: Hypothesis' default 200 ms
# deadline per example is a wall-clock bound that a loaded CI machine breaks (one example failed it
# beside other test runs, then passed alone). The quadratic-regex regression has its own test.
hypothesis_settings.register_profile("olmocr", deadline=None)
hypothesis_settings.load_profile("olmocr")

pytest_plugins = [
    "tests.fixtures.pdfs",
    "tests.fixtures.standin",
    "tests.fixtures.s3",
    "tests.fixtures.airflow",
    "tests.fixtures.browser",
    "tests.fixtures.ocr_runs",
    "tests.fixtures.ports",
]

# Tiers whose tests share one package-scoped deployment: they must all run in one process, in order.
# A new such tier adds its marker here and to SOLO_TIERS or LATER_TIERS in the Makefile.
ONE_PROCESS_TIERS = ("deployment", "compose", "vllm")
DEPLOYMENT_DIR = Path(__file__).resolve().parent / "deployment"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("olmocr tiers", "how make test splits the suite (scripts/run-tests.sh)")
    group.addoption("--tier", default=None, help="run only the tests carrying this tier's marker (e.g. deployment)")
    group.addoption(
        "--exclude-tiers",
        default="",
        help="space-separated tier markers whose tests are left out (they run in a process of their own)",
    )


def _tier_options(config: pytest.Config) -> tuple[str | None, set[str]]:
    return config.getoption("--tier"), set(config.getoption("--exclude-tiers").split())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep this process's part of the suite (``--tier`` / ``--exclude-tiers``), reported as deselected.

    pytest-xdist cannot keep a group of tests on one worker here (its ``loadgroup`` reads the
    ``xdist_group`` mark into the node id, which pytest 9 no longer takes), so ``make test`` runs each
    one-process tier as a pytest process of its own and the rest with ``--exclude-tiers``.
    """
    for item in items:
        # A test file added under tests/deployment/ without its pytestmark still belongs to the tier.
        if DEPLOYMENT_DIR in item.path.parents and not item.get_closest_marker("deployment"):
            item.add_marker(pytest.mark.deployment)
    tier, excluded = _tier_options(config)
    if tier is not None or excluded:
        keep = [item for item in items if _in_part(item, tier, excluded)]
        if len(keep) != len(items):
            config.hook.pytest_deselected(items=[item for item in items if item not in keep])
            items[:] = keep


def _in_part(item: pytest.Item, tier: str | None, excluded: set[str]) -> bool:
    if tier is not None and not item.get_closest_marker(tier):
        return False
    return not any(item.get_closest_marker(marker) for marker in excluded)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Record which process ran each solo-tier test, for the check ``make test`` makes afterwards.

    Under ``pytest -n 2`` a one-process tier's tests fail here, before their deployment starts: each
    worker would start its own (two Celery clusters on a 2-core machine).
    """
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    split = [marker for marker in ONE_PROCESS_TIERS if item.get_closest_marker(marker)]
    if workers > 1 and split:
        pytest.fail(
            f"the {split[0]} tier's tests share one deployment and would start one per pytest-xdist worker "
            f"({workers}): run them in one process (`make test`, or pytest -n 0)",
            pytrace=False,
        )
    tier, excluded = _tier_options(item.config)
    for marker in sorted({*ONE_PROCESS_TIERS, *excluded, *([tier] if tier else [])}):
        if item.get_closest_marker(marker):
            tier_record.record(tier_record.TEST, marker, test=item.nodeid)
