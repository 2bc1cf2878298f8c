"""Where a triggered run may read and write: allow-lists of location prefixes, closed unless configured.

Whoever can trigger a DAG run chooses its ``input_uri``, ``output_uri`` and ``documents``; without a
check they could point the worker at any local path or bucket its credentials reach. The deployment
decides instead, with two environment variables on the workers::

    OLMOCR_ALLOWED_INPUTS="s3://scans/incoming/ s3://scans/backfill/"   (spaces or commas between)
    OLMOCR_ALLOWED_OUTPUTS="s3://ocr-results/"

Each unset list defaults to the configured location (``OLMOCR_INPUT_URI`` / ``OLMOCR_OUTPUT_URI``).
With neither set, that side is **closed**: a run that would read (or write) there fails with
``AccessNotConfiguredError`` naming the variable to set. ``*`` allows anywhere, explicitly. Prefixes
are folders: ``s3://b/in`` allows ``s3://b/in/x.pdf``, not ``s3://b/input/x.pdf``. S3 keys with ``.``
or ``..`` segments are refused outright because some S3-compatible stores collapse them.

Local locations are compared after resolving ``..`` and symbolic links (``os.path.realpath``, of the
location and of the prefix): neither can lead out of an allowed folder. A run's named documents are
first checked as written (``check_run``: a name outside every prefix fails the run); each document is
then checked resolved, by planning and again by the convert task just before it is opened
(``check_input``, which returns the real path to open): one whose name lies inside but whose file
lies outside (a symbolic link) is refused as that document's failure, ``outside_allowed``. Every
``file://`` URI is read by ``storage.uri.local_path``, the one parser the check and the open share.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from olmocr_tasks.core import environment
from olmocr_tasks.core.errors import ConfigurationError
from olmocr_tasks.storage.uri import is_s3, local_path, split_s3

ALLOWED_INPUTS_ENV = environment.ALLOWED_INPUTS
ALLOWED_OUTPUTS_ENV = environment.ALLOWED_OUTPUTS
INPUT_URI_ENV = environment.INPUT_URI
OUTPUT_URI_ENV = environment.OUTPUT_URI
ANYWHERE = "*"

_SEPARATORS = re.compile(r"[\s,]+")
_VARIABLES = {"input": (ALLOWED_INPUTS_ENV, INPUT_URI_ENV), "output": (ALLOWED_OUTPUTS_ENV, OUTPUT_URI_ENV)}


class LocationNotAllowedError(ConfigurationError):
    """A run asked to read or write a location outside the deployment's allow-list.

    ``linked``: the location's name is inside an allowed prefix but what it names is not (a symbolic
    link, or a ``..`` after one); the message does not say where it leads.
    """

    def __init__(self, uri: str, role: str, allowed: tuple[str, ...], *, linked: bool = False) -> None:
        self.uri, self.role, self.allowed, self.linked = uri, role, allowed, linked
        where = ", ".join(allowed) or "any allowed prefix"
        reason = (
            f"it resolves (through a symbolic link) to a file outside {where}" if linked else f"it is not under {where}"
        )
        variable = _VARIABLES[role][0]
        super().__init__(f"{role} {uri!r} is not allowed: {reason} (set {variable} on the workers to allow it)")


class AccessNotConfiguredError(ConfigurationError):
    """The workers have no allow-list for a side a run needs: nothing is read or written there."""

    def __init__(self, role: str) -> None:
        self.role = role
        allowed, configured = _VARIABLES[role]
        super().__init__(
            f"no {role} locations are allowed on this worker: set {allowed} (prefixes, or {ANYWHERE} for anywhere) "
            f"or {configured} in the workers' environment"
        )


@dataclass(frozen=True)
class AccessPolicy:
    """Allowed input and output prefixes; on a side, ``None`` means anywhere (an explicit ``*``) and
    ``()`` nothing (no allow-list configured: fail closed)."""

    inputs: tuple[str, ...] | None
    outputs: tuple[str, ...] | None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AccessPolicy:
        inputs, outputs = environment.allowed_locations(environ)
        return cls(inputs=_prefixes(inputs), outputs=_prefixes(outputs))

    @classmethod
    def anywhere(cls) -> AccessPolicy:
        """No restriction on either side: the CLI's (its user runs it with their own credentials)."""
        return cls(inputs=None, outputs=None)

    def check_input(self, uri: str) -> str:
        """Raise unless ``uri`` may be read; return what to open: a local file's real path, else ``uri``."""
        return _check(uri, "input", self.inputs)

    def check_output(self, uri: str) -> str:
        return _check(uri, "output", self.outputs)

    def check_run(self, input_uri: str, output_uri: str, documents: Iterable[str] | None = None) -> None:
        """Every location a run would touch, before it touches any; the first offender is raised.

        Both sides must be configured (a run reads and writes). Named documents are checked by name
        here (a symbolic link among them is each document's own failure, found by ``check_input``).
        """
        for role, allowed in (("input", self.inputs), ("output", self.outputs)):
            if allowed == ():
                raise AccessNotConfiguredError(role)
        if input_uri:
            self.check_input(input_uri)
        for document in documents or ():
            _check_named(document, self.inputs)
        self.check_output(output_uri)


