"""The Tesseract CPU engine against olmOCR's own request builder and answer parser.

Real Tesseract reads a real rendered PDF page; a fake ``tesseract`` script stands in where only the
server's behaviour matters (concurrency bound, answer budget), so those tests cost no OCR time.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pypdfium2 as pdfium
import pytest
from PIL import Image
from reportlab.lib.pagesizes import letter
from reportlab.pdfgen import canvas

from olmocr_tasks.core.config import DEFAULT_MODEL
from olmocr_tasks.inference.vllm_metrics import parse_vllm_sample
from olmocr_tasks.page.protocol import RequestBodyBuilder, parse_completion, parse_front_matter
from olmocr_tasks.servers.cpu_engine import CPU_ENGINE_MODEL, is_loopback_host, start_cpu_engine_in_thread
from olmocr_tasks.servers.cpu_engine.chat import format_answer
from olmocr_tasks.servers.cpu_engine.tesseract import PageOcr, parse_osd, tidy_text
from olmocr_testkit.page_query import build_page_query

pytestmark = pytest.mark.skipif(shutil.which("tesseract") is None, reason="tesseract-ocr is not installed")

KNOWN_SENTENCE = "The harbour lights were shining brightly over the quiet water"
FILLER = [
    "Orientation detection in Tesseract needs several lines of ordinary text,",
    "so this page carries a short paragraph below the sentence we look for.",
    "Each line is printed in a large, plain font that any engine can read.",
    "The remaining lines only give the detector enough letters to decide.",
    "Seven lines of body text are plenty for a confident orientation.",
]


def _render_page_png(lines: list[str]) -> bytes:
    """A letter page with ``lines`` in large type, rendered at olmOCR's 1288 px longest side."""
    buffer = io.BytesIO()
    pdf = canvas.Canvas(buffer, pagesize=letter)
    pdf.setFont("Helvetica", 20)
    y = 720
    for line in lines:
        pdf.drawString(54, y, line)
        y -= 34
    pdf.showPage()
    pdf.save()
    document = pdfium.PdfDocument(buffer.getvalue())
    try:
        page = document[0]
        width, height = page.get_size()
        image = page.render(scale=1288 / max(width, height)).to_pil()
    finally:
        document.close()
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def page_png() -> bytes:
    return _render_page_png([KNOWN_SENTENCE, *FILLER])


@pytest.fixture(scope="module")
def engine():
    handle = start_cpu_engine_in_thread(max_concurrency=2)
    yield handle
    handle.stop()


