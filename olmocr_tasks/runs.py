"""The run folder ``OUTPUT/_runs/<run>/``: what a run plans and what its batches report, and nothing else.

Layout (only this module builds these keys)::

    _runs/<run>/plan.json              the plan: sources to convert, unavailable ones, dead letters
    _runs/<run>/batches/<batch>.json   the sources of one batch (a convert task reads only its own)
    _runs/<run>/parts/<batch>.json     every entry of a batch, written when the batch finishes
    _runs/<run>/entries/<hash>.json    one document's entry, written the moment it finishes

Parts and entries let publishing account for every planned document: a batch that finished reports
through its part; one that died part-way still reports the documents it did finish through their
entries; anything else is "not converted". XCom only ever carries batch keys and counts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from olmocr_tasks.manifest import DocumentEntry, safe_run_id, utc_now
from olmocr_tasks.storage import ObjectInfo, Storage
from olmocr_tasks.uri import join_uri

RUNS_DIR = "_runs"
PLAN_FILE = "plan.json"
BATCHES_DIR = "batches"
PARTS_DIR = "parts"
ENTRIES_DIR = "entries"


@dataclass(frozen=True)
class SourceDocument:
    """A PDF to convert: where it is, what the listing said about it, and where its outputs go."""

    info: ObjectInfo
    stem: str

    @property
    def uri(self) -> str:
        return self.info.uri

    def to_dict(self) -> dict[str, Any]:
        info = self.info
        return {
            "uri": info.uri,
            "size": info.size,
            "etag": info.etag,
            "last_modified": info.last_modified.isoformat() if info.last_modified else None,
            "stem": self.stem,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SourceDocument:
        modified = data.get("last_modified")
        info = ObjectInfo(
            uri=data["uri"],
            size=data.get("size"),
            etag=data.get("etag"),
            last_modified=datetime.fromisoformat(modified) if modified else None,
        )
        return cls(info=info, stem=data["stem"])


@dataclass
class RunPlan:
    """What one run set out to do, fixed before any conversion starts."""

    sources: list[SourceDocument]
    # Documents that cannot even be attempted (an explicit URI that does not exist).
    unavailable: list[DocumentEntry] = field(default_factory=list)
    dead_letters: list[DocumentEntry] = field(default_factory=list)
    already_converted: int = 0
    started_at: str = field(default_factory=utc_now)

    def to_dict(self) -> dict[str, Any]:
        return {
            "started_at": self.started_at,
            "already_converted": self.already_converted,
            "sources": [source.to_dict() for source in self.sources],
            "unavailable": [entry.to_dict() for entry in self.unavailable],
            "dead_letters": [entry.to_dict() for entry in self.dead_letters],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunPlan:
        return cls(
            sources=[SourceDocument.from_dict(item) for item in data["sources"]],
            unavailable=[DocumentEntry.from_dict(item) for item in data.get("unavailable", [])],
            dead_letters=[DocumentEntry.from_dict(item) for item in data.get("dead_letters", [])],
            already_converted=data.get("already_converted", 0),
            started_at=data["started_at"],
        )


class RunFolder:
    """Reads and writes one run's folder under an output location."""

    def __init__(self, storage: Storage, output_uri: str, run_id: str) -> None:
        self.storage = storage
        self.uri = join_uri(output_uri, RUNS_DIR, safe_run_id(run_id))

    # ---------------------------------------------------------------------------------- plan

    def write_plan(self, plan: RunPlan) -> str:
        uri = join_uri(self.uri, PLAN_FILE)
        self.storage.write_bytes_atomic(uri, _json(plan.to_dict()))
        return uri

    def read_plan(self) -> RunPlan:
        return RunPlan.from_dict(json.loads(self.storage.read_bytes(join_uri(self.uri, PLAN_FILE))))

    def clear_earlier_attempt(self) -> None:
        """Remove the batches, parts and entries a cleared and re-planned run left behind.

        They must not leak into the new attempt's manifest.
        """
        stale = [
            info.uri
            for folder in (PARTS_DIR, ENTRIES_DIR, BATCHES_DIR)
            for info in self.storage.list_objects(join_uri(self.uri, folder) + "/")
        ]
        for uri in stale:
            self.storage.delete(uri)

    # ------------------------------------------------------------------------------- batches

    def write_batch(self, batch_key: str, sources: Sequence[SourceDocument]) -> None:
        self.storage.write_bytes_atomic(self._batch_uri(batch_key), _json([source.to_dict() for source in sources]))

    def read_batch(self, batch_key: str) -> list[SourceDocument]:
        raw = json.loads(self.storage.read_bytes(self._batch_uri(batch_key)))
        return [SourceDocument.from_dict(item) for item in raw]

    def _batch_uri(self, batch_key: str) -> str:
        return join_uri(self.uri, BATCHES_DIR, f"{batch_key}.json")

    # ------------------------------------------------------------------------ parts, entries

    def part_uri(self, batch_key: str) -> str:
        return join_uri(self.uri, PARTS_DIR, f"{batch_key}.json")

    def write_part(self, batch_key: str, entries: Sequence[DocumentEntry]) -> str:
        uri = self.part_uri(batch_key)
        self.storage.write_bytes_atomic(uri, _json([entry.to_dict() for entry in entries]))
        return uri

    def write_entry(self, entry: DocumentEntry) -> None:
        self.storage.write_bytes_atomic(self._entry_uri(entry.source), _json(entry.to_dict()))

    def _entry_uri(self, source_uri: str) -> str:
        return join_uri(self.uri, ENTRIES_DIR, hashlib.sha1(source_uri.encode()).hexdigest() + ".json")

    def collect(self, expected_sources: Iterable[str] = ()) -> dict[str, DocumentEntry]:
        """Every entry reported by this run's batches, keyed by source URI.

        Parts (one per finished batch) are read first; sources in ``expected_sources`` that no part
        reports are then looked up among the entries of batches that died part-way.
        """
        entries: dict[str, DocumentEntry] = {}
        for info in self.storage.list_objects(join_uri(self.uri, PARTS_DIR) + "/"):
            if not info.uri.endswith(".json"):
                continue
            for item in json.loads(self.storage.read_bytes(info.uri)):
                entry = DocumentEntry.from_dict(item)
                entries[entry.source] = entry
        missing = {self._entry_uri(source): source for source in expected_sources if source not in entries}
        if missing:
            for info in self.storage.list_objects(join_uri(self.uri, ENTRIES_DIR) + "/"):
                if info.uri in missing:
                    entry = DocumentEntry.from_dict(json.loads(self.storage.read_bytes(info.uri)))
                    entries[entry.source] = entry
        return entries


def _json(data: Any) -> bytes:
    return json.dumps(data).encode()
