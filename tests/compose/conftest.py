"""The compose tier's marker: ``make test-compose`` selects it (``-m compose``); the rest of the suite
deselects it, since it needs a Docker engine and takes minutes."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "compose: builds docker/ images and runs the compose stack (tests/compose; make test-compose)"
    )
