"""Where everything lives under an output location: the only module that names its folders and keys.

The same on local disk and S3; every other module asks this one for a key and for what a listed key
means, so a layout change is made here::

    OUTPUT/dolma/<stem>.jsonl                                  a document's Dolma record   (outputs)
    OUTPUT/markdown/<stem>.md                                  its markdown                (outputs)
    OUTPUT/manifests/<run>.json                                a run's summary             (manifest)
    OUTPUT/manifests/<run>/<publish>/<kind>-<n>.jsonl.gz       the summary's entry shards  (manifest)
    OUTPUT/_runs/<run>/<plan>/...                              what a run plans and reports (runs)
    OUTPUT/_state/output-owners/<hash>.json                    which source a stem belongs to (outputs)
    OUTPUT/_state/<conv>/conversion.json                       what the conversion key stands for (ledger)
    OUTPUT/_state/<conv>/instance-costs.json                   the last run's convert instance costs (instance_costs)
    OUTPUT/_state/<conv>/sources/<source-id>/<fp>.done         this version is converted   (ledger)
    OUTPUT/_state/<conv>/sources/<source-id>/<fp>.failed.<run> one run failed it            (ledger)
    OUTPUT/_state/<conv>/content/<sha256>.json                 these bytes were converted  (ledger)
    OUTPUT/_state/<conv>/pages/<sha256>/<page>.json            a saved page                (page_store)
    OUTPUT/_state/<conv>/claims/<source-id>/<fp>.claim[.after-<token>]  a claim             (claims)

and inside one plan of a run folder::

    run.json (the resolved run)   plan.json   batches/<batch>.json   slices/<slice>.json (while planning)
    attempts/<batch>/try-<n>/{started, part.json, entries/<hash>.json}

``<run>`` is ``safe_run_id`` of the run id: the run folder and the manifest of one run share it.
Nothing here performs I/O.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal

from olmocr_tasks.storage.uri import join_uri, safe_join

_STATE = "_state"
_OWNERS = "output-owners"
_CONVERSION_FILE = "conversion.json"
_INSTANCE_COSTS_FILE = "instance-costs.json"
_SOURCES = "sources"
_CONTENT = "content"
_PAGES = "pages"
_CLAIMS = "claims"
_RUNS = "_runs"
_MANIFESTS = "manifests"
_DOLMA = "dolma"
_MARKDOWN = "markdown"
_PLAN_FILE = "plan.json"
_RESOLVED_RUN_FILE = "run.json"
_BATCHES = "batches"
_SLICES = "slices"
_ATTEMPTS = "attempts"
_ENTRIES = "entries"
_PART_FILE = "part.json"
_STARTED_FILE = "started"
_SUMMARY_SUFFIX = ".json"
SHARD_SUFFIX = ".jsonl.gz"
# Version of the state layout, part of every conversion key: a layout change starts a new partition.
LAYOUT_VERSION = 1

_RUN_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]+")
_MARKER = re.compile(r"^(?P<fp>[0-9a-f]{16})\.(?:(?P<done>done)|failed\.(?P<run>[0-9a-f]{12}))$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_PAGE_RECORD = re.compile(r"^(?P<page>[0-9]{1,9})\.json$")
_TRY = re.compile(r"^try-(\d+)$")
_CLAIM_SUFFIX = ".claim"
_SUCCESSOR_MARK = ".claim.after-"

StateKind = Literal["done", "failed", "content", "page", "claim"]


def safe_run_id(run_id: str) -> str:
    """Run ids become object keys: keep them to a portable character set (Airflow's contain ':')."""
    cleaned = _RUN_ID_UNSAFE.sub("_", run_id).strip("._")
    return cleaned[:200] or "run"


def checked_sha256(sha256: str) -> str:
    """``sha256`` if it is a lower-case hex SHA-256 (content keys are built from nothing else)."""
    if not _HEX64.match(sha256):
        raise ValueError(f"not a hex SHA-256: {sha256!r}")
    return sha256


def _below(base: str, uri: str) -> list[str] | None:
    """``uri``'s key components below the folder ``base``; None when it is not below it."""
    prefix = base.rstrip("/") + "/"
    return uri[len(prefix) :].split("/") if uri.startswith(prefix) else None


@dataclass(frozen=True)
class SourceMarker:
    """A ledger marker named by its key: one version (source id, fingerprint) done, or failed in one run."""

    source_id: str
    fingerprint: str
    done: bool
    run_token: str | None


@dataclass(frozen=True)
class StateKey:
    """What one object under ``_state/<conv>/`` is, read from its key alone.

    ``subject`` is ``<source-id>/<fingerprint>`` for markers and claims and the SHA-256 for content
    records and saved pages.
    """

    conversion_key: str
    kind: StateKind
    subject: str


@dataclass(frozen=True)
class OutputLocation:
    """The keys under one output location (``uri``: a local path, ``file://`` or ``s3://`` prefix)."""

    uri: str

    # --------------------------------------------------------------------------- outputs

    def outputs(self, stem: str) -> dict[str, str]:
        """Where a stem's outputs live: ``{"dolma": uri, "markdown": uri}`` (written or not)."""
        return {
            "dolma": safe_join(join_uri(self.uri, _DOLMA), f"{stem}.jsonl"),
            "markdown": safe_join(join_uri(self.uri, _MARKDOWN), f"{stem}.md"),
        }

    def owner_record(self, folded_stem: str) -> str:
        """The record naming who owns a stem (``folded_stem``: the stem as owners compare it)."""
        digest = hashlib.sha256(folded_stem.encode("utf-8", "surrogatepass")).hexdigest()
        return join_uri(self.uri, _STATE, _OWNERS, f"{digest}.json")

    # ----------------------------------------------------------------------------- state

    @property
    def state_uri(self) -> str:
        return join_uri(self.uri, _STATE)

    def state(self, conversion_key: str) -> ConversionState:
        return ConversionState(join_uri(self.uri, _STATE, conversion_key))

    def state_key(self, uri: str) -> StateKey | None:
        """What a listed object under ``_state/`` is (None: an owner record, or not ours)."""
        parts = _below(self.state_uri, uri)
        if parts is None or len(parts) < 3:
            return None
        conv, folder = parts[0], parts[1]
        if len(parts) == 4 and folder == _SOURCES:
            marker = _MARKER.match(parts[3])
            if marker is None:
                return None
            return StateKey(conv, "done" if marker["done"] else "failed", f"{parts[2]}/{marker['fp']}")
        if len(parts) == 3 and folder == _CONTENT and parts[2].endswith(".json"):
            return StateKey(conv, "content", parts[2].removesuffix(".json"))
        if len(parts) == 4 and folder == _PAGES:
            return StateKey(conv, "page", parts[2])
        if len(parts) == 4 and folder == _CLAIMS:
            return StateKey(conv, "claim", f"{parts[2]}/{parts[3]}")
        return None

    # ------------------------------------------------------------------------ run folders

    @property
    def runs_uri(self) -> str:
        """The folder holding every run folder, each named by its run key (``safe_run_id``)."""
        return join_uri(self.uri, _RUNS)

    def run_folder(self, run_key: str) -> str:
        return join_uri(self.uri, _RUNS, run_key)

    def plan(self, run_id: str, plan_id: str) -> PlanFolder:
        return PlanFolder(join_uri(self.run_folder(safe_run_id(run_id)), plan_id))

    # -------------------------------------------------------------------------- manifests

    @property
    def manifests_uri(self) -> str:
        """The folder of every run's summary and of each run's shard folder, named by run key."""
        return join_uri(self.uri, _MANIFESTS)

    def manifest(self, run_id: str) -> str:
        """The summary of ``run_id``'s manifest."""
        return self.summary(safe_run_id(run_id))

    def summary(self, run_key: str) -> str:
        """The summary of the run whose key (its run folder's name) is ``run_key``."""
        return f"{self.uri.rstrip('/')}/{summary_path(run_key)}"

    def summary_key(self, uri: str) -> str | None:
        """The run key of a listed summary (an object directly in ``manifests/``); None for anything else,
        shards and the hidden temporary files of an in-flight write included."""
        parts = _below(self.manifests_uri, uri)
        if parts is None or len(parts) != 1 or not parts[0].endswith(_SUMMARY_SUFFIX) or parts[0].startswith("."):
            return None
        return parts[0].removesuffix(_SUMMARY_SUFFIX)


def summary_path(run_key: str) -> str:
    """A summary's key relative to its output location (``manifests/<run>.json``), for messages."""
    return f"{_MANIFESTS}/{run_key}{_SUMMARY_SUFFIX}"


def shards_folder(summary_uri: str) -> str:
    """The folder of a run's shards: next to its summary, named like it (``manifests/<run>/``)."""
    return summary_uri.removesuffix(_SUMMARY_SUFFIX) + "/"


def shard_path(publish_id: str, name: str, number: int) -> str:
    """A shard's key below its run's shard folder: one folder per publish, numbered shards per kind."""
    return f"{publish_id}/{name}-{number:05d}{SHARD_SUFFIX}"


@dataclass(frozen=True)
class ConversionState:
    """The keys of one conversion key's state (``uri``: ``OUTPUT/_state/<conv>``)."""

    uri: str

    @property
    def description(self) -> str:
        return join_uri(self.uri, _CONVERSION_FILE)

    @property
    def instance_costs(self) -> str:
        """What the last measured run's convert instances cost (``olmocr_tasks.run.instance_costs``)."""
        return join_uri(self.uri, _INSTANCE_COSTS_FILE)

    # ------------------------------------------------------------------ ledger markers

    @property
    def sources_uri(self) -> str:
        return join_uri(self.uri, _SOURCES)

    def source_folder(self, source_id: str) -> str:
        return join_uri(self.uri, _SOURCES, source_id)

    def done_marker(self, source_id: str, fingerprint: str) -> str:
        return join_uri(self.source_folder(source_id), f"{fingerprint}.done")

    def failure_marker(self, source_id: str, fingerprint: str, run_token: str) -> str:
        return join_uri(self.source_folder(source_id), f"{fingerprint}.failed.{run_token}")

    def marker(self, uri: str) -> SourceMarker | None:
        """The marker a listed key under ``sources/`` names (None: not ours, or a future layout)."""
        parts = _below(self.sources_uri, uri)
        if parts is None or len(parts) != 2:
            return None
        match = _MARKER.match(parts[1])
        if match is None:
            return None
        return SourceMarker(parts[0], match["fp"], bool(match["done"]), match["run"])

    def content(self, sha256: str) -> str:
        return join_uri(self.uri, _CONTENT, f"{sha256}.json")

    # ------------------------------------------------------------------ saved pages

    def pages_of(self, sha256: str) -> str:
        """The folder of a document's saved pages (by its content's SHA-256)."""
        return join_uri(self.uri, _PAGES, checked_sha256(sha256))

    def page(self, sha256: str, page_number: int) -> str:
        if page_number < 1:
            raise ValueError(f"page numbers start at 1, got {page_number}")
        return join_uri(self.pages_of(sha256), f"{page_number:05d}.json")

    @staticmethod
    def page_number(uri: str) -> int | None:
        """The page number a listed page record's key names (None: not a page record)."""
        match = _PAGE_RECORD.match(uri.rsplit("/", 1)[-1])
        return None if match is None else int(match["page"])

    # ----------------------------------------------------------------------- claims

    def claim(self, source_id: str, fingerprint: str) -> str:
        """The first claim of a source version; take-overs are its successors (``claim_successor``)."""
        return join_uri(self.uri, _CLAIMS, source_id, f"{fingerprint}{_CLAIM_SUFFIX}")


def claim_successor(first_claim: str, token: str) -> str:
    """The key that takes over the claim with ``token`` in the chain starting at ``first_claim``."""
    return f"{first_claim}.after-{token}"


def first_claim_of(uri: str) -> str | None:
    """The first claim's key of a claim object's chain; None for anything that is not a claim."""
    head, marker, _ = uri.rpartition(_SUCCESSOR_MARK)
    if marker:
        return f"{head}{_CLAIM_SUFFIX}"
    return uri if uri.endswith(_CLAIM_SUFFIX) else None


@dataclass(frozen=True)
class PlanFolder:
    """The keys of one plan of one run (``uri``: ``OUTPUT/_runs/<run>/<plan>``)."""

    uri: str

    @property
    def plan(self) -> str:
        return join_uri(self.uri, _PLAN_FILE)

    @property
    def resolved_run(self) -> str:
        """The run as its planning resolved it, which the plan's later steps read back."""
        return join_uri(self.uri, _RESOLVED_RUN_FILE)

    def batch(self, batch_key: str) -> str:
        return join_uri(self.uri, _BATCHES, f"{batch_key}.json")

    def plan_slice(self, slice_key: str) -> str:
        """Discovered sources in discovery order, written while a plan packs them (not a batch)."""
        return join_uri(self.uri, _SLICES, f"{slice_key}.json")

    @property
    def attempts_uri(self) -> str:
        return join_uri(self.uri, _ATTEMPTS)

    def attempts_of(self, batch_key: str) -> str:
        return join_uri(self.uri, _ATTEMPTS, batch_key)

    def attempt(self, batch_key: str, try_number: int) -> str:
        return join_uri(self.uri, _ATTEMPTS, batch_key, f"try-{try_number:04d}")

    def attempt_object(self, uri: str) -> tuple[str, int, str] | None:
        """``(batch, try number, rest of the key)`` of a listed object of an attempt; None otherwise."""
        parts = _below(self.attempts_uri, uri)
        if parts is None or len(parts) < 2:
            return None
        match = _TRY.match(parts[1])
        return None if match is None else (parts[0], int(match[1]), "/".join(parts[2:]))

    @staticmethod
    def started(attempt_uri: str) -> str:
        return join_uri(attempt_uri, _STARTED_FILE)

    @staticmethod
    def part(attempt_uri: str) -> str:
        return join_uri(attempt_uri, _PART_FILE)

    @staticmethod
    def entry(attempt_uri: str, source: str) -> str:
        name = hashlib.sha1(source.encode("utf-8", "surrogatepass")).hexdigest() + ".json"
        return join_uri(attempt_uri, _ENTRIES, name)

    @staticmethod
    def is_started(rest: str) -> bool:
        """Whether the rest of an attempt object's key (``attempt_object``) is its start mark."""
        return rest == _STARTED_FILE

    @staticmethod
    def is_part(uri: str) -> bool:
        return uri.endswith("/" + _PART_FILE)

    @staticmethod
    def is_entry(uri: str) -> bool:
        return f"/{_ENTRIES}/" in uri and uri.endswith(".json")


def plan_of_batch(uri: str) -> str | None:
    """The plan folder of a listed batch file under a run folder; None for anything else."""
    head, marker, _ = uri.rpartition(f"/{_BATCHES}/")
    return head if marker else None
