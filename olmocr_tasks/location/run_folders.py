"""The run folder ``OUTPUT/_runs/<run>/``: what a run plans and what its batches report, and nothing else.

Layout (keys named by ``olmocr_tasks.location.layout``; only this module reads and writes them)::

    _runs/<run>/<plan>/run.json                          the run as its planning resolved it (no secret)
    _runs/<run>/<plan>/plan.json                         the plan: sources (or its batches' keys),
                                                         unavailable, dead letters
    _runs/<run>/<plan>/batches/<batch>.json              the sources of one batch
    _runs/<run>/<plan>/slices/<slice>.json               while a plan packs its batches: the sources
                                                         discovered, a slice at a time (then removed)
    _runs/<run>/<plan>/attempts/<batch>/<try>/started    this attempt of the batch began
    _runs/<run>/<plan>/attempts/<batch>/<try>/entries/<hash>.json   one finished document
    _runs/<run>/<plan>/attempts/<batch>/<try>/part.json  every entry and the batch's GPU-busy seconds,
                                                         written when the attempt finishes

**Plans are fenced**: each planning (a cleared and re-run DAG run plans again) writes under a fresh
plan id, so nothing of an earlier plan is ever read for the new one, even when a task of the old
plan is still running somewhere. **Attempts are fenced**: each try of a batch writes under its own
try number and publishing collects only the latest attempt that started, so a stale attempt (a
worker thought dead, a task cleared while running) can never overwrite or add to a newer one's
results. An attempt first carries forward every entry of the batch's earlier attempts, then
converts only what they did not finish: its results are the whole batch, and documents an earlier
attempt converted keep their pages, tokens and outputs.

A batch that finished reports through its part; one that died part-way through the entries of the
documents it did finish; anything else is "not converted". XCom only ever carries keys and counts.
A part's GPU-busy seconds (``gpu_busy``) cover every attempt of its batch: an attempt adds its own to
what the attempt before it reported, and one that follows an attempt that died without a part reports
them as unmeasured, since what the dead attempt spent is unknown.
"""

from __future__ import annotations

import json
import re
import secrets
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from olmocr_tasks.core.clock import utc_now
from olmocr_tasks.core.errors import ConfigurationError
from olmocr_tasks.core.gpu_busy import NOTHING_SENT, GpuBusy
from olmocr_tasks.location.documents import SourceDocument
from olmocr_tasks.location.layout import OutputLocation, PlanFolder, plan_of_batch, safe_run_id
from olmocr_tasks.location.manifest import LEFT_FOR_LATER, DocumentEntry
from olmocr_tasks.location.records import read_record
from olmocr_tasks.storage.store import Storage

# The plan id of runs that plan once in one process (the CLI): a rerun with the same run id resumes it.
SINGLE_PLAN = "plan"

# Plan ids and batch keys name folders and objects of the run folder, and reach a convert task through
# XCom: letters, digits, ``_`` and ``-`` only, 1 to 64 of them, nothing else (not even a final newline).
_SAFE_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def new_plan_id(label: str = "p") -> str:
    """A plan id no earlier planning of the same run can have used (``label`` makes it readable)."""
    return f"{label}-{secrets.token_hex(4)}"


