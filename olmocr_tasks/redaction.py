"""Keep secrets out of anything that is logged, returned through XCom or written to a manifest."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

_REDACTED = "***"


def redact_url(url: str) -> str:
    """Drop a password (or token) embedded in a URL's user-info part."""
    parts = urlsplit(url)
    if parts.password is None and "@" not in parts.netloc:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    user = parts.username
    netloc = f"{user}:{_REDACTED}@{host}" if user else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def redact_text(text: str, secrets: list[str | None]) -> str:
    """Replace every occurrence of each known secret (ignoring short or empty ones) in a text."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, _REDACTED)
    return _BEARER.sub("Bearer " + _REDACTED, text)


_BEARER = re.compile(r"Bearer\s+[A-Za-z0-9._~+/=-]+")
