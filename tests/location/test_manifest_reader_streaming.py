"""The manifest reader streams: what it holds does not grow with a shard, and every read is bounded.

Shards are written by the real writer (``ManifestWriter``) with one shard per run, so a run of 20,000
entries is one shard of 20,000 lines. ``tracemalloc`` measures the Python allocations of a read
beyond what was allocated before it: iterating every entry, a page of 10 in the middle and a search
with ``contains`` cost the same over 20,000 entries as over 200 (the reader before issue 34 held the
decompressed shard and a list of its dicts: 134 MB to iterate this 20,000-entry shard, 52 MB for a
page of it). Damaged or hostile shards (a gzip bomb, a line of megabytes, endless blank lines, more
entries than the summary names) fail with ``ManifestFormatError`` while the reader's memory stays
bounded.
"""

from __future__ import annotations

import gzip
import json
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from olmocr_tasks.location.manifest import DocumentEntry, ManifestWriter
from olmocr_tasks.location.manifest_reader import (
    READ_LIMITS,
    ManifestFormatError,
    ManifestReader,
    ReadLimits,
    read_manifest,
)
from olmocr_tasks.storage.store import Storage
from tests.fixtures.manifests import manifest_header

T = TypeVar("T")
MIB = 1024 * 1024
# One shard holds the whole run, whatever its size.
ONE_SHARD = 1_000_000
PAGES = 40


def _entry(index: int, output: str) -> DocumentEntry:
    """A converted 40-page document (about 1 KB as a line); every 50th failed."""
    name = f"collection-{index // 1000:04d}/scan-{index:07d}"
    failed = index % 50 == 7
    return DocumentEntry(
        source=f"s3://archive/in/{name}.pdf",
        status="failed" if failed else "converted",
        error_class="corrupt" if failed else None,
        sha256=f"{index:064x}",
        pages=PAGES,
        input_tokens=1784 * PAGES,
        output_tokens=610 * PAGES,
        attempts=PAGES,
        outputs={"dolma": f"{output}/dolma/{name}.jsonl", "markdown": f"{output}/markdown/{name}.md"},
        page_latencies_s=[round(0.3 + ((index + page) % 97) / 100, 3) for page in range(PAGES)],
        accepted_attempt_histogram={"1": PAGES},
    )


def _publish(
    output: Path, entries: list[DocumentEntry] | Iterator[DocumentEntry], run_id: str = "run"
) -> ManifestReader:
    writer = ManifestWriter(Storage(), str(output), run_id, shard_entries=ONE_SHARD)
    for entry in entries:
        writer.add(entry)
    writer.commit(manifest_header(str(output), run_id))
    reader = read_manifest(Storage(), str(output), run_id)
    assert reader is not None
    return reader


