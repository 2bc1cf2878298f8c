"""Where a triggered run may read and write: allow-lists of location prefixes.

Whoever can trigger a DAG run chooses its ``input_uri``, ``output_uri`` and ``documents``; without a
check they could point the worker at any local path or bucket its credentials reach. The deployment
decides instead, with two environment variables on the workers::

    OLMOCR_ALLOWED_INPUTS="s3://scans/incoming/ s3://scans/backfill/"   (spaces or commas between)
    OLMOCR_ALLOWED_OUTPUTS="s3://ocr-results/"

Each unset list defaults to the configured location (``OLMOCR_INPUT_URI`` / ``OLMOCR_OUTPUT_URI``).
With neither set there is nothing to compare against and that side is unrestricted; ``*`` allows
anything explicitly. Prefixes are folders: ``s3://b/in`` allows ``s3://b/in/x.pdf``, not
``s3://b/input/x.pdf``. Local paths are compared after resolving ``..`` and symbolic links, so neither
can lead out of an allowed folder; S3 keys with ``.`` or ``..`` segments are refused outright because
some S3-compatible stores collapse them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from olmocr_tasks.core.errors import ConfigurationError
from olmocr_tasks.storage.uri import is_s3, local_path, split_s3

ALLOWED_INPUTS_ENV = "OLMOCR_ALLOWED_INPUTS"
ALLOWED_OUTPUTS_ENV = "OLMOCR_ALLOWED_OUTPUTS"
INPUT_URI_ENV = "OLMOCR_INPUT_URI"
OUTPUT_URI_ENV = "OLMOCR_OUTPUT_URI"
ANYWHERE = "*"

_SEPARATORS = re.compile(r"[\s,]+")


class LocationNotAllowedError(ConfigurationError):
    """A run asked to read or write a location outside the deployment's allow-list."""

    def __init__(self, uri: str, role: str, allowed: tuple[str, ...]) -> None:
        self.uri, self.role, self.allowed = uri, role, allowed
        variable = ALLOWED_INPUTS_ENV if role == "input" else ALLOWED_OUTPUTS_ENV
        super().__init__(
            f"{role} {uri!r} is not allowed: it is not under {', '.join(allowed) or 'any allowed prefix'} "
            f"(set {variable} on the workers to allow it)"
        )


@dataclass(frozen=True)
class AccessPolicy:
    """Allowed input and output prefixes; ``None`` on a side means unrestricted."""

    inputs: tuple[str, ...] | None
    outputs: tuple[str, ...] | None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AccessPolicy:
        env = os.environ if environ is None else environ
        return cls(
            inputs=_prefixes(env.get(ALLOWED_INPUTS_ENV) or env.get(INPUT_URI_ENV)),
            outputs=_prefixes(env.get(ALLOWED_OUTPUTS_ENV) or env.get(OUTPUT_URI_ENV)),
        )

    def check_input(self, uri: str) -> None:
        _check(uri, "input", self.inputs)

    def check_output(self, uri: str) -> None:
        _check(uri, "output", self.outputs)

    def check_run(self, input_uri: str, output_uri: str, documents: Iterable[str] | None = None) -> None:
        """Every location a run would touch, before it touches any; the first offender is raised."""
        if input_uri:
            self.check_input(input_uri)
        for document in documents or ():
            self.check_input(document)
        self.check_output(output_uri)


def check_run_allowed(input_uri: str, output_uri: str, documents: Iterable[str] | None = None) -> None:
    """``AccessPolicy.from_env().check_run(...)``: what the plan task calls."""
    AccessPolicy.from_env().check_run(input_uri, output_uri, documents)


def _prefixes(value: str | None) -> tuple[str, ...] | None:
    items = tuple(item for item in _SEPARATORS.split(value or "") if item)
    if not items or ANYWHERE in items:
        return None
    return items


def _check(uri: str, role: str, allowed: tuple[str, ...] | None) -> None:
    if allowed is None:
        return
    try:
        candidate = _canonical(uri)
    except ValueError:
        raise LocationNotAllowedError(uri, role, allowed) from None
    for prefix in allowed:
        try:
            base = _canonical(prefix)
        except ValueError:
            continue  # a malformed allow-list entry allows nothing
        folder = base.rstrip("/")
        if candidate.rstrip("/") == folder or candidate.startswith(folder + "/"):
            return
    raise LocationNotAllowedError(uri, role, allowed)


def _canonical(uri: str) -> str:
    """One spelling per location: ``s3://bucket/key`` (scheme lower-cased) or an absolute real path."""
    if is_s3(uri):
        bucket, key = split_s3(uri)
        if any(part in (".", "..") for part in key.split("/")):
            raise ValueError(f"dot segments in an S3 key: {uri!r}")
        return f"s3://{bucket}/{key}"
    path = local_path(uri)
    if not path or "\0" in path:
        raise ValueError(f"not a path: {uri!r}")
    return os.path.realpath(os.path.abspath(path))
