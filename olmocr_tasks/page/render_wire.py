"""The render workers' wire format: framed JSON headers and raw bytes, nothing that can run code.

A render worker parses hostile PDFs with a C library, so the pool treats whatever comes back as
untrusted: no pickle (unpickling runs code chosen by the sender), sizes bounded before anything is
read, and every reply checked against the shape its request allows before it reaches a caller.

One message, either way over a connected stream socket::

    header length (4 bytes, big-endian) | payload length (4 bytes) | header (UTF-8 JSON object) | payload

Requests (pool to worker) are ``{"kind": ..., "args": [...], "drops": [...]}`` with no payload.
Replies are ``{"status": "ready", "pid": n}`` once, then one of ``{"status": "ok", "value": ...}``
(a page's PNG or text travels as the payload), ``{"status": "document_error", "error": class name,
"message": ...}`` or ``{"status": "render_error", "reason": "failed", "message": ...}``; each reply
also carries ``"cpu_s"``, the CPU seconds the worker has used so far.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_MESSAGE_CHARS",
    "MAX_TEXT_BYTES",
    "PNG_SIGNATURE",
    "ProtocolError",
    "png_payload_bound",
    "read_message",
    "write_message",
]

_LENGTHS = struct.Struct(">II")
MAX_HEADER_BYTES = 64 * 1024
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Worker-supplied text (error messages) kept in a manifest entry at most.
MAX_MESSAGE_CHARS = 2000
# A page's text layer at most (UTF-8); a worker answers a larger one as too_large.
MAX_TEXT_BYTES = 16 * 1024 * 1024


class ProtocolError(Exception):
    """A message that breaks the wire format or its bounds: its sender is no longer trusted."""


def png_payload_bound(max_render_pixels: int) -> int:
    """The most bytes a PNG of at most ``max_render_pixels`` RGB pixels can take, at any zlib level.

    Level 0 stores 3 bytes a pixel plus a filter byte a row and a few bytes of framing per 64 KiB
    block; a 4-byte allowance per pixel and 1 MiB for chunks covers every shape, including a 1-pixel
    wide strip (one filter byte per 3-byte row).
    """
    return max_render_pixels * 4 + 1024 * 1024


def write_message(sock: socket.socket, header: dict[str, Any], payload: bytes = b"") -> None:
    """Send one framed message (blocking)."""
    encoded = json.dumps(header, allow_nan=False, separators=(",", ":")).encode()
    if len(encoded) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(encoded)} bytes is over the limit of {MAX_HEADER_BYTES}")
    sock.sendall(_LENGTHS.pack(len(encoded), len(payload)) + encoded)
    if payload:
        sock.sendall(payload)


def read_message(
    sock: socket.socket, *, max_payload: int, deadline: float | None = None
) -> tuple[dict[str, Any], bytes]:
    """Receive one framed message: its header (a JSON object) and payload.

    Raises ``ProtocolError`` for a malformed or oversized message (nothing past the lengths is read
    then), ``EOFError`` when the peer closed the connection, ``TimeoutError`` when ``deadline`` (a
    ``time.monotonic()`` value; None: wait for ever) passes first, even mid-message.
    """
    header_length, payload_length = _LENGTHS.unpack(_read_exactly(sock, _LENGTHS.size, deadline))
    if header_length > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {header_length} bytes is over the limit of {MAX_HEADER_BYTES}")
    if payload_length > max_payload:
        raise ProtocolError(f"payload of {payload_length} bytes is over the limit of {max_payload}")
    raw_header = _read_exactly(sock, header_length, deadline)
    try:
        header = json.loads(raw_header.decode("utf-8"), parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ProtocolError(f"header is a JSON {type(header).__name__}, not an object")
    return header, _read_exactly(sock, payload_length, deadline)


def _refuse_constant(name: str) -> Any:
    raise ProtocolError(f"header holds {name}, which is not JSON")


def _read_exactly(sock: socket.socket, size: int, deadline: float | None) -> bytes:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no complete message in time")
            sock.settimeout(remaining)
        else:
            sock.settimeout(None)
        try:
            count = sock.recv_into(view[got:])
        except TimeoutError:
            raise TimeoutError("no complete message in time") from None
        except ConnectionResetError:
            raise EOFError("connection reset") from None
        if count == 0:
            raise EOFError("connection closed")
        got += count
    return bytes(buffer)
