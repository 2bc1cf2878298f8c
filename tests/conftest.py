"""Shared fixtures. Each fixtures module owns one real component the tests start themselves."""

import pytest

pytest_plugins = [
    "tests.fixtures.pdfs",
    "tests.fixtures.standin",
    "tests.fixtures.s3",
    "tests.fixtures.airflow",
]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``pytest -n N --dist loadgroup`` (``make test``), the deployment tier stays on one worker.

    Its tests share one Airflow deployment (a package-scoped fixture) and run in order against it;
    the other tests spread over the remaining workers meanwhile.
    """
    for item in items:
        if item.get_closest_marker("deployment"):
            item.add_marker(pytest.mark.xdist_group("deployment"))