@dataclass
class RunPlan:
    """What one run set out to do, fixed before any conversion starts.

    A plan holds its sources in ``sources`` (plans written before streaming, tests), or, *streamed*
    into the run folder batch by batch (``olmocr_tasks.run.planning``: the CLI's ``stream_plan`` and
    the Airflow plan's ``plan_batches``), keeps only their batches' keys in ``batch_keys`` and reads
    each batch back when it is needed, so no process holds every source of a big run.
    """

    sources: list[SourceDocument]
    # Documents that cannot even be attempted (an explicit URI that does not exist).
    unavailable: list[DocumentEntry] = field(default_factory=list)
    dead_letters: list[DocumentEntry] = field(default_factory=list)
    # Discovered documents this run leaves for later (``skipped`` / ``retry_later``: failed recently).
    left_for_later: list[DocumentEntry] = field(default_factory=list)
    already_converted: int = 0
    # How many sources are planned because their last outcome was a failure (``SourceDocument.redriven``).
    redriven: int = 0
    started_at: str = field(default_factory=utc_now)
    # How many sources the plan holds, in ``sources`` or in its batches.
    planned: int = 0
    # The batches a streamed plan wrote its sources to, in order (empty: the sources are in ``sources``).
    batch_keys: list[str] = field(default_factory=list)
    # The storage requests planning sent (listings, ledger snapshot, the batches it wrote), by kind;
    # None for plans written before they were counted.
    storage_requests: dict[str, int] | None = None

    @property
    def streamed(self) -> bool:
        return bool(self.batch_keys)

    def to_dict(self) -> dict[str, Any]:
        return self._dict_with([source.to_dict() for source in self.sources])

    def _dict_with(self, sources: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "started_at": self.started_at,
            "already_converted": self.already_converted,
            "redriven": self.redriven,
            "planned": self.planned,
            "batch_keys": self.batch_keys,
            "storage_requests": self.storage_requests,
            "sources": sources,
            "unavailable": [entry.to_dict() for entry in self.unavailable],
            "dead_letters": [entry.to_dict() for entry in self.dead_letters],
            "left_for_later": [entry.to_dict() for entry in self.left_for_later],
        }

    def to_json(self) -> bytes:
        """``to_dict`` as JSON, encoded source by source: a plan of 100,000 documents never exists
        as 100,000 dicts at once (those would cost about twice the resident plan while it is written)."""
        text = json.dumps(self._dict_with([]))
        cut = text.index('"sources": []') + len('"sources": [')
        sources = b", ".join(json.dumps(source.to_dict()).encode() for source in self.sources)
        return text[:cut].encode() + sources + text[cut:].encode()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunPlan:
        sources = [SourceDocument.from_dict(item) for item in data["sources"]]
        return cls(
            sources=sources,
            unavailable=[DocumentEntry.from_dict(item) for item in data.get("unavailable", [])],
            dead_letters=[DocumentEntry.from_dict(item) for item in data.get("dead_letters", [])],
            left_for_later=[DocumentEntry.from_dict(item) for item in data.get("left_for_later", [])],
            already_converted=data.get("already_converted", 0),
            redriven=data.get("redriven", 0),
            started_at=data["started_at"],
            # Plans written before streaming counted their sources by holding them.
            planned=data.get("planned", len(sources)),
            batch_keys=list(data.get("batch_keys", [])),
            storage_requests=_request_counts(data.get("storage_requests")),
        )


@dataclass(frozen=True)
class AttemptReport:
    """What one attempt of a batch reported: its entries and, from a finished part, the GPU-busy seconds."""

    entries: list[DocumentEntry]
    gpu_busy: GpuBusy | None
    # The storage requests of the batch's attempts so far, by kind (None: no part, or a part from before
    # they were counted).
    storage_requests: dict[str, int] | None = None


