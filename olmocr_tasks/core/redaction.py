"""Keep secrets out of anything that is logged, returned through XCom or written to a manifest."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
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
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]+@")


def redact_urls(text: str) -> str:
    """Drop the user-info part (user and password) of every URL inside a text, such as an error message."""
    return _URL_USERINFO.sub(rf"\g<scheme>{_REDACTED}@", text)


# Parts of a field name that mark its value as secret; matched against whole parts of the name so
# ``max_tokens`` stays visible while ``api_key``, ``aws_session_token`` and s3fs's ``key`` /
# ``username`` (the access key id) do not.
SECRET_NAME_PARTS = frozenset(
    {"key", "apikey", "token", "secret", "password", "passwd", "credentials", "authorization", "username"}
)


def is_secret_name(name: str) -> bool:
    """Whether a field called ``name`` holds a secret (``*_set`` flags only say whether one is configured)."""
    lowered = name.lower()
    return bool(set(lowered.replace("-", "_").split("_")) & SECRET_NAME_PARTS) and not lowered.endswith("_set")


def secret_values(fields: Mapping[str, Any]) -> list[str]:
    """The values of every secret-named field in ``fields`` and the mappings nested in it (storage options)."""
    found: list[str] = []
    for name, value in fields.items():
        if isinstance(value, Mapping):
            found += secret_values(value)
        elif value and is_secret_name(str(name)):
            found.append(str(value))
    return found


def redact_fields(value: Any) -> Any:
    """A copy without the values of secret-named fields and without passwords embedded in URLs."""
    if isinstance(value, Mapping):
        return {name: _REDACTED if is_secret_name(str(name)) else redact_fields(item) for name, item in value.items()}
    if isinstance(value, list | tuple):
        return [redact_fields(item) for item in value]
    if isinstance(value, str) and "://" in value and "@" in value:
        return redact_url(value)
    return value


# Credentials a process may hold in its environment that libraries can end up logging: botocore logs
# every request's headers at DEBUG, the session token among them.
SECRET_ENVIRONMENT_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


def environment_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of the credential variables that are set."""
    env = os.environ if environ is None else environ
    return [env[name] for name in SECRET_ENVIRONMENT_VARIABLES if env.get(name)]


class RedactingFilter(logging.Filter):
    """Scrubs known secrets from every record a handler emits, whichever library logged it.

    Attach it to handlers (not loggers): a handler filter sees the records propagated from every
    logger, including third-party ones such as botocore's.
    """

    def __init__(self, secrets: Iterable[str | None]) -> None:
        super().__init__()
        self._secrets: list[str | None] = [secret for secret in secrets if secret]

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: let the handler report it as it would anyway
            return True
        record.msg, record.args = redact_text(message, self._secrets), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text, self._secrets)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info, self._secrets)
        return True


def install_log_redaction(secrets: Iterable[str | None], logger: logging.Logger | None = None) -> RedactingFilter:
    """Add a ``RedactingFilter`` to every handler of ``logger`` (the root logger by default)."""
    redacting = RedactingFilter(secrets)
    for handler in (logger or logging.getLogger()).handlers:
        handler.addFilter(redacting)
    return redacting
