"""olmOCR 0.4.27's page protocol: prompt, request body, response validation, and the front matter
both read (from the model) and written (by the servers we run: the CPU engine, the test stand-in).

This module is pure (no I/O) so the exact bytes we send and the exact acceptance rules can be tested
in isolation. The behaviour follows olmOCR's published pipeline; the code is our own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import yaml

PROMPT_VERSION = "olmocr-v4-yaml"

PROMPT_V4 = (
    "Attached is one page of a document that you must process. Just return the plain text representation "
    "of this document as if you were reading it naturally. Convert equations to LateX and tables to HTML.\n"
    "If there are any figures or charts, label them with the following markdown syntax "
    "![Alt text describing the contents of the figure](page_startx_starty_width_height.png)\n"
    "Return your output as markdown, with a front matter section on top specifying values for the "
    "primary_language, is_rotation_valid, rotation_correction, is_table, and is_diagram parameters."
)

# Attempt i is sent at TEMPERATURE_BY_ATTEMPT[min(i, 7)].
TEMPERATURE_BY_ATTEMPT: tuple[float, ...] = (0.1, 0.1, 0.2, 0.3, 0.5, 0.8, 0.9, 1.0)

# olmOCR's --guided_decoding constraint (pipeline.py): the front matter's five keys in training order,
# then either the end of the answer or a newline and the page text.
OLMOCR_FRONT_MATTER_REGEX = (
    "---\nprimary_language: (?:[a-z]{2}|null)\nis_rotation_valid: (?:True|False|true|false)\n"
    "rotation_correction: (?:0|90|180|270)\nis_table: (?:True|False|true|false)\n"
    "is_diagram: (?:True|False|true|false)\n(?:---|---\n[\\s\\S]+)"
)

VALID_ROTATIONS = frozenset({0, 90, 180, 270})
FRONT_MATTER_KEYS = ("primary_language", "is_rotation_valid", "rotation_correction", "is_table", "is_diagram")
_BOOL_KEYS = ("is_rotation_valid", "is_table", "is_diagram")

_IMAGE_PLACEHOLDER = "\x00IMAGE\x00"
# libyaml's loader parses a front matter ~8x faster than the pure-Python one; same safe semantics.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class FrontMatterError(ValueError):
    """The model's answer does not carry olmOCR's front matter exactly."""


class CompletionFormatError(ValueError):
    """The server's JSON is not an OpenAI chat completion."""


def temperature_for_attempt(attempt: int) -> float:
    return TEMPERATURE_BY_ATTEMPT[min(attempt, len(TEMPERATURE_BY_ATTEMPT) - 1)]


class RequestBodyBuilder:
    """Builds request bodies byte-identical to ``json.dumps`` of olmOCR's page query.

    The page image dominates the body, so the fixed JSON around it is serialised once and the base64
    text is spliced in: base64 never needs JSON escaping, so the result equals ``json.dumps(body)``
    with Python's default separators and ``ensure_ascii=True``, keys in the order model, messages,
    max_tokens, temperature.
    """

    def __init__(self, model: str, max_tokens: int = 8000) -> None:
        template = json.dumps(
            {
                "model": model,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": PROMPT_V4},
                            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + _IMAGE_PLACEHOLDER}},
                        ],
                    }
                ],
                "max_tokens": max_tokens,
                "temperature": 0.0,
            }
        )
        placeholder = json.dumps(_IMAGE_PLACEHOLDER)[1:-1]
        head, tail = template.split(placeholder)
        suffix_without_temperature, _ = tail.rsplit("0.0", 1)
        self._head = head.encode("ascii")
        self._tail = suffix_without_temperature.encode("ascii")

    def build(self, image_png_base64: bytes, temperature: float) -> bytes:
        return b"".join((self._head, image_png_base64, self._tail, repr(float(temperature)).encode(), b"}"))


@dataclass(frozen=True)
class PageResponse:
    """The five front-matter attributes and the page text of one model answer."""

    primary_language: str | None
    is_rotation_valid: bool
    rotation_correction: int
    is_table: bool
    is_diagram: bool
    natural_text: str | None

    def attributes(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in FRONT_MATTER_KEYS}


@dataclass(frozen=True)
class Completion:
    """One parsed chat completion: the page answer plus what decides whether it is acceptable."""

    response: PageResponse
    finish_reason: str | None
    input_tokens: int
    output_tokens: int
    total_tokens: int
    is_valid: bool