def _post(url: str, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(
        url + "/chat/completions",
        content=body,
        headers={"Content-Type": "application/json", **(headers or {})},
        timeout=120,
    )


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().lower()


def test_reads_a_rendered_page_in_olmocr_format(engine, page_png):
    body = RequestBodyBuilder(CPU_ENGINE_MODEL).build(base64.b64encode(page_png), 0.1)
    response = _post(engine.url, body)
    assert response.status_code == 200
    payload = response.json()
    completion = parse_completion(payload)
    assert completion.is_valid
    assert completion.finish_reason == "stop"
    assert completion.input_tokens > 1000  # the image dominates, as with Qwen2.5-VL
    assert completion.output_tokens > 0
    page = completion.response
    assert page.primary_language == "en"
    assert page.is_rotation_valid is True
    assert page.rotation_correction == 0
    assert page.is_table is False and page.is_diagram is False
    assert _normalise(KNOWN_SENTENCE) in _normalise(page.natural_text or "")
    assert payload["model"] == CPU_ENGINE_MODEL
    assert payload["object"] == "chat.completion"


def test_rotated_page_is_reported_with_the_correction_that_makes_it_upright(engine, page_png):
    # PIL's rotate(90) turns the page counter-clockwise; olmOCR labels that 270, since applying
    # Transpose.ROTATE_270 undoes it.
    rotated = Image.open(io.BytesIO(page_png)).rotate(90, expand=True)
    buffer = io.BytesIO()
    rotated.save(buffer, format="PNG")
    body = RequestBodyBuilder(CPU_ENGINE_MODEL).build(base64.b64encode(buffer.getvalue()), 0.1)
    response = _post(engine.url, body)
    assert response.status_code == 200
    page = parse_completion(response.json()).response
    assert page.is_rotation_valid is False
    assert page.rotation_correction == 270
    upright = rotated.transpose(Image.Transpose.ROTATE_270)
    assert upright.size == Image.open(io.BytesIO(page_png)).size
    # The text is read from the corrected image, so it is still usable.
    assert _normalise(KNOWN_SENTENCE) in _normalise(page.natural_text or "")


@pytest.mark.parametrize(
    ("rotate", "expected"),
    [("0", 0), ("90", 270), ("180", 180), ("270", 90)],
)
def test_osd_rotate_maps_to_olmocr_convention(rotate, expected):
    output = f"Page number: 0\nOrientation in degrees: {expected}\nRotate: {rotate}\nOrientation confidence: 9.1\n"
    assert parse_osd(output) == expected


def test_low_confidence_or_missing_osd_is_upright():
    assert parse_osd("Rotate: 90\nOrientation confidence: 0.4\n") == 0
    assert parse_osd("Too few characters. Skipping this page\n") == 0


def test_serves_its_own_model_name_never_olmocrs(engine, page_png):
    # Tesseract's text recorded under olmOCR's name would make a later GPU run skip those documents.
    response = httpx.get(engine.url + "/models")
    assert response.status_code == 200
    assert [item["id"] for item in response.json()["data"]] == [CPU_ENGINE_MODEL] == ["olmocr-cpu-tesseract"]
    asked_for_olmocr = _post(engine.url, RequestBodyBuilder(DEFAULT_MODEL).build(base64.b64encode(page_png), 0.1))
    assert asked_for_olmocr.status_code == 404


def test_custom_served_model_name_and_wrong_model_is_404(page_png):
    with start_cpu_engine_in_thread(served_model_name="olmocr") as handle:
        ids = [item["id"] for item in httpx.get(handle.url + "/models").json()["data"]]
        assert ids == ["olmocr"]
        body = json.dumps(build_page_query(DEFAULT_MODEL, base64.b64encode(page_png).decode(), 0.1)).encode()
        response = _post(handle.url, body)
        assert response.status_code == 404
        error = response.json()["error"]
        assert DEFAULT_MODEL in error["message"]
        assert error["code"] == 404


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"not json", "not valid JSON"),
        (b"[]", "JSON object"),
        (json.dumps({"model": CPU_ENGINE_MODEL}).encode(), "messages"),
        (
            json.dumps({"model": CPU_ENGINE_MODEL, "messages": [{"role": "user", "content": "hello"}]}).encode(),
            "exactly one image",
        ),
        (json.dumps(build_page_query(CPU_ENGINE_MODEL, "!!notbase64!!", 0.1)).encode(), "base64"),
        (
            json.dumps(build_page_query(CPU_ENGINE_MODEL, base64.b64encode(b"garbage").decode(), 0.1)).encode(),
            "decoded",
        ),
    ],
)
def test_malformed_requests_are_400(engine, body, fragment):
    response = _post(engine.url, body)
    assert response.status_code == 400
    assert fragment in response.json()["error"]["message"]


def test_remote_image_urls_are_refused(engine):
    query = build_page_query(CPU_ENGINE_MODEL, "x", 0.1)
    query["messages"][0]["content"][1]["image_url"]["url"] = "http://169.254.169.254/latest/meta-data"
    response = _post(engine.url, json.dumps(query).encode())
    assert response.status_code == 400


def test_binds_loopback_by_default(engine):
    assert engine.host == "127.0.0.1"
    assert engine.url.startswith("http://127.0.0.1:") and engine.url.endswith("/v1")
    assert is_loopback_host("127.0.0.1") and is_loopback_host("::1") and is_loopback_host("localhost")
    assert not is_loopback_host("0.0.0.0") and not is_loopback_host("10.1.2.3")


