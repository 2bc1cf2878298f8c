"""Claims through the conversion engine (issue 33): a long document keeps its claim, a late writer records nothing.

``tests/location/test_claims.py`` shows the claim objects' rules; these show that the engine follows
them: it renews a claim for as long as the document converts (so a run longer than the expiry is never
taken over), and a run frozen past the expiry, whose claim another run took over meanwhile, writes no
output and records no outcome when it resumes. Each page is held by the stand-in (its "slow" fault)
until the test has seen what it waits for, so no step depends on how fast a loaded machine is.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from olmocr_tasks.location.claims import Blocked, Claim, ClaimBook, ClaimHolder, ClaimRecord
from olmocr_tasks.location.ledger import Ledger
from olmocr_tasks.run.pipeline import ConvertedSources, convert_sources
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.storage.store import ObjectInfo, Storage
from olmocr_testkit import pdfgen
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.cli_process import FAST_CLI, start_cli
from tests.fixtures.client import requests_for
from tests.fixtures.manifests import load_whole
from tests.fixtures.plans import plan_held_whole
from tests.fixtures.reader_view import quick_settings

T0 = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
# Seconds (of the injected clock) a claim lasts unrenewed; the engine renews every quarter of it, in real time.
EXPIRY_S = 0.4
HELD_S = 3600  # the stand-in holds a "slow" page this long, or until the test sets slow_s to 0


def _wait(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _record(storage: Storage, uri: str) -> ClaimRecord | None:
    raw = storage.read_bytes_or_none(uri)
    return None if raw is None else ClaimRecord.from_bytes(raw)


def _outputs(output: Path) -> list[Path]:
    """What a conversion writes for readers (Dolma, markdown), as opposed to state, run folders and manifests."""
    return [
        path
        for path in output.rglob("*")
        if path.is_file() and path.relative_to(output).parts[0] in ("dolma", "markdown")
    ]


class WallClock:
    """The claims' clock, moved by the test: a claim expires when the test says so, not when the machine is slow."""

    def __init__(self) -> None:
        self.now = T0
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self.now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += timedelta(seconds=seconds)


def test_a_document_converting_for_many_expiries_keeps_its_claim(tmp_path: Path, standin: StandinServer) -> None:
    inbox, output = tmp_path / "inbox", tmp_path / "out"
    pdfgen.write_pdf(inbox / "long.pdf", pdfgen.text_pdf(1, doc_id=91))
    standin.configure(always={"91:1": "slow"}, slow_s=HELD_S)
    storage = Storage()
    settings = quick_settings(standin.url, read_timeout_s=HELD_S, hedge_requests=False)
    request = RunRequest(input_uri=str(inbox), output_uri=str(output), run_id="long", settings=settings)
    (source,) = plan_held_whole(request, storage).sources
    state = Ledger(str(output), storage, request.conversion_key).state
    clock = WallClock()

    def book(run_id: str) -> ClaimBook:
        return ClaimBook(storage, state, ClaimHolder(run_id, "p", "b", 1, T0), EXPIRY_S, clock=clock)

    holder = book("long")
    claim_uri = holder.root_uri(source.info)
    converted: list[ConvertedSources] = []
    worker = threading.Thread(
        target=lambda: converted.append(asyncio.run(convert_sources(request, storage, [source], claims=holder)))
    )
    worker.start()
    try:
        _wait(lambda: requests_for(standin, 91, 1) != [], "the page's request (the claim is held by then)")
        for _ in range(5):
            # The claim's clock jumps far past the expiry: only a renewal since keeps the claim live.
            clock.advance(10 * EXPIRY_S)
            _wait(
                lambda: (record := _record(storage, claim_uri)) is not None and record.expires_at > clock(),
                "the engine to renew the claim past the jump of its clock",
            )
            other = book("other").acquire(source.info)
            assert isinstance(other, Blocked), "another run took the claim of a document still converting"
            assert other.record.run_id == "long"
    finally:
        standin.configure(slow_s=0)
        worker.join(timeout=120)
    (result,) = converted
    (entry,) = result.entries
    assert (entry.status, entry.claimed_by) == ("converted", None)
    assert Ledger(str(output), storage, request.conversion_key).status(source.info) == "done"
    assert [path.name for path in _outputs(output)] and storage.stat(claim_uri) is None, (
        "outputs written, claim given back"
    )


def test_a_run_frozen_past_its_claim_expiry_and_taken_over_writes_no_output_and_records_nothing(
    tmp_path: Path, standin: StandinServer
) -> None:
    """A real CLI process, stopped with SIGSTOP while its page is at the server, as a frozen VM or a GC pause."""
    inbox, output = tmp_path / "inbox", tmp_path / "out"
    pdfgen.write_pdf(inbox / "frozen.pdf", pdfgen.text_pdf(1, doc_id=92))
    standin.configure(always={"92:1": "slow"}, slow_s=HELD_S)
    process = start_cli(
        "convert", str(inbox), str(output), "--server", standin.url, "--run-id", "frozen", *FAST_CLI,
        "--read-timeout", str(HELD_S), "--no-hedging", "--claim-expiry", "2", "--target-longest-image-dim", "512",
        log=tmp_path / "frozen.log",
    )  # fmt: skip
    storage = Storage()
    # The CLI's conversion key (its model, 512-pixel renders): where its claims and records go.
    request = RunRequest(str(inbox), str(output), "frozen", settings=quick_settings(standin.url))
    info: ObjectInfo = next(iter(storage.list_objects(str(inbox))))
    state = Ledger(str(output), storage, request.conversion_key).state
    taker_book = ClaimBook(storage, state, ClaimHolder("taker", "p", "b", 1, datetime.now(UTC)), 600)
    claim_uri = taker_book.root_uri(info)
    stopped = False
    try:
        _wait(lambda: requests_for(standin, 92, 1) != [] or process.poll() is not None, "the page's request")
        assert process.poll() is None, (tmp_path / "frozen.log").read_text()
        os.kill(process.pid, signal.SIGSTOP)
        stopped = True
        # Frozen, it renews nothing: its claim lapses at the expiry its last renewal wrote.
        held = _record(storage, claim_uri)
        assert held is not None and held.run_id == "frozen"
        time.sleep(max(0.0, (held.expires_at - datetime.now(UTC)).total_seconds()) + 0.1)
        taken = taker_book.acquire(info)
        assert isinstance(taken, Claim), f"the lapsed claim was not taken over: {taken}"
        os.kill(process.pid, signal.SIGCONT)
        stopped = False
        standin.configure(slow_s=0)  # the frozen run's page is answered: it has a result to write
        assert process.wait(timeout=120) == 0, (tmp_path / "frozen.log").read_text()
    finally:
        if stopped:
            os.kill(process.pid, signal.SIGCONT)
        if process.poll() is None:
            process.kill()
            process.wait()
    assert [record["outcome"] for record in requests_for(standin, 92, 1)] == ["slow"], "its page was answered"
    (doc,) = load_whole(str(output / "manifests" / "frozen.json"))["documents"]
    assert (doc["status"], doc["skip_reason"], doc["claimed_by"]) == ("skipped", "claimed", "taker")
    assert _outputs(output) == [], "the late writer wrote outputs over the run that took its claim"
    assert Ledger(str(output), storage, request.conversion_key).status(info) == "new", "it recorded an outcome"
    # It deleted nothing of the chain either: the taker still holds the document.
    assert taken.still_held() and storage.stat(taken.uri) is not None
