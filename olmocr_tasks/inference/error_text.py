"""Failures of inference requests worded for logs and exceptions, with the client's secrets redacted.

The client's secrets are the API key and any password in a replica's URL; ``redact`` also catches
what looks like a credential. Texts are cut short: a server's error page can be megabytes.
"""

from __future__ import annotations

from collections.abc import Iterable

import httpx

from olmocr_tasks.core.redaction import redact

_ERROR_SNIPPET_CHARS = 300


class ErrorText:
    """Words exceptions and error answers without the given secrets."""

    def __init__(self, secrets: Iterable[str | None]) -> None:
        self.secrets: list[str | None] = list(secrets)

    def exception(self, exc: BaseException) -> str:
        text = str(exc) or repr(exc)
        return redact(f"{type(exc).__name__}: {text}", self.secrets)[:_ERROR_SNIPPET_CHARS]

    def snippet(self, response: httpx.Response) -> str:
        """``": <start of the body>"``, or nothing for an empty body."""
        text = response.text.strip().replace("\n", " ")
        if not text:
            return ""
        return ": " + redact(text, self.secrets)[:_ERROR_SNIPPET_CHARS]
