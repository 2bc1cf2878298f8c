"""olmOCR 0.4.27 page protocol: exact prompt, exact request bytes, strict answer validation."""

from __future__ import annotations

import json

import pytest

from olmocr_tasks.protocol import (
    PROMPT_V4,
    TEMPERATURE_BY_ATTEMPT,
    CompletionFormatError,
    FrontMatterError,
    RequestBodyBuilder,
    build_page_query,
    parse_completion,
    parse_front_matter,
    temperature_for_attempt,
)

MODEL = "allenai/olmOCR-2-7B-1025-FP8"
IMAGE = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def test_prompt_is_olmocr_v4_yaml_prompt_verbatim() -> None:
    assert len(PROMPT_V4) == 557
    assert PROMPT_V4.startswith("Attached is one page of a document that you must process.")
    assert PROMPT_V4.count("\n") == 2 and not PROMPT_V4.endswith("\n")
    assert "Convert equations to LateX and tables to HTML.\nIf there are any figures or charts" in PROMPT_V4
    assert PROMPT_V4.endswith("is_rotation_valid, rotation_correction, is_table, and is_diagram parameters.")
    assert PROMPT_V4 == (
        "Attached is one page of a document that you must process. Just return the plain text representation of "
        "this document as if you were reading it naturally. Convert equations to LateX and tables to HTML.\n"
        "If there are any figures or charts, label them with the following markdown syntax ![Alt text describing "
        "the contents of the figure](page_startx_starty_width_height.png)\nReturn your output as markdown, with a "
        "front matter section on top specifying values for the primary_language, is_rotation_valid, "
        "rotation_correction, is_table, and is_diagram parameters."
    )


def test_temperature_ladder_and_clamping() -> None:
    assert TEMPERATURE_BY_ATTEMPT == (0.1, 0.1, 0.2, 0.3, 0.5, 0.8, 0.9, 1.0)
    assert [temperature_for_attempt(i) for i in range(10)] == [0.1, 0.1, 0.2, 0.3, 0.5, 0.8, 0.9, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("temperature", TEMPERATURE_BY_ATTEMPT)
def test_request_bytes_equal_python_json_dumps_of_olmocr_query(temperature: float) -> None:
    body = RequestBodyBuilder(MODEL).build(IMAGE.encode(), temperature)
    assert body == json.dumps(build_page_query(MODEL, IMAGE, temperature)).encode()
    decoded = json.loads(body)
    assert list(decoded) == ["model", "messages", "max_tokens", "temperature"]
    assert decoded["max_tokens"] == 8000
    assert decoded["temperature"] == temperature
    (message,) = decoded["messages"]
    assert message["role"] == "user"
    text_part, image_part = message["content"]
    assert text_part == {"type": "text", "text": PROMPT_V4}
    assert image_part == {"type": "image_url", "image_url": {"url": "data:image/png;base64," + IMAGE}}
    assert body.isascii() and b'", "' in body  # Python's default separators, ASCII escaping


def test_model_names_with_quotes_and_unicode_are_escaped_like_json_dumps() -> None:
    model = 'weird"model\u00e9'
    body = RequestBodyBuilder(model, max_tokens=123).build(IMAGE.encode(), 0.5)
    assert body == json.dumps(build_page_query(model, IMAGE, 0.5, max_tokens=123)).encode()


ANSWER = (
    "---\nprimary_language: en\nis_rotation_valid: True\nrotation_correction: 0\nis_table: False\n"
    "is_diagram: False\n---\nHello world.\n\nSecond paragraph.  \n"
)


def test_front_matter_parses_five_keys_and_strips_text() -> None:
    response = parse_front_matter(ANSWER)
    assert response.primary_language == "en"
    assert response.is_rotation_valid is True
    assert response.rotation_correction == 0
    assert response.is_table is False and response.is_diagram is False
    assert response.natural_text == "Hello world.\n\nSecond paragraph."


def test_front_matter_coercions_follow_olmocr() -> None:
    answer = (
        "---\nprimary_language: no\nis_rotation_valid: 'TRUE'\nrotation_correction: '90'\nis_table: 'yes'\n"
        "is_diagram: true\n---\n"
    )
    response = parse_front_matter(answer)
    assert response.primary_language is None  # YAML bool → None
    assert response.is_rotation_valid is True  # "true" case-insensitively
    assert response.rotation_correction == 90  # str → int
    assert response.is_table is False  # any other string is false
    assert response.is_diagram is True
    assert response.natural_text is None  # empty text → None
    assert parse_front_matter(answer.replace("primary_language: no", "primary_language: ''")).primary_language is None
    # Python's None printed by the training formatter stays the string "None", as in olmOCR.
    assert parse_front_matter(answer.replace("primary_language: no", "primary_language: None")).primary_language == (
        "None"
    )


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ("Hello, no front matter", "does not start"),
        ("---\nprimary_language: en\n", "not closed"),
        (ANSWER.replace("is_diagram: False\n", ""), "missing required field(s): is_diagram"),
        (ANSWER.replace("is_table: False\n", "is_table: False\nconfidence: 3\n"), "unexpected field(s): confidence"),
        (ANSWER.replace("rotation_correction: 0", "rotation_correction: 45"), "one of 0, 90, 180, 270"),
        (ANSWER.replace("rotation_correction: 0", "rotation_correction: ninety"), "not an integer"),
        (ANSWER.replace("is_table: False", "is_table: 3"), "is_table must be a boolean"),
        ("---\n- a\n- b\n---\ntext", "not a mapping"),
        ("---\nprimary_language: [unclosed\n---\ntext", "not valid YAML"),
    ],
)
def test_front_matter_rejections(answer: str, message: str) -> None:
    with pytest.raises(FrontMatterError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_front_matter(answer)


def _completion(content: str, finish_reason: str = "stop", usage: dict | None = None) -> dict:
    payload: dict = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}
    payload["choices"][0]["finish_reason"] = finish_reason
    if usage is not None:
        payload["usage"] = usage
    return payload


