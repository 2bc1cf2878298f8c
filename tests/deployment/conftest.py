"""The deployment tier: one real Airflow deployment (``olmocr_testkit.cluster``), shared by this folder.

Starting it costs one to three minutes on a loaded 2-core machine, so it is started once; it is
package-scoped, so it stops as soon as the last test here has run instead of idling through the
rest of the suite. Each test uses its own S3 prefix (``prefix``; for scheduled runs a folder of its
own under the DAGs' environment input, asserting only about its own PDFs there) and reads what the
runs published. Whatever a test changes on the shared deployment (the stand-in's behaviour, a killed
worker, a DAG it unpaused) is put back by a fixture, so any test passes alone or after any other's
failure.
"""

from __future__ import annotations

import os
import random
import re
import signal
import uuid
from collections.abc import Callable, Iterator

import pytest

from olmocr_testkit.bucket import Bucket
from olmocr_testkit.cluster import Deployment
from olmocr_testkit.cluster import deployment as start_deployment


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``OLMOCR_SHUFFLE_SEED=<n>``: the tier's files in a random order, and the tests within each.

    Shows that no deployment test depends on another having run (or passed) before it. Files stay
    whole, so a module fixture (the backfills) is still set up once.
    """
    seed = os.environ.get("OLMOCR_SHUFFLE_SEED")
    if not seed:
        return
    rng = random.Random(int(seed))
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        if item.get_closest_marker("deployment"):
            modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    order = list(modules)
    rng.shuffle(order)
    for module in order:
        rng.shuffle(modules[module])
    shuffled = [item for module in order for item in modules[module]]
    items[:] = [item for item in items if not item.get_closest_marker("deployment")] + shuffled


@pytest.fixture(scope="package")
def deployment(moto_server: str) -> Iterator[Deployment]:
    # A SIGTERM (CI's timeout, `kill`, a stopped `make test`) would end pytest without teardown and
    # leave a whole Celery cluster and its database behind: turn it into the interrupt pytest
    # already cleans up after.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with start_deployment(moto_server) as running:
            yield running
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}: stopping the deployment")


@pytest.fixture(scope="package")
def bucket(deployment: Deployment) -> Bucket:
    return Bucket(deployment.moto_url, deployment.bucket)


@pytest.fixture(scope="package")
def ingest_unpaused(deployment: Deployment) -> None:
    """``olmocr_ingest`` unpaused from now on: runs of a paused DAG are never scheduled.

    From then on the scheduler also makes its own run every minute (``OLMOCR_SCHEDULE``); those only
    look at the DAGs' default input, which no other test writes to.
    """
    deployment.api.set_paused("olmocr_ingest", False)


@pytest.fixture(autouse=True)
def shared_deployment_restored(request: pytest.FixtureRequest) -> Iterator[None]:
    """The stand-in in its starting configuration and every worker up, before and after each test.

    Before: whatever an earlier test left (its teardown may itself have failed) does not reach this
    one. After: a failed test leaves no fault, outage, rotated key, latency or dead worker behind. A
    fixture, not a ``finally``: it runs even when the test failed before reaching its ``try``.
    Tests that need no deployment do not start one for this.
    """
    if "deployment" not in request.fixturenames:
        yield
        return
    running: Deployment = request.getfixturevalue("deployment")
    _restore(running)
    yield
    _restore(running)


def _restore(running: Deployment) -> None:
    # reset: the configuration the stand-in started with (key, latency, no faults), no outage.
    running.standin.reset()
    for name in running.cluster.worker_names():
        if not running.cluster.processes[name].alive:
            running.cluster.start_worker(name)


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> str:
    """An S3 key prefix no other test (nor another run of this one) writes to: ``<test>-<random>/``."""
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.removeprefix("test_").lower()).strip("-")[:40]
    return f"{name}-{uuid.uuid4().hex[:6]}/"


@pytest.fixture
def scheduled_prefix(deployment: Deployment, prefix: str) -> str:
    """A folder of this test's own under the DAGs' default input (the key prefix, no ``s3://``).

    Scheduled runs and backfills without Params list ``OLMOCR_INPUT_URI`` as a whole, so they also
    list (and re-drive) other tests' PDFs there; tests assert exactly about the PDFs under this folder.
    """
    return deployment.input_uri.removeprefix(f"s3://{deployment.bucket}/") + prefix


@pytest.fixture
def unpause(deployment: Deployment) -> Iterator[Callable[[str], None]]:
    """Unpause a DAG for this test; paused again afterwards, however the test ended."""
    unpaused: list[str] = []

    def unpause_dag(dag_id: str) -> None:
        unpaused.append(dag_id)
        deployment.api.set_paused(dag_id, False)

    yield unpause_dag
    for dag_id in unpaused:
        deployment.api.set_paused(dag_id, True)
