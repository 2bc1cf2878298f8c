"""Claims: a document version is converted by one run at a time (olmOCR's worker locks, per document).

Before converting a version a run claims it in the output location's state with the storage layer's
create-if-absent write (``Storage.create_exclusive``: a hard link locally, ``If-None-Match: *`` on S3,
the primitive output-owner records use)::

    _state/<conv>/claims/<source-id>/<fingerprint>.claim                     the first claim
    _state/<conv>/claims/<source-id>/<fingerprint>.claim.after-<token>       took over the claim <token>

A claim record names its run, plan, batch and attempt, a random token and an expiry. Its holder
renews it while converting and deletes it once the outcome is recorded (one create and one delete per
document; no listing). A claim that is not renewed expires: its holder died (SIGKILL, a lost worker)
or froze. Another run then **takes it over by creating the successor key** named after the expired
claim's token, again create-if-absent, so of two runs taking over one expired claim exactly one wins,
on both backends, with no moment where the claim is absent and no compare-and-swap needed. The
current claim is the end of the chain (a key whose successor does not exist); chains grow only by
take-overs, and whoever releases deletes the whole chain, oldest first.

**Fencing.** A holder trusts its claim without asking storage for as long as its own renewal is
fresh (``LEASE_SHARE`` of the expiry, from before the write started: nobody may take over before the
expiry). Once that has lapsed (the process was frozen, storage refused the renewals), it trusts
nothing it cannot read: before writing outputs or recording an outcome it reads its own key (still its
token?) and checks that no successor exists. A late writer whose claim was taken over therefore
never records over the newer holder. A holder that lost its claim deletes nothing.

**Same run, later attempt.** A claim held by an earlier attempt of the same batch of the same plan is
taken over at once: Airflow (or a CLI rerun with the same run id) starts a later attempt only once
the earlier one is over or declared dead, and attempt fencing already ignores what the earlier one
reports.

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
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from olmocr_tasks.errors import StorageError
from olmocr_tasks.ledger import fingerprint, source_id
from olmocr_tasks.storage import ObjectInfo, Storage
from olmocr_tasks.uri import join_uri

log = logging.getLogger(__name__)

CLAIMS_DIR = "claims"
# A holder trusts its own claim without reading it back for this share of the expiry after each
# write started: the rest is the margin for clocks of other hosts running slightly ahead.
LEASE_SHARE = 0.75
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
        state_uri: str,
        holder: ClaimHolder,
        expiry_s: float,
        *,
        respect_cool_downs: bool = True,
        clock: Callable[[], datetime] = _now,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if expiry_s <= 0:
            raise ValueError(f"a claim expiry must be positive, not {expiry_s!r}")
        self.storage = storage
        self.holder = holder
        self.expiry_s = float(expiry_s)
        self.respect_cool_downs = respect_cool_downs
        self._folder = join_uri(state_uri, CLAIMS_DIR)
        self._clock = clock
        self._monotonic = monotonic

    @property
    def renew_every_s(self) -> float:
        return self.expiry_s / RENEWALS_PER_EXPIRY

    def root_uri(self, info: ObjectInfo) -> str:
        return join_uri(self._folder, source_id(info.uri), f"{fingerprint(info)}.claim")

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
            started = self._monotonic()
            record = self._record(token)
            if self.storage.create_exclusive(key, record.to_bytes()):
                return Claim(self, [*chain, key], record, started)
            raw = self.storage.read_bytes_or_none(key)
            if raw is None:
                # Released between our create and our read: start again from the first claim.
                chain, key = [], root
                continue
            existing = ClaimRecord.from_bytes(raw)
            blocker = existing
            chain.append(key)
            successor = _successor(root, existing.token)
            if self._may_take_over(existing):
                key = successor  # create it; if another run did first, read theirs and walk on
                continue
            if self.storage.stat(successor) is None:
                return Blocked(existing, cooling_down=existing.retry_from is not None)
            key = successor
        assert blocker is not None
        log.warning("claim chain of %s longer than %d: treating it as held", info.uri, _MAX_STEPS)
        return Blocked(blocker, cooling_down=False)

    def _record(self, token: str, retry_from: datetime | None = None) -> ClaimRecord:
        holder = self.holder
        expires = self._clock() if retry_from else self._clock() + timedelta(seconds=self.expiry_s)
        return ClaimRecord(token, holder.run_id, holder.plan, holder.batch, holder.attempt, expires, retry_from)

    def _may_take_over(self, record: ClaimRecord) -> bool:
        holder = self.holder
        same_batch = (record.run_id, record.plan, record.batch) == (holder.run_id, holder.plan, holder.batch)
        if same_batch and record.attempt < holder.attempt:
            # An earlier attempt of this very batch: over, or declared dead, once a later one runs.
            return True
        if record.retry_from is not None:
            return not self.respect_cool_downs or holder.run_time >= record.retry_from
        return self._clock() >= record.expires_at


class Claim:
    """A held claim: renew it while converting, check it before recording, release it after."""

    def __init__(self, book: ClaimBook, chain: list[str], record: ClaimRecord, written_at: float) -> None:
        self._book = book
        # From the first claim to ours: released oldest first, so a chain is never cut above its root.
        self._chain = chain
        self.record = record
        self._trusted_until = written_at + book.expiry_s * LEASE_SHARE
        # Once our own lease lapsed we read storage for every check from then on (see the module doc).
        self._lapsed = False
        self._released = False
        self.lost_to: ClaimRecord | None = None

    @property
    def uri(self) -> str:
        return self._chain[-1]

    def still_held(self) -> bool:
        """Whether this claim is still ours: from our own lease while fresh, else read back from storage."""
        if self.lost_to is not None or self._released:
            return False
        if not self._lapsed and self._book._monotonic() < self._trusted_until:
            return True
        self._lapsed = True
        storage = self._book.storage
        raw = storage.read_bytes_or_none(self.uri)
        current = ClaimRecord.from_bytes(raw) if raw is not None else None
        if current is None or current.token != self.record.token:
            self.lost_to = current or ClaimRecord("", "unknown", "", "", 0, self._book._clock())
            return False
        successor = _successor(self._chain[0], self.record.token)
        raw = storage.read_bytes_or_none(successor)
        if raw is not None:
            self.lost_to = ClaimRecord.from_bytes(raw)
            return False
        return True

    def renew(self) -> bool:
        """Push the expiry out again; False when the claim was lost (nothing is written then)."""
        if not self.still_held():
            return False
        book = self._book
        started = book._monotonic()
        record = book._record(self.record.token)
        try:
            book.storage.write_bytes_atomic(self.uri, record.to_bytes(), content_type="application/json")
        except StorageError as exc:
            # The lease runs out on its own; checks then read storage.
            log.warning("could not renew the claim %s: %s", self.uri, exc)
            return True
        self.record = record
        if not self._lapsed:
            self._trusted_until = started + book.expiry_s * LEASE_SHARE
        return True

    def release(self, retry_from: datetime | None = None) -> None:
        """Give the version back once its outcome is recorded (``retry_from``: leave a cool-down).

        A claim that was taken over is left alone: the chain belongs to the run that holds it now.
        """
        if not self.still_held():
            return
        storage = self._book.storage
        if retry_from is not None:
            # Predecessors stay (expired), so the chain still leads here; whoever takes over deletes it all.
            record = self._book._record(self.record.token, retry_from)
            storage.write_bytes_atomic(self.uri, record.to_bytes(), content_type="application/json")
        else:
            for uri in self._chain:
                storage.delete(uri)
        self._released = True


def _successor(root: str, token: str) -> str:
    return f"{root}.after-{token}"


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
