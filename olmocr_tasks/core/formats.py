"""The input formats a run converts: which names discovery lists, and what a file's content is.

A document's format is decided by its content (the first bytes, ``detect_format``), never by its name
alone: discovery lists names with a known extension (``is_document_name``), and before anything renders
a document ``check_format`` compares its content with its name and the run's formats. A file whose
content is not what its name says, or no format we convert, fails as ``unsupported_format`` with the
type that was detected; a file named ``.pdf`` that is not a PDF keeps its older class, ``not_pdf``
(manifests and ledgers written before images were accepted carry it).

Reading a few bytes and comparing them with signatures is all that happens here, so the caller's own
process may do it; parsing the document happens in a render worker.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from olmocr_tasks.core.errors import (
    ConfigurationError,
    EmptyDocumentError,
    NotPdfError,
    UnreadableSourceError,
    UnsupportedFormatError,
)

__all__ = [
    "ALL_FORMATS",
    "FORMATS",
    "HEAD_BYTES",
    "IMAGE_FORMATS",
    "check_format",
    "detect_format",
    "file_format",
    "format_of_name",
    "is_document_name",
    "parse_formats",
    "read_head",
    "strip_document_extension",
]

# The formats a run converts, in the order they are listed to users.
FORMATS: tuple[str, ...] = ("pdf", "png", "jpeg", "tiff", "webp")
IMAGE_FORMATS: frozenset[str] = frozenset(FORMATS) - {"pdf"}
ALL_FORMATS: frozenset[str] = frozenset(FORMATS)

# Extension (lower case, with its dot) -> format. Names are compared in any letter case.
_EXTENSIONS: dict[str, str] = {
    ".pdf": "pdf",
    ".png": "png",
    ".jpg": "jpeg",
    ".jpeg": "jpeg",
    ".tif": "tiff",
    ".tiff": "tiff",
    ".webp": "webp",
}
# What users may write in ``--formats`` / the ``formats`` Param besides the format names themselves.
_ALIASES: dict[str, str] = {"jpg": "jpeg", "tif": "tiff"}

# PDFium (like Acrobat) accepts a PDF header preceded by junk within the first 1024 bytes.
HEAD_BYTES = 1024
_PDF_HEADER = b"%PDF-"

# Signatures at offset 0: the formats we convert, then a few we recognise only to name them in the
# error (what a user finds beside scans: GIF, BMP, JPEG 2000, HEIC, archives).
_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpeg"),
    (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"),
    (b"II+\x00", "tiff"),  # BigTIFF
    (b"MM\x00+", "tiff"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n", "jpeg2000"),
    (b"\xff\x4f\xff\x51", "jpeg2000"),
    (b"PK\x03\x04", "zip"),
    (b"\x1f\x8b", "gzip"),
)


def format_of_name(uri: str) -> str | None:
    """The format a name claims by its extension (any letter case, last path component only)."""
    name = uri.rsplit("/", 1)[-1]
    stem, dot, extension = name.rpartition(".")
    if not dot or not stem:
        return None  # no extension, or a bare ".pdf"
    return _EXTENSIONS.get("." + extension.lower())


def is_document_name(uri: str, formats: Iterable[str] = ALL_FORMATS) -> bool:
    """Whether discovery lists this name: its extension is one of ``formats``."""
    named = format_of_name(uri)
    return named is not None and named in formats


def strip_document_extension(name: str) -> str:
    """``name`` without a known document extension (``x/Scan.TIFF`` -> ``x/Scan``), else unchanged."""
    base, dot, extension = name.rpartition(".")
    if dot and "/" not in extension and "." + extension.lower() in _EXTENSIONS:
        return base
    return name


def parse_formats(value: str | Iterable[str] | None) -> frozenset[str]:
    """The formats a run converts, from ``"pdf,tiff"`` or ``["pdf", "tif"]``; empty or None: all.

    Raises ``ConfigurationError`` for a name we do not convert.
    """
    if value is None:
        return ALL_FORMATS
    names = value.split(",") if isinstance(value, str) else list(value)
    chosen = set()
    for raw in names:
        name = str(raw).strip().lower().lstrip(".")
        if not name:
            continue
        name = _ALIASES.get(name, name)
        if name not in ALL_FORMATS:
            raise ConfigurationError(f"unknown format {raw!r}: choose from {', '.join(FORMATS)}")
        chosen.add(name)
    return frozenset(chosen) if chosen else ALL_FORMATS


def ordered_formats(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """``parse_formats`` in ``FORMATS`` order: a run's ``ConversionSettings.formats`` (the CLI's
    ``--formats``, the DAGs' ``formats`` Param)."""
    chosen = parse_formats(value)
    return tuple(name for name in FORMATS if name in chosen)


def detect_format(head: bytes) -> str:
    """The format the first bytes of a file show: one of ``FORMATS``, a recognised format we do not
    convert (``gif``, ``bmp``, ...), or ``unknown``.

    Image signatures are fixed at offset 0 and checked first, so an image that happens to hold
    ``%PDF-`` in its first kilobyte is still an image.
    """
    for signature, name in _SIGNATURES:
        if head.startswith(signature):
            return name
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        return "avif" if brand in (b"avif", b"avis") else "heic" if brand.startswith((b"hei", b"mif")) else "iso-media"
    if _PDF_HEADER in head[:HEAD_BYTES]:
        return "pdf"
    return "unknown"


def read_head(path: str) -> bytes:
    """The first ``HEAD_BYTES`` bytes of a local file; an unreadable file is a DocumentError."""
    try:
        with open(path, "rb") as handle:
            return handle.read(HEAD_BYTES)
    except OSError as exc:
        raise UnreadableSourceError(f"cannot read file: {exc.strerror or exc}") from None


def check_format(head: bytes, name: str, formats: Iterable[str] = ALL_FORMATS) -> str:
    """The format of a document whose file starts with ``head`` and whose source is ``name``.

    Raises the document's typed failure instead: ``empty`` for no bytes, ``not_pdf`` for a ``.pdf`` that
    is not one, ``unsupported_format`` for content of no format we convert, content that is not what
    the extension says (a ``.tif`` holding a PNG), or a format the run was not asked to convert.
    A name without a known extension (an explicitly listed document) is judged on its content alone.
    """
    if not head:
        raise EmptyDocumentError("file is empty (0 bytes)")
    detected = detect_format(head)
    named = format_of_name(name)
    if named == "pdf" and detected != "pdf":
        raise NotPdfError(
            f"not a PDF: no {_PDF_HEADER.decode()} header in the first {HEAD_BYTES} bytes (content: {detected})"
        )
    if detected not in ALL_FORMATS:
        raise UnsupportedFormatError(
            f"the content is {detected}, not a format this converts ({', '.join(FORMATS)})", detected=detected
        )
    if named is not None and named != detected:
        extension = "." + name.rsplit(".", 1)[-1]
        raise UnsupportedFormatError(f"named {extension} but the content is {detected}", detected=detected)
    allowed = frozenset(formats)
    if detected not in allowed:
        raise UnsupportedFormatError(
            f"the content is {detected}; this run converts {', '.join(f for f in FORMATS if f in allowed)}",
            detected=detected,
        )
    return detected


def file_format(path: str | os.PathLike[str]) -> str:
    """``detect_format`` of a local file (used by the render worker to pick its reader)."""
    return detect_format(read_head(os.fspath(path)))
