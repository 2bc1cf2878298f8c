"""Claims: a document version is converted by one run at a time (olmOCR's worker locks, per document).

Before converting a version a run claims it in the output location's state with the storage layer's
create-if-absent write (``Storage.create_exclusive``: a hard link locally, ``If-None-Match: *`` on S3,
the primitive output-owner records use; keys named by ``olmocr_tasks.location.layout``)::

    _state/<conv>/claims/<source-id>/<fingerprint>.claim                     the first claim
    _state/<conv>/claims/<source-id>/<fingerprint>.claim.after-<token>       took over the claim <token>

A claim record names its run, plan, batch and attempt, a random token and an expiry. Its holder
renews it while converting and deletes it once the outcome is recorded: one create and one delete
per document, no listing (plus the small reads of the fence below). A claim that is not renewed
expires: its holder died (SIGKILL, a lost worker) or froze. Another run then **takes it over by
creating the successor key** named after the expired claim's token, again create-if-absent, so of two
runs taking over one expired claim exactly one wins, on both backends, with no moment where the claim
is absent and no compare-and-swap needed. The current claim is the end of the chain (a key whose
successor does not exist).

**Fencing.** A claim is lost exactly when its successor exists. Before writing outputs or recording
an outcome a holder reads that key (it normally does not exist: one small read), so a late writer
whose claim was taken over never records over the newer holder. Successors are never deleted while
they fence someone: a holder that took over releases by deleting its predecessors and leaving its
own key behind, expired. A holder that lost its claim deletes nothing.

**Same run, later attempt.** A claim held by an earlier attempt of the same batch, or by another
plan of the same run, is taken over at once: Airflow (or a CLI rerun with the same run id) starts a
later attempt only once the earlier one is over or declared dead, a cleared run plans afresh, and
attempt and plan fencing already ignore what those report.

**Cool-down.** A run with a retry interval leaves a failed document's claim behind as a cool-down
(expired, with ``retry_from``: the earliest run time that may try it again) instead of deleting it,
so a run that planned a re-drive of the same failure concurrently does not fail it a second time
within the interval. Runs that name their documents ignore cool-downs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from olmocr_tasks.core.errors import StorageError
from olmocr_tasks.location.layout import ConversionState, claim_successor, first_claim_of
from olmocr_tasks.location.ledger import fingerprint, source_id
from olmocr_tasks.location.records import RecordTooLargeError, read_record
from olmocr_tasks.storage.store import ObjectInfo, Storage

log = logging.getLogger(__name__)

# Renewals per expiry: a holder renews every expiry / RENEWALS_PER_EXPIRY seconds.
RENEWALS_PER_EXPIRY = 4
# Steps of a chain walk before giving up (each step is a take-over: a chain this long is pathological).
_MAX_STEPS = 64


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class ClaimHolder:
    """Who claims: one attempt of one batch of one run, and the run's time on its schedule."""

    run_id: str
    plan: str
    batch: str
    attempt: int
    run_time: datetime


@dataclass(frozen=True)
class ClaimRecord:
    """One claim object's content."""

    token: str
    run_id: str
    plan: str
    batch: str
    attempt: int
    expires_at: datetime
    # Set on a cool-down: the earliest run time (on the schedule) that may try the version again.
    retry_from: datetime | None = None

    def to_bytes(self) -> bytes:
        data: dict[str, Any] = {
            "token": self.token,
            "run_id": self.run_id,
            "plan": self.plan,
            "batch": self.batch,
            "attempt": self.attempt,
            "expires_at": self.expires_at.isoformat(),
        }
        if self.retry_from is not None:
            data["retry_from"] = self.retry_from.isoformat()
        return json.dumps(data).encode("ascii")

    @classmethod
    def from_bytes(cls, raw: bytes) -> ClaimRecord:
        try:
            data = json.loads(raw)
            retry_from = data.get("retry_from")
            return cls(
                token=str(data["token"]),
                run_id=str(data["run_id"]),
                plan=str(data.get("plan", "")),
                batch=str(data.get("batch", "")),
                attempt=int(data.get("attempt", 0)),
                expires_at=_aware(datetime.fromisoformat(data["expires_at"])),
                retry_from=_aware(datetime.fromisoformat(retry_from)) if retry_from else None,
            )
        except (ValueError, KeyError, TypeError):
            # Not one of ours (or damaged): an expired claim nobody holds, with a token from its bytes.
            token = hashlib.sha1(raw).hexdigest()[:16]
            return cls(token, "unknown", "", "", 0, datetime.min.replace(tzinfo=UTC))


