"""Keep secrets out of anything that is logged, returned through XCom, written to a manifest or shown.

One function, ``redact``, for every kind of value, with one set of rules:

* **mappings**: the value of a field whose name marks it secret becomes ``***`` (``is_secret_name``:
  whole parts of the name, in any case and in snake, kebab or camel case: ``api_key``,
  ``secretAccessKey``, ``X-Amz-Security-Token``; not ``max_tokens``); other values are redacted in turn;
* **URLs** (a whole string or inside a text, ``redact_url``): the whole user-info part, whatever it
  holds (a password with ``/ # ? @ :``, a token as user name), and the values of secret-looking query
  and fragment parameters of web URLs (``api_key``, ``token``, ``X-Amz-Signature``,
  ``X-Amz-Credential``); never raises, whatever the URL (a non-numeric port, no host);
* **texts**: the credentials of ``Authorization`` headers (any scheme), ``Bearer`` tokens, ``Basic``
  credentials, ``name=value`` / ``"name": "value"`` pairs with a secret name, and every known secret
  value passed in (a key the process holds), wherever they appear.

Object names in ``s3://`` and ``file://`` URIs keep their ``?`` and ``=``: they are names, not queries.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote

REDACTED = "***"

# Whole parts of a field name that mark its value as secret: ``max_tokens`` stays visible while
# ``api_key``, ``aws_session_token`` and s3fs's ``key`` / ``username`` (the access key id) do not.
SECRET_NAME_PARTS = frozenset(
    {
        "key",
        "apikey",
        "token",
        "secret",
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "credential",
        "credentials",
        "authorization",
        "auth",
        "username",
        "signature",
        "sig",
        "cookie",
        "jwt",
        "bearer",
    }
)
# A part ending with one of these is secret too: names written as one lower-case word
# (``accesstoken``, ``secretkey``, ``clientsecret``).
_SECRET_PART_ENDINGS = (
    "apikey",
    "accesskey",
    "secretkey",
    "privatekey",
    "token",
    "secret",
    "password",
    "passwd",
    "signature",
    "credential",
    "credentials",
)
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NAME_SEPARATORS = re.compile(r"[^a-z0-9]+")


def name_parts(name: str) -> list[str]:
    """``secretAccessKey`` → ``["secret", "access", "key"]``; ``X-Amz-Credential`` → ``["x", "amz", "credential"]``."""
    return [part for part in _NAME_SEPARATORS.split(_CAMEL_BOUNDARY.sub("_", name).lower()) if part]


def is_secret_name(name: str) -> bool:
    """Whether a field called ``name`` holds a secret (``*_set`` flags only say whether one is configured)."""
    parts = name_parts(name)
    if not parts or parts[-1] == "set":
        return False
    return any(part in SECRET_NAME_PARTS or part.endswith(_SECRET_PART_ENDINGS) for part in parts)


def redact(value: Any, secrets: Iterable[str | None] = ()) -> Any:
    """A copy of ``value`` (a text, a URL, a mapping, a list) with every secret replaced by ``***``.

    ``secrets``: values known to be secret (an API key the process holds); each of four characters or
    more is removed wherever it appears. Values of other types come back as they are.
    """
    known = sorted({secret for secret in secrets if secret and len(secret) >= 4}, key=len, reverse=True)
    return _redact(value, known)


def _redact(value: Any, known: list[str]) -> Any:
    if isinstance(value, str):
        return _redact_text(value, known)
    if isinstance(value, Mapping):
        return {name: REDACTED if is_secret_name(str(name)) else _redact(item, known) for name, item in value.items()}
    if isinstance(value, list | tuple):
        return [_redact(item, known) for item in value]
    return value


# ------------------------------------------------------------------------------------------- URLs

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
# What may follow the ``@`` that ends a user-info part: a host (name, IPv4, [IPv6]) and a port, then
# the end or the path, query or fragment.
_HOST_AFTER_AT = re.compile(r"@(?:\[[0-9A-Za-z:.%]*\]|[A-Za-z0-9._~%!$&'()*+,;=-]*)(?::[0-9]*)?(?=[/?#]|$)")
# Names in these schemes are object keys and paths: ``?`` and ``=`` in them are characters of the name.
_NAME_SCHEMES = frozenset({"s3", "s3a", "s3n", "file", "gs", "gcs", "az", "abfs", "hdfs"})
_PARAM = re.compile(r"(?P<lead>[?&;#])(?P<name>[^=&;#?\s]+)=(?P<value>[^&;#\s]*)")


def redact_url(url: str) -> str:
    """``url`` without its user-info part and without the values of secret-looking query parameters.

    Never raises. A password that holds ``/``, ``#`` or ``?`` unescaped ends the authority early for a
    URL parser, so whenever what precedes the first of them holds a ``:`` or an ``@`` (user-info, or a
    port), the user-info is taken to run to the *last* ``@`` that is followed by a host: it is removed
    whole, at worst with more than the user-info (an e-mail address in the query), never less. An
    authority that is a plain host has no user-info: an ``@`` further on belongs to the path
    (``s3://bucket/me@example.com/a.pdf``).
    """
    scheme, separator, rest = url.partition("://")
    if not separator or not _SCHEME.fullmatch(scheme):
        return url
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if ":" in authority or "@" in authority:
        ends = [match.start() for match in _HOST_AFTER_AT.finditer(rest)]
        end = ends[-1] if ends else authority.rfind("@")
        if end >= 0:
            rest = REDACTED + rest[end:]
    if scheme.lower() not in _NAME_SCHEMES:
        rest = _redact_params(rest)
    return f"{scheme}://{rest}"


def _redact_params(rest: str) -> str:
    """Secret-named query and fragment parameters of a URL's tail keep their names, not their values."""
    start = min((index for index in (rest.find("?"), rest.find("#")) if index >= 0), default=-1)
    if start < 0:
        return rest

    def hide(match: re.Match[str]) -> str:
        if is_secret_name(unquote(match["name"])):
            return f"{match['lead']}{match['name']}={REDACTED}"
        return match[0]

    return rest[:start] + _PARAM.sub(hide, rest[start:])


# ------------------------------------------------------------------------------------------- texts

_WHOLE_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S*")
# Every pattern that opens on a run of name characters starts only where such a run starts (the
# look-behind): tried at each position of a long word instead, it would cost the word's length squared.
_URL_IN_TEXT = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>`]+")
# ``Authorization: Bearer x``, ``'authorization': 'Basic x'``, ``Proxy-Authorization=...``: all of the
# credentials, up to the end of the line or of the quoted value.
_AUTHORIZATION = re.compile(r"(?i)(\b(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)[^\r\n\"']+")
_BEARER = re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]+")
_BASIC = re.compile(r"(?i)\b(basic)\s+([A-Za-z0-9+/=_-]{4,})")
# ``name=value``, ``name: value``, ``"name": "value"``: the value up to a quote, a separator or a space.
_NAMED_VALUE = re.compile(
    r"(?<![A-Za-z0-9_.-])(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P<sep>[\"']?\s*[:=]\s*[\"']?)(?P<value>[^\s\"',;&}\]]+)"
)


def _redact_text(text: str, known: list[str]) -> str:
    for secret in known:
        text = text.replace(secret, REDACTED)
    if _WHOLE_URL.fullmatch(text):
        return redact_url(text)  # a value that is one URL: its user-info may hold quotes
    if "://" not in text:
        return _redact_prose(text)
    pieces: list[str] = []
    position = 0
    for match in _URL_IN_TEXT.finditer(text):
        pieces += [_redact_prose(text[position : match.start()]), redact_url(match[0])]
        position = match.end()
    pieces.append(_redact_prose(text[position:]))
    return "".join(pieces)


def _redact_prose(text: str) -> str:
    """Headers and secret-named values in a text without URLs."""
    if not text:
        return text
    text = _AUTHORIZATION.sub(rf"\g<1>{REDACTED}", text)
    text = _BEARER.sub(rf"\g<1> {REDACTED}", text)
    text = _BASIC.sub(_hide_basic, text)

    def hide(match: re.Match[str]) -> str:
        if match["value"] == REDACTED or not is_secret_name(match["name"]):
            return match[0]
        return f"{match['name']}{match['sep']}{REDACTED}"

    return _NAMED_VALUE.sub(hide, text)


def _hide_basic(match: re.Match[str]) -> str:
    """``Basic <base64 of user:password>``; the word "basic" before anything else stays."""
    token = match[2]
    try:
        decoded = base64.b64decode(token + "=" * (-len(token) % 4), validate=False)
    except (binascii.Error, ValueError):
        return match[0]
    return f"{match[1]} {REDACTED}" if b":" in decoded else match[0]


# ---------------------------------------------------------------------------------- known secrets


def secret_values(fields: Mapping[str, Any]) -> list[str]:
    """The values of every secret-named field in ``fields`` and the mappings nested in it (storage options)."""
    found: list[str] = []
    for name, value in fields.items():
        if isinstance(value, Mapping):
            found += secret_values(value)
        elif value and is_secret_name(str(name)):
            found.append(str(value))
    return found


# Credentials a process may hold in its environment that libraries can end up logging: botocore logs
# every request's headers at DEBUG, the session token among them.
SECRET_ENVIRONMENT_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


def environment_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """The values of the credential variables that are set."""
    env = os.environ if environ is None else environ
    return [env[name] for name in SECRET_ENVIRONMENT_VARIABLES if env.get(name)]


# ------------------------------------------------------------------------------------------- logs


class RedactingFilter(logging.Filter):
    """Scrubs secrets (known values and the patterns ``redact`` knows) from every record a handler emits,
    whichever library logged it.

    Attach it to handlers (not loggers): a handler filter sees the records propagated from every
    logger, including third-party ones such as botocore's.
    """

    def __init__(self, secrets: Iterable[str | None]) -> None:
        super().__init__()
        self._secrets: list[str] = [secret for secret in secrets if secret]

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: let the handler report it as it would anyway
            return True
        record.msg, record.args = redact(message, self._secrets), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self._secrets)
        if record.stack_info:
            record.stack_info = redact(record.stack_info, self._secrets)
        return True


def install_log_redaction(secrets: Iterable[str | None], logger: logging.Logger | None = None) -> RedactingFilter:
    """Add a ``RedactingFilter`` to every handler of ``logger`` (the root logger by default)."""
    redacting = RedactingFilter(secrets)
    for handler in (logger or logging.getLogger()).handlers:
        handler.addFilter(redacting)
    return redacting
