"""The claim guard (``olmocr_tasks.run.claim_guard``) as a unit, on a local output location.

The claims themselves (take-over races, S3, costs) are ``tests/location/test_claims.py``'s; whole runs
frozen and taken over are ``tests/run/test_claimed_conversion.py``'s. Here: what one document's guard
does around its body. The wall clock claims compare expiries with is injected; the renewal period
(a quarter of the expiry) is real time, so the expiries are short where renewals are awaited.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from olmocr_tasks.location.claims import Blocked, Claim, ClaimBook, ClaimHolder, ClaimRecord, read_claim
from olmocr_tasks.location.documents import SourceDocument
from olmocr_tasks.location.layout import OutputLocation
from olmocr_tasks.location.manifest import SKIP_CLAIMED, SKIP_RETRY_LATER, DocumentEntry
from olmocr_tasks.run.claim_guard import ClaimGuard, ClaimLost, ClaimRules
from olmocr_tasks.storage.store import Storage
from tests.location.test_claims import T0, Clocks, document

# Renewed every 0.05 s of real time.
SHORT_EXPIRY = 0.2
# Never renewed within a test: a holder that stays frozen past its expiry on the injected clock.
LONG_EXPIRY = 600.0


class Location:
    """One output location's claims, for runs that share the injected clock."""

    def __init__(self, tmp_path: Path) -> None:
        self.storage = Storage()
        self.output = tmp_path / "out"
        self.state = OutputLocation(str(self.output)).state("k")
        self.clocks = Clocks()
        self.source = SourceDocument(document(str(tmp_path / "in" / "a.pdf")), "a")

    def book(self, run_id: str, expiry_s: float) -> ClaimBook:
        holder = ClaimHolder(run_id, "p", "b00000", 1, T0)
        return ClaimBook(self.storage, self.state, holder, expiry_s, clock=lambda: self.clocks.wall)

    def guard(self, rules: ClaimRules | None, run_id: str) -> ClaimGuard:
        return ClaimGuard(rules, self.source, run_id)

    def claim_record(self, book: ClaimBook) -> ClaimRecord | None:
        return read_claim(self.storage, book.root_uri(self.source.info))


@pytest.fixture
def place(tmp_path: Path) -> Location:
    return Location(tmp_path)


def entry(status: str) -> DocumentEntry:
    return DocumentEntry(source="a.pdf", status=status)


async def until(condition: Callable[[], bool]) -> None:
    """Wait for a background step (a renewal) to show; the test's own timeout bounds it."""
    while not condition():
        await asyncio.sleep(0.01)


def test_the_guard_acquires_on_entering_renews_while_held_and_releases_on_leaving(place: Location) -> None:
    book = place.book("holder", SHORT_EXPIRY)

    async def scenario() -> None:
        async with place.guard(ClaimRules(book), "holder") as guard:
            assert guard.blocked is None
            acquired = place.claim_record(book)
            assert acquired is not None and acquired.run_id == "holder"
            assert isinstance(place.book("other", SHORT_EXPIRY).acquire(place.source.info), Blocked)

            place.clocks.advance(SHORT_EXPIRY / 2)
            renewed_until = place.clocks.wall + timedelta(seconds=SHORT_EXPIRY)
            await until(lambda: getattr(place.claim_record(book), "expires_at", None) == renewed_until)
            await guard.fence()  # still ours: writing may go ahead
            guard.finished(entry("converted"))
        assert place.claim_record(book) is None, "a released claim leaves nothing behind"
        assert isinstance(place.book("other", SHORT_EXPIRY).acquire(place.source.info), Claim)

    asyncio.run(scenario())


def test_a_claim_taken_over_fences_the_write_and_its_late_holder_releases_nothing(place: Location) -> None:
    async def scenario() -> None:
        async with place.guard(ClaimRules(place.book("frozen", LONG_EXPIRY)), "frozen") as guard:
            place.clocks.advance(LONG_EXPIRY + 1)  # frozen past its expiry: never renewed
            taker = place.book("taker", LONG_EXPIRY).acquire(place.source.info)
            assert isinstance(taker, Claim)
            with pytest.raises(ClaimLost) as lost:
                await guard.fence()
            assert lost.value.run_id == "taker"
            guard.finished(entry("failed"))
        assert taker.still_held(), "the late holder gave back nothing of the chain the taker holds now"
        blocked = place.book("third", LONG_EXPIRY).acquire(place.source.info)
        assert isinstance(blocked, Blocked) and blocked.record.run_id == "taker"

    asyncio.run(scenario())


def test_a_superseded_attempt_is_fenced_in_its_own_run_s_name(place: Location) -> None:
    started_again = False
    rules = ClaimRules(place.book("run", LONG_EXPIRY), superseded=lambda: started_again)

    async def scenario() -> None:
        nonlocal started_again
        async with place.guard(rules, "run") as guard:
            await guard.fence()
            started_again = True
            with pytest.raises(ClaimLost) as lost:
                await guard.fence()
            assert lost.value.run_id == "run"

    asyncio.run(scenario())


def test_a_document_another_run_holds_is_left_for_later_and_its_claim_kept(place: Location) -> None:
    holder = place.book("holder", LONG_EXPIRY).acquire(place.source.info)
    assert isinstance(holder, Claim)

    async def scenario() -> DocumentEntry:
        async with place.guard(ClaimRules(place.book("late", LONG_EXPIRY)), "late") as guard:
            assert guard.blocked is not None
            await guard.fence()  # holds nothing, so nothing to lose
            return guard.left_for_later({"task": "convert"})

    skipped = asyncio.run(scenario())
    assert (skipped.status, skipped.skip_reason, skipped.claimed_by) == ("skipped", SKIP_CLAIMED, "holder")
    assert skipped.task == {"task": "convert"} and skipped.retry_from is None
    assert holder.still_held()


def test_a_failure_leaves_a_cool_down_until_retry_from_and_anything_else_gives_the_claim_back(
    place: Location,
) -> None:
    retry_from = T0 + timedelta(hours=1)

    async def convert(run_id: str, outcome: DocumentEntry | None) -> None:
        rules = ClaimRules(place.book(run_id, LONG_EXPIRY), retry_from=retry_from)
        async with place.guard(rules, run_id) as guard:
            assert guard.blocked is None
            if outcome is None:
                raise ConnectionError("the server went away before an outcome")
            guard.finished(outcome)

    with pytest.raises(ConnectionError):
        asyncio.run(convert("outage", None))
    asyncio.run(convert("converted", entry("converted")))
    asyncio.run(convert("failing", entry("failed")))

    async def next_run() -> DocumentEntry:
        async with place.guard(ClaimRules(place.book("next", LONG_EXPIRY)), "next") as guard:
            assert guard.blocked is not None and guard.blocked.cooling_down
            return guard.left_for_later(None)

    later = asyncio.run(next_run())
    assert (later.skip_reason, later.claimed_by, later.retry_from) == (
        SKIP_RETRY_LATER,
        "failing",
        retry_from.isoformat(),
    )


def test_without_claims_the_guard_holds_and_fences_nothing(place: Location) -> None:
    async def scenario() -> None:
        async with place.guard(None, "run") as guard:
            assert guard.blocked is None
            await guard.fence()
            guard.finished(entry("failed"))

    asyncio.run(scenario())
    assert not place.output.exists(), "nothing was claimed, so nothing was written"
