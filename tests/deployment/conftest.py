"""The deployment tier: one real Airflow deployment (see ``harness``), shared by the tests of this folder.

Starting it costs one to three minutes on a loaded 2-core machine, so it is started once; it is
package-scoped, so it stops as soon as the last test here has run instead of idling through the
rest of the suite. Each test uses its own S3 prefixes (or, for scheduled runs, the DAGs'
environment prefixes) and reads what the runs published.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.deployment.corpus import Bucket
from tests.deployment.harness import Deployment
from tests.deployment.harness import deployment as start_deployment


@pytest.fixture(scope="package")
def deployment(moto_server: str) -> Iterator[Deployment]:
    with start_deployment(moto_server) as running:
        yield running


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
