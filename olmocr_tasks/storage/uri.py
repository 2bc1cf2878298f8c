"""Locations as strings: ``s3://bucket/key``, ``file://`` URIs and plain paths, and safe keys below them.

Nothing here performs I/O. ``join_uri`` trusts its parts; ``safe_join`` and ``safe_relative_key``
neutralise untrusted names (document keys, run ids) so they can only name something below a prefix.
"""

from __future__ import annotations

import hashlib
import unicodedata
from urllib.parse import unquote, urlsplit

S3_SCHEME = "s3://"


def is_s3(uri: str) -> bool:
    return uri[:5].lower() == S3_SCHEME


def split_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` → ``("bucket", "key")``; the key may be empty."""
    if not is_s3(uri):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[5:].partition("/")
    if not bucket:
        raise ValueError(f"s3 URI without a bucket: {uri!r}")
    return bucket, key


def local_path(uri: str) -> str:
    """A local URI (plain path or ``file://``) as a filesystem path."""
    if is_s3(uri):
        raise ValueError(f"not a local path: {uri!r}")
    if uri[:7].lower() == "file://":
        parts = urlsplit(uri)
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file:// URI with a remote host is not supported: {uri!r}")
        return unquote(parts.path) or "/"
    return uri


def join_uri(base: str, *parts: str) -> str:
    """Join key parts onto a base URI with ``/``. No sanitising: see ``safe_join`` for untrusted parts."""
    pieces = [part.strip("/") for part in parts if part and part.strip("/")]
    if not pieces:
        return base
    return "/".join([base.rstrip("/"), *pieces])


# Characters that must never reach a key: C0/C1 controls, lone surrogates (not encodable as UTF-8),
# line/paragraph separators and the bidi overrides used to disguise names.
_BIDI_CONTROLS = frozenset("\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})
# Leave room for suffixes such as ".jsonl" under the usual 255-byte file name limit.
_MAX_COMPONENT_BYTES = 200


def _safe_char(char: str) -> str:
    if char in _BIDI_CONTROLS or unicodedata.category(char) in _UNSAFE_CATEGORIES:
        return "_"
    if char == "\\":
        return "_"
    # Look-alikes that compatibility normalisation turns into separators (fullwidth solidus,
    # division slash...): a consumer applying NFKC must not see new path components.
    if char != "/" and any(c in "/\\" for c in unicodedata.normalize("NFKC", char)):
        return "_"
    return char


def _safe_component(component: str) -> str:
    cleaned = "".join(_safe_char(char) for char in component)
    # Dot-only names (also via NFKC look-alikes such as U+2024 or fullwidth dots) are never
    # followed: they would climb out of the prefix on a consumer that interprets them.
    if unicodedata.normalize("NFKC", cleaned).strip() in ("", ".", ".."):
        return ""
    encoded = cleaned.encode("utf-8")
    if len(encoded) > _MAX_COMPONENT_BYTES:
        digest = hashlib.sha1(encoded).hexdigest()[:10]
        head = encoded[: _MAX_COMPONENT_BYTES - 11].decode("utf-8", errors="ignore")
        cleaned = f"{head}~{digest}"
    return cleaned


def safe_relative_key(key: str) -> str:
    """Neutralise an untrusted relative key so it can only name something *below* a prefix.

    NFC-normalises, replaces backslashes, control and bidi characters with ``_``, drops empty, ``.``
    and ``..`` components (so absolute paths become relative) and caps component length. Returns
    ``""`` when nothing is left; idempotent.
    """
    normalised = unicodedata.normalize("NFC", key)
    components = (_safe_component(part) for part in normalised.split("/"))
    return "/".join(part for part in components if part)


def safe_join(base_uri: str, key: str) -> str:
    """``base_uri`` + a sanitised ``key``; raises ``ValueError`` instead of writing outside the base."""
    relative = safe_relative_key(key)
    if not relative:
        raise ValueError(f"key {key!r} is empty after sanitising")
    joined = join_uri(base_uri, relative)
    base = base_uri.rstrip("/") + "/"
    if not joined.startswith(base) or "/../" in f"/{relative}/":
        raise ValueError(f"key {key!r} escapes {base_uri!r}")
    return joined
