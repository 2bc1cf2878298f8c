"""Golden fixtures of olmOCR 0.4.27's page protocol, asked of olmOCR itself (run by hand).

    .venv/bin/python scripts/golden_olmocr.py

installs ``olmocr==0.4.27`` from PyPI into a side venv (the one the benchmark uses; poppler-utils with
apt when missing), writes a few test PDFs, and then runs THIS file again with that venv's
interpreter (``--olmocr-side``), where only olmOCR's own functions answer:

* the prompt: ``olmocr.prompts.build_no_anchoring_v4_yaml_prompt()``;
* the request of a page, exactly as sent on the wire: ``olmocr.pipeline.try_single_page`` posts to a
  local socket server of this script (all pages, rotations, attempts, model names and an API key);
* the request of a PNG or JPEG page image: olmOCR's own ``olmocr.image_utils`` tells the image by its
  first bytes and wraps it in a one-page PDF (the ``img2pdf`` command, installed into a venv of its
  own, since olmOCR calls it without depending on it), and ``try_single_page`` sends that page;
* what it makes of a completion: the same ``try_single_page`` fed canned server answers (valid,
  cut off, over the context, without usage, malformed);
* what its parser makes of an answer: ``FrontMatterParser(front_matter_class=PageResponse)``;
* its retry ladder: ``olmocr.pipeline.process_page`` for a few pages against the vLLM stand-in
  (``olmocr_testkit/standin``, started here) with per-page fault scripts; the stand-in's log gives the
  temperature and image orientation of every attempt, ``process_page`` the page it settled on.

Back in the project venv the page images are reduced to their size and the page marker they show
(``olmocr_testkit.page_marker``), since our renderer (PDFium) and olmOCR's (poppler) differ in pixels, and
everything lands in ``tests/fixtures/golden/``. ``tests/page/test_protocol.py`` compares our request bodies
and our parse results with these fixtures field by field. No olmOCR code is copied here: the
olmOCR side only calls olmOCR.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
from pathlib import Path
from typing import Any

OLMOCR_VERSION = "0.4.27"
REPO_ROOT = Path(__file__).resolve().parents[1]
GOLDEN_DIR = REPO_ROOT / "tests" / "fixtures" / "golden"
FIXTURE_NAME = f"olmocr-{OLMOCR_VERSION}.json"
IMAGE_PLACEHOLDER = "<IMAGE>"
DEFAULT_MODEL = "allenai/olmOCR-2-7B-1025-FP8"
# A model name JSON must escape (quote, backslash, non-ASCII): proves the same serialiser settings.
ODD_MODEL = 'odd "model"\\name-\u00e9\u4e2d'
API_KEY = "golden-test-key"
TARGET_DIM = 1288

# name -> how olmocr_testkit.pdfgen makes it (function, keyword arguments). The bytes are committed, so the
# test renders exactly what olmOCR rendered.
PDFS: dict[str, tuple[str, dict[str, Any]]] = {
    "letter_2p.pdf": ("text_pdf", {"pages": 2, "doc_id": 71}),
    "a4_landscape.pdf": ("text_pdf", {"pages": 1, "doc_id": 72, "page_size": (842.0, 595.0)}),
    "rotate90.pdf": ("rotated_pdf", {"rotate": 90, "pages": 1, "doc_id": 73}),
    "ladder.pdf": ("text_pdf", {"pages": 4, "doc_id": 74}),
    "rotate90_2p.pdf": ("rotated_pdf", {"rotate": 90, "pages": 2, "doc_id": 75}),
}

# Page images, as olmOCR takes them (PNG and JPEG; it converts each to a one-page PDF with img2pdf):
# name -> imagegen.page_image arguments, the Pillow format and save options. One carries a 300 dpi
# resolution (img2pdf sizes the PDF page from it; the render must not change), one is landscape, and
# the JPEG's page marker survives JPEG coding (imagegen.JPEG_SAFE_DOC_IDS).
IMAGES: dict[str, tuple[dict[str, Any], str, dict[str, Any]]] = {
    "page.png": ({"doc_id": 77}, "PNG", {}),
    "page_300dpi.png": ({"doc_id": 78}, "PNG", {"dpi": (300, 300)}),
    "landscape.png": ({"doc_id": 79, "size": (1100, 850)}, "PNG", {}),
    "photo.jpg": ({"doc_id": 16}, "JPEG", {}),
}
IMG2PDF_VERSION = "0.6.3"

# The retry ladder, page by page: olmOCR's process_page against the vLLM stand-in (olmocr_testkit/standin), whose
# answers follow the page marker it sees (a sideways page makes it report the rotation) and, per page,
# a script of faults for successive requests. name -> (pdf, page, doc id, script).
LADDER: dict[str, tuple[str, int, int, list[str]]] = {
    "upright_first_try": ("ladder.pdf", 1, 74, []),
    "cut_off_then_ok": ("ladder.pdf", 2, 74, ["length", "ok"]),
    "unusable_answers_then_ok": ("ladder.pdf", 3, 74, ["garbage", "bad_json", "invalid_rotation", "ok"]),
    "never_valid": ("ladder.pdf", 4, 74, ["length"] * 8),
    "scanned_sideways": ("rotate90_2p.pdf", 1, 75, []),
    "sideways_after_an_unusable_answer": ("rotate90_2p.pdf", 2, 75, ["garbage"]),
}


def _request_cases() -> list[dict[str, Any]]:
    cases = [
        {"pdf": "letter_2p.pdf", "page": 1, "rotation": 0, "attempt": attempt, "model": DEFAULT_MODEL}
        for attempt in range(9)  # one past the ladder: the temperature stays at its last step
    ]
    cases += [
        {"pdf": "letter_2p.pdf", "page": 2, "rotation": rotation, "attempt": 1, "model": DEFAULT_MODEL}
        for rotation in (0, 90, 180, 270)
    ]
    cases += [
        {"pdf": "a4_landscape.pdf", "page": 1, "rotation": 0, "attempt": 0, "model": DEFAULT_MODEL},
        {"pdf": "rotate90.pdf", "page": 1, "rotation": 0, "attempt": 0, "model": DEFAULT_MODEL},
        {"pdf": "rotate90.pdf", "page": 1, "rotation": 90, "attempt": 1, "model": DEFAULT_MODEL},
        {"pdf": "letter_2p.pdf", "page": 1, "rotation": 0, "attempt": 3, "model": ODD_MODEL},
        {"pdf": "letter_2p.pdf", "page": 1, "rotation": 0, "attempt": 0, "model": DEFAULT_MODEL, "api_key": API_KEY},
    ]
    cases += [{"image_file": name, "page": 1, "rotation": 0, "attempt": 0, "model": DEFAULT_MODEL} for name in IMAGES]
    cases.append({"image_file": "page.png", "page": 1, "rotation": 90, "attempt": 1, "model": DEFAULT_MODEL})
    for index, case in enumerate(cases):
        source = case.get("pdf") or case["image_file"]
        case["name"] = f"{index:02d}-{source}-p{case['page']}-r{case['rotation']}-a{case['attempt']}"
    return cases


_ANSWER = (
    "---\nprimary_language: en\nis_rotation_valid: True\nrotation_correction: 0\nis_table: False\n"
    "is_diagram: False\n---\nHello world.\n\nSecond paragraph.  \n"
)


def _answer(**changes: str) -> str:
    """The valid answer with front-matter lines replaced (``key=None`` drops the line)."""
    lines = _ANSWER.split("\n")
    for key, value in changes.items():
        lines = [
            (f"{key}: {value}" if value is not None else None) if line.startswith(f"{key}:") else line for line in lines
        ]
    return "\n".join(line for line in lines if line is not None)


# Model answers for olmOCR's front-matter parser: name -> answer text.
ANSWERS: dict[str, str] = {
    "valid": _ANSWER,
    "valid_lowercase_bools": _answer(is_rotation_valid="true", is_table="false", is_diagram="true"),
    "text_with_markdown_rule": _ANSWER + "\n---\nAfter a rule.\n",
    "no_text": _ANSWER.split("---\nHello")[0] + "---\n",
    "whitespace_text": _ANSWER.split("---\nHello")[0] + "---\n   \n\t\n",
    "closing_marker_glued_to_text": _ANSWER.replace("---\nHello", "---Hello"),
    "language_no": _answer(primary_language="no"),
    "language_empty_string": _answer(primary_language="''"),
    "language_null": _answer(primary_language="null"),
    "language_tilde": _answer(primary_language="~"),
    "language_python_none": _answer(primary_language="None"),
    "language_quoted": _answer(primary_language="'de'"),
    "language_number": _answer(primary_language="5"),
    "language_zero": _answer(primary_language="0"),
    "language_list": _answer(primary_language="[en, de]"),
    "language_date": _answer(primary_language="2024-01-01"),
    "rotation_invalid_90": _answer(is_rotation_valid="False", rotation_correction="90"),
    "rotation_invalid_180": _answer(is_rotation_valid="False", rotation_correction="180"),
    "rotation_invalid_270": _answer(is_rotation_valid="False", rotation_correction="270"),
    "rotation_string": _answer(rotation_correction="'90'"),
    "rotation_45": _answer(rotation_correction="45"),
    "rotation_360": _answer(rotation_correction="360"),
    "rotation_negative": _answer(rotation_correction="-90"),
    "rotation_float": _answer(rotation_correction="90.0"),
    "rotation_word": _answer(rotation_correction="ninety"),
    "rotation_bool": _answer(rotation_correction="true"),
    "rotation_null": _answer(rotation_correction="null"),
    "bool_string_yes": _answer(is_table="'yes'"),
    "bool_string_true_upper": _answer(is_table="'TRUE'"),
    "bool_yaml_yes": _answer(is_table="yes"),
    "bool_int": _answer(is_table="1"),
    "bool_null": _answer(is_diagram="null"),
    "missing_language": _answer(primary_language=None),
    "missing_rotation_valid": _answer(is_rotation_valid=None),
    "missing_rotation": _answer(rotation_correction=None),
    "missing_table": _answer(is_table=None),
    "missing_diagram": _answer(is_diagram=None),
    "extra_field": _ANSWER.replace("is_diagram: False\n", "is_diagram: False\nconfidence: 3\n"),
    "extra_natural_text_field": _ANSWER.replace("is_diagram: False\n", "is_diagram: False\nnatural_text: hi\n"),
    "no_front_matter": "Hello, no front matter at all.",
    "empty_answer": "",
    "leading_blank_line": "\n" + _ANSWER,
    "crlf_line_ends": _ANSWER.replace("\n", "\r\n"),
    "unclosed": "---\nprimary_language: en\nis_rotation_valid: True\n",
    "empty_front_matter": "---\n---\nText.",
    "yaml_list": "---\n- a\n- b\n---\ntext",
    "yaml_scalar": "---\njust a string\n---\ntext",
    "yaml_syntax_error": "---\nprimary_language: [unclosed\n---\ntext",
    "yaml_duplicate_key": _ANSWER.replace("is_table: False\n", "is_table: False\nis_table: True\n"),
    "unicode_text": _ANSWER.replace("Hello world.", "Gr\u00fc\u00dfe \u2014 \u4f60\u597d \U0001f600"),
}

_USAGE = {"prompt_tokens": 1500, "completion_tokens": 300, "total_tokens": 1800}


def _completion(
    content: Any, finish_reason: Any = "stop", usage: dict[str, Any] | None = _USAGE, **extra: Any
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "id": "chatcmpl-golden",
        "object": "chat.completion",
        "model": DEFAULT_MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish_reason}],
    }
    if usage is not None:
        payload["usage"] = usage
    payload.update(extra)
    return payload


# Server answers (HTTP 200 bodies) for olmOCR's try_single_page: name -> JSON payload.
COMPLETIONS: dict[str, Any] = {
    "valid": _completion(_ANSWER),
    "valid_rotation_invalid": _completion(_answer(is_rotation_valid="False", rotation_correction="90")),
    "finish_length": _completion(_ANSWER, "length"),
    "finish_length_rotation_invalid": _completion(
        _answer(is_rotation_valid="False", rotation_correction="270"), "length"
    ),
    "finish_null": _completion(_ANSWER, None),
    "tokens_at_context_limit": _completion(
        _ANSWER, usage={"prompt_tokens": 8384, "completion_tokens": 8000, "total_tokens": 16384}
    ),
    "tokens_over_context_limit": _completion(
        _ANSWER, usage={"prompt_tokens": 8385, "completion_tokens": 8000, "total_tokens": 16385}
    ),
    "usage_missing": _completion(_ANSWER, usage=None),
    "usage_without_total": _completion(_ANSWER, usage={"prompt_tokens": 10, "completion_tokens": 5}),
    "bad_front_matter": _completion("No front matter here."),
    "content_null": _completion(None),
    "no_choices": {"object": "chat.completion", "choices": [], "usage": _USAGE},
    "not_an_object": [1, 2, 3],
}


# ----------------------------------------------------------------------------------- olmOCR side


def _olmocr_side(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs inside olmOCR's venv: every answer below comes from olmOCR's own functions."""
    import logging
    import tempfile
    from dataclasses import asdict
    from types import SimpleNamespace

    from olmocr import pipeline
    from olmocr.image_utils import convert_image_to_pdf_bytes, is_jpeg, is_png
    from olmocr.prompts import PageResponse, build_no_anchoring_v4_yaml_prompt
    from olmocr.train.front_matter import FrontMatterParser
    from olmocr.version import VERSION

    warnings: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings.append(record.getMessage())

    pipeline.logger.addHandler(Collect(level=logging.WARNING))
    pipeline.logger.propagate = False

    def parse(answer: str) -> dict[str, Any]:
        parser = FrontMatterParser(front_matter_class=PageResponse)
        try:
            front_matter, text = parser._extract_front_matter_and_text(answer)
            return {"ok": True, "response": asdict(parser._parse_front_matter(front_matter, text))}
        except Exception as exc:  # olmOCR's try_single_page turns any of these into a failed attempt
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}

    async def exchange() -> dict[str, Any]:
        captured: list[bytes] = []
        replies: list[bytes] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            captured.append(head + await reader.readexactly(length))
            body = replies.pop(0)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                % len(body)
                + body
            )
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]

        def args_for(model: str, api_key: str | None) -> SimpleNamespace:
            return SimpleNamespace(
                server=f"http://127.0.0.1:{port}/v1",
                model=model,
                api_key=api_key,
                target_longest_image_dim=TARGET_DIM,
                guided_decoding=False,
            )

        async def ask(case: dict[str, Any], reply: Any) -> tuple[bytes | None, Any]:
            captured.clear()
            warnings.clear()
            replies[:] = [json.dumps(reply).encode()]
            if "image_file" in case:
                # What olmOCR's process_pdf does with a PNG or JPEG before its page protocol.
                image = str(Path(spec["image_dir"]) / case["image_file"])
                assert is_png(image) or is_jpeg(image), image
                pdf = str(Path(converted) / f"{case['image_file']}.pdf")
                Path(pdf).write_bytes(convert_image_to_pdf_bytes(image))
            else:
                pdf = str(Path(spec["pdf_dir"]) / case["pdf"])
            result = await pipeline.try_single_page(
                args_for(case["model"], case.get("api_key")), case.get("pdf") or case["image_file"], pdf, case["page"],
                case["attempt"], case["rotation"],
            )  # fmt: skip
            return (captured[0] if captured else None), result

        requests = []
        for case in spec["requests"]:
            raw, result = await ask(case, COMPLETIONS["valid"])
            assert raw is not None and result is not None, (case, warnings)
            head, _, body = raw.partition(b"\r\n\r\n")
            request_line, *header_lines = head.decode().split("\r\n")
            requests.append(
                {
                    **case,
                    "request_line": request_line,
                    "headers": [line.split(": ", 1) for line in header_lines],
                    "body": body.decode("ascii"),
                }
            )

        completions = {}
        probe = {"pdf": "letter_2p.pdf", "page": 1, "rotation": 0, "attempt": 0, "model": DEFAULT_MODEL}
        for name, payload in COMPLETIONS.items():
            _, result = await ask(probe, payload)
            if result is None:
                completions[name] = {"accepted_as_attempt": False, "warning": " | ".join(warnings)}
            else:
                completions[name] = {
                    "accepted_as_attempt": True,
                    "is_valid": result.is_valid,
                    "input_tokens": result.input_tokens,
                    "output_tokens": result.output_tokens,
                    "response": asdict(result.response),
                }
        server.close()
        await server.wait_closed()

        ladder = {}
        for name, (pdf, page, _, _) in spec["ladder"].items():
            args = SimpleNamespace(
                server=spec["standin_url"], model=DEFAULT_MODEL, api_key=None, max_page_retries=8,
                target_longest_image_dim=TARGET_DIM, guided_decoding=False,
            )  # fmt: skip
            result = await pipeline.process_page(args, 0, pdf, str(Path(spec["pdf_dir"]) / pdf), page)
            ladder[name] = {
                "is_fallback": result.is_fallback,
                "is_valid": result.is_valid,
                "input_tokens": result.input_tokens,
                "output_tokens": result.output_tokens,
                "response": asdict(result.response),
            }
        return {"requests": requests, "completions": completions, "ladder": ladder}

    with tempfile.TemporaryDirectory() as converted:
        exchanged = asyncio.run(exchange())
    return {
        "olmocr_version": VERSION,
        "prompt": build_no_anchoring_v4_yaml_prompt(),
        "temperature_by_attempt": list(pipeline.TEMPERATURE_BY_ATTEMPT),
        "requests": exchanged["requests"],
        "completions": {
            name: {"payload": COMPLETIONS[name], **found} for name, found in exchanged["completions"].items()
        },
        "front_matter": {name: {"answer": answer, **parse(answer)} for name, answer in ANSWERS.items()},
        "ladder": exchanged["ladder"],
    }