class RunFolder:
    """Reads and writes one plan of one run under an output location."""

    def __init__(self, storage: Storage, output_uri: str, run_id: str, plan_id: str = SINGLE_PLAN) -> None:
        safe_name(plan_id, "plan id")
        self.storage = storage
        self.plan_id = plan_id
        location = OutputLocation(output_uri)
        self.run_uri = location.run_folder(safe_run_id(run_id))
        self.keys = location.plan(run_id, plan_id)
        self.uri = self.keys.uri

    # ---------------------------------------------------------------------------------- plan

    def write_plan(self, plan: RunPlan) -> str:
        uri = self.keys.plan
        self.storage.write_bytes_atomic(uri, plan.to_json())
        return uri

    def read_plan(self) -> RunPlan:
        return RunPlan.from_dict(json.loads(self.storage.read_bytes(self.keys.plan)))

    def read_plan_or_none(self) -> RunPlan | None:
        raw = self.storage.read_bytes_or_none(self.keys.plan)
        return None if raw is None else RunPlan.from_dict(json.loads(raw))

    def write_resolved_run(self, run: dict[str, Any]) -> None:
        """The run as its planning resolved it (``RunRequest.to_dict``), written before the plan."""
        self.storage.write_bytes_atomic(self.keys.resolved_run, _json(run))

    def read_resolved_run(self) -> dict[str, Any]:
        """The resolved run, read bounded (``location.records``: a few KB as written); a plan without one
        (planned by an earlier version, or by the CLI, which keeps none) is a ``ConfigurationError``."""
        raw = read_record(self.storage, self.keys.resolved_run)
        if raw is None:
            raise ConfigurationError(
                f"plan {self.plan_id} of this run has no resolved run ({self.keys.resolved_run}): plan the run again"
            )
        return json.loads(raw)

    def earlier_batch_count(self) -> int:
        """How many batches the largest earlier planning of this run wrote (0 when none is left).

        A cleared Airflow run maps ``convert`` again, but Airflow 3.3 marks the instances beyond the
        previous pass's length REMOVED (judged before plan runs again) and never brings them back when
        the new plan is longer: plan pads to this count so a pass never maps fewer than the last.
        """
        counts: Counter[str] = Counter()
        for info in self.storage.list_objects(self.run_uri + "/"):
            plan = plan_of_batch(info.uri)
            if plan is not None:
                counts[plan] += 1
        return max(counts.values(), default=0)

    def clear_earlier_attempt(self) -> None:
        """Remove what earlier plannings of this run left (other plan ids, and this one's own files).

        Only housekeeping: fencing does not depend on it, since nothing outside this plan id is read.
        Each object is deleted once listed (both backends list on past it, as ``rm -r`` does), so a
        cleared run's plan never holds the listing of its earlier attempts (an entry per document).
        """
        for info in self.storage.list_objects(self.run_uri + "/"):
            self.storage.delete(info.uri)

    # ------------------------------------------------------------------------------- batches

    def write_batch(self, batch_key: str, sources: Sequence[SourceDocument]) -> None:
        self.batch_write(batch_key, sources)()

    def batch_write(self, batch_key: str, sources: Sequence[SourceDocument]) -> Callable[[], None]:
        """``write_batch`` in two steps: the sources are encoded now, written when the returned call runs
        (a writer thread then holds the batch's bytes, not its documents)."""
        uri, data = self._batch_uri(batch_key), _sources_json(sources)
        return lambda: self.storage.write_bytes_atomic(uri, data)

    def read_batch(self, batch_key: str) -> list[SourceDocument]:
        return self._read_sources(self._batch_uri(batch_key))

    def _batch_uri(self, batch_key: str) -> str:
        return self.keys.batch(_checked_key(batch_key))

    def write_slice(self, slice_key: str, sources: Sequence[SourceDocument]) -> None:
        """Sources a planning discovered, kept aside (not a batch: nothing converts or publishes it)
        until it has packed them into batches (``olmocr_tasks.run.planning.plan_batches``)."""
        self.storage.write_bytes_atomic(self.keys.plan_slice(_checked_key(slice_key)), _sources_json(sources))

    def read_slice(self, slice_key: str) -> list[SourceDocument]:
        return self._read_sources(self.keys.plan_slice(_checked_key(slice_key)))

    def remove_slices(self, slice_keys: Iterable[str]) -> None:
        """Remove a planning's slices once its batches hold their sources: each source is then kept once."""
        for key in slice_keys:
            self.storage.delete(self.keys.plan_slice(_checked_key(key)))

    def _read_sources(self, uri: str) -> list[SourceDocument]:
        return [SourceDocument.from_dict(item) for item in json.loads(self.storage.read_bytes(uri))]

    # ------------------------------------------------------------------------------ attempts

    def attempt(self, batch_key: str, try_number: int) -> BatchAttempt:
        return BatchAttempt(self, _checked_key(batch_key), try_number)

    def next_try(self, batch_key: str) -> int:
        """One more than the latest attempt of the batch that started (1 for a batch never tried)."""
        tries = self._attempts(_checked_key(batch_key)).get(batch_key, {})
        return max(tries, default=0) + 1

    def latest_report(self, batch_key: str) -> AttemptReport | None:
        """What the latest started attempt of one batch reported (None: no attempt started).

        Lists that batch's objects only, so a run published batch by batch holds one batch's listing.
        """
        tries = self._attempts(_checked_key(batch_key)).get(batch_key)
        return self._read_attempt(tries[max(tries)]) if tries else None

    def iter_reports(self) -> Iterator[AttemptReport]:
        """What the latest started attempt of each batch reported, one batch at a time (in key order).

        A finished attempt reports through its part; one that died part-way through the entries it
        wrote. Attempts carry every earlier entry (and GPU-busy seconds) forward, so nothing outside the
        latest is needed. Publishing holds one batch's entries at a time, not the run's.
        """
        for _, tries in sorted(self._attempts().items()):
            yield self._read_attempt(tries[max(tries)])

    def _attempts(self, batch_key: str | None = None) -> dict[str, dict[int, list[str]]]:
        """batch → try → the URIs of that attempt's objects, for attempts that wrote their start mark.

        With ``batch_key`` only that batch's objects are listed: a run converted batch after batch
        (the CLI) would otherwise list every earlier batch's entries again for each new one.
        """
        found: dict[str, dict[int, list[str]]] = {}
        started: set[tuple[str, int]] = set()
        listed = self.keys.attempts_uri if batch_key is None else self.keys.attempts_of(batch_key)
        for info in self.storage.list_objects(listed + "/"):
            attempt = self.keys.attempt_object(info.uri)
            if attempt is None:
                continue
            batch, number, rest = attempt
            found.setdefault(batch, {}).setdefault(number, []).append(info.uri)
            if PlanFolder.is_started(rest):
                started.add((batch, number))
        return {
            batch: {number: uris for number, uris in tries.items() if (batch, number) in started}
            for batch, tries in found.items()
            if any((batch, number) in started for number in tries)
        }

    def _read_attempt(self, uris: Sequence[str]) -> AttemptReport:
        part = next((uri for uri in uris if PlanFolder.is_part(uri)), None)
        if part is not None:
            data = json.loads(self.storage.read_bytes(part))
            # Parts written before GPU-busy seconds were measured are a bare list of entries.
            items, gpu_busy = (data, None) if isinstance(data, list) else (data["entries"], data.get("gpu_busy"))
            requests = None if isinstance(data, list) else _request_counts(data.get("storage_requests"))
            return AttemptReport(
                [DocumentEntry.from_dict(item) for item in items], GpuBusy.from_dict(gpu_busy), requests
            )
        entry_uris = [uri for uri in uris if PlanFolder.is_entry(uri)]
        entries = [DocumentEntry.from_dict(json.loads(self.storage.read_bytes(uri))) for uri in entry_uris]
        return AttemptReport(entries, None)