def read_claim(storage: Storage, uri: str) -> ClaimRecord | None:
    """The claim record at ``uri`` (None: there is none), read bounded (``OLMOCR_MAX_RECORD_BYTES``).

    One past the bound is a damaged record: expired, held by nobody, its token derived from its URI
    so that every run walks the same chain past it.
    """
    try:
        raw = read_record(storage, uri)
    except RecordTooLargeError as exc:
        log.warning("treating an oversized claim as damaged: %s", exc)
        raw = f"oversized claim record {uri}".encode()
    return None if raw is None else ClaimRecord.from_bytes(raw)


@dataclass(frozen=True)
class Blocked:
    """Another run holds the version (``cooling_down`` False) or failed it recently (True)."""

    record: ClaimRecord
    cooling_down: bool


class ClaimBook:
    """Claims of one output location's conversion key, for one claiming attempt."""

    def __init__(
        self,
        storage: Storage,
        state: ConversionState,
        holder: ClaimHolder,
        expiry_s: float,
        *,
        respect_cool_downs: bool = True,
        clock: Callable[[], datetime] = _now,
    ) -> None:
        if expiry_s <= 0:
            raise ValueError(f"a claim expiry must be positive, not {expiry_s!r}")
        self.storage = storage
        self.holder = holder
        self.expiry_s = float(expiry_s)
        self.respect_cool_downs = respect_cool_downs
        self._state = state
        self._clock = clock

    @property
    def renew_every_s(self) -> float:
        return self.expiry_s / RENEWALS_PER_EXPIRY

    def root_uri(self, info: ObjectInfo) -> str:
        return self._state.claim(source_id(info.uri), fingerprint(info))

    def acquire(self, info: ObjectInfo) -> Claim | Blocked:
        """Claim this version: a ``Claim`` to hold, or ``Blocked`` by the run that holds it.

        Uncontended: one create. Otherwise one read per claim in the chain (usually one), one
        existence check of the end of the chain when it is live, and a create to take over.
        """
        root = self.root_uri(info)
        chain: list[str] = []
        key = root
        blocker: ClaimRecord | None = None
        for _ in range(_MAX_STEPS):
            token = secrets.token_hex(8)
            record = self._record(token)
            if self.storage.create_exclusive(key, record.to_bytes()):
                return Claim(self, [*chain, key], record)
            existing = read_claim(self.storage, key)
            if existing is None:
                # Released between our create and our read: start again from the first claim.
                chain, key = [], root
                continue
            blocker = existing
            chain.append(key)
            successor = claim_successor(root, existing.token)
            if self._may_take_over(existing):
                key = successor  # create it; if another run did first, read theirs and walk on
                continue
            if self.storage.stat(successor) is None:
                return Blocked(existing, cooling_down=existing.retry_from is not None)
            key = successor
        assert blocker is not None
        log.warning("claim chain of %s longer than %d: treating it as held", info.uri, _MAX_STEPS)
        return Blocked(blocker, cooling_down=False)

    def _record(self, token: str, retry_from: datetime | None = None, *, expired: bool = False) -> ClaimRecord:
        holder = self.holder
        now = self._clock()
        expires = now if retry_from or expired else now + timedelta(seconds=self.expiry_s)
        return ClaimRecord(token, holder.run_id, holder.plan, holder.batch, holder.attempt, expires, retry_from)

    def _may_take_over(self, record: ClaimRecord) -> bool:
        holder = self.holder
        if record.run_id == holder.run_id:
            # An earlier attempt of this very batch is over, or declared dead, once a later one runs;
            # another plan of this run is an earlier planning (a cleared run plans afresh), fenced anyway.
            if record.plan != holder.plan:
                return True
            if record.batch == holder.batch and record.attempt < holder.attempt:
                return True
        if record.retry_from is not None:
            return not self.respect_cool_downs or holder.run_time >= record.retry_from
        return self._clock() >= record.expires_at


