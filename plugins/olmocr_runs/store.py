"""Find and read run manifests under ``OUTPUT/manifests/`` through ``olmocr_tasks.storage.store.Storage``.

Local folders, ``file://`` and ``s3://`` locations are read exactly as the engine writes them, with
the engine's retries, error translation and credential scrubbing.

The pages only ever read ``*.json`` objects directly inside that folder (the summaries), and the
shards a summary names below its own ``<key>/`` folder, through ``olmocr_tasks.location.manifest_reader`` (which
reads old single-file manifests too). The list reads summaries only (cached by version); a run's page
reads its summary and the shards of the documents it shows (``paging``). A run is looked up by the
name of a file the listing returned, never by a path built from the request, so a crafted run id
cannot reach anything else.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from olmocr_tasks.public import (
    ManifestFormatError,
    ManifestReader,
    OutputLocation,
    Storage,
    StorageError,
    UnreadableSourceError,
    overview_of,
    summary_path,
)

from .runs import RunSummary, summarize

log = logging.getLogger(__name__)

# Reading a cold listing from S3 is latency bound; a few parallel GETs make the first page load
# bearable without hammering the bucket.
_READ_WORKERS = 8


# What reading a manifest's summary or shards may raise when the stored data is bad or unreachable.
READ_ERRORS = (StorageError, UnreadableSourceError, ManifestFormatError, ValueError, KeyError)


class ManifestReadError(Exception):
    """A manifest file exists but is not a readable manifest (bad JSON, not an object, I/O error)."""

    @classmethod
    def of(cls, exc: Exception) -> ManifestReadError:
        return cls(f"{type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class ManifestFile:
    """One ``manifests/<key>.json`` object as listed."""

    key: str
    uri: str
    # Changes whenever the object changes (size plus ETag or modification time): the cache key.
    version: str


@dataclass
class Listing:
    """Readable runs plus one human-readable note per file that could not be read."""

    runs: list[RunSummary] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    # The file of each listed run, by key (for reading its entries without listing again).
    files: dict[str, ManifestFile] = field(default_factory=dict)


class ManifestStore:
    """Lists and reads the manifests of one output location, caching each file's summary by version."""

    def __init__(self, output_uri: str, storage: Storage | None = None) -> None:
        self.output_uri = output_uri
        # Without options Storage reads AWS_* and the usual credential chain, as the engine does.
        self.storage = storage or Storage()
        self._location = OutputLocation(output_uri)
        self._dir = self._location.manifests_uri
        self._lock = threading.Lock()
        # Per summary URI: (version, the run's list row or a note, its reader). A reader holds the
        # summary only (schema 3, small); an old manifest's entries are inline and kept with it, as before.
        self._summaries: dict[str, tuple[str, RunSummary | str, ManifestReader | None]] = {}
        # Overviews folded from the entries of runs published without one, per (URI, version).
        self._overviews: dict[tuple[str, str], dict[str, Any]] = {}

    @property
    def display_dir(self) -> str:
        return f"{self._dir.rstrip('/')}/"

    def list_files(self) -> list[ManifestFile]:
        """The manifest files now present; an absent folder means no run has finished yet."""
        files = []
        for info in self.storage.list_objects(self._dir):
            # Summaries only: shards and the temp files of an in-flight write are never listed.
            key = self._location.summary_key(info.uri)
            if key is None:
                continue
            version = f"{info.size}:{info.etag or info.last_modified.isoformat()}"
            files.append(ManifestFile(key=key, uri=info.uri, version=version))
        return files

    def open(self, manifest: ManifestFile) -> ManifestReader:
        """The run's summary; its entries are read from its shards only when asked for."""
        try:
            return ManifestReader.open(self.storage, manifest.uri)
        except (StorageError, UnreadableSourceError, ManifestFormatError) as exc:
            raise ManifestReadError.of(exc) from exc

    def reader(self, manifest: ManifestFile) -> ManifestReader:
        """The run's summary from the listing's cache when it is current, else read; entries stay unread."""
        with self._lock:
            cached = self._summaries.get(manifest.uri)
        if cached is not None and cached[0] == manifest.version and cached[2] is not None:
            return cached[2]
        return self.open(manifest)

    def overview(self, manifest: ManifestFile, reader: ManifestReader) -> dict[str, Any]:
        """What the run page's charts and problem list show: the summary's ``overview``, or for runs
        published before it, folded once from every entry and kept per version."""
        stored = reader.summary.get("overview")
        if isinstance(stored, dict):
            return stored
        key = (manifest.uri, manifest.version)
        with self._lock:
            if key in self._overviews:
                return self._overviews[key]
        try:
            folded = overview_of(reader.iter_documents(), reader.iter_dead_letters())
        except READ_ERRORS as exc:
            raise ManifestReadError.of(exc) from exc
        with self._lock:
            self._overviews = {k: v for k, v in self._overviews.items() if k[0] != manifest.uri}
            self._overviews[key] = folded
        return folded

    def document(
        self, manifest: ManifestFile, index: int, reader: ManifestReader | None = None
    ) -> dict[str, Any] | None:
        """One document entry by its position in the manifest, reading only the shard that holds it."""
        if index < 0:
            return None
        reader = reader or self.reader(manifest)
        try:
            page = reader.page(index, 1)
        except READ_ERRORS as exc:
            raise ManifestReadError.of(exc) from exc
        return page[0] if page and isinstance(page[0], dict) else None

    def find(self, key: str) -> ManifestFile | None:
        return next((manifest for manifest in self.list_files() if manifest.key == key), None)

    def listing(self) -> Listing:
        """Summaries of every manifest, newest first by finished_at; unreadable files become notes."""
        try:
            files = self.list_files()
        except Exception as exc:  # storage errors (credentials, missing bucket) are shown, not raised
            log.warning("Cannot list %s: %s", self._dir, exc)
            return Listing(error=f"Cannot list {self.display_dir}: {type(exc).__name__}: {exc}")

        with self._lock:
            cached = {path: entry for path, entry in self._summaries.items()}
        stale = [f for f in files if cached.get(f.uri, ("",))[0] != f.version]
        if stale:
            with ThreadPoolExecutor(max_workers=min(_READ_WORKERS, len(stale))) as pool:
                for manifest, (result, reader) in zip(stale, pool.map(self._summarize, stale), strict=True):
                    cached[manifest.uri] = (manifest.version, result, reader)
        present = {f.uri for f in files}
        with self._lock:
            # Forget deleted files so the cache never outgrows the folder.
            self._summaries = {path: entry for path, entry in cached.items() if path in present}
            self._overviews = {key: value for key, value in self._overviews.items() if key[0] in present}

        listing = Listing()
        for manifest in files:
            result = cached[manifest.uri][1]
            if isinstance(result, str):
                listing.notes.append(result)
            else:
                listing.runs.append(result)
                listing.files[result.key] = manifest
        listing.runs.sort(key=lambda run: run.sort_key, reverse=True)
        listing.notes.sort()
        return listing

    def _summarize(self, manifest: ManifestFile) -> tuple[RunSummary | str, ManifestReader | None]:
        """The run's list row from its summary alone (no shard is read), and the summary's reader."""
        try:
            reader = self.open(manifest)
            return summarize(manifest.key, reader.summary), reader
        except ManifestReadError as exc:
            log.warning("Skipping unreadable manifest %s: %s", manifest.uri, exc)
            return f"{summary_path(manifest.key)} could not be read ({exc}); it is left out.", None
        except Exception as exc:  # a manifest of an unexpected shape must not break the list
            log.exception("Skipping manifest %s", manifest.uri)
            return (
                f"{summary_path(manifest.key)} has an unexpected shape ({type(exc).__name__}: {exc}).",
                None,
            )
