"""Per-document outputs: olmOCR's Dolma JSONL record and the markdown file, at deterministic keys.

Layout under the output prefix (the same on local disk and S3; keys named by ``olmocr_tasks.location.layout``)::

    OUTPUT/dolma/<stem>.jsonl                       one Dolma record (one line)
    OUTPUT/markdown/<stem>.md                       exactly the record's text
    OUTPUT/_state/output-owners/<hash>.json         which source a stem belongs to

``<stem>`` mirrors the source key relative to the input prefix (a document outside it: its file
name), so a rerun overwrites the same objects instead of adding new ones.

A stem belongs to the first source that writes it (``claim_stem``). Another source whose name
maps to the same stem, in any letter case (another bucket or input folder writing to the same
output, ``x.PDF`` beside ``x.pdf``, the NFD spelling of an NFC name), is written under
``<stem>~<hash of its full URI>`` instead, so no document's outputs are ever overwritten by
another's. Outputs written before owner records existed are recognised by the ``Source-File`` of
their Dolma record.
"""

from __future__ import annotations

import hashlib
import json
import logging
import unicodedata
from collections.abc import Mapping
from datetime import date
from typing import Any

from olmocr_tasks.core.errors import DocumentError
from olmocr_tasks.core.formats import strip_document_extension
from olmocr_tasks.location.layout import OutputLocation
from olmocr_tasks.page.results import DocumentResult, DocumentTotals
from olmocr_tasks.storage.store import Storage
from olmocr_tasks.storage.uri import is_s3, local_path, safe_relative_key, split_s3

log = logging.getLogger(__name__)

# The olmOCR release whose page protocol and record schema we reproduce; written where olmOCR
# writes its own version so readers of olmOCR output find the field they expect.
OLMOCR_COMPAT_VERSION = "0.4.27"


def _normalised(uri: str) -> str:
    # Compare local URIs as paths: "file:///x/in" and "/x/in" name the same folder.
    return uri if is_s3(uri) else local_path(uri)


def _relative_source(source_uri: str, input_uri: str) -> str:
    source = _normalised(source_uri)
    base = _normalised(input_uri).rstrip("/")
    if base and source.startswith(base + "/"):
        return source[len(base) + 1 :]
    # A single-file input, or an explicitly listed document outside the input folder: its name.
    # Owner records (claim_stem) keep two such names from sharing outputs.
    if is_s3(source):
        return split_s3(source)[1].rsplit("/", 1)[-1]
    return source.rsplit("/", 1)[-1]