# ---------------------------------------------------------------------------------- project side


def _image_facts(body: str) -> tuple[str, dict[str, Any]]:
    """The body with its base64 image replaced by a placeholder, and what the image shows."""
    import io

    from PIL import Image

    from olmocr_testkit.page_marker import read_marker

    prefix = '"data:image/png;base64,'
    start = body.index(prefix) + len(prefix)
    end = body.index('"', start)
    png = base64.b64decode(body[start:end], validate=True)
    with Image.open(io.BytesIO(png)) as image:
        marker = read_marker(image.convert("RGB"))
        facts = {"format": image.format, "size": list(image.size)}
    facts["marker"] = None if marker is None else {
        "doc_id": marker.doc_id, "page_number": marker.page_number, "rotation_correction": marker.rotation_correction
    }  # fmt: skip
    return body[:start] + IMAGE_PLACEHOLDER + body[end:], facts


def ladder_scripts() -> dict[str, list[str]]:
    """The stand-in's per-page fault scripts ("doc:page" -> steps) for the ladder scenarios."""
    return {f"{doc_id}:{page}": script for _, page, doc_id, script in LADDER.values() if script}


def ladder_requests(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The stand-in's request log per page ("doc:page"), in order: what each request asked and showed."""
    pages: dict[str, list[dict[str, Any]]] = {}
    for record in sorted(records, key=lambda record: record["seq"]):
        marker = record.get("marker") or {}
        if not marker:
            continue
        pages.setdefault(f"{marker['doc_id']}:{marker['page_number']}", []).append(
            {
                "temperature": record["temperature"],
                "rotation_seen": marker["rotation_correction"],  # how far the image was from upright
                "outcome": record["outcome"],
            }
        )
    return pages


def _write_pdfs(folder: Path) -> None:
    from olmocr_testkit import pdfgen

    for name, (function, kwargs) in PDFS.items():
        pdfgen.write_pdf(folder / name, getattr(pdfgen, function)(**kwargs))


def _write_images(folder: Path) -> None:
    from olmocr_testkit import imagegen

    folder.mkdir(parents=True, exist_ok=True)
    for name, (arguments, image_format, options) in IMAGES.items():
        (folder / name).write_bytes(imagegen.encode(imagegen.page_image(**arguments), image_format, **options))


def _ensure_img2pdf(log: Path) -> tuple[Path | None, str | None]:
    """The folder holding the ``img2pdf`` command (a venv of its own beside olmOCR's), or why not."""
    from bench.common import RESULTS_DIR, VENV_BIN

    venv = RESULTS_DIR / "img2pdf-venv"
    command = venv / "bin" / "img2pdf"
    if command.exists():
        return command.parent, None
    import subprocess

    with open(log, "a") as out:
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--clear", str(venv)], stdout=out, stderr=out, check=True)
        install = [str(VENV_BIN / "uv"), "pip", "install", "-p", str(venv / "bin" / "python"),
                   f"img2pdf=={IMG2PDF_VERSION}"]  # fmt: skip
        done = subprocess.run(install, stdout=out, stderr=out, check=False)
    if done.returncode != 0 or not command.exists():
        return None, f"installing img2pdf=={IMG2PDF_VERSION} failed (see {log})"
    return command.parent, None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--olmocr-side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--keep-pdfs", action="store_true", help="reuse the committed PDFs and images instead of new ones"
    )
    options = parser.parse_args(argv)
    if options.olmocr_side:
        json.dump(_olmocr_side(json.load(sys.stdin)), sys.stdout)
        return 0

    import subprocess

    sys.path.insert(0, str(REPO_ROOT))
    from bench.run_olmocr import ensure_olmocr, olmocr_env, olmocr_python

    GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
    log = REPO_ROOT / "bench" / "results" / "golden-olmocr-install.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    problem = ensure_olmocr(log)
    img2pdf_bin, img2pdf_problem = _ensure_img2pdf(log)
    if problem or img2pdf_problem:
        print(problem or img2pdf_problem, file=sys.stderr)
        return 1
    pdf_dir = GOLDEN_DIR / "pdfs"
    image_dir = GOLDEN_DIR / "images"
    if not options.keep_pdfs:
        _write_pdfs(pdf_dir)
    if not options.keep_pdfs or not all((image_dir / name).exists() for name in IMAGES):
        _write_images(image_dir)
    from olmocr_testkit.standin.process import start_standin_process

    side_env = olmocr_env()
    # Last on the PATH: olmOCR's own venv still answers for python and everything else.
    side_env["PATH"] = os.pathsep.join([side_env["PATH"], str(img2pdf_bin)])
    with start_standin_process(model=DEFAULT_MODEL, scripts=ladder_scripts()) as standin:
        spec = {
            "pdf_dir": str(pdf_dir),
            "image_dir": str(image_dir),
            "requests": _request_cases(),
            "ladder": LADDER,
            "standin_url": standin.url,
        }
        done = subprocess.run(
            [str(olmocr_python()), str(Path(__file__).resolve()), "--olmocr-side"],
            input=json.dumps(spec), capture_output=True, text=True, env=side_env, cwd=str(pdf_dir), check=False,
        )  # fmt: skip
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            return 1
        golden = json.loads(done.stdout)
        requests_seen = ladder_requests(standin.requests())
    for name, (pdf, page, doc_id, script) in LADDER.items():
        golden["ladder"][name] = {
            "pdf": pdf,
            "page": page,
            "doc_id": doc_id,
            "script": script,
            "requests": requests_seen.get(f"{doc_id}:{page}", []),
            **golden["ladder"][name],
        }
    assert golden["olmocr_version"] == OLMOCR_VERSION, golden["olmocr_version"]
    for request in golden["requests"]:
        request["body"], request["image"] = _image_facts(request["body"])
    golden = {
        "generated_by": "scripts/golden_olmocr.py (olmOCR's own functions; do not edit by hand)",
        "image_placeholder": IMAGE_PLACEHOLDER,
        "target_longest_image_dim": TARGET_DIM,
        "pdfs": {
            name: {"made_by": f"olmocr_testkit.pdfgen.{make}", "arguments": kwargs}
            for name, (make, kwargs) in PDFS.items()
        },
        "images": {
            name: {
                "made_by": "olmocr_testkit.imagegen.page_image",
                "arguments": arguments,
                "format": image_format,
                "options": options,
                "img2pdf": IMG2PDF_VERSION,
            }
            for name, (arguments, image_format, options) in IMAGES.items()
        },
        **golden,
    }
    target = GOLDEN_DIR / FIXTURE_NAME
    target.write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {target.relative_to(REPO_ROOT)}: {len(golden['requests'])} requests, "
          f"{len(golden['completions'])} completions, {len(golden['front_matter'])} answers")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
