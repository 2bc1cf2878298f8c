"""State records are read back bounded (``olmocr_tasks.location.records``): one past
``OLMOCR_MAX_RECORD_BYTES`` is a damaged record, never read whole.

Each planted record is valid JSON padded with spaces past the bound, so a reader that read it whole
would accept it; the bounded reader reads at most one byte past the bound and refuses it.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from olmocr_tasks.core.errors import ConfigurationError
from olmocr_tasks.location.claims import Blocked, Claim, ClaimBook, ClaimHolder
from olmocr_tasks.location.layout import OutputLocation
from olmocr_tasks.location.ledger import Ledger, conversion_key
from olmocr_tasks.location.records import RecordTooLargeError, max_record_bytes, read_record
from olmocr_tasks.storage.store import ObjectInfo, Storage

CONV = conversion_key("allenai/olmOCR-2-7B-1025-FP8", "olmocr-v4-yaml", 1288)
T0 = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
BOUND = 4096


@pytest.fixture(autouse=True)
def small_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OLMOCR_MAX_RECORD_BYTES", str(BOUND))


def _padded(record: dict[str, object]) -> bytes:
    return json.dumps(record).encode() + b" " * (BOUND * 4)


def test_a_record_past_the_bound_is_a_typed_error(tmp_path: Path) -> None:
    small, large = tmp_path / "small.json", tmp_path / "large.json"
    small.write_bytes(b"{}")
    large.write_bytes(_padded({}))
    assert read_record(Storage(), str(small)) == b"{}"
    assert read_record(Storage(), str(tmp_path / "absent.json")) is None
    with pytest.raises(RecordTooLargeError, match=f"more than {BOUND:,} bytes .OLMOCR_MAX_RECORD_BYTES"):
        read_record(Storage(), str(large))


def test_the_bound_is_a_setting_with_a_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OLMOCR_MAX_RECORD_BYTES")
    assert max_record_bytes() == 1024 * 1024
    monkeypatch.setenv("OLMOCR_MAX_RECORD_BYTES", "lots")
    with pytest.raises(ConfigurationError, match="OLMOCR_MAX_RECORD_BYTES must be a number of bytes"):
        max_record_bytes()


def test_an_oversized_content_record_is_not_trusted(tmp_path: Path) -> None:
    """A planted content record would make a document "already converted" into outputs of the planter's choosing."""
    out = str(tmp_path / "out")
    ledger = Ledger(out, Storage(), CONV)
    sha = "ab" * 32
    record = {"sha256": sha, "source": "s3://in/x.pdf", "outputs": {}, "run_id": "planted", "at": ""}
    path = Path(OutputLocation(out).state(CONV).content(sha))
    path.parent.mkdir(parents=True)
    path.write_bytes(json.dumps(record).encode())
    assert ledger.find_content(sha, verify_outputs=False) is not None  # the same record, small, is read
    path.write_bytes(_padded(record))
    assert ledger.find_content(sha, verify_outputs=False) is None


def test_an_oversized_claim_is_a_damaged_claim_that_is_taken_over(tmp_path: Path) -> None:
    storage = Storage()
    state = OutputLocation(str(tmp_path / "out")).state(CONV)
    info = ObjectInfo(uri="s3://in/a.pdf", size=1234, etag="abc", last_modified=T0)

    def book(run_id: str) -> ClaimBook:
        return ClaimBook(storage, state, ClaimHolder(run_id, "p", "b", 1, T0), 60.0, clock=lambda: T0)

    first = book("holder").acquire(info)
    assert isinstance(first, Claim)
    live = json.loads(Path(first.uri).read_bytes())
    live["expires_at"] = (T0 + timedelta(hours=1)).isoformat()
    Path(first.uri).write_bytes(json.dumps(live).encode())
    assert isinstance(book("other").acquire(info), Blocked)  # a live claim, small: respected

    Path(first.uri).write_bytes(_padded(live))
    taken = book("other").acquire(info)
    assert isinstance(taken, Claim) and taken.record.run_id == "other"