def output_stem(source_uri: str, input_uri: str) -> str:
    """The safe relative path (no extension) under which a source's outputs are written.

    ``s3://b/in/x/Report.PDF`` under ``s3://b/in/`` → ``x/Report`` (the same for ``Report.tif`` and the
    other document extensions of ``core.formats``; two sources that differ only there share a stem,
    which ``claim_stem`` settles). Sources outside the input prefix
    keep their file name only (``/elsewhere/alpha.pdf`` → ``alpha``). The result is
    always sanitised (see ``storage.safe_relative_key``) and never empty; a name that sanitising
    changed (``..``, empty or ``.`` components, control characters, backslashes) ends in ``~`` and
    ten hex digits of a hash of the original, so distinct sources keep distinct outputs.
    """
    # The extension goes first: sanitising "..pdf" would otherwise leave a "." component behind.
    relative = strip_document_extension(_relative_source(source_uri, input_uri))
    stem = safe_relative_key(relative)
    if not stem:
        stem = "_unnamed_" + hashlib.sha1(source_uri.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    elif stem != unicodedata.normalize("NFC", relative):
        # Sanitising is not one-to-one ("in/../x.pdf" and "in/x.pdf" both give "x"): a name it had to
        # change gets a suffix derived from the original, so a hostile name cannot overwrite the outputs
        # of the document it imitates. Ordinary names keep mirroring their source exactly.
        digest = hashlib.sha1(relative.encode("utf-8", "surrogatepass")).hexdigest()[:10]
        stem = f"{stem}~{digest}"
    return stem


class OutputCollisionError(DocumentError):
    """Both keys a source may write to already belong to other sources."""

    error_class = "output_collision"


def claim_stem(storage: Storage, output_uri: str, stem: str, source_uri: str) -> str:
    """The stem this source's outputs go under: ``stem`` if it is free or already its own, else
    ``stem~<hash of the source URI>`` (see the module docstring).

    Claims are create-if-absent writes, so of two documents racing for one stem exactly one gets it.
    """
    me = _normalised(source_uri)
    digest = hashlib.sha1(me.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    owners = []
    for candidate in (stem, f"{stem}~{digest}"):
        owners.append(_owner(storage, output_uri, candidate, me))
        if owners[-1] == me:
            if candidate != stem:
                log.warning("outputs of %s go to %s: %s holds those of %s", source_uri, candidate, stem, owners[0])
            return candidate
    raise OutputCollisionError(
        f"the output names {stem!r} and {stem}~{digest} already belong to {' and '.join(owners)}; "
        "write this document to another output location"
    )


def _owner(storage: Storage, output_uri: str, stem: str, claimant: str) -> str:
    """Who owns ``stem`` (in any letter case), recording ``claimant`` as the owner if nobody does."""
    record_uri = OutputLocation(output_uri).owner_record(unicodedata.normalize("NFC", stem).casefold())
    for _ in range(3):
        record = storage.read_bytes_or_none(record_uri)
        if record is not None:
            return str(json.loads(record)["source"])
        owner = _writer_of(storage, output_uris(output_uri, stem)["dolma"]) or claimant
        if storage.create_exclusive(record_uri, json.dumps({"stem": stem, "source": owner}).encode("utf-8")):
            return owner
    raise OutputCollisionError(f"could not record who owns the outputs {stem!r}")


def _writer_of(storage: Storage, dolma_uri: str) -> str | None:
    """The source of a Dolma record already at ``dolma_uri`` (written before owner records), if any."""
    data = storage.read_bytes_or_none(dolma_uri)
    if data is None:
        return None
    try:
        return _normalised(str(_record_metadata(data)["Source-File"]))
    except (ValueError, KeyError, IndexError, TypeError):
        # Not one of ours: never overwrite it.
        return f"an unreadable record at {dolma_uri}"


def _record_metadata(data: bytes) -> dict[str, Any]:
    """The ``metadata`` of the first Dolma record in ``data`` (raises on anything else)."""
    metadata = json.loads(data.splitlines()[0])["metadata"]
    if not isinstance(metadata, dict):
        raise TypeError("a Dolma record's metadata is an object")
    return metadata


def outputs_hold(storage: Storage, outputs: Mapping[str, str], sha256: str) -> bool:
    """Whether recorded ``outputs`` still exist and hold the conversion of the content ``sha256``.

    The Dolma record must carry that SHA-256 (its key may since have been overwritten by a changed
    source of the same name); the other outputs must exist. Without a Dolma record, every output
    must exist (and there must be one).
    """
    dolma = outputs.get("dolma")
    if dolma is None:
        return bool(outputs) and all(storage.exists(uri) for uri in outputs.values())
    raw = storage.read_bytes_or_none(dolma)
    if raw is None:
        return False
    try:
        metadata = _record_metadata(raw)
    except (ValueError, KeyError, TypeError, IndexError):
        return False
    if metadata.get("source-sha256") != sha256:
        return False
    return all(storage.exists(uri) for name, uri in outputs.items() if name != "dolma")


def recorded_totals(storage: Storage, dolma_uri: str) -> DocumentTotals | None:
    """What the Dolma record at ``dolma_uri`` says its document added up to; None if it says nothing readable.

    The counts its metadata carries (pages, fallbacks, tokens, attempts); per-page latencies and the
    accepted-attempt histogram are not in it and come back empty.
    """
    raw = storage.read_bytes_or_none(dolma_uri)
    if raw is None:
        return None
    try:
        metadata = _record_metadata(raw)
        return DocumentTotals(
            pages=int(metadata["pdf-total-pages"]),
            fallback_pages=int(metadata["total-fallback-pages"]),
            input_tokens=int(metadata["total-input-tokens"]),
            output_tokens=int(metadata["total-output-tokens"]),
            attempts=int(metadata.get("total-attempts", 0)),
            server_input_tokens=int(metadata.get("server-input-tokens", 0)),
            server_output_tokens=int(metadata.get("server-output-tokens", 0)),
            page_latencies_s=(),
            accepted_attempt_histogram={},
        )
    except (ValueError, KeyError, TypeError, IndexError):
        return None


def dolma_record(
    result: DocumentResult,
    *,
    model: str,
    prompt_version: str,
    package_version: str,
    created: date | None = None,
) -> dict[str, Any]:
    """olmOCR's Dolma document for a converted PDF, key order included, plus our provenance fields.

    Keys olmOCR emits come first and keep their meaning; ours follow them so a reader written for
    olmOCR output keeps working.
    """
    text = result.text
    today = date.today().isoformat()
    pages = result.pages
    # The same totals the document's manifest entry records (computed once, in DocumentResult).
    totals = result.totals
    fallback = [page for page in pages if page.is_fallback]
    return {
        # surrogatepass: a lone surrogate decoded from a model's JSON must not crash the hash.
        "id": hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest(),
        "text": text,
        "source": "olmocr",
        "added": today,
        "created": created.isoformat() if created else today,
        "metadata": {
            "Source-File": result.source,
            "olmocr-version": OLMOCR_COMPAT_VERSION,
            "pdf-total-pages": totals.pages,
            "total-input-tokens": totals.input_tokens,
            "total-output-tokens": totals.output_tokens,
            "total-fallback-pages": totals.fallback_pages,
            "olmocr-airflow-version": package_version,
            "model": model,
            "prompt-version": prompt_version,
            "source-sha256": result.sha256,
            "source-size": result.size,
            "fallback-page-numbers": [page.page_number for page in fallback],
            "fallback-reasons": [page.fallback_reason for page in fallback],
            "total-attempts": totals.attempts,
            # Every answered attempt, retries included: what the server really spent.
            "server-input-tokens": totals.server_input_tokens,
            "server-output-tokens": totals.server_output_tokens,
            "conversion-seconds": round(result.seconds, 3),
        },
        "attributes": {
            "pdf_page_numbers": result.page_spans(),
            "primary_language": [page.primary_language for page in pages],
            "is_rotation_valid": [page.is_rotation_valid for page in pages],
            "rotation_correction": [page.rotation_correction for page in pages],
            "is_table": [page.is_table for page in pages],
            "is_diagram": [page.is_diagram for page in pages],
            "is_fallback": [page.is_fallback for page in pages],
            "attempts": [page.attempts for page in pages],
            "accepted_attempt": [page.accepted_attempt for page in pages],
            "input_tokens": [page.input_tokens for page in pages],
            "output_tokens": [page.output_tokens for page in pages],
            "latency_ms": [round(page.latency_s * 1000) for page in pages],
        },
    }


def dolma_line(record: dict[str, Any]) -> bytes:
    """One JSONL line exactly as olmOCR writes it: default separators, ASCII-escaped."""
    return (json.dumps(record) + "\n").encode("ascii")


def output_uris(output_uri: str, stem: str) -> dict[str, str]:
    """Where a stem's outputs live (whether or not they have been written)."""
    return OutputLocation(output_uri).outputs(stem)


def write_document_outputs(
    result: DocumentResult,
    *,
    output_uri: str,
    stem: str,
    storage: Storage,
    write_markdown: bool,
    model: str,
    prompt_version: str,
    package_version: str,
    created: date | None = None,
) -> dict[str, str]:
    """Write the Dolma line (and the markdown) atomically; returns ``{"dolma": uri, "markdown": uri}``.

    The outputs go under ``stem`` unless another source owns it (see ``claim_stem``).
    ``"markdown"`` is absent when ``write_markdown`` is false. A document whose pages hold no text
    (blank scans) still gets its record and an empty markdown file: olmOCR silently drops it, which
    makes it indistinguishable from a lost document and reconverts it on every run.
    """
    record = dolma_record(
        result, model=model, prompt_version=prompt_version, package_version=package_version, created=created
    )
    targets = output_uris(output_uri, claim_stem(storage, output_uri, stem, result.source))
    written: dict[str, str] = {}
    if write_markdown:
        storage.write_bytes_atomic(
            targets["markdown"], record["text"].encode("utf-8", "replace"), content_type="text/markdown; charset=utf-8"
        )
        written["markdown"] = targets["markdown"]
    # The Dolma record is written last: it is the primary output, so its presence implies the rest.
    storage.write_bytes_atomic(targets["dolma"], dolma_line(record), content_type="application/x-ndjson")
    return {"dolma": targets["dolma"], **written}