def parse_front_matter(content: str) -> PageResponse:
    """Parse olmOCR's YAML front matter strictly: exactly the five keys, olmOCR's coercions."""
    if not content.startswith("---\n"):
        raise FrontMatterError("answer does not start with a front matter block")
    end = content.find("\n---", 4)
    if end == -1:
        raise FrontMatterError("front matter block is not closed")
    try:
        data = yaml.load(content[4:end], Loader=_YAML_LOADER)
    except yaml.YAMLError as exc:
        raise FrontMatterError(f"front matter is not valid YAML: {exc.__class__.__name__}") from None
    if not isinstance(data, dict):
        raise FrontMatterError("front matter is not a mapping")
    missing = [key for key in FRONT_MATTER_KEYS if key not in data]
    if missing:
        raise FrontMatterError(f"missing required field(s): {', '.join(missing)}")
    extra = sorted(str(key) for key in data if key not in FRONT_MATTER_KEYS)
    if extra:
        raise FrontMatterError(f"unexpected field(s): {', '.join(extra)}")

    language = data["primary_language"]
    if isinstance(language, bool) or not language:  # YAML's no/false, "", 0, [] are no language, as in olmOCR
        language = None
    if language is not None and not isinstance(language, str):
        raise FrontMatterError("primary_language must be a string or null")

    flags: dict[str, bool] = {}
    for key in _BOOL_KEYS:
        value = data[key]
        if isinstance(value, str):
            value = value.lower() == "true"
        if not isinstance(value, bool):
            raise FrontMatterError(f"{key} must be a boolean")
        flags[key] = value

    rotation = data["rotation_correction"]
    if isinstance(rotation, str):
        try:
            rotation = int(rotation)
        except ValueError:
            raise FrontMatterError("rotation_correction is not an integer") from None
    if isinstance(rotation, bool) or not isinstance(rotation, int):
        raise FrontMatterError("rotation_correction must be an integer")
    if rotation not in VALID_ROTATIONS:
        raise FrontMatterError(f"rotation_correction must be one of 0, 90, 180, 270, got {rotation}")

    text = content[end + 4 :].strip()
    return PageResponse(
        primary_language=language,
        is_rotation_valid=flags["is_rotation_valid"],
        rotation_correction=rotation,
        is_table=flags["is_table"],
        is_diagram=flags["is_diagram"],
        natural_text=text or None,
    )


def format_front_matter(
    *,
    primary_language: str | None,
    is_rotation_valid: bool,
    rotation_correction: int,
    is_table: bool = False,
    is_diagram: bool = False,
) -> str:
    """The front matter an olmOCR model answers with: the five keys in training order, ``null`` for
    no language, Python-style booleans. ``parse_front_matter`` reads it back."""
    return (
        "---\n"
        f"primary_language: {primary_language if primary_language else 'null'}\n"
        f"is_rotation_valid: {bool(is_rotation_valid)}\n"
        f"rotation_correction: {int(rotation_correction)}\n"
        f"is_table: {bool(is_table)}\n"
        f"is_diagram: {bool(is_diagram)}\n"
        "---\n"
    )


def parse_completion(payload: Any, model_max_context: int = 16384) -> Completion:
    """Validate an OpenAI chat-completion JSON object and parse its answer.

    Valid means ``finish_reason == "stop"`` and total tokens within the model's context. An invalid
    answer is still parsed (olmOCR keeps it as a candidate when its rotation is the only problem).
    A missing ``usage`` block counts as zero tokens instead of failing every attempt as olmOCR does.
    """
    try:
        choice = payload["choices"][0]
        content = choice["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise CompletionFormatError("response has no choices[0].message.content") from None
    if not isinstance(content, str):
        raise CompletionFormatError("message content is not a string")
    input_tokens, output_tokens, reported_total = _usage_counts(payload)
    total_tokens = reported_total or input_tokens + output_tokens
    finish_reason = choice.get("finish_reason")
    response = parse_front_matter(content)
    return Completion(
        response=response,
        finish_reason=finish_reason,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=total_tokens,
        is_valid=finish_reason == "stop" and total_tokens <= model_max_context,
    )


def usage_tokens(payload: dict[str, Any]) -> int:
    """Prompt plus completion tokens that an answer's ``usage`` block reports (0 where it reports none)."""
    input_tokens, output_tokens, _ = _usage_counts(payload)
    return input_tokens + output_tokens


def _usage_counts(payload: dict[str, Any]) -> tuple[int, int, int]:
    """Prompt, completion and total tokens of an answer's ``usage`` block (0 for each one it lacks)."""
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return 0, 0, 0
    count = _as_count
    return count(usage.get("prompt_tokens")), count(usage.get("completion_tokens")), count(usage.get("total_tokens"))


def _as_count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
