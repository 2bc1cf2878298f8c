"""Guided decoding, as olmOCR's ``--guided_decoding``: page answers constrained to olmOCR's front matter.

With it a model can only answer in the shape the page parser accepts (the five keys, then the text), so
no attempt is lost to a malformed front matter. vLLM takes the constraint in a field that changed with
its releases: ``guided_regex`` until 0.11 (what olmOCR 0.4.27 sends; removed in 0.12), and
``structured_outputs: {"regex": ...}`` since 0.12, which ignores ``guided_regex`` with a log line only
(the vllm tier's contract suite shows it on 0.32). Sending the wrong one would silently turn the option
off, so the field is chosen from the server's ``GET /version`` before the first page, and a server that
does not report a vLLM version it can be chosen for is a configuration error then, not silence.

Pure but for ``server_field``'s one request.
"""

from __future__ import annotations

import json
import re

import httpx

from olmocr_tasks.core.errors import ServerMisconfigured
from olmocr_tasks.page.protocol import OLMOCR_FRONT_MATTER_REGEX

GUIDED_REGEX = "guided_regex"
STRUCTURED_OUTPUTS = "structured_outputs"
# The first release that reads structured_outputs (and no longer guided_regex), and the oldest one that
# reads guided_regex in its OpenAI server.
_STRUCTURED_SINCE = (0, 12)
_GUIDED_SINCE = (0, 4)
_VERSION = re.compile(r"^v?(\d+)\.(\d+)")


def field_for_version(version: str) -> str:
    """The request field vLLM ``version`` reads a regex constraint from; ``ValueError`` if none."""
    match = _VERSION.match(version.strip())
    if match is None:
        raise ValueError(f"{version!r} is not a vLLM version")
    release = (int(match.group(1)), int(match.group(2)))
    if release >= _STRUCTURED_SINCE:
        return STRUCTURED_OUTPUTS
    if release >= _GUIDED_SINCE:
        return GUIDED_REGEX
    raise ValueError(f"vLLM {version} predates guided decoding")


def with_guided_decoding(body: bytes, field: str, regex: str = OLMOCR_FRONT_MATTER_REGEX) -> bytes:
    """A JSON object body with the constraint as its last key, as ``json.dumps`` would write it."""
    value = {"regex": regex} if field == STRUCTURED_OUTPUTS else regex
    stripped = body.rstrip()
    if not stripped.endswith(b"}"):
        raise ValueError("a request body must be a JSON object")
    inner = stripped[:-1].rstrip()
    separator = b"" if inner.endswith(b"{") else b", "
    return inner + separator + json.dumps({field: value})[1:-1].encode() + b"}"


def version_url(base_url: str) -> str:
    """vLLM serves ``/version`` beside ``/v1``, at its root."""
    root = base_url.rstrip("/")
    return root.removesuffix("/v1") + "/version"


async def server_field(
    http: httpx.AsyncClient, base_url: str, display: str, headers: dict[str, str], timeout: httpx.Timeout | float
) -> str:
    """Ask one replica its vLLM version; the guided-decoding field it reads, or ``ServerMisconfigured``."""
    try:
        response = await http.get(version_url(base_url), headers=headers, timeout=timeout)
        version = response.json()["version"] if response.status_code == 200 else None
    except (httpx.HTTPError, OSError, ValueError, KeyError, TypeError):
        version = None
    why = "it does not report a vLLM version (GET /version)" if version is None else None
    if version is not None:
        try:
            return field_for_version(str(version))
        except ValueError as exc:
            why = str(exc)
    raise ServerMisconfigured(
        f"guided decoding is on, but {display} would not apply it: {why}; turn guided_decoding off or serve with vLLM"
    )
