"""What the parent accepts as a render worker's answer to each kind of request (``render_wire`` frames it).

A worker parses hostile PDFs, so its ``ok`` replies are checked against the shape their request allows
before they reach a caller: a document description within the limits, a PNG, UTF-8 text, or nothing.
Each decoder returns the caller's value or raises ``ProtocolError``; the reply's status is already "ok".
"""

from __future__ import annotations

import base64
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from olmocr_tasks.core.config import DocumentLimits
from olmocr_tasks.page.render_wire import PNG_SIGNATURE, ProtocolError
from olmocr_tasks.page.render_worker import PdfInfo

# (header, payload) -> the caller's value, or ProtocolError.
Decoder = Callable[[dict[str, Any], bytes], Any]


def reply_decoders(limits: DocumentLimits) -> dict[str, Decoder]:
    """The decoder of each request kind production workers answer."""
    return {
        "inspect": functools.partial(_decode_pdf_info, limits),
        "render": _decode_png,
        "text": _decode_text,
        "noop": decode_nothing,
    }


def _decode_pdf_info(limits: DocumentLimits, header: dict[str, Any], payload: bytes) -> PdfInfo:
    value = header.get("value")
    fields = {field.name for field in dataclasses.fields(PdfInfo)}
    if payload or not isinstance(value, dict) or set(value) != fields:
        raise ProtocolError("an inspect reply must be a document description")
    pages, size, version = value["page_count"], value["size_bytes"], value["pdf_version"]
    if type(pages) is not int or not 1 <= pages <= limits.max_pages:
        raise ProtocolError(f"page_count {pages!r} is not within 1..{limits.max_pages}")
    if type(size) is not int or size < 0:
        raise ProtocolError(f"size_bytes {size!r} is not a size")
    if version is not None and type(version) is not int:
        raise ProtocolError(f"pdf_version {version!r} is not a version")
    if type(value["is_encrypted_owner_only"]) is not bool:
        raise ProtocolError("is_encrypted_owner_only is not true or false")
    return PdfInfo(**value)


def _decode_png(header: dict[str, Any], payload: bytes) -> bytes:
    """Base64 of the PNG the worker sent (checked for the PNG signature only: decoding an untrusted
    image here would bring the attack surface the worker exists to hold into this process)."""
    if header.get("payload") != "bytes" or header.get("value") is not None or not payload.startswith(PNG_SIGNATURE):
        raise ProtocolError("a render reply must be a PNG")
    return base64.b64encode(payload)


def _decode_text(header: dict[str, Any], payload: bytes) -> str:
    if header.get("payload") != "text" or header.get("value") is not None:
        raise ProtocolError("a text reply must be text")
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"a text reply is not UTF-8: {exc}") from None


def decode_nothing(header: dict[str, Any], payload: bytes) -> None:
    if payload or header.get("value") is not None:
        raise ProtocolError("a reply that carries nothing carries something")


def decode_any(header: dict[str, Any], payload: bytes) -> Any:
    """For request kinds without a decoder of their own (test hooks): the JSON value, or the payload."""
    return payload if payload else header.get("value")
