"""What one run should convert and how (``RunRequest``), built once (``resolve_run``) and kept with its plan.

Planning (``olmocr_tasks.run.planning``), converting (``olmocr_tasks.run.pipeline``) and publishing
(``olmocr_tasks.run.publishing``) all work from it. The CLI and Airflow's ``plan`` task build it through
``resolve_run``; an Airflow run's later tasks read it back from the run folder, where ``plan`` wrote it
(``to_dict``: no secret, schema-versioned; ``olmocr_tasks.run.planned``), instead of resolving it again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from olmocr_tasks.core.config import ConversionSettings, ServerAccess
from olmocr_tasks.core.errors import ConfigurationError
from olmocr_tasks.core.formats import ordered_formats
from olmocr_tasks.location.layout import ConversionState, OutputLocation
from olmocr_tasks.location.ledger import conversion_key
from olmocr_tasks.location.run_folders import SINGLE_PLAN, RunFolder
from olmocr_tasks.page.protocol import PROMPT_VERSION
from olmocr_tasks.run.settings import RunSettings
from olmocr_tasks.storage.access import AccessPolicy
from olmocr_tasks.storage.store import Storage

# The version of ``RunRequest.to_dict``'s layout; a record of another is refused (plan the run again).
REQUEST_SCHEMA = 1


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
        return run_conversion_key(self.settings.server.connection.model, self.settings.page.target_longest_image_dim)

    @property
    def conversion_state(self) -> ConversionState:
        """Where this run's output location keeps the state of its conversion key."""
        return OutputLocation(self.output_uri).state(self.conversion_key)

    def run_folder(self, storage: Storage, plan_id: str = SINGLE_PLAN) -> RunFolder:
        return RunFolder(storage, self.output_uri, self.run_id, plan_id)

    def to_dict(self) -> dict[str, Any]:
        """The run as its plan keeps it: no secret (no API key, no credentials in URLs: see
        ``ServerSettings.to_dict``) and none of the worker's own policy (``access``). The documents a run
        names are its plan's (its batches list them): only that it names them is kept."""
        return {
            "schema": REQUEST_SCHEMA,
            "input_uri": self.input_uri,
            "output_uri": self.output_uri,
            "run_id": self.run_id,
            "settings": self.settings.to_dict(),
            "names_documents": self.documents is not None,
            "modified_after": _stamp(self.modified_after),
            "modified_until": _stamp(self.modified_until),
            "reprocess": self.reprocess,
            "max_documents": self.max_documents,
            "run_settings": dataclasses.asdict(self.run_settings),
            "retry_dead_letters": self.retry_dead_letters,
            "redrive": self.redrive,
            "retry_interval_s": self.retry_interval.total_seconds(),
            "run_time": self.run_time.isoformat(),
            "claim_expiry_s": self.claim_expiry_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, server: ServerAccess, access: AccessPolicy) -> RunRequest:
        """``to_dict`` read back by a later step of the run, with what it reads for itself at use: the
        server's address and key (``server``) and the worker's allow-list (``access``). A run that named
        its documents reads back with ``documents=()``: they are in its plan's batches, and a later step
        only asks whether it named them."""
        if data.get("schema") != REQUEST_SCHEMA:
            raise ConfigurationError(
                f"the run's resolved request has schema {data.get('schema')!r}, this version reads "
                f"{REQUEST_SCHEMA}: plan the run again (clear it)"
            )
        settings = ConversionSettings.from_dict(data["settings"])
        return cls(
            input_uri=data["input_uri"],
            output_uri=data["output_uri"],
            run_id=data["run_id"],
            settings=dataclasses.replace(settings, server=settings.server.with_access(server)),
            documents=() if data["names_documents"] else None,
            modified_after=_moment(data.get("modified_after")),
            modified_until=_moment(data.get("modified_until")),
            reprocess=bool(data["reprocess"]),
            max_documents=data.get("max_documents"),
            run_settings=RunSettings(**data["run_settings"]),
            retry_dead_letters=bool(data["retry_dead_letters"]),
            redrive=bool(data["redrive"]),
            retry_interval=timedelta(seconds=float(data["retry_interval_s"])),
            run_time=datetime.fromisoformat(data["run_time"]),
            claim_expiry_s=data.get("claim_expiry_s"),
            access=access,
        )


def resolve_run(
    choices: Mapping[str, Any],
    *,
    input_uri: str,
    output_uri: str,
    run_id: str,
    settings: ConversionSettings,
    documents: Sequence[str] | None = None,
    modified_after: datetime | None = None,
    modified_until: datetime | None = None,
    redrive: bool = True,
    retry_interval: timedelta = timedelta(0),
    run_time: datetime | None = None,
    claim_expiry_s: float | None = None,
    access: AccessPolicy | None = None,
) -> RunRequest:
    """A run's ``RunRequest``, from what whoever started it chose and what its caller resolved.

    The one builder of the CLI (``choices``: its flags) and of Airflow's ``plan`` (``choices``: the DAG
    run's Params). The choices both offer are read here under their shared names, with the engine's
    defaults: ``reprocess``, ``max_documents``, ``retry_dead_letters``, ``formats``,
    ``max_page_error_rate``, ``max_document_error_rate`` and ``max_failed_attempts``. The server and
    how to convert (``settings``) and the rest are the caller's; ``access`` defaults to anywhere (the
    CLI's: its user's own credentials).
    """
    max_page_error_rate = choices.get("max_page_error_rate", ConversionSettings.max_page_error_rate)
    return RunRequest(
        input_uri=input_uri,
        output_uri=output_uri,
        run_id=run_id,
        settings=dataclasses.replace(
            settings, max_page_error_rate=float(max_page_error_rate), formats=ordered_formats(choices.get("formats"))
        ),
        documents=tuple(documents) if documents is not None else None,
        modified_after=modified_after,
        modified_until=modified_until,
        reprocess=bool(choices.get("reprocess", False)),
        max_documents=choices.get("max_documents"),
        run_settings=RunSettings(
            max_document_error_rate=float(choices.get("max_document_error_rate", RunSettings.max_document_error_rate)),
            max_failed_attempts=int(choices.get("max_failed_attempts", RunSettings.max_failed_attempts)),
        ),
        retry_dead_letters=bool(choices.get("retry_dead_letters", False)),
        redrive=redrive,
        retry_interval=max(retry_interval, timedelta(0)),
        run_time=run_time or datetime.now(UTC),
        claim_expiry_s=claim_expiry_s,
        access=access or AccessPolicy.anywhere(),
    )


def run_conversion_key(model: str, target_longest_image_dim: int) -> str:
    """The conversion key of a model at a render size under this version's prompt: what a run converts
    under, what its state and dead letters are kept by (``location.ledger.conversion_key``)."""
    return conversion_key(model, PROMPT_VERSION, target_longest_image_dim)


def _stamp(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def _moment(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


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
