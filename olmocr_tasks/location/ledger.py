"""What has been converted, as small state objects under ``OUTPUT/_state/`` (no database).

Three questions, three kinds of object, all partitioned by a *conversion key* (model, prompt
version, render settings) so that a new model starts from a clean slate while the old state stays
readable (keys named by ``olmocr_tasks.location.layout``)::

    _state/<conv>/sources/<source-id>/<fingerprint>.done             converted (JSON: outputs, sha256)
    _state/<conv>/sources/<source-id>/<fingerprint>.failed.<run>     one failed run (JSON: error)
    _state/<conv>/content/<sha256>.json                              these bytes were converted once
    _state/<conv>/conversion.json                                    what the key stands for (optional)

* *Is this listed object done?* The status is encoded in key names, so **one paginated listing** of
  ``_state/<conv>/sources/`` answers it for every object of a discovery (``Ledger.snapshot``); no
  per-object GET. The source id is a hash of the URI and the fingerprint a hash of (size, ETag) on
  S3 or (size, mtime) locally: new content under the same key has a new fingerprint and is "new".
* *Has a copy of these bytes been converted under another name?* Asked once per new document after
  download, when its SHA-256 is known (``Ledger.find_content``): renamed or re-uploaded copies are not
  converted twice.
* *How often has this version failed?* One marker per failing run: names are unique per run, so two
  runs writing at once never overwrite each other's count, and a retried task of the same run
  overwrites its own marker instead of counting twice. ``done`` always wins over failures.

Every write is a whole-object atomic PUT or rename of a uniquely named object, so concurrent runs
never corrupt state; claims (``olmocr_tasks.location.claims``, under ``_state/<conv>/claims/``) keep them from
converting one version at the same time. A failure marker also records its run's ``run_time`` (its
time on the schedule), from which re-drive spaces the next attempt.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from olmocr_tasks.core.clock import utc_now
from olmocr_tasks.location.layout import LAYOUT_VERSION, OutputLocation, checked_sha256
from olmocr_tasks.location.outputs import outputs_hold
from olmocr_tasks.location.records import RecordTooLargeError, read_record
from olmocr_tasks.storage.store import ObjectInfo, Storage
from olmocr_tasks.storage.uri import is_s3, local_path

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 2000

Status = Literal["new", "done"] | tuple[Literal["failed"], int]

_DONE = -1


def conversion_key(
    model: str,
    prompt_version: str,
    target_longest_image_dim: int,
    *,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """A short stable hash of everything that changes what a conversion produces.

    ``extra`` holds further output-shaping settings (e.g. ``{"max_tokens": 8000}``); its keys must
    not collide with the named arguments.
    """
    settings: dict[str, Any] = dict(extra or {})
    settings.update(
        layout=LAYOUT_VERSION,
        model=model,
        prompt_version=prompt_version,
        target_longest_image_dim=int(target_longest_image_dim),
    )
    canonical = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha1(canonical.encode("utf-8")).hexdigest()[:16]


def source_id(uri: str) -> str:
    """A fixed-length name for a source URI; local sources are compared as absolute paths."""
    canonical = uri if is_s3(uri) else os.path.abspath(local_path(uri))
    return hashlib.sha1(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def fingerprint(info: ObjectInfo) -> str:
    """Identity of one version of an object, from listing metadata alone (no download).

    S3: size + ETag, so re-uploading identical bytes (same ETag) is still "done". Local: size + mtime.
    """
    identity = info.etag if info.etag else f"mtime:{info.last_modified.isoformat()}"
    return hashlib.sha1(f"{info.size}\x00{identity}".encode()).hexdigest()[:16]


def _run_token(run_id: str) -> str:
    return hashlib.sha1(run_id.encode("utf-8", "surrogatepass")).hexdigest()[:12]


@dataclass(frozen=True)
class ContentRecord:
    """The first conversion of a given content (SHA-256) under one conversion key."""

    sha256: str
    source: str
    outputs: dict[str, str]
    run_id: str
    at: str


@dataclass(frozen=True)
class FailureRecord:
    source: str
    error_class: str
    error: str
    run_id: str
    at: str
    # The failing run's time on its schedule (``RunRequest.run_time``): re-drive spaces attempts from it.
    run_time: datetime | None = None


class LedgerSnapshot:
    """The state of every source version at the time of one listing."""

    def __init__(self, versions: dict[str, int], failure_markers: dict[str, str] | None = None) -> None:
        # "<source-id>/<fingerprint>" → -1 when done, else the number of failed runs.
        self._versions = versions
        # "<source-id>/<fingerprint>" → the URI of its latest failure marker (they name the source).
        self._failure_markers = failure_markers or {}

    def last_failure_marker(self, info: ObjectInfo) -> str | None:
        """The URI of this version's most recent failure marker, if it failed (None otherwise)."""
        return self._failure_markers.get(_version_key(info))

    def failure_markers(self) -> dict[str, int]:
        """One failure marker per version that failed and was never converted since → its failed runs."""
        markers = self._failure_markers.items()
        return {uri: self._versions[key] for key, uri in markers if self._versions.get(key, 0) > 0}

    def status(self, info: ObjectInfo) -> Status:
        """``"new"``, ``"done"`` or ``("failed", n)`` for this exact version of the object."""
        value = self._versions.get(_version_key(info))
        if value is None:
            return "new"
        if value == _DONE:
            return "done"
        return ("failed", value)

    def failures(self, info: ObjectInfo) -> int:
        value = self._versions.get(_version_key(info), 0)
        return 0 if value == _DONE else value

    def is_dead_letter(self, info: ObjectInfo, max_attempts: int) -> bool:
        """Failed in at least ``max_attempts`` runs and never converted: not to be tried again."""
        return self.failures(info) >= max_attempts

    def failed_source_ids(self) -> set[str]:
        """The source ids (``source_id``) with a version whose last outcome was a failure."""
        return {key.split("/", 1)[0] for key, value in self._versions.items() if value > 0}

    @property
    def done_count(self) -> int:
        return sum(1 for value in self._versions.values() if value == _DONE)

    @property
    def failed_count(self) -> int:
        return sum(1 for value in self._versions.values() if value > 0)

    def __len__(self) -> int:
        return len(self._versions)


