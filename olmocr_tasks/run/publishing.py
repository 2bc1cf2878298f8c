"""Publishing a run, for the CLI and the Airflow ``publish_manifest`` task alike: its manifest and verdict.

``publish_run`` merges the plan and what every batch reported into the run manifest (entries to
shards, the summary last, the commit marker). A planned document no batch reported is a failure of
this run, ``not_converted``, recorded in the ledger so later runs re-drive it; the error budget
(``RunSettings.max_document_error_rate``) is judged once, here, into the manifest, where the Airflow
``enforce_error_budget`` task, the CLI's exit code and the OCR runs page read it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from olmocr_tasks import __version__
from olmocr_tasks.core.clock import utc_now
from olmocr_tasks.core.gpu_busy import GpuBusy, total_gpu_busy
from olmocr_tasks.location.documents import SourceDocument
from olmocr_tasks.location.ledger import Ledger
from olmocr_tasks.location.manifest import (
    NOT_CONVERTED,
    SHARD_ENTRIES,
    DocumentEntry,
    Manifest,
    ManifestWriter,
)
from olmocr_tasks.location.manifest_reader import ManifestReader
from olmocr_tasks.location.run_folders import AttemptReport, RunFolder, RunPlan
from olmocr_tasks.page.protocol import PROMPT_VERSION
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.storage.store import REQUEST_KINDS, Storage


def not_converted(source: SourceDocument, reason: str) -> DocumentEntry:
    """The entry of a planned document no attempt converted or failed: a failure of its run, re-driven later."""
    return DocumentEntry(
        source=source.uri, status="failed", size=source.info.size, error_class=NOT_CONVERTED, error=reason
    )


def _manifest_header(request: RunRequest, plan: RunPlan, *, gpu_busy: GpuBusy | None = None) -> Manifest:
    """The run's manifest without entries: what it was, how it was configured, when it ran."""
    return Manifest(
        run_id=request.run_id,
        started_at=plan.started_at,
        finished_at=utc_now(),
        server=request.settings.server.public_dict(),
        model=request.settings.server.connection.model,
        prompt_version=PROMPT_VERSION,
        package_version=__version__,
        settings=request.settings.public_dict(),
        input_uri=request.input_uri,
        output_uri=request.output_uri,
        already_converted=plan.already_converted,
        gpu_hour_price=request.settings.gpu_hour_price,
        gpu_busy=gpu_busy,
    )


def _lost(source: SourceDocument) -> DocumentEntry:
    return not_converted(source, "its batch did not finish (see the task log); it will be retried by the next run")


@dataclass(frozen=True)
class PublishedRun:
    """What ``publish_run`` wrote: the summary (totals, no entries), its URI, and how many planned
    documents no batch reported (recorded as ``not_converted`` failures)."""

    manifest: Manifest
    uri: str
    not_converted: int

    def reader(self, storage: Storage) -> ManifestReader:
        """The published manifest, read back through the one reader (from memory: no extra request)."""
        return ManifestReader(storage, self.uri, self.manifest.to_dict())

    @property
    def verdict(self) -> dict[str, Any]:
        """The error budget's verdict (``max_document_error_rate``, ``exceeded``, ``problems``)."""
        return self.manifest.error_budget or {}

    def summary(self) -> dict[str, Any]:
        """What a caller passes on (the publish task's XCom): manifest URI, counts and verdict, no entries."""
        return {
            "manifest": self.uri,
            "run_id": self.manifest.run_id,
            "output_uri": self.manifest.output_uri,
            **self.manifest.counts(),
            "error_budget": self.verdict,
        }