def _prefixes(value: str | None) -> tuple[str, ...] | None:
    items = tuple(item for item in _SEPARATORS.split(value or "") if item)
    return None if ANYWHERE in items else items


def _check(uri: str, role: str, allowed: tuple[str, ...] | None) -> str:
    if allowed is None:
        return uri if is_s3(uri) else local_path(uri)
    if not allowed:
        raise AccessNotConfiguredError(role)
    try:
        candidate = _canonical(uri)
    except ValueError:
        raise LocationNotAllowedError(uri, role, allowed) from None
    if _under_any(candidate, allowed, _canonical):
        return candidate
    # Inside by its name but not once resolved: a link leading out (said so, without saying where).
    linked = not is_s3(uri) and _named_inside(uri, allowed)
    raise LocationNotAllowedError(uri, role, allowed, linked=linked)


def _check_named(uri: str, allowed: tuple[str, ...] | None) -> None:
    """A named input inside the allowed prefixes by its name or resolved (``check_input`` decides which)."""
    if allowed is None:
        return
    try:
        _check(uri, "input", allowed)
    except LocationNotAllowedError as exc:
        if not exc.linked:
            raise


def _named_inside(uri: str, allowed: tuple[str, ...]) -> bool:
    try:
        return _under_any(_lexical(uri), allowed, _lexical)
    except ValueError:
        return False


def _under_any(candidate: str, allowed: tuple[str, ...], canonical: Callable[[str], str]) -> bool:
    for prefix in allowed:
        try:
            folder = canonical(prefix).rstrip("/")
        except ValueError:
            continue  # a malformed allow-list entry allows nothing
        if candidate.rstrip("/") == folder or candidate.startswith(folder + "/"):
            return True
    return False


def _canonical(uri: str) -> str:
    """One spelling per location: ``s3://bucket/key`` (scheme lower-cased) or an absolute real path."""
    if is_s3(uri):
        return _s3(uri)
    return os.path.realpath(_local(uri))


def _lexical(uri: str) -> str:
    """A location as written: ``..`` collapsed, symbolic links not followed."""
    if is_s3(uri):
        return _s3(uri)
    return os.path.normpath(_local(uri))


def _s3(uri: str) -> str:
    bucket, key = split_s3(uri)
    if any(part in (".", "..") for part in key.split("/")):
        raise ValueError(f"dot segments in an S3 key: {uri!r}")
    return f"s3://{bucket}/{key}"


def _local(uri: str) -> str:
    path = local_path(uri)
    if not path or "\0" in path:
        raise ValueError(f"not a path: {uri!r}")
    return os.path.abspath(path)