def _traced_peak(call: Callable[[], T]) -> tuple[int, T]:
    """The peak of Python allocations while ``call`` runs, beyond what was allocated before it."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        result = call()
        return tracemalloc.get_traced_memory()[1] - before, result
    finally:
        tracemalloc.stop()


def _count(entries: Iterator[Any]) -> int:
    return sum(1 for _ in entries)


def test_what_the_reader_holds_does_not_grow_with_the_shard(tmp_path: Path) -> None:
    peaks: dict[int, dict[str, int]] = {}
    for size in (200, 20_000):
        output = tmp_path / f"out-{size}"
        reader = _publish(output, (_entry(index, str(output)) for index in range(size)))
        [shard] = reader.shard_uris("documents")
        iterated, count = _traced_peak(lambda reader=reader: _count(reader.iter_documents()))
        assert count == size
        middle = size // 2
        paged, page = _traced_peak(lambda reader=reader, middle=middle: reader.page(middle, 10))
        assert page == [_entry(index, str(output)).to_dict() for index in range(middle, middle + 10)]
        searched, hits = _traced_peak(lambda reader=reader, shard=shard: list(reader.read_shard(shard, "SCAN-0000123")))
        assert [number for number, _ in hits] == [123]
        peaks[size] = {"iterate": iterated, "page": paged, "search": searched}
        print(f"{size:,} entries in one shard of {Path(shard).stat().st_size:,} bytes: traced peaks {peaks[size]}")
    for read in ("iterate", "page", "search"):
        small, large = peaks[200][read], peaks[20_000][read]
        assert large <= 1.5 * small, (read, peaks)
        assert large < 2 * MIB, (read, peaks)


def test_read_shard_streams_the_lines_holding_the_text_with_their_positions(tmp_path: Path) -> None:
    output = tmp_path / "out"
    entries = [_entry(index, str(output)) for index in range(30)]
    # Names JSON writes as they are (ensure_ascii=False): a line separator, NEL, an eszett. Lines are
    # split on newlines only, so these entries keep their positions in every read.
    entries[4].source = "s3://archive/in/Straße/über\u2028zwei.pdf"
    entries[11].source = "s3://archive/in/next\x85line.pdf"
    reader = _publish(output, entries)
    [shard] = reader.shard_uris("documents")

    found = reader.read_shard(shard, "STRASSE")  # casefolded: ß matches SS
    assert isinstance(found, Iterator)
    assert [(number, entry["source"]) for number, entry in found] == [(4, entries[4].source)]
    assert [number for number, _ in reader.read_shard(shard, "scan-000002")] == list(range(20, 30))
    assert [number for number, _ in reader.read_shard(shard, "not in any line")] == []
    everything = list(reader.read_shard(shard))
    assert [number for number, _ in everything] == list(range(30))
    assert [entry for _, entry in everything] == [entry.to_dict() for entry in entries]
    assert [doc["source"] for doc in reader.iter_documents()] == [entry.source for entry in entries]
    assert reader.page(11, 2) == [entries[11].to_dict(), entries[12].to_dict()]


# ------------------------------------------------------------------------------ damaged shards


def _one_shard(tmp_path: Path, entries: int = 3) -> tuple[ManifestReader, Path]:
    output = tmp_path / "out"
    reader = _publish(output, [_entry(index, str(output)) for index in range(entries)])
    [shard] = reader.shard_uris("documents")
    return reader, Path(shard)


def _repeated_members(text: bytes, times: int) -> bytes:
    """``text`` ``times`` over as a gzip stream of identical members: a bomb of any size in a few KB."""
    member = gzip.compress(text, compresslevel=9, mtime=0)
    return member * times


def _fails_bounded(read: Callable[[], Any], match: str, bound: int) -> int:
    """``read`` raises ``ManifestFormatError`` matching ``match``, its traced peak under ``bound``."""

    def attempt() -> None:
        with pytest.raises(ManifestFormatError, match=match):
            read()

    peak, _ = _traced_peak(attempt)
    assert peak < bound, peak
    return peak


def test_a_gzip_bomb_stops_at_the_decompressed_bound(tmp_path: Path) -> None:
    reader, shard = _one_shard(tmp_path)
    limit = READ_LIMITS.shard_bytes
    # 1 MiB lines of spaces (blank lines, skipped) until just past the bound: about 1 MB compressed.
    bomb = _repeated_members(b" " * (MIB - 1) + b"\n", limit // MIB + 1)
    shard.write_bytes(bomb)
    assert len(bomb) < 2 * MIB
    peak = _fails_bounded(
        lambda: _count(reader.iter_documents()), f"decompresses to more than {limit:,} bytes", 8 * MIB
    )
    print(f"a {len(bomb):,}-byte shard decompressing past {limit:,} bytes: failed holding at most {peak:,} bytes")
    # Zeros without a newline: the first line is longer than a line may be.
    shard.write_bytes(_repeated_members(b"\0" * MIB, 2 * READ_LIMITS.line_bytes // MIB))
    _fails_bounded(
        lambda: reader.page(0, 1), f"longer than {READ_LIMITS.line_bytes:,} bytes", 4 * READ_LIMITS.line_bytes
    )
    # Newlines only: blank lines are skipped, but not without end.
    shard.write_bytes(gzip.compress(b"\n" * (READ_LIMITS.blank_lines + 1)))
    _fails_bounded(lambda: _count(reader.iter_documents()), "more than 10,000 blank lines", MIB)


def test_a_shard_past_its_compressed_bound_or_its_entry_count_fails(tmp_path: Path) -> None:
    reader, shard = _one_shard(tmp_path)
    strict = ManifestReader.open(Storage(), reader.uri, limits=ReadLimits(shard_bytes=200))
    assert shard.stat().st_size > 200
    with pytest.raises(ManifestFormatError, match="larger than 200 bytes compressed"):
        _count(strict.iter_documents())
    # One line more than the summary names: damaged, whatever the line holds.
    lines = gzip.decompress(shard.read_bytes()).splitlines(keepends=True)
    shard.write_bytes(gzip.compress(b"".join([*lines, lines[0]])))
    with pytest.raises(ManifestFormatError, match="more than the 3 entries its summary names"):
        _count(reader.iter_documents())
    assert len(reader.page(0, 3)) == 3  # a page before the extra line does not read that far
    shard.write_bytes(b"not gzip at all")
    with pytest.raises(ManifestFormatError, match="is not gzip"):
        reader.page(0, 1)
    shard.write_bytes(gzip.compress(lines[0] + b'{"source": \n' + lines[2]))
    with pytest.raises(ManifestFormatError, match="entry 1 is not JSON"):
        _count(reader.iter_documents())
    # A truncated stream (the end of the gzip member missing).
    whole = gzip.compress(b"".join(lines))
    shard.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ManifestFormatError, match="is not gzip"):
        _count(reader.iter_documents())


def test_an_entry_longer_than_a_line_may_be_fails_with_a_clear_message(tmp_path: Path) -> None:
    output = tmp_path / "out"
    entries = [_entry(index, str(output)) for index in range(3)]
    entries[1].status, entries[1].error = "failed", "x" * (READ_LIMITS.line_bytes + 1)
    reader = _publish(output, entries)
    assert reader.page(0, 1) == [entries[0].to_dict()]  # the lines before it still read
    message = f"entry 1 is longer than {READ_LIMITS.line_bytes:,} bytes"
    _fails_bounded(lambda: _count(reader.iter_documents()), message, 4 * READ_LIMITS.line_bytes)
    with pytest.raises(ManifestFormatError, match=message):
        list(reader.read_shard(reader.shard_uris("documents")[0], "scan-"))


def test_the_summary_read_is_bounded(tmp_path: Path) -> None:
    reader, _ = _one_shard(tmp_path)
    size = Path(reader.uri).stat().st_size
    assert ManifestReader.open(Storage(), reader.uri, limits=ReadLimits(summary_bytes=size)).summary == reader.summary
    with pytest.raises(ManifestFormatError, match=f"larger than {size - 1:,} bytes"):
        ManifestReader.open(Storage(), reader.uri, limits=ReadLimits(summary_bytes=size - 1))
    # Not JSON, or JSON but not an object.
    Path(reader.uri).write_text("[1, 2]")
    with pytest.raises(ManifestFormatError, match="expected a JSON object"):
        ManifestReader.open(Storage(), reader.uri)
    Path(reader.uri).write_bytes(zlib.compress(json.dumps(reader.summary).encode()))
    with pytest.raises(ManifestFormatError, match="not JSON"):
        read_manifest(Storage(), str(tmp_path / "out"), "run")
