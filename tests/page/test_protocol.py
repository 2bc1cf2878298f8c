"""olmOCR 0.4.27's page protocol, checked against olmOCR itself.

``tests/fixtures/golden/olmocr-0.4.27.json`` was written by ``scripts/golden_olmocr.py`` from olmOCR's
own functions (its prompt builder, the request ``try_single_page`` put on the wire, what
``try_single_page`` made of server answers, what its front-matter parser made of model answers). The
tests here compare our request bodies and our parse results with it field by field; the page images
come from different renderers (PDFium here, poppler there), so for them the size and the page marker
they show are compared instead of the bytes. The same holds for PNG and JPEG page images, which
olmOCR wraps in a one-page PDF (img2pdf) and renders, and we scale directly.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
from dataclasses import asdict
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from olmocr_tasks.page.protocol import (
    FRONT_MATTER_KEYS,
    PROMPT_V4,
    TEMPERATURE_BY_ATTEMPT,
    CompletionFormatError,
    FrontMatterError,
    RequestBodyBuilder,
    parse_completion,
    parse_front_matter,
    temperature_for_attempt,
)
from olmocr_tasks.page.render_pool import RenderPool
from olmocr_testkit.page_marker import read_marker
from olmocr_testkit.page_query import build_page_query
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.cli_process import run_cli

GOLDEN_DIR = Path(__file__).parents[1] / "fixtures" / "golden"
GOLDEN_FILE = GOLDEN_DIR / "olmocr-0.4.27.json"
MODEL = "allenai/olmOCR-2-7B-1025-FP8"
IMAGE = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="

# Where we differ from olmOCR on purpose (each also stated in olmocr_tasks/page/protocol.py):
# a completion without ``usage`` (or without ``usage.total_tokens``) is a KeyError and a failed
# attempt in olmOCR; we accept the answer and count the tokens we are given. Some OpenAI-compatible
# servers omit usage, and failing every page on them would turn every page into a fallback.
ACCEPTED_WHERE_OLMOCR_FAILS = {"usage_missing", "usage_without_total"}


@cache
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN_FILE.read_text())


def _names(section: str) -> list[str]:
    return list(golden()[section])


def _image_facts(image_b64: bytes) -> dict[str, Any]:
    with Image.open(io.BytesIO(base64.b64decode(image_b64, validate=True))) as image:
        found = read_marker(image.convert("RGB"))
        facts: dict[str, Any] = {"format": image.format, "size": list(image.size)}
    facts["marker"] = None if found is None else asdict(found)
    return facts


# -- prompt and request body ------------------------------------------------------------------------


def test_prompt_and_temperatures_are_olmocrs_own() -> None:
    assert golden()["olmocr_version"] == "0.4.27"
    assert golden()["prompt"] == PROMPT_V4
    assert list(TEMPERATURE_BY_ATTEMPT) == golden()["temperature_by_attempt"]


@pytest.mark.parametrize("name", [case["name"] for case in golden()["requests"]])
def test_request_body_equals_olmocrs_wire_body_except_the_image(name: str, render_pool: RenderPool) -> None:
    (case,) = [case for case in golden()["requests"] if case["name"] == name]
    # A PNG or JPEG page image is rendered from the image itself; olmOCR wrapped it in a one-page PDF
    # with img2pdf and rendered that.
    source = GOLDEN_DIR / "pdfs" / case["pdf"] if "pdf" in case else GOLDEN_DIR / "images" / case["image_file"]
    image_b64 = asyncio.run(
        render_pool.render_page(
            str(source),
            case["page"] - 1,
            golden()["target_longest_image_dim"],
            case["rotation"],
        )
    )
    body = RequestBodyBuilder(case["model"]).build(image_b64, temperature_for_attempt(case["attempt"]))

    # Every byte around the image: key order, separators, escaping, prompt, max_tokens, temperature.
    assert body.replace(image_b64, golden()["image_placeholder"].encode()).decode("ascii") == case["body"]
    ours, theirs = json.loads(body), json.loads(case["body"])
    assert list(ours) == list(theirs)
    for key in theirs:
        if key != "messages":
            assert ours[key] == theirs[key], key
    assert ours["messages"][0]["content"][0] == theirs["messages"][0]["content"][0]

    # The image: the same page in the same orientation. poppler rounds a partial pixel up where we
    # round to the nearest, so the shorter side may differ by one pixel; the longest side is exact.
    image = _image_facts(image_b64)
    expected = case["image"]
    assert (image["format"], image["marker"]) == (expected["format"], expected["marker"])
    assert max(image["size"]) == max(expected["size"]) == golden()["target_longest_image_dim"]
    assert [abs(a - b) <= 1 for a, b in zip(image["size"], expected["size"], strict=True)] == [True, True], (
        image["size"],
        expected["size"],
    )


def test_page_images_are_among_the_golden_requests() -> None:
    # PNG and JPEG, portrait and landscape, a 300 dpi image (img2pdf sizes its PDF page from the dpi;
    # the page image the model sees must not change), and a rotation retry.
    cases = [case for case in golden()["requests"] if "image_file" in case]
    assert {case["image_file"] for case in cases} == {"page.png", "page_300dpi.png", "landscape.png", "photo.jpg"}
    assert {case["rotation"] for case in cases} == {0, 90}
    for case in cases:
        assert (GOLDEN_DIR / "images" / case["image_file"]).is_file()


def test_wire_headers_that_matter_match_olmocr() -> None:
    # The rest of olmOCR's framing (Host without port, Connection: close, no User-Agent) is its
    # hand-written HTTP client's; servers do not look at it.
    for case in golden()["requests"]:
        headers = dict(case["headers"])
        assert case["request_line"] == "POST /v1/chat/completions HTTP/1.1"
        assert headers["Content-Type"] == "application/json"
        assert headers.get("Authorization") == (f"Bearer {case['api_key']}" if "api_key" in case else None)


@pytest.mark.parametrize("temperature", TEMPERATURE_BY_ATTEMPT)
def test_request_bytes_equal_python_json_dumps_of_the_query(temperature: float) -> None:
    # The builder splices the image into pre-serialised JSON; it must equal plain json.dumps.
    body = RequestBodyBuilder(MODEL).build(IMAGE.encode(), temperature)
    assert body == json.dumps(build_page_query(MODEL, IMAGE, temperature)).encode()


def test_model_names_with_quotes_and_unicode_are_escaped_like_json_dumps() -> None:
    model = 'weird"model\u00e9'
    body = RequestBodyBuilder(model, max_tokens=123).build(IMAGE.encode(), 0.5)
    assert body == json.dumps(build_page_query(model, IMAGE, 0.5, max_tokens=123)).encode()


# -- model answers ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", _names("front_matter"))
def test_front_matter_parse_equals_olmocrs_parser(name: str) -> None:
    case = golden()["front_matter"][name]
    if case["ok"]:
        assert asdict(parse_front_matter(case["answer"])) == case["response"]
    else:
        with pytest.raises(FrontMatterError):
            parse_front_matter(case["answer"])


@pytest.mark.parametrize("name", _names("completions"))
def test_completion_outcome_equals_olmocrs_try_single_page(name: str) -> None:
    case = golden()["completions"][name]
    if name in ACCEPTED_WHERE_OLMOCR_FAILS:
        assert not case["accepted_as_attempt"]
        completion = parse_completion(case["payload"])
        usage = case["payload"].get("usage") or {}
        assert completion.is_valid
        assert (completion.input_tokens, completion.output_tokens) == (
            usage.get("prompt_tokens", 0),
            usage.get("completion_tokens", 0),
        )
        return
    if not case["accepted_as_attempt"]:
        with pytest.raises((CompletionFormatError, FrontMatterError)):
            parse_completion(case["payload"])
        return
    completion = parse_completion(case["payload"])
    assert asdict(completion.response) == case["response"]
    assert completion.is_valid == case["is_valid"]
    assert (completion.input_tokens, completion.output_tokens) == (case["input_tokens"], case["output_tokens"])


def test_golden_set_covers_the_cases_that_decide_a_page() -> None:
    # A regenerated fixture must keep the cases this file relies on.
    answers, completions = golden()["front_matter"], golden()["completions"]
    assert {"valid", "rotation_invalid_90", "missing_diagram", "extra_field", "yaml_syntax_error"} <= set(answers)
    assert {"finish_length", "tokens_over_context_limit", "valid_rotation_invalid"} <= set(completions)
    assert set(completions) >= ACCEPTED_WHERE_OLMOCR_FAILS
    rotations = {(case.get("pdf") or case["image_file"], case["rotation"]) for case in golden()["requests"]}
    assert {0, 90, 180, 270} <= {rotation for _, rotation in rotations}


# -- the retry ladder -------------------------------------------------------------------------------------

# Where our ladder differs from olmOCR's process_page on purpose. olmOCR follows a rotation correction
# only when the FIRST attempt reports one: after an unusable first answer it keeps sending the sideways
# image for all remaining attempts and settles for an answer that says the rotation is wrong. We turn
# the page as soon as any valid answer reports a correction, so the page ends upright.
LADDER_DEVIATIONS = {"sideways_after_an_unusable_answer"}


def _page_texts(record: dict[str, Any]) -> list[str]:
    return [record["text"][start:end].rstrip("\n") for start, end, _ in record["attributes"]["pdf_page_numbers"]]


@pytest.mark.slow
def test_retry_ladder_asks_and_settles_like_olmocrs_process_page(tmp_path: Path, standin: StandinServer) -> None:
    ladder = golden()["ladder"]
    scripts = {f"{case['doc_id']}:{case['page']}": case["script"] for case in ladder.values() if case["script"]}
    standin.configure(scripts=scripts)
    for pdf in {case["pdf"] for case in ladder.values()}:
        (tmp_path / "in").mkdir(exist_ok=True)
        (tmp_path / "in" / pdf).write_bytes((GOLDEN_DIR / "pdfs" / pdf).read_bytes())
    result = run_cli(
        "convert", str(tmp_path / "in"), str(tmp_path / "out"), "--server", standin.url, "--run-id", "ladder",
        "--max-page-error-rate", "1", "--target-longest-image-dim", str(golden()["target_longest_image_dim"]),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    seen: dict[str, list[dict[str, Any]]] = {}
    for record in sorted(standin.requests(), key=lambda record: record["seq"]):
        marker = record["marker"]
        seen.setdefault(f"{marker['doc_id']}:{marker['page_number']}", []).append(
            {"temperature": record["temperature"], "rotation_seen": marker["rotation_correction"],
             "outcome": record["outcome"]}
        )  # fmt: skip
    dolma = {
        Path(record["metadata"]["Source-File"]).name: record
        for path in (tmp_path / "out" / "dolma").glob("*.jsonl")
        for record in map(json.loads, path.read_text().splitlines())
    }
    fallbacks = {name: 0 for name in dolma}
    for name, case in ladder.items():
        record, index = dolma[case["pdf"]], case["page"] - 1
        attributes = {key: record["attributes"][key][index] for key in FRONT_MATTER_KEYS}
        fallbacks[case["pdf"]] += case["is_fallback"]
        requests = seen[f"{case['doc_id']}:{case['page']}"]
        if name in LADDER_DEVIATIONS:
            assert not case["response"]["is_rotation_valid"] and case["response"]["rotation_correction"] == 90
            assert [r["rotation_seen"] for r in requests][-1] == 0 and attributes["is_rotation_valid"], requests
            continue
        # The same requests, attempt by attempt: temperature, how the image was turned, what came back.
        assert requests == case["requests"], name
        expected = {key: case["response"][key] for key in attributes}
        if case["is_fallback"]:
            # olmOCR's fallback text is poppler's pdftotext, ours PDFium's text layer: same page, other bytes.
            assert attributes == expected and "page " + str(case["page"]) in _page_texts(record)[index], name
        else:
            assert attributes == expected, name
            assert _page_texts(record)[index] == case["response"]["natural_text"], name
    assert {name: record["metadata"]["total-fallback-pages"] for name, record in dolma.items()} == fallbacks


# -- our own error reporting (olmOCR has none to compare with) -------------------------------------

ANSWER = (
    "---\nprimary_language: en\nis_rotation_valid: True\nrotation_correction: 0\nis_table: False\n"
    "is_diagram: False\n---\nHello world.\n\nSecond paragraph.  \n"
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
def test_front_matter_rejections_say_why(answer: str, message: str) -> None:
    with pytest.raises(FrontMatterError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_front_matter(answer)


@pytest.mark.parametrize("payload", [{}, {"choices": []}, {"choices": [{"message": {"content": None}}]}, []])
def test_malformed_completion_payloads(payload: object) -> None:
    with pytest.raises(CompletionFormatError):
        parse_completion(payload)


def test_context_limit_is_configurable() -> None:
    usage = {"prompt_tokens": 9000, "completion_tokens": 8000, "total_tokens": 17000}
    payload = {"choices": [{"message": {"content": ANSWER}, "finish_reason": "stop"}], "usage": usage}
    assert not parse_completion(payload).is_valid
    assert parse_completion(payload, model_max_context=20000).is_valid
