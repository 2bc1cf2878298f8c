"""Claims (``olmocr_tasks.location.claims``) on a local folder and on S3 (moto's server over HTTP).

Time is injected (the wall clock claimants compare expiries with), so expiry is stated, not slept through.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from olmocr_tasks.location.claims import Blocked, Claim, ClaimBook, ClaimHolder
from olmocr_tasks.location.layout import ConversionState, OutputLocation
from olmocr_tasks.location.ledger import Ledger
from olmocr_tasks.location.retention import clean_output
from olmocr_tasks.run.pipeline import run_conversion
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.storage.store import ObjectInfo, Storage
from olmocr_testkit import pdfgen
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.reader_view import quick_settings

T0 = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
EXPIRY = 60.0


class Clocks:
    """The wall clock, moved by ``advance``."""

    def __init__(self) -> None:
        self.wall = T0

    def advance(self, seconds: float) -> None:
        self.wall += timedelta(seconds=seconds)


# Where the claims go: a storage and one conversion key's state under an output location.
Place = tuple[Storage, ConversionState]


@pytest.fixture(params=["local", "s3"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    """A storage and the state folder claims go under, on each backend."""
    if request.param == "local":
        return Storage(), OutputLocation(str(tmp_path / "out")).state("k")
    options = request.getfixturevalue("s3_storage_options")
    bucket = request.getfixturevalue("s3_bucket")
    return Storage(options), OutputLocation(f"s3://{bucket}/out").state("k")


def document(uri: str = "s3://in/a.pdf") -> ObjectInfo:
    return ObjectInfo(uri=uri, size=1234, etag="abc", last_modified=T0)


def book_for(
    place: Place,
    clocks: Clocks,
    run_id: str,
    *,
    attempt: int = 1,
    run_time: datetime = T0,
    respect_cool_downs: bool = True,
    plan: str = "p",
    batch: str = "b00000",
) -> ClaimBook:
    storage, state = place
    return ClaimBook(
        storage,
        state,
        ClaimHolder(run_id, plan, batch, attempt, run_time),
        EXPIRY,
        respect_cool_downs=respect_cool_downs,
        clock=lambda: clocks.wall,
    )


def held(result: Claim | Blocked) -> Claim:
    assert isinstance(result, Claim), result
    return result


def blocked(result: Claim | Blocked) -> Blocked:
    assert isinstance(result, Blocked), result
    return result


def test_a_live_claim_blocks_other_runs_and_its_release_frees_the_document(place: Place) -> None:
    clocks = Clocks()
    info = document()
    claim = held(book_for(place, clocks, "left").acquire(info))
    clocks.advance(EXPIRY / 2)
    other = blocked(book_for(place, clocks, "right").acquire(info))
    assert (other.record.run_id, other.cooling_down) == ("left", False)
    assert claim.still_held()
    claim.release()
    assert place[0].stat(claim.uri) is None, "a released claim leaves nothing behind"
    assert not claim.still_held()
    held(book_for(place, clocks, "right").acquire(info)).release()


def test_renewal_keeps_a_long_conversion_claimed(place: Place) -> None:
    clocks = Clocks()
    info = document()
    claim = held(book_for(place, clocks, "long").acquire(info))
    for _ in range(8):  # two whole expiries, renewed every quarter
        clocks.advance(EXPIRY / 4)
        assert claim.renew()
        assert isinstance(book_for(place, clocks, "other").acquire(info), Blocked)
    record = json.loads(place[0].read_bytes(claim.uri))
    assert datetime.fromisoformat(record["expires_at"]) == clocks.wall + timedelta(seconds=EXPIRY)
    assert (record["run_id"], record["attempt"]) == ("long", 1)


def test_an_expired_claim_is_taken_over_once_and_its_late_holder_is_fenced(place: Place) -> None:
    clocks = Clocks()
    info = document()
    dead = held(book_for(place, clocks, "dead").acquire(info))
    clocks.advance(EXPIRY + 1)  # never renewed: its holder died or froze

    # Several runs race to take it over at once: exactly one wins, the others see it held by the winner.
    results: dict[str, Claim | Blocked] = {}

    def take(run_id: str) -> None:
        results[run_id] = book_for(place, clocks, run_id).acquire(info)

    threads = [threading.Thread(target=take, args=(f"taker-{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [run_id for run_id, result in results.items() if isinstance(result, Claim)]
    assert len(winners) == 1, results
    (winner,) = winners
    assert {result.record.run_id for result in results.values() if isinstance(result, Blocked)} <= {winner}

    # The frozen holder comes back and reads its claim's successor: replaced.
    assert not dead.still_held()
    assert dead.lost_to is not None and dead.lost_to.run_id == winner
    assert not dead.renew()
    dead.release()  # deletes nothing: the chain is the winner's now
    assert held(results[winner]).still_held()
    assert isinstance(book_for(place, clocks, "late").acquire(info), Blocked)

    held(results[winner]).release()
    # The first claim is gone, the take-over stays behind (expired): the dead holder, seen afresh,
    # is still fenced even once a new run has claimed the document again.
    fresh = held(book_for(place, clocks, "fresh").acquire(info))
    assert fresh.still_held()
    revived = Claim(book_for(place, clocks, "dead"), [dead.uri], dead.record)
    assert not revived.still_held() and revived.lost_to is not None and revived.lost_to.run_id == winner
    revived.release()
    assert fresh.still_held() and place[0].stat(fresh.uri) is not None


def test_a_later_attempt_of_the_same_batch_takes_over_at_once(place: Place) -> None:
    clocks = Clocks()
    info = document()
    first = held(book_for(place, clocks, "run", attempt=1).acquire(info))
    # Another batch or another run must wait for the expiry; the retry of this batch need not.
    assert isinstance(book_for(place, clocks, "run", attempt=2, batch="b00001").acquire(info), Blocked)
    retry = held(book_for(place, clocks, "run", attempt=2).acquire(info))
    # The first attempt, frozen rather than dead, finds itself replaced before its expiry.
    assert not first.still_held()
    assert retry.renew() and retry.still_held()
    # A cleared run plans afresh under a new plan id: its convert tasks take over the old plan's claims.
    replanned = held(book_for(place, clocks, "run", plan="p2").acquire(info))
    assert not retry.still_held() and replanned.still_held()


def test_a_failed_document_cools_down_for_runs_that_respect_it(place: Place) -> None:
    clocks = Clocks()
    info = document()
    hour = timedelta(hours=1)
    failing = held(book_for(place, clocks, "scheduled-10", run_time=T0).acquire(info))
    failing.release(retry_from=T0 + hour)
    clocks.advance(120)
    # A run planned in the same interval (a concurrent re-drive) is turned away until the next one.
    cooling = blocked(book_for(place, clocks, "backfill", run_time=T0 + hour / 2).acquire(info))
    assert cooling.cooling_down and cooling.record.retry_from == T0 + hour
    assert cooling.record.run_id == "scheduled-10"
    # A run naming the document ignores the cool-down; so does the next scheduled run.
    held(book_for(place, clocks, "rest", run_time=T0, respect_cool_downs=False).acquire(info)).release()
    failing_again = held(book_for(place, clocks, "scheduled-10b", run_time=T0).acquire(info))
    failing_again.release(retry_from=T0 + hour)
    held(book_for(place, clocks, "scheduled-11", run_time=T0 + hour).acquire(info)).release()


def test_claims_are_per_document_version(place: Place) -> None:
    clocks = Clocks()
    old = document()
    new = ObjectInfo(uri=old.uri, size=99, etag="def", last_modified=T0 + timedelta(minutes=1))
    held(book_for(place, clocks, "a").acquire(old))
    # A re-upload is a new version: another run converts it while the old one is still claimed.
    held(book_for(place, clocks, "b").acquire(new))
    held(book_for(place, clocks, "c").acquire(document("s3://in/other.pdf")))


def test_an_uncontended_claim_costs_one_create_one_delete_and_small_reads_on_s3(
    s3_fault_proxy: Any, s3_bucket: str, tmp_path: Path
) -> None:
    clocks = Clocks()
    storage = Storage(s3_fault_proxy.storage_options)
    book = ClaimBook(
        storage,
        OutputLocation(f"s3://{s3_bucket}/out").state("k"),
        ClaimHolder("run", "p", "b", 1, T0),
        EXPIRY,
        clock=lambda: clocks.wall,
    )
    before = len(s3_fault_proxy.requests)
    claim = held(book.acquire(document()))
    assert claim.still_held()  # the fence before recording: its successor does not exist
    claim.release()
    requests = s3_fault_proxy.requests[before:]
    writes = sorted(request.method for request in requests if request.method != "GET")
    assert writes == ["DELETE", "PUT"], requests
    # Reads: the fence (successor absent), then the release's check (successor absent, own token there).
    assert sum(request.method == "GET" for request in requests) == 3, requests


def test_retention_removes_claims_no_run_holds_and_never_a_live_one(place: Place) -> None:
    """``clean`` removes what dead runs and take-overs leave behind; live and cooling-down claims stay.

    The claims' clock runs a month ahead of the storage's, so retention sees the objects as old
    (LastModified is the storage's) while the clock decides which claims are live.
    """
    storage, state = place
    output = state.uri.rsplit("/_state/", 1)[0]
    clocks = Clocks()
    clocks.wall = datetime.now(UTC) + timedelta(days=30)
    docs = {name: document(f"s3://in/{name}.pdf") for name in ("dead", "taken", "held", "live", "cool")}

    def claim(run_id: str, name: str) -> Claim | Blocked:
        return book_for(place, clocks, run_id).acquire(docs[name])

    def left() -> set[str]:
        return {info.uri for info in storage.list_objects(f"{state.uri}/claims")}

    held(claim("dead", "dead"))  # its holder dies: never renewed, never released
    frozen = held(claim("frozen", "taken"))  # its holder freezes and is taken over
    held(claim("stuck", "held"))  # dies too, but is taken over by a run still converting
    clocks.advance(EXPIRY + 1)
    taker = held(claim("taker", "taken"))
    taker.release()  # deletes the first claim, leaves its own key behind: that key fences ``frozen``
    assert not frozen.still_held()
    holding = held(claim("holding", "held"))
    live = held(claim("live", "live"))
    cooling = held(claim("cooling", "cool"))
    cooling.release(retry_from=clocks.wall + timedelta(hours=1))
    book = book_for(place, clocks, "anyone")
    roots = {name: book.root_uri(info) for name, info in docs.items()}
    assert left() == {roots["dead"], taker.uri, roots["held"], holding.uri, live.uri, cooling.uri}

    # Nothing changed within a retention period longer than the claims' age: nothing goes.
    assert clean_output(output, storage, older_than=timedelta(days=60), now=clocks.wall).claims == 0
    report = clean_output(output, storage, older_than=timedelta(days=7), now=clocks.wall)
    # The dead run's claim and the take-over's leftover key go; the live claim, the chain leading to
    # the run converting ``held`` (its expired first claim included) and the cool-down stay.
    assert report.claims == 2 and report.objects == 2, report
    assert left() == {roots["held"], holding.uri, live.uri, cooling.uri}
    assert blocked(claim("new", "held")).record.run_id == "holding"
    assert blocked(claim("new", "live")).record.run_id == "live"
    assert blocked(claim("new", "cool")).cooling_down

    # Once every claim has run out (the holders died, the cool-down passed), all of it goes.
    assert clean_output(output, storage, older_than=timedelta(days=7), now=clocks.wall + timedelta(hours=2)).claims == 4
    assert left() == set()
    assert all(isinstance(claim(f"next-{name}", name), Claim) for name in docs)


def test_what_claims_cost_per_document_in_a_counted_run_on_s3(
    tmp_path: Path, standin: StandinServer, s3_fault_proxy: Any, s3_bucket: str
) -> None:
    """Every storage request of a real run to an S3 output, counted at a proxy: claims' share per document.

    Uncontended, each document's claim costs one create (a conditional PUT), one delete and three
    small reads of claim keys (the fence before recording reads the successor key, normally absent;
    the release reads it again and checks its own token), plus the engine's check that no later
    attempt of its batch has started (one HEAD). A document another run holds costs the refused
    create, one read of the holder's claim and one HEAD of its successor. No listing: claims never list.
    """
    docs = 6
    inbox = tmp_path / "in"
    for number in range(docs):
        pdfgen.write_pdf(inbox / f"d{number}.pdf", pdfgen.text_pdf(1, doc_id=180 + number))
    storage = Storage(s3_fault_proxy.storage_options)
    output = f"s3://{s3_bucket}/counted"
    # Claims that outlast the run: a loaded machine must not add renewals (a PUT each) to the count.
    request = RunRequest(str(inbox), output, "counted", settings=quick_settings(standin.url), claim_expiry_s=3600.0)
    # One more document is held by another run that is converting it: this run leaves it for later.
    taken = inbox / "taken.pdf"
    pdfgen.write_pdf(taken, pdfgen.text_pdf(1, doc_id=180 + docs))
    state = Ledger(output, storage, request.conversion_key).state
    other = ClaimBook(storage, state, ClaimHolder("other", "p", "b", 1, T0), 600.0)
    other_claim = held(other.acquire(Storage().stat(str(taken))))
    taken_claim = unquote(other_claim.uri.split("/counted/", 1)[1])

    before = len(s3_fault_proxy.requests)
    manifest, _ = run_conversion(request, storage)
    statuses = sorted((doc.status, doc.claimed_by) for doc in manifest.documents)
    assert statuses == [("converted", None)] * docs + [("skipped", "other")], statuses
    requests = [(r.method, unquote(r.target.split("?")[0])) for r in s3_fault_proxy.requests[before:]]
    claims = Counter(method for method, path in requests if "/claims/" in path and taken_claim not in path)
    blocked_on = Counter(method for method, path in requests if taken_claim in path)
    fences = sum(method == "HEAD" and path.endswith("/try-0002/started") for method, path in requests)
    lists = sum("list-type=2" in r.target for r in s3_fault_proxy.requests[before:] if "/claims" in unquote(r.target))
    print(
        f"\n{len(requests)} storage requests for {docs} converted one-page documents and one left for later; "
        f"claims per converted document: {dict((m, n / docs) for m, n in claims.items())}, "
        f"later-attempt checks {fences / docs}; for the one held by another run: {dict(blocked_on)}"
    )
    assert claims == Counter({"PUT": docs, "GET": 3 * docs, "DELETE": docs}), claims
    assert fences == docs and lists == 0
    # Held by another run: the refused create, a read of the holder's claim, a HEAD of its successor.
    assert blocked_on == Counter({"PUT": 1, "GET": 1, "HEAD": 1}), blocked_on