def test_api_key_is_required_on_v1_routes(page_png):
    with start_cpu_engine_in_thread(api_key="s3cret-token") as handle:
        assert httpx.get(handle.url + "/models").status_code == 401
        wrong = httpx.get(handle.url + "/models", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        good = httpx.get(handle.url + "/models", headers={"Authorization": "Bearer s3cret-token"})
        assert good.status_code == 200
        body = RequestBodyBuilder(CPU_ENGINE_MODEL).build(base64.b64encode(page_png), 0.1)
        assert _post(handle.url, body).status_code == 401
        # Health and metrics stay open for probes, as with vLLM.
        assert httpx.get(handle.base_url + "/health").status_code == 200
        assert httpx.get(handle.base_url + "/metrics").status_code == 200


def test_metrics_carry_vllm_queue_gauges(engine):
    text = httpx.get(engine.base_url + "/metrics").text
    sample = parse_vllm_sample(text).queue
    assert sample.running == 0 and sample.waiting == 0


# -- behaviour with a fake tesseract (no OCR time) ------------------------------------------------

FAKE_TESSERACT = """\
import sys, time
args = sys.argv[1:]
if args == ["--version"]:
    print("tesseract 0.0-fake"); sys.exit(0)
if args == ["--list-langs"]:
    print('List of available languages in "/fake" (2):'); print("eng"); print("osd"); sys.exit(0)
sys.stdin.buffer.read()
if "0" in args and "--psm" in args and args[args.index("--psm") + 1] == "0":
    print("Too few characters. Skipping this page", file=sys.stderr); sys.exit(1)
time.sleep({delay})
print("Fake words from a fake engine.\\n\\nA second para-\\ngraph of text.\\f")
"""


def _fake_tesseract(tmp_path: Path, delay: float) -> str:
    script = tmp_path / "tesseract"
    script.write_text(f"#!{sys.executable}\n" + FAKE_TESSERACT.replace("{delay}", repr(delay)))
    script.chmod(0o755)
    return str(script)


def test_concurrency_is_bounded_and_extra_requests_wait(tmp_path, page_png):
    binary = _fake_tesseract(tmp_path, delay=1.0)
    body = RequestBodyBuilder(CPU_ENGINE_MODEL).build(base64.b64encode(page_png), 0.1)
    with start_cpu_engine_in_thread(max_concurrency=1, tesseract_binary=binary) as handle:
        results: list[int] = []
        threads = [
            threading.Thread(target=lambda: results.append(_post(handle.url, body).status_code)) for _ in range(3)
        ]
        for thread in threads:
            thread.start()
        seen = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(t.is_alive() for t in threads):
            seen.append(parse_vllm_sample(httpx.get(handle.base_url + "/metrics").text).queue)
            time.sleep(0.1)
        for thread in threads:
            thread.join(30)
        assert results == [200, 200, 200]
        assert max(sample.running for sample in seen) == 1
        assert max(sample.waiting for sample in seen) >= 1


def test_answer_text_is_tidied_and_budget_is_enforced(tmp_path, page_png):
    binary = _fake_tesseract(tmp_path, delay=0.0)
    with start_cpu_engine_in_thread(tesseract_binary=binary) as handle:
        body = RequestBodyBuilder(CPU_ENGINE_MODEL).build(base64.b64encode(page_png), 0.1)
        page = parse_completion(_post(handle.url, body).json()).response
        assert page.natural_text == "Fake words from a fake engine.\n\nA second paragraph of text."
        assert page.is_rotation_valid and page.rotation_correction == 0  # OSD failed: upright
        short = RequestBodyBuilder(CPU_ENGINE_MODEL, max_tokens=40).build(base64.b64encode(page_png), 0.1)
        payload = _post(handle.url, short).json()
        assert payload["choices"][0]["finish_reason"] == "length"
        assert payload["usage"]["completion_tokens"] == 40
        assert not parse_completion(payload).is_valid


def test_tidy_text_joins_lines_keeps_lists():
    raw = (
        "First line of a para-\ngraph continues here\nand ends.\n\n"
        "- item one\n- item two\n\n\n\fstate-of-the-\nart work\n"
    )
    assert tidy_text(raw) == (
        "First line of a paragraph continues here and ends.\n\n- item one\n- item two\n\nstate-of-the-art work"
    )


def test_empty_page_answer_parses_with_null_language():
    answer = format_answer(PageOcr(text="", rotation_correction=0, width=10, height=10), "eng")
    page = parse_front_matter(answer)
    assert page.primary_language is None and page.natural_text is None


# -- CLI --------------------------------------------------------------------------------------------


def _cli(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "olmocr_tasks.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_missing_tesseract_binary_exits_2_with_install_hint(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # an empty directory: no tesseract anywhere
    proc = _cli(["serve-cpu", "--port", "0"], env)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "sudo apt-get install tesseract-ocr" in stderr


def test_api_key_env_must_be_set(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "OLMOCR_TEST_UNSET_KEY"}
    proc = _cli(["serve-cpu", "--port", "0", "--api-key-env", "OLMOCR_TEST_UNSET_KEY"], env)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "OLMOCR_TEST_UNSET_KEY" in stderr


def test_cli_serves_and_stops_on_sigterm():
    proc = _cli(["serve-cpu", "--port", "0", "--served-model-name", "cli-test"], dict(os.environ))
    try:
        url = None
        deadline = time.monotonic() + 60
        assert proc.stderr is not None
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            match = re.search(r"at (http://127\.0\.0\.1:\d+/v1)", line)
            url = match.group(1) if match else None
        assert url is not None, "no start line with the URL"
        assert [item["id"] for item in httpx.get(url + "/models").json()["data"]] == ["cli-test"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        # One start line, and no line per request.
        assert "GET" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