class Claim:
    """A held claim: renew it while converting, check it before recording, release it after."""

    def __init__(self, book: ClaimBook, chain: list[str], record: ClaimRecord) -> None:
        self._book = book
        # From the first claim to ours: predecessors are released oldest first.
        self._chain = chain
        self.record = record
        self._released = False
        self.lost_to: ClaimRecord | None = None
        # Renewals run in a worker thread while the document converts: one must never write the claim
        # back after the release removed it.
        self._writing = threading.Lock()

    @property
    def uri(self) -> str:
        return self._chain[-1]

    @property
    def _successor_uri(self) -> str:
        return claim_successor(self._chain[0], self.record.token)

    def still_held(self) -> bool:
        """Whether this claim is still ours: nobody created its successor (one small read).

        Read every time rather than trusted from our own renewals: Airflow's retry of the same batch
        takes over at once, while the attempt it replaces may only be frozen and about to resume.
        """
        if self.lost_to is not None or self._released:
            return False
        successor = read_claim(self._book.storage, self._successor_uri)
        if successor is not None:
            self.lost_to = successor
            return False
        return True

    def renew(self) -> bool:
        """Push the expiry out again; False when the claim was lost (nothing is written then)."""
        with self._writing:
            return self._renew()

    def _renew(self) -> bool:
        if not self.still_held():
            return False
        book = self._book
        record = book._record(self.record.token)
        try:
            book.storage.write_bytes_atomic(self.uri, record.to_bytes(), content_type="application/json")
        except StorageError as exc:
            # Not fatal: a later renewal may get through before the claim expires.
            log.warning("could not renew the claim %s: %s", self.uri, exc)
            return True
        self.record = record
        return True

    def release(self, retry_from: datetime | None = None) -> None:
        """Give the version back once its outcome is recorded (``retry_from``: leave a cool-down).

        A claim that was taken over is left alone: the chain belongs to the run that holds it now.
        Predecessors are deleted oldest first; a claim that took over stays behind, expired, because
        its existence is what fences the holder it replaced. The first claim of a chain is deleted.
        """
        with self._writing:
            self._release(retry_from)

    def _release(self, retry_from: datetime | None) -> None:
        if not self.still_held():
            return
        storage = self._book.storage
        own = read_claim(storage, self.uri)
        if own is None or own.token != self.record.token:
            # Not ours any more although nobody took it over (removed by hand): nothing to give back.
            self._released = True
            return
        if retry_from is not None:
            # Predecessors stay, so the chain still leads here until the cool-down is taken over.
            record = self._book._record(self.record.token, retry_from)
            storage.write_bytes_atomic(self.uri, record.to_bytes(), content_type="application/json")
        else:
            for uri in self._chain[:-1]:
                storage.delete(uri)
            if len(self._chain) == 1:
                storage.delete(self.uri)
            else:
                expired = self._book._record(self.record.token, expired=True)
                storage.write_bytes_atomic(self.uri, expired.to_bytes(), content_type="application/json")
        self._released = True


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def stale_claims(
    storage: Storage, claim_objects: Iterable[ObjectInfo], *, now: datetime, cutoff: datetime
) -> list[ObjectInfo]:
    """The claim objects among ``claim_objects`` that no run holds and no holder is fenced by any more.

    For retention (``olmocr_tasks.location.retention``), which lists the state once and passes the objects under
    ``claims/`` here. What accumulates without it: a claim whose holder died and whose document no
    run tried again, the expired key a take-over leaves behind when it releases (it fenced the holder
    it replaced), and cool-downs. Objects are grouped by document version (the first claim's key); one
    read each, no listing.

    * The **chain** (the first claim and the successors reached from it token by token) is removed
      whole, or not at all: only when its end, the current claim, is neither live (``expires_at``
      after ``now``) nor cooling down (``retry_from`` after ``now``), and no object of it changed
      since ``cutoff``. A live claim is never removed, nor anything leading to it: a run walking the
      chain from its first claim would otherwise miss the holder and claim the document again.
    * A key **off the chain** (the first claim was deleted by a release, so nothing leads to it) is
      removed on its own terms: settled and unchanged since ``cutoff``.

    Returned first claims first: deleting a chain's first claim makes the rest unreachable at once, so
    a run claiming the document meanwhile starts a fresh chain (new random tokens, new successor
    names) rather than walking into keys being deleted; a run that had read the first claim just before
    may still take over into a key no later run reaches, so that version can be converted twice, never
    recorded wrongly (the release of a take-over has the same window). ``cutoff`` (the retention period) is what
    stands between a removed take-over key and the holder it fenced: that holder would have to stay
    frozen for the whole period and then resume to record an outcome the take-over already recorded.
    """
    groups: dict[str, dict[str, ObjectInfo]] = defaultdict(dict)
    for info in claim_objects:
        root = first_claim_of(info.uri)
        if root is not None:
            groups[root][info.uri] = info
    doomed: list[ObjectInfo] = []
    for root, objects in sorted(groups.items()):
        records: dict[str, ClaimRecord] = {}
        for uri in objects:
            record = read_claim(storage, uri)
            if record is not None:  # gone meanwhile (released): nothing to remove
                records[uri] = record
        chain: list[str] = []
        key = root
        while key in records and key not in chain:
            chain.append(key)
            key = claim_successor(root, records[key].token)
        if chain and _settled(records[chain[-1]], now) and all(objects[uri].last_modified < cutoff for uri in chain):
            doomed += [objects[uri] for uri in chain]
        doomed += [
            objects[uri]
            for uri, record in records.items()
            if uri not in chain and _settled(record, now) and objects[uri].last_modified < cutoff
        ]
    return doomed


def _settled(record: ClaimRecord, now: datetime) -> bool:
    """Neither held (expired) nor cooling down: nothing a run waits for."""
    return record.expires_at <= now and (record.retry_from is None or record.retry_from <= now)
