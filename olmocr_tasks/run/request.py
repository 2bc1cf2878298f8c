"""What one run should convert and how (``RunRequest``), as the CLI and the Airflow tasks build it.

Planning (``olmocr_tasks.run.planning``), converting (``olmocr_tasks.run.pipeline``) and publishing
(``olmocr_tasks.run.publishing``) all work from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from olmocr_tasks.core.config import ConversionSettings
from olmocr_tasks.location.ledger import conversion_key
from olmocr_tasks.location.runs import SINGLE_PLAN, RunFolder
from olmocr_tasks.page.protocol import PROMPT_VERSION
from olmocr_tasks.run.settings import RunSettings
from olmocr_tasks.storage.access import AccessPolicy
from olmocr_tasks.storage.store import Storage


@dataclass(frozen=True)
class RunRequest:
    """What one run should convert and how."""

    input_uri: str
    output_uri: str
    run_id: str
    settings: ConversionSettings = field(default_factory=ConversionSettings)
    documents: tuple[str, ...] | None = None
    modified_after: datetime | None = None
    modified_until: datetime | None = None
    reprocess: bool = False
    max_documents: int | None = None
    # The error budget and the dead-letter threshold.
    run_settings: RunSettings = field(default_factory=RunSettings)
    # Convert dead letters once more instead of listing them.
    retry_dead_letters: bool = False
    # A reconciliation run (scheduled, manual scope "all", the CLI): it also re-drives the failed
    # versions under its input that discovery did not list. Runs naming ``documents`` never re-drive.
    redrive: bool = True
    # The least time between two runs' attempts at a failing version, measured on the runs' schedule
    # (``run_time``): Airflow uses the DAG's schedule interval, the CLI ``--retry-interval`` (default 0).
    retry_interval: timedelta = timedelta(0)
    # This run's time on its schedule: Airflow's ``run_after`` (a scheduled run's interval end), the
    # CLI's start. Failure markers and cool-down claims record it.
    run_time: datetime = field(default_factory=lambda: datetime.now(UTC))
    # Seconds a document claim lasts without renewal (None: ``default_claim_expiry_s``).
    claim_expiry_s: float | None = None
    # Where its documents may be read from: each one is checked, resolved, when planned and again just
    # before it is opened (``storage.access``). The Airflow tasks' is the workers' allow-list; the CLI's
    # (its user's own credentials) allows anywhere.
    access: AccessPolicy = field(default_factory=AccessPolicy.anywhere)

    @property
    def claim_expiry(self) -> float:
        return self.claim_expiry_s or default_claim_expiry_s(self.settings)

    @property
    def conversion_key(self) -> str:
        return conversion_key(
            self.settings.server.connection.model, PROMPT_VERSION, self.settings.page.target_longest_image_dim
        )

    def run_folder(self, storage: Storage, plan_id: str = SINGLE_PLAN) -> RunFolder:
        return RunFolder(storage, self.output_uri, self.run_id, plan_id)


def default_claim_expiry_s(settings: ConversionSettings) -> float:
    """How long a document claim lasts without renewal: two page-request timeouts (620 s by default).

    A live holder renews every quarter of it, off the event loop, so only a holder that stopped
    running (killed, frozen, cut off from storage) lets it lapse. Two whole request timeouts are the
    bound the client itself uses to call one request hung, comfortably more than a renewal's storage
    retries, and short next to a schedule interval: a dead run's documents are taken over by the next
    run. Airflow's retry of the same batch takes over its earlier attempt's claims at once.
    """
    server = settings.server
    return 2 * (server.timeouts.read_timeout_s + server.timeouts.connect_timeout_s)
