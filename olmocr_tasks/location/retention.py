"""Retention: remove what an output location keeps only while runs and documents are in flight.

These objects stop serving anything:

* **Run folders** ``_runs/<run>/`` (plans, batches, attempts; see ``olmocr_tasks.location.run_folders``) once the
  run's manifest is published: the manifest carries everything a reader needs. A folder is removed
  only when its manifest exists, nothing in the folder changed for ``older_than``, and nothing in it
  is newer than the manifest. A run still working, never published, or cleared and running again
  after its first manifest (it writes a new plan after that manifest) is kept.
* **State that no longer serves a pending document**, under ``_state/<conversion key>/``: the
  failure markers of a source version that has since been converted (``.done`` wins over failures,
  so they count nothing any more), and saved pages (``olmocr_tasks.location.page_store``) of content that has
  been converted (a crash between committing the outputs and discarding the pages leaves them). Only
  objects untouched for ``older_than`` go, so a run that is converting right now loses nothing.
* **Claims no run holds** (``olmocr_tasks.location.claims``, under ``_state/<conversion key>/claims/``): the
  claim a dead run left on a document nobody tried again, the expired key each take-over leaves
  behind, and cool-downs that have run out; untouched for ``older_than`` too. Which of them may go is
  decided by ``claims.stale_claims``: never a live claim, nor a key on the way to one.
* **Manifest shards no summary names** under ``manifests/<run>/`` (``olmocr_tasks.location.manifest``): those
  of a publish that died before writing its summary, of a publish a later one of the same run
  superseded, and every shard of a run whose summary was deleted. Only shards untouched for
  ``older_than`` go, so a publish writing its shards right now loses nothing.

Never removed: manifest summaries and the shards they name, outputs, ``.done`` markers and content
records (the idempotency state), failure markers of versions not converted (they count towards dead
letters), pages of content not converted (a later run resumes from them), the output owner records,
and claims a run holds or cools down (and the keys leading to them).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from olmocr_tasks.core.errors import StorageError, UnreadableSourceError
from olmocr_tasks.location.claims import stale_claims
from olmocr_tasks.location.layout import OutputLocation
from olmocr_tasks.location.manifest_reader import ManifestFormatError, ManifestReader
from olmocr_tasks.storage.store import ObjectInfo, Storage

log = logging.getLogger(__name__)


@dataclass
class RetentionReport:
    """What a clean-up removed (or, with ``dry_run``, would remove) and what it kept, and why."""

    removed_runs: list[str] = field(default_factory=list)
    kept_runs: dict[str, str] = field(default_factory=dict)
    failure_markers: int = 0
    page_records: int = 0
    manifest_shards: int = 0
    claims: int = 0
    objects: int = 0
    dry_run: bool = False

    def summary(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        return (
            f"{verb} {len(self.removed_runs)} run folders, {self.failure_markers} failure markers of converted "
            f"versions, {self.page_records} saved pages of converted documents, {self.manifest_shards} "
            f"manifest shards no summary names and {self.claims} claims no run holds ({self.objects} objects); "
            f"kept {len(self.kept_runs)} run folders"
        )


def clean_output(
    output_uri: str,
    storage: Storage,
    *,
    older_than: timedelta,
    now: datetime | None = None,
    dry_run: bool = False,
) -> RetentionReport:
    """Remove finished run folders and obsolete state under ``output_uri`` (see the module docstring)."""
    if older_than < timedelta(0):
        raise ValueError("older_than must not be negative")
    now = now or datetime.now(UTC)
    cutoff = now - older_than
    report = RetentionReport(dry_run=dry_run)
    location = OutputLocation(output_uri)
    doomed: list[ObjectInfo] = []
    doomed += _finished_run_folders(location, storage, cutoff, report)
    doomed += _obsolete_state(location, storage, now, cutoff, report)
    doomed += _unnamed_manifest_shards(location, storage, cutoff, report)
    report.objects = len(doomed)
    if not dry_run:
        for info in doomed:
            storage.delete(info.uri)
    log.info("%s: %s", output_uri, report.summary())
    return report


def _objects_by_folder(prefix_uri: str, storage: Storage) -> dict[str, list[ObjectInfo]]:
    """The objects inside each folder directly below ``prefix_uri`` (objects at its top level left out)."""
    base = prefix_uri.rstrip("/") + "/"
    folders: dict[str, list[ObjectInfo]] = defaultdict(list)
    for info in storage.list_objects(prefix_uri):
        folder, slash, _ = info.uri.removeprefix(base).partition("/")
        if info.uri.startswith(base) and slash:
            folders[folder].append(info)
    return folders


def _finished_run_folders(
    location: OutputLocation, storage: Storage, cutoff: datetime, report: RetentionReport
) -> list[ObjectInfo]:
    folders = _objects_by_folder(location.runs_uri, storage)
    doomed: list[ObjectInfo] = []
    for run_key, objects in sorted(folders.items()):
        folder_uri = location.run_folder(run_key)
        newest = max(info.last_modified for info in objects)
        # A run folder and its run's manifest share the run key.
        manifest = storage.stat(location.summary(run_key))
        if manifest is None:
            report.kept_runs[folder_uri] = "no published manifest (running, failed before publishing, or abandoned)"
        elif newest > manifest.last_modified:
            report.kept_runs[folder_uri] = "written after its manifest was published (the run is running again)"
        elif newest >= cutoff:
            report.kept_runs[folder_uri] = "changed within the retention period"
        else:
            report.removed_runs.append(folder_uri)
            doomed += objects
    return doomed


def _unnamed_manifest_shards(
    location: OutputLocation, storage: Storage, cutoff: datetime, report: RetentionReport
) -> list[ObjectInfo]:
    shards = _objects_by_folder(location.manifests_uri, storage)
    doomed: list[ObjectInfo] = []
    for run_key, objects in sorted(shards.items()):
        summary_uri = location.summary(run_key)
        try:
            summary = ManifestReader.open_or_none(storage, summary_uri)
            named = set() if summary is None else set(summary.shard_uris())
        except (ManifestFormatError, StorageError, UnreadableSourceError) as exc:
            # A summary that cannot be read now might name any of them: keep them all.
            log.warning("kept the shards of %s: its summary could not be read (%s)", summary_uri, exc)
            continue
        doomed += [info for info in objects if info.uri not in named and info.last_modified < cutoff]
    report.manifest_shards = len(doomed)
    return doomed


def _obsolete_state(
    location: OutputLocation, storage: Storage, now: datetime, cutoff: datetime, report: RetentionReport
) -> list[ObjectInfo]:
    # Versions (conversion key, source version) with a done marker, content (key, SHA-256) converted.
    done: set[tuple[str, str]] = set()
    converted: set[tuple[str, str]] = set()
    failures: list[tuple[tuple[str, str], ObjectInfo]] = []
    pages: list[tuple[tuple[str, str], ObjectInfo]] = []
    claims: list[ObjectInfo] = []
    for info in storage.list_objects(location.state_uri):
        key = location.state_key(info.uri)
        if key is None:
            continue
        subject = (key.conversion_key, key.subject)
        if key.kind == "done":
            done.add(subject)
        elif key.kind == "failed":
            failures.append((subject, info))
        elif key.kind == "content":
            converted.add(subject)
        elif key.kind == "page":
            pages.append((subject, info))
        else:
            claims.append(info)
    doomed = [info for version, info in failures if version in done and info.last_modified < cutoff]
    report.failure_markers = len(doomed)
    stale_pages = [info for content, info in pages if content in converted and info.last_modified < cutoff]
    report.page_records = len(stale_pages)
    # Claims are judged by their own rules (``claims.stale_claims``) and come last, in its order.
    released = stale_claims(storage, claims, now=now, cutoff=cutoff)
    report.claims = len(released)
    return doomed + stale_pages + released