def test_completion_valid_only_with_stop_and_tokens_within_context() -> None:
    usage = {"prompt_tokens": 1500, "completion_tokens": 300, "total_tokens": 1800}
    ok = parse_completion(_completion(ANSWER, usage=usage))
    assert ok.is_valid and (ok.input_tokens, ok.output_tokens, ok.total_tokens) == (1500, 300, 1800)
    assert not parse_completion(_completion(ANSWER, "length", usage)).is_valid
    overlong = {"prompt_tokens": 9000, "completion_tokens": 8000, "total_tokens": 17000}
    assert not parse_completion(_completion(ANSWER, usage=overlong)).is_valid
    assert parse_completion(_completion(ANSWER, usage=overlong), model_max_context=20000).is_valid
    at_limit = {"prompt_tokens": 8384, "completion_tokens": 8000, "total_tokens": 16384}
    assert parse_completion(_completion(ANSWER, usage=at_limit)).is_valid


def test_completion_without_usage_counts_zero_tokens_but_stays_valid() -> None:
    completion = parse_completion(_completion(ANSWER))
    assert completion.is_valid and completion.total_tokens == 0


def test_invalid_completion_is_still_parsed_for_its_rotation() -> None:
    rotated = ANSWER.replace("is_rotation_valid: True", "is_rotation_valid: False").replace(
        "rotation_correction: 0", "rotation_correction: 270"
    )
    completion = parse_completion(_completion(rotated, "length"))
    assert not completion.is_valid
    assert completion.response.rotation_correction == 270 and not completion.response.is_rotation_valid


@pytest.mark.parametrize("payload", [{}, {"choices": []}, {"choices": [{"message": {"content": None}}]}, []])
def test_malformed_completion_payloads(payload: object) -> None:
    with pytest.raises(CompletionFormatError):
        parse_completion(payload)