def publish_run(
    request: RunRequest,
    storage: Storage,
    folder: RunFolder,
    plan: RunPlan,
    *,
    airflow_run: dict[str, Any] | None = None,
    shard_entries: int = SHARD_ENTRIES,
) -> PublishedRun:
    """Stream a run's results into its manifest: entries to shards batch by batch, the summary last.

    Holds one batch's report at a time and, for a streamed plan (the CLI's and the Airflow plan's), one
    batch's sources (a plan held whole, written before plans were streamed: the set of its sources);
    counts and metrics are folded as the entries stream (``ManifestWriter``: what grows with the run is
    8 bytes per converted page, kept for exact latency percentiles). A planned document no batch
    reported is recorded as failed ``not_converted`` after its batch's entries, in the manifest and as
    a failure of this run in the ledger, so later runs re-drive it. The error budget is judged into the
    summary.
    ``airflow_run``: the DAG run the manifest belongs to (None for the CLI).
    """
    before = storage.requests.counts()
    writer = ManifestWriter(storage, request.output_uri, request.run_id, shard_entries=shard_entries)
    # Where the documents no batch reported are recorded as failures of this run, batch after batch.
    ledger = Ledger(request.output_uri, storage, request.conversion_key)
    for entry in plan.unavailable:
        writer.add(entry)
    gpu_reports: list[GpuBusy | None] = []
    request_reports: list[dict[str, int] | None] = []
    lost = 0
    for sources, reports in _planned_and_reported(plan, folder):
        # Planned sources not reported yet, in plan order; what is left at the end was never reported.
        pending = {source.uri: source for source in sources}
        for report in reports:
            for entry in report.entries:
                source = pending.pop(entry.source, None)
                if source is None:
                    continue  # not planned by this plan, or already reported by another batch
                entry.redriven = source.redriven
                writer.add(entry)
            gpu_reports.append(report.gpu_busy)
            request_reports.append(report.storage_requests)
        # Recorded after the batch's reported entries (a plan held whole: after every batch's), so
        # only one batch's lost sources are ever held.
        for source in pending.values():
            entry = _lost(source)
            entry.redriven = source.redriven
            writer.add(entry)
        if pending:
            _mark_not_converted(request, ledger, pending.values())
            lost += len(pending)
    for entry in plan.left_for_later:
        writer.add(entry)
    for entry in plan.dead_letters:
        writer.add_dead_letter(entry)
    manifest = _manifest_header(request, plan, gpu_busy=total_gpu_busy(gpu_reports))
    manifest.storage_requests = total_storage_requests(request_reports)
    if manifest.storage_requests is not None:
        # Planning's own requests beside the batches'; publishing's are added by the commit, once its
        # last shards are written (all but the summary's own write).
        manifest.storage_requests["planning"] = plan.storage_requests
    manifest.totals = writer.totals
    manifest.judge_error_budget(request.run_settings.max_document_error_rate)
    manifest.airflow_run = airflow_run
    uri = writer.commit(manifest, publishing_since=before)
    return PublishedRun(manifest, uri, lost)


def _planned_and_reported(
    plan: RunPlan, folder: RunFolder
) -> Iterator[tuple[Sequence[SourceDocument], Iterable[AttemptReport]]]:
    """The plan's sources with the reports that can name them: a streamed plan batch by batch (a batch
    reports only its own sources), one read each; a plan held whole with every batch's report."""
    if not plan.streamed:
        yield plan.sources, folder.iter_reports()
        return
    for key in plan.batch_keys:
        report = folder.latest_report(key)
        yield folder.read_batch(key), [] if report is None else [report]


def total_storage_requests(reports: Iterable[dict[str, int] | None]) -> dict[str, Any] | None:
    """A run's storage requests by kind, summed over its batches' reports (None: no batch at all).

    ``complete`` is False when some batch reported none (an attempt that died before its part, a part
    written before requests were counted): the counts are then a lower bound.
    """
    totals: Counter[str] = Counter()
    complete, batches = True, 0
    for report in reports:
        batches += 1
        if report is None:
            complete = False
            continue
        totals.update(report)
    if not batches:
        return None
    return {"by_kind": {kind: totals[kind] for kind in REQUEST_KINDS}, "batches": batches, "complete": complete}


def _mark_not_converted(request: RunRequest, ledger: Ledger, sources: Iterable[SourceDocument]) -> None:
    for source in sources:
        ledger.mark_failed(
            source.info, NOT_CONVERTED, "its batch did not finish", request.run_id, run_time=request.run_time
        )