class BatchAttempt:
    """One try of one batch: its start mark, its entries and its part, under its own try number."""

    def __init__(self, folder: RunFolder, batch_key: str, try_number: int) -> None:
        if try_number < 1:
            raise ValueError(f"try numbers start at 1, not {try_number}")
        self.folder = folder
        self.batch_key = batch_key
        self.try_number = try_number
        self.uri = folder.keys.attempt(batch_key, try_number)
        # The GPU-busy seconds of the earlier attempts (set by ``start``); this attempt adds its own.
        self.carried_gpu_busy = NOTHING_SENT
        # The storage requests of the earlier attempts that wrote a part (set by ``start``): a lower bound
        # when an attempt died before its part, whose requests nobody recorded.
        self.carried_storage_requests: dict[str, int] = {}

    @property
    def part_uri(self) -> str:
        return PlanFolder.part(self.uri)

    def start(self) -> dict[str, DocumentEntry]:
        """Mark the attempt started and carry forward what earlier attempts finished; returns those entries.

        From this moment publishing reads this attempt only, so the carried entries are written as
        this attempt's own before anything is converted. Only documents an earlier attempt converted
        (or found converted) are carried; its failures, and what it left for later (another run held
        the claim), are tried again. An attempt that is retried
        died or was declared dead, and a failure it recorded may come from what stopped it rather
        than from the document: a render time limit that ran out while its machine was frozen, a
        starved worker. A document that really is broken fails again, and quickly.
        """
        earlier: dict[str, DocumentEntry] = {}
        tries = self.folder._attempts(self.batch_key).get(self.batch_key, {})
        for number in sorted(n for n in tries if n < self.try_number):
            report = self.folder._read_attempt(tries[number])
            for entry in report.entries:
                # Failures and documents left for later (claimed by another run, fenced) are tried again.
                if entry.status == "failed" or entry.skip_reason in LEFT_FOR_LATER:
                    earlier.pop(entry.source, None)
                else:
                    earlier[entry.source] = entry
            # Each part's seconds already include those of the attempts before it; an attempt without a
            # measured part spent an unknown amount, which no later attempt can make measured again.
            if report.gpu_busy is not None:
                self.carried_gpu_busy = report.gpu_busy
            else:
                self.carried_gpu_busy = GpuBusy(self.carried_gpu_busy.seconds, measured=False)
            # Like the seconds, a part's counts already include those of the parts before it.
            if report.storage_requests is not None:
                self.carried_storage_requests = dict(report.storage_requests)
        self.folder.storage.write_bytes_atomic(PlanFolder.started(self.uri), b"")
        for entry in earlier.values():
            self.write_entry(entry)
        return earlier

    def superseded(self) -> bool:
        """Whether a later attempt of this batch has started (one small existence check).

        Once it has, it carried forward what this attempt had finished and converts the rest itself:
        anything this attempt recorded from then on (a frozen attempt that came back) would change
        what the later one did, so the conversion engine records nothing more (its claim guard's fence,
        ``olmocr_tasks.run.claim_guard``).
        """
        later = self.folder.attempt(self.batch_key, self.try_number + 1)
        return self.folder.storage.exists(PlanFolder.started(later.uri))

    def write_entry(self, entry: DocumentEntry) -> None:
        self.folder.storage.write_bytes_atomic(PlanFolder.entry(self.uri, entry.source), _json(entry.to_dict()))

    def write_part(
        self,
        entries: Sequence[DocumentEntry],
        gpu_busy: GpuBusy | None = None,
        storage_requests: dict[str, int] | None = None,
    ) -> str:
        """The attempt's report: every entry, and the GPU-busy seconds and storage requests (by kind) of
        the batch's attempts so far."""
        report: dict[str, Any] = {
            "entries": [entry.to_dict() for entry in entries],
            "gpu_busy": gpu_busy and gpu_busy.to_dict(),
        }
        if storage_requests is not None:
            report["storage_requests"] = storage_requests
        self.folder.storage.write_bytes_atomic(self.part_uri, _json(report))
        return self.part_uri


def _request_counts(data: Any) -> dict[str, int] | None:
    """A part's storage request counts; None for anything else (parts from before they were counted)."""
    if not isinstance(data, dict):
        return None
    return {str(kind): int(count) for kind, count in data.items() if isinstance(count, int)}


def safe_name(value: Any, what: str) -> str:
    """``value`` if it is a safe plan id or batch key (``_SAFE_NAME``), else ``ConfigurationError`` naming ``what``."""
    if not isinstance(value, str) or not _SAFE_NAME.fullmatch(value):
        raise ConfigurationError(f"refused {what} {value!r}: letters, digits, _ and - only, at most 64")
    return value


def _checked_key(batch_key: str) -> str:
    return safe_name(batch_key, "batch key")


def _json(data: Any) -> bytes:
    return json.dumps(data).encode()


def _sources_json(sources: Sequence[SourceDocument]) -> bytes:
    return _json([source.to_dict() for source in sources])
