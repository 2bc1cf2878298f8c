"""The one way to read a run manifest: its summary at once, its entries streamed shard by shard.

Every layout reads the same way: schema 3 summaries whose entries are in gzip JSON Lines shards
(``olmocr_tasks.location.manifest``), and schema 1 and 2 manifests with every entry inline. Readers (the CLI's
``manifest`` command, the OCR runs page, retention, notifications, tests and benches) never parse
manifest JSON themselves, so a layout change stays in this module::

    manifest = read_manifest(storage, output_uri, run_id)
    manifest.summary["counts"]            # bounded, whatever the run's size
    for doc in manifest.iter_documents():  # one entry in memory at a time
        ...

Shards are read as streams (``Storage.open_read``) through a streaming gzip decompressor, line by line:
no reader ever holds a decompressed shard or a list of its entries, only the entry it yields (``page``
holds the entries it returns and skips the others unparsed). Every read is bounded (``ReadLimits``):
a summary, a shard (compressed and decompressed, so a gzip bomb stops at the bound), a line and a
shard's entry count; a manifest past a bound is a ``ManifestFormatError``, never an exhausted memory.
The bounds are settings (``ReadLimits.from_environment``: ``OLMOCR_MAX_SUMMARY_BYTES``,
``OLMOCR_MAX_SHARD_BYTES``, ``OLMOCR_MAX_ENTRY_BYTES``).

A manifest may have been tampered with (anyone who can write the output location can write one), so
its JSON is read strictly: ``NaN`` and ``Infinity`` are refused, in a summary also numbers beyond 64
bits, and the summary's fields that readers rely on must have their schema's types (``check_summary``). Either
is a ``ManifestFormatError``, which the runs page shows as an unreadable manifest.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import math
import zlib
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from olmocr_tasks.core import environment
from olmocr_tasks.location.layout import shards_folder
from olmocr_tasks.location.manifest import (
    DEAD_LETTERS_KIND,
    DOCUMENTS_KIND,
    DocumentEntry,
    Manifest,
    error_class_counts,
    manifest_uri,
)
from olmocr_tasks.storage.store import ReadLimitExceeded, Storage

# What a summary holds besides its entries; the inline entry lists of schema 1 and 2 are not summary.
_INLINE = (DOCUMENTS_KIND, DEAD_LETTERS_KIND)
# Compressed bytes a shard stream asks storage for at a time (one S3 body read per chunk).
_READ_CHUNK = 256 * 1024
_MIB = 1024 * 1024


@dataclass(frozen=True)
class ReadLimits:
    """What one read of a manifest may hold or cost; past a bound it is a ``ManifestFormatError``.

    ``summary_bytes``: a schema 3 summary is 20-30 KB (at most 256 KB by construction); the bound is
    for schema 1 and 2 manifests, whose entries are inline (about 75,000 entries of 850 bytes).
    ``line_bytes``: one entry (a 10,000-page document's latencies are about 70 KB). ``shard_bytes``:
    a shard's compressed and its decompressed bytes (10,000 entries of a few KB are 20-40 MB).
    ``blank_lines``: the writer writes none; readers skip a few, not a stream of them.
    """

    summary_bytes: int = 64 * _MIB
    line_bytes: int = 8 * _MIB
    shard_bytes: int = 1024 * _MIB
    blank_lines: int = 10_000

    @classmethod
    def from_environment(cls) -> ReadLimits:
        """The defaults, each replaced by its setting when set (bytes; ``ConfigurationError`` if not
        a positive whole number): ``OLMOCR_MAX_SUMMARY_BYTES``, ``OLMOCR_MAX_SHARD_BYTES`` (compressed
        and decompressed), ``OLMOCR_MAX_ENTRY_BYTES`` (one entry's line)."""
        return dataclasses.replace(cls(), **environment.manifest_read_limits())


READ_LIMITS = ReadLimits()
# No count, size, duration or cost a manifest records comes near 64 bits; a number past it is tampering.
_LARGEST_NUMBER = 2**63


def strict_json(raw: bytes | str, what: str, *, bound_numbers: bool = True) -> Any:
    """``raw`` parsed as JSON without ``NaN``/``Infinity`` (no JSON answer could carry them) and, with
    ``bound_numbers``, without numbers beyond 64 bits; else a ``ManifestFormatError``.

    Shard entries are read without the number bound: checking each number in Python doubles the cost
    of parsing an entry (40 page latencies), and the pages read an entry's numbers tolerantly.
    """

    def refuse_constant(name: str) -> Any:
        raise ManifestFormatError(f"{what}: {name} is not a number a manifest holds")

    def bounded_int(text: str) -> int:
        # Checked on the digits before converting: a 100,000-digit number costs seconds to convert.
        if len(text.lstrip("-")) > 19 or abs(number := int(text)) > _LARGEST_NUMBER:
            raise ManifestFormatError(f"{what}: the integer {text[:24]}... is beyond 64 bits")
        return number

    def bounded_float(text: str) -> float:
        number = float(text)
        if not math.isfinite(number) or abs(number) > _LARGEST_NUMBER:
            raise ManifestFormatError(f"{what}: the number {text[:24]} is beyond 64 bits")
        return number

    try:
        if not bound_numbers:
            return json.loads(raw, parse_constant=refuse_constant)
        return json.loads(raw, parse_constant=refuse_constant, parse_int=bounded_int, parse_float=bounded_float)
    except ManifestFormatError:
        raise
    except (ValueError, RecursionError) as exc:
        raise ManifestFormatError(f"{what} is not JSON: {exc}") from exc


class ManifestFormatError(ValueError):
    """The object is not a manifest this reader understands (not a JSON object, a bad shard list,
    a field of the wrong type, a number beyond 64 bits, a damaged shard, or a read past its
    ``ReadLimits``)."""


# What a summary's fields must be, by the schema (olmocr_tasks/schemas/manifest.schema.json), for the
# fields readers and the runs page rely on; None (or absent) is allowed for each. "int" is a whole number
# (not a bool), "number" any number; a dict of a kind is an object whose values are all that kind.
_INT, _NUMBER, _TEXT = "int", "number", "text"
_SUMMARY_FIELDS: dict[str, Any] = {
    "schema_version": _INT,
    "counts": {_INT},
    "metrics": {"accepted_attempt_histogram": {_INT}},
    "error_classes": {_INT},
    "error_budget": {"problems": [_TEXT]},
    "airflow_run": {"dag_id": _TEXT, "run_id": _TEXT},
    "overview": {
        "latency_histogram": [[_TEXT, _INT]],
        "latency_count": _INT,
        "progress": {"documents": _INT, "busy_s": _NUMBER, "points": [[_NUMBER, _NUMBER, _NUMBER]]},
        "failure_classes": {_INT},
        "failed": {"total": _INT, "first": [dict]},
        "dead_letters": {"total": _INT, "first": [dict]},
    },
}
_SHARDS = {"count": _INT, "shards": [{"path": _TEXT, "entries": _INT, "statuses": {_INT}}]}


def check_summary(data: dict[str, Any]) -> None:
    """The summary's fields readers rely on have their schema's types; else a ``ManifestFormatError``
    naming the first field that does not (so a tampered summary is an unreadable manifest, not a
    crash in whatever reads the field)."""
    if "entries" in data:
        if not isinstance(data["entries"], dict):
            raise ManifestFormatError("'entries' is not an object")
        for kind in _INLINE:
            _check(data["entries"].get(kind), _SHARDS, f"entries.{kind}")
    else:
        for kind in _INLINE:
            _check(data.get(kind), [dict], kind)
    for name, kind in _SUMMARY_FIELDS.items():
        _check(data.get(name), kind, name)


def _check(value: Any, kind: Any, path: str) -> None:
    if value is None:
        return
    if kind is dict:
        ok = isinstance(value, dict)
    elif isinstance(kind, str):
        ok = {
            _INT: isinstance(value, int) and not isinstance(value, bool),
            _NUMBER: isinstance(value, int | float) and not isinstance(value, bool),
            _TEXT: isinstance(value, str | int | float),  # shown as text; a number prints as itself
        }[kind]
    else:
        ok = isinstance(value, dict if isinstance(kind, dict | set) else list)
    if not ok:
        raise ManifestFormatError(f"summary field {path} is {type(value).__name__}, not {_describe(kind)}")
    if isinstance(kind, set):  # an object whose every value is of one kind
        (each,) = kind
        for key, item in value.items():
            _check(item, each, f"{path}.{key}")
    elif isinstance(kind, dict):
        for key, each in kind.items():
            _check(value.get(key), each, f"{path}.{key}")
    elif isinstance(kind, list) and len(kind) == 1:  # a list of one kind
        for index, item in enumerate(value):
            _check(item, kind[0], f"{path}[{index}]")
    elif isinstance(kind, list):  # a tuple: exactly these kinds in order
        if len(value) != len(kind):
            raise ManifestFormatError(f"summary field {path} has {len(value)} items, not {len(kind)}")
        for index, (item, each) in enumerate(zip(value, kind, strict=True)):
            _check(item, each, f"{path}[{index}]")


def _describe(kind: Any) -> str:
    if kind is dict or isinstance(kind, dict | set):
        return "an object"
    if isinstance(kind, list):
        return "a list"
    return {_INT: "a whole number", _NUMBER: "a number", _TEXT: "text"}[kind]


class ManifestReader:
    """One published manifest: ``summary`` (a dict without entries) and its entries, read lazily."""

    def __init__(self, storage: Storage, uri: str, data: dict[str, Any], *, limits: ReadLimits | None = None) -> None:
        if not isinstance(data, dict):
            raise ManifestFormatError(f"expected a JSON object, found {type(data).__name__}")
        check_summary(data)
        self.storage = storage
        self.uri = uri
        self.limits = limits or ReadLimits.from_environment()
        self._inline = {kind: data.get(kind) or [] for kind in _INLINE} if "entries" not in data else None
        self.summary: dict[str, Any] = {key: value for key, value in data.items() if key not in _INLINE}

    @classmethod
    def from_bytes(cls, storage: Storage, uri: str, raw: bytes, *, limits: ReadLimits | None = None) -> ManifestReader:
        return cls(storage, uri, strict_json(raw, f"summary {uri}"), limits=limits)

    @classmethod
    def open(cls, storage: Storage, uri: str, *, limits: ReadLimits | None = None) -> ManifestReader:
        """Read the summary at ``uri`` (``UnreadableSourceError`` if missing); entries are read on demand."""
        reader = cls.open_or_none(storage, uri, limits=limits, missing_ok=False)
        assert reader is not None
        return reader

    @classmethod
    def open_or_none(
        cls, storage: Storage, uri: str, *, limits: ReadLimits | None = None, missing_ok: bool = True
    ) -> ManifestReader | None:
        """``open``, or None when nothing is at ``uri`` (a run not published yet)."""
        limits = limits or ReadLimits.from_environment()
        if missing_ok:
            stream = storage.open_read_or_none(uri, max_bytes=limits.summary_bytes)
            if stream is None:
                return None
        else:
            stream = storage.open_read(uri, max_bytes=limits.summary_bytes)
        with stream:
            try:
                raw = stream.read()
            except ReadLimitExceeded as exc:
                raise ManifestFormatError(
                    f"summary {uri} is larger than {limits.summary_bytes:,} bytes (a schema 3 summary is a "
                    "few KB; an inline schema 1 or 2 manifest this large needs OLMOCR_MAX_SUMMARY_BYTES)"
                ) from exc
        return cls.from_bytes(storage, uri, raw, limits=limits)

    # ------------------------------------------------------------------------------- summary

    @property
    def sharded(self) -> bool:
        return self._inline is None

    @property
    def schema_version(self) -> int:
        return int(self.summary.get("schema_version") or 1)

    def counts(self) -> dict[str, int]:
        return dict(self.summary.get("counts") or {})

    def metrics(self) -> dict[str, Any]:
        return dict(self.summary.get("metrics") or {})

    def error_budget(self) -> dict[str, Any]:
        """The run's error-budget verdict as published (empty for a manifest published without one)."""
        return dict(self.summary.get("error_budget") or {})

    @property
    def already_converted(self) -> int:
        return int(self.counts().get("already_converted", 0))

    def document_count(self, kind: str = DOCUMENTS_KIND) -> int:
        if self._inline is not None:
            return len(self._inline[kind])
        return int((self.summary["entries"].get(kind) or {}).get("count", 0))

    def error_classes(self) -> dict[str, int]:
        """Failed documents per error class: from the summary (schema 3), else counted from the entries."""
        if "error_classes" in self.summary:
            return dict(self.summary["error_classes"])
        return error_class_counts(DocumentEntry.from_dict(doc) for doc in self.iter_documents())

    def manifest(self) -> Manifest:
        """The summary as a ``Manifest`` (counts, metrics, cost; inline entries of old manifests kept)."""
        if self._inline is not None:
            return Manifest.from_dict({**self.summary, **self._inline})
        return Manifest.from_dict(self.summary)

    # ------------------------------------------------------------------------------- entries

    def shard_uris(self, kind: str | None = None) -> list[str]:
        """The shards the summary names (of one kind, or all), in order; none for inline manifests."""
        return [uri for _, uri, _ in self._shards(kind)]

    def _shards(self, kind: str | None) -> list[tuple[str, str, int]]:
        if self._inline is not None:
            return []
        base = shards_folder(self.uri)
        found = []
        for each in (kind,) if kind else _INLINE:
            for shard in (self.summary["entries"].get(each) or {}).get("shards") or []:
                path = str(shard["path"])
                # Shards live below the run's own folder: a summary cannot point a reader elsewhere.
                if path.startswith("/") or ".." in path.split("/") or "://" in path:
                    raise ManifestFormatError(f"shard path {path!r} leaves the run's folder")
                found.append((each, base + path, int(shard.get("entries", 0))))
        return found

    def shard_table(self, kind: str = DOCUMENTS_KIND) -> list[dict[str, Any]]:
        """Each shard of one kind: ``uri``, ``start`` (position of its first entry), ``entries`` and
        ``statuses`` (entries per status, None in summaries written before shards counted them)."""
        table, start = [], 0
        raw = (self.summary.get("entries") or {}).get(kind) or {} if self._inline is None else {}
        for (_, uri, entries), shard in zip(self._shards(kind), raw.get("shards") or [], strict=True):
            statuses = shard.get("statuses")
            table.append(
                {
                    "uri": uri,
                    "start": start,
                    "entries": entries,
                    "statuses": statuses if isinstance(statuses, dict) else None,
                }
            )
            start += entries
        return table

    def read_shard(self, uri: str, contains: str | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
        """The entries of one shard (a ``uri`` from ``shard_table``) with their positions in it, streamed.

        ``contains``: only lines whose text holds it (any letter case) are parsed, a cheap first cut
        for a search by name (the caller still checks the field it means).
        """
        needle = contains.casefold() if contains else None
        declared = next((entries for _, each, entries in self._shards(None) if each == uri), None)
        for number, line in enumerate(self._lines(uri, declared)):
            if needle is None or needle in line.decode("utf-8", errors="replace").casefold():
                yield number, self._entry(uri, number, line)

    def iter_documents(self) -> Iterator[dict[str, Any]]:
        """Every document entry as a dict, in the order written, one entry in memory at a time."""
        return self._iter(DOCUMENTS_KIND)

    def iter_dead_letters(self) -> Iterator[dict[str, Any]]:
        return self._iter(DEAD_LETTERS_KIND)

    def iter_entries(self) -> Iterator[DocumentEntry]:
        return (DocumentEntry.from_dict(doc) for doc in self.iter_documents())

    def _iter(self, kind: str) -> Iterator[dict[str, Any]]:
        if self._inline is not None:
            yield from self._inline[kind]
            return
        for _, uri, entries in self._shards(kind):
            for number, line in enumerate(self._lines(uri, entries)):
                yield self._entry(uri, number, line)

    def page(self, start: int, count: int, kind: str = DOCUMENTS_KIND) -> list[dict[str, Any]]:
        """Entries ``start`` to ``start + count`` (manifest order), reading only the shards they are in,
        each only up to its last wanted line; the lines before them are skipped unparsed."""
        if self._inline is not None:
            return list(self._inline[kind][max(start, 0) : max(start, 0) + max(count, 0)])
        wanted: list[dict[str, Any]] = []
        offset = 0
        for _, uri, entries in self._shards(kind):
            if len(wanted) >= count:
                break
            if offset + entries > start:
                skip = max(start - offset, 0)
                lines = self._lines(uri, entries)
                try:
                    for number, line in enumerate(lines):
                        if number < skip:
                            continue
                        wanted.append(self._entry(uri, number, line))
                        if len(wanted) >= count:
                            break
                finally:
                    lines.close()  # stops reading the shard (and closes its stream) past the page
            offset += entries
        return wanted

    def _entry(self, uri: str, number: int, line: bytes) -> dict[str, Any]:
        entry = strict_json(line, f"shard {uri}: entry {number}", bound_numbers=False)
        if not isinstance(entry, dict):
            raise ManifestFormatError(f"shard {uri}: entry {number} is not an object")
        return entry

    def _lines(self, uri: str, entries: int | None) -> Generator[bytes, None, None]:
        """The shard's entry lines (bytes, blank lines skipped), read from a streaming decompressor.

        Holds one line at a time. ``entries``: how many the summary says the shard holds (0 or None:
        not recorded); a shard holding more is damaged, and reading on could last as long as a bomb.
        """
        limits = self.limits
        found = blank = decompressed = 0
        try:
            with (
                self.storage.open_read(uri, max_bytes=limits.shard_bytes) as stream,
                io.BufferedReader(stream, buffer_size=_READ_CHUNK) as buffered,
                gzip.GzipFile(fileobj=buffered, mode="rb") as unzipped,
            ):
                while line := unzipped.readline(limits.line_bytes + 1):
                    decompressed += len(line)
                    if decompressed > limits.shard_bytes:
                        raise ManifestFormatError(
                            f"shard {uri} decompresses to more than {limits.shard_bytes:,} bytes (a gzip bomb?)"
                        )
                    if len(line) > limits.line_bytes and not line.endswith(b"\n"):
                        raise ManifestFormatError(
                            f"shard {uri}: entry {found} is longer than {limits.line_bytes:,} bytes"
                        )
                    if not line.strip():
                        blank += 1
                        if blank > limits.blank_lines:
                            raise ManifestFormatError(f"shard {uri} holds more than {limits.blank_lines:,} blank lines")
                        continue
                    if entries and found >= entries:
                        raise ManifestFormatError(
                            f"shard {uri} holds more than the {entries:,} entries its summary names"
                        )
                    found += 1
                    yield line
        except ReadLimitExceeded as exc:
            raise ManifestFormatError(f"shard {uri} is larger than {limits.shard_bytes:,} bytes compressed") from exc
        except (OSError, EOFError, zlib.error) as exc:
            raise ManifestFormatError(f"shard {uri} is not gzip: {exc}") from exc

    @cached_property
    def documents(self) -> list[DocumentEntry]:
        """Every document entry, all in memory: for small runs and tests; stream with ``iter_entries``."""
        return list(self.iter_entries())

    @cached_property
    def dead_letters(self) -> list[DocumentEntry]:
        return [DocumentEntry.from_dict(doc) for doc in self.iter_dead_letters()]

    def whole(self) -> dict[str, Any]:
        """The manifest as one dict with ``documents`` and ``dead_letters`` inline (the schema 2 shape).

        Holds every entry: for small runs, tests and the runs page's JSON API, not for archives.
        """
        # Without ``entries``: the entries are inline now, and a reader of this dict must read those.
        return {
            **{key: value for key, value in self.summary.items() if key != "entries"},
            DOCUMENTS_KIND: list(self.iter_documents()),
            DEAD_LETTERS_KIND: list(self.iter_dead_letters()),
        }


def read_manifest(storage: Storage, output_uri: str, run_id: str) -> ManifestReader | None:
    """The published manifest of ``run_id`` under ``output_uri``, or None if it has none (yet)."""
    return ManifestReader.open_or_none(storage, manifest_uri(output_uri, run_id))


def open_manifest(uri: str, storage: Storage | None = None) -> ManifestReader:
    """The manifest whose summary is at ``uri`` (a local path, ``file://`` or ``s3://`` URI)."""
    return ManifestReader.open(storage or Storage(), uri)