def _version_key(info: ObjectInfo) -> str:
    return f"{source_id(info.uri)}/{fingerprint(info)}"


class Ledger:
    """Reads and writes the state of one output prefix for one conversion key."""

    def __init__(
        self,
        output_uri: str,
        storage: Storage,
        conversion_key: str,
        *,
        description: Mapping[str, Any] | None = None,
    ) -> None:
        if not re.fullmatch(r"[0-9A-Za-z_-]{1,64}", conversion_key):
            raise ValueError(f"conversion key must be a short token, got {conversion_key!r}")
        self.output_uri = output_uri
        self.storage = storage
        self.conversion_key = conversion_key
        # The keys of this conversion key's state (``olmocr_tasks.location.layout``), shared with pages and claims.
        self.state = OutputLocation(output_uri).state(conversion_key)
        self._description = dict(description) if description else None
        # Failure markers read by this instance (they never change once written).
        self._markers_read: dict[str, dict[str, Any] | None] = {}

    # ------------------------------------------------------------------------------- reading

    def snapshot(self, source_ids: Iterable[str] | None = None) -> LedgerSnapshot:
        """Status of every known source version from one paginated listing of the state prefix.

        With ``source_ids``, only those sources' versions, one listing of each source's own folder: a
        run that names a few documents pays a request per document, not a listing of the whole history
        (one page per 1,000 markers).
        """
        if source_ids is None:
            listed: Iterable[ObjectInfo] = self.storage.list_objects(self.state.sources_uri)
        else:
            folders = [self.state.source_folder(sid) for sid in sorted(set(source_ids))]
            listed = itertools.chain.from_iterable(self.storage.list_objects(folder) for folder in folders)
        versions: dict[str, int] = {}
        failure_markers: dict[str, str] = {}
        marker_times: dict[str, datetime] = {}
        for info in listed:
            marker = self.state.marker(info.uri)
            if marker is None:
                continue  # not ours (or a future layout): ignore rather than guess
            key = f"{marker.source_id}/{marker.fingerprint}"
            current = versions.get(key, 0)
            if marker.done:
                versions[key] = _DONE
            else:
                # The latest marker: its run's time decides when the version may be tried again.
                if key not in marker_times or info.last_modified >= marker_times[key]:
                    failure_markers[key], marker_times[key] = info.uri, info.last_modified
                if current != _DONE:
                    versions[key] = current + 1
        return LedgerSnapshot(versions, failure_markers)

    def failed_sources(
        self,
        snapshot: LedgerSnapshot,
        failed_runs: Callable[[int], bool] = lambda _: True,
        *,
        known: Iterable[str] = (),
    ) -> list[ObjectInfo]:
        """The source versions whose last outcome was a failure, as their failure markers recorded them.

        Only versions whose number of failed runs passes ``failed_runs`` (e.g. only dead letters) and
        whose source is not among the ``known`` URIs are read; one small read each, and damaged
        markers are skipped.
        """
        skip = {source_id(uri) for uri in known}
        found: list[ObjectInfo] = []
        for uri, failures in snapshot.failure_markers().items():
            marker = self.state.marker(uri)
            if not failed_runs(failures) or marker is None or marker.source_id in skip:
                continue
            data = self._read_marker(uri)
            if data is None:
                continue
            try:
                found.append(
                    ObjectInfo(
                        uri=data["source"],
                        size=data["size"],
                        etag=data.get("etag"),
                        last_modified=datetime.fromisoformat(data["last_modified"]),
                    )
                )
            except (ValueError, KeyError, TypeError):
                continue
        return found

    def latest_failure(self, snapshot: LedgerSnapshot, info: ObjectInfo) -> FailureRecord | None:
        """This version's latest failure as the snapshot found it (None: it never failed, or unreadable).

        One small read of its latest marker, shared with ``failed_sources``; no listing.
        """
        uri = snapshot.last_failure_marker(info)
        data = self._read_marker(uri) if uri else None
        if data is None:
            return None
        try:
            at = str(data["at"])
            return FailureRecord(
                source=data["source"],
                error_class=data["error_class"],
                error=data.get("error", ""),
                run_id=data.get("run_id", ""),
                at=at,
                # Markers from before run times were recorded: the time they were written.
                run_time=_aware(datetime.fromisoformat(str(data.get("run_time") or at).replace("Z", "+00:00"))),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def _read_record(self, uri: str) -> bytes | None:
        """A marker or content record, bounded: one past ``OLMOCR_MAX_RECORD_BYTES`` reads as absent,
        as a damaged one does (a reconversion at most), and is never held whole."""
        try:
            return read_record(self.storage, uri)
        except RecordTooLargeError as exc:
            log.warning("ignoring a state record: %s", exc)
            return None

    def _read_marker(self, uri: str) -> dict[str, Any] | None:
        if uri not in self._markers_read:
            raw = self._read_record(uri)
            try:
                data = json.loads(raw) if raw is not None else None
            except ValueError:
                data = None
            self._markers_read[uri] = data if isinstance(data, dict) else None
        return self._markers_read[uri]

    def status(self, info: ObjectInfo) -> Status:
        """The status of one object from a small listing of its own state folder."""
        return self.snapshot([source_id(info.uri)]).status(info)

    def failure_count(self, info: ObjectInfo) -> int:
        return self.snapshot([source_id(info.uri)]).failures(info)

    def find_content(self, sha256: str, *, verify_outputs: bool = True) -> ContentRecord | None:
        """The earlier conversion of identical bytes, if any and if its outputs still hold them.

        With ``verify_outputs`` the recorded Dolma output must exist and still carry this SHA-256
        (its key may since have been overwritten by a changed source of the same name).
        """
        raw = self._read_record(self.state.content(checked_sha256(sha256)))
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            record = ContentRecord(
                sha256=data["sha256"],
                source=data["source"],
                outputs=dict(data.get("outputs") or {}),
                run_id=data.get("run_id", ""),
                at=data.get("at", ""),
            )
        except (ValueError, KeyError, TypeError):
            return None  # a damaged record only costs a reconversion
        if record.sha256 != sha256:
            return None
        if verify_outputs and not outputs_hold(self.storage, record.outputs, sha256):
            return None
        return record

    def last_failure(self, info: ObjectInfo) -> FailureRecord | None:
        """The most recent failure of this object version (for dead-letter reports)."""
        wanted = fingerprint(info)
        markers = [
            item
            for item in self.storage.list_objects(self.state.source_folder(source_id(info.uri)))
            if (marker := self.state.marker(item.uri)) and marker.fingerprint == wanted and not marker.done
        ]
        if not markers:
            return None
        latest = max(markers, key=lambda item: (item.last_modified, item.uri))
        raw = self._read_record(latest.uri)
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            return FailureRecord(
                source=data["source"],
                error_class=data["error_class"],
                error=data.get("error", ""),
                run_id=data.get("run_id", ""),
                at=data.get("at", ""),
            )
        except (ValueError, KeyError, TypeError):
            return None

    # ------------------------------------------------------------------------------- writing

    def mark_done(
        self,
        info: ObjectInfo,
        sha256: str,
        outputs: Mapping[str, str],
        run_id: str,
        *,
        duplicate_of: str | None = None,
    ) -> None:
        """Record this object version as converted (``duplicate_of``: it reused that source's outputs)."""
        self._describe()
        now = utc_now()
        payload: dict[str, Any] = {
            **_object_fields(info),
            "sha256": sha256,
            "outputs": dict(outputs),
            "run_id": run_id,
            "at": now,
        }
        if duplicate_of:
            payload["duplicate_of"] = duplicate_of
        # The content record first: if we die between the two writes, the next run sees "new",
        # downloads, finds the content record and skips the conversion anyway.
        content_uri = self.state.content(sha256)
        if not self.storage.exists(content_uri):
            # First writer wins in spirit; a concurrent overwrite names an equally valid conversion.
            content = {"sha256": sha256, "source": info.uri, "outputs": dict(outputs), "run_id": run_id, "at": now}
            self.storage.write_bytes_atomic(content_uri, _json(content), content_type="application/json")
        done_uri = self.state.done_marker(source_id(info.uri), fingerprint(info))
        self.storage.write_bytes_atomic(done_uri, _json(payload), content_type="application/json")

    def mark_failed(
        self, info: ObjectInfo, error_class: str, error: str, run_id: str, *, run_time: datetime | None = None
    ) -> int:
        """Record that this run failed to convert the object version; returns the failed-run count.

        ``error`` must already be free of secrets. Marking twice in the same run counts once.
        ``run_time`` is the run's time on its schedule (``RunRequest.run_time``): re-drive spaces the
        next attempt from it.
        """
        self._describe()
        payload = {
            **_object_fields(info),
            "error_class": error_class,
            "error": error[:MAX_ERROR_CHARS],
            "run_id": run_id,
            "at": utc_now(),
        }
        if run_time is not None:
            payload["run_time"] = run_time.isoformat()
        marker_uri = self.state.failure_marker(source_id(info.uri), fingerprint(info), _run_token(run_id))
        self.storage.write_bytes_atomic(marker_uri, _json(payload), content_type="application/json")
        # Count from storage, not from memory: other runs may have failed it meanwhile.
        return max(1, self.failure_count(info))

    # ----------------------------------------------------------------------------- internals

    def _describe(self) -> None:
        # Written once per Ledger so a human browsing _state/ can tell what a key stands for.
        if self._description is None:
            return
        description, self._description = self._description, None
        uri = self.state.description
        if not self.storage.exists(uri):
            body = {"conversion_key": self.conversion_key, "layout": LAYOUT_VERSION, **description}
            self.storage.write_bytes_atomic(uri, _json(body), content_type="application/json")


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _object_fields(info: ObjectInfo) -> dict[str, Any]:
    return {
        "source": info.uri,
        "size": info.size,
        "etag": info.etag,
        "last_modified": info.last_modified.isoformat(),
    }


def _json(data: Mapping[str, Any]) -> bytes:
    # ASCII-escaped: a stray surrogate in a file name must not make the state unwritable.
    return json.dumps(data, indent=1, default=str).encode("ascii")
