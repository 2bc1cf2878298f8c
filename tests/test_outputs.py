"""Dolma records, markdown and output keys, written to real local folders and moto S3."""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from olmocr_tasks.outputs import (
    OLMOCR_COMPAT_VERSION,
    dolma_line,
    dolma_record,
    output_stem,
    output_uris,
    write_document_outputs,
)
from olmocr_tasks.results import DocumentResult, PageResult
from olmocr_tasks.storage import Storage


def _page(number: int, text: str | None, **overrides: Any) -> PageResult:
    page = PageResult(
        page_number=number,
        text=text,
        primary_language="en",
        is_rotation_valid=True,
        rotation_correction=0,
        is_table=False,
        is_diagram=False,
        input_tokens=100 + number,
        output_tokens=10 + number,
        attempts=1,
        accepted_attempt=1,
        latency_s=0.25,
        is_fallback=False,
        server_input_tokens=100 + number,
        server_output_tokens=10 + number,
    )
    for key, value in overrides.items():
        setattr(page, key, value)
    return page


def _result(pages: list[PageResult], source: str = "s3://bucket/in/doc.pdf") -> DocumentResult:
    return DocumentResult(source=source, size=1234, sha256="ab" * 32, pages=pages, seconds=1.23456)


# ------------------------------------------------------------------------------------ stems


@pytest.mark.parametrize(
    ("source", "input_uri", "stem"),
    [
        ("s3://b/in/x/Report.PDF", "s3://b/in", "x/Report"),
        ("s3://b/in/x/Report.Pdf", "s3://b/in/", "x/Report"),
        ("s3://b/in/a.pdf.pdf", "s3://b/in", "a.pdf"),
        ("s3://b/in/notes.txt", "s3://b/in", "notes.txt"),
        ("s3://b/input/a.pdf", "s3://b/in", "input/a"),  # not under "in/": olmOCR drops the bucket
        ("s3://b/in/single.pdf", "s3://b/in/single.pdf", "single"),
        ("s3://other/x/y.pdf", "s3://b/in", "x/y"),
        ("/data/in/sub/a.pdf", "/data/in", "sub/a"),
        ("file:///data/in/sub/a.pdf", "/data/in/", "sub/a"),
        ("/data/in/sub/a.pdf", "file:///data/in", "sub/a"),
        ("/elsewhere/b.pdf", "/data/in", "elsewhere/b"),  # olmOCR strips the leading "/"
        ("s3://b/in/../../etc/passwd.pdf", "s3://b/in", "etc/passwd~"),  # "~": plus a hash of the original
        ("s3://b/in/a/./b//c.pdf", "s3://b/in", "a/b/c~"),
        ("/abs/x.pdf", "s3://b/in", "abs/x"),
        ("s3://b/in/dir\\..\\evil.pdf", "s3://b/in", "dir_.._evil~"),
        ("s3://b/in/ctl\x00\x1b.pdf", "s3://b/in", "ctl__~"),
        ("s3://b/in/..pdf", "s3://b/in", None),
        ("s3://b/in/.pdf", "s3://b/in", None),
    ],
)
def test_output_stem(source: str, input_uri: str, stem: str | None) -> None:
    result = output_stem(source, input_uri)
    if stem is None:
        assert result.startswith("_unnamed_") and len(result) > len("_unnamed_")
    elif stem.endswith("~"):
        # Sanitising changed the name: the cleaned name plus a hash of the original, so that e.g.
        # "in/../x.pdf" cannot overwrite the outputs of "in/x.pdf".
        assert re.fullmatch(re.escape(stem) + "[0-9a-f]{10}", result), result
    else:
        assert result == stem
    assert result and not result.startswith("/") and ".." not in result.split("/")


def test_output_stem_unicode_is_nfc_and_deterministic() -> None:
    nfd = unicodedata.normalize("NFD", "s3://b/in/Résumé/Ölçek.pdf")
    nfc = unicodedata.normalize("NFC", "Résumé/Ölçek")
    assert output_stem(nfd, "s3://b/in") == nfc
    assert output_stem(nfd, "s3://b/in") == output_stem(nfd, "s3://b/in")
    # Different unnamed sources get different stems.
    assert output_stem("s3://b/in/.pdf", "s3://b/in") != output_stem("s3://b/in/x/.pdf", "s3://b/in")


def test_output_uris_cannot_escape_the_output_prefix() -> None:
    uris = output_uris("s3://b/out/", "../../x")
    assert uris == {"dolma": "s3://b/out/dolma/x.jsonl", "markdown": "s3://b/out/markdown/x.md"}


# ------------------------------------------------------------------------------------- dolma


def test_dolma_record_schema_key_order_and_spans() -> None:
    pages = [
        _page(1, "First page"),
        _page(2, None, is_fallback=True, accepted_attempt=None, input_tokens=0, output_tokens=0, attempts=8),
        _page(3, "Third — page", primary_language=None, is_table=True, rotation_correction=90),
        _page(4, None, is_fallback=True, accepted_attempt=None, input_tokens=0, output_tokens=0),
    ]
    pages[1].fallback_reason = "no valid response"
    pages[3].fallback_reason = "blank"
    result = _result(pages)
    record = dolma_record(result, model="m/x", prompt_version="v4", package_version="0.1.0", created=date(2024, 2, 29))
    text = "First page\nThird — page\n"
    assert text == result.text
    assert list(record) == ["id", "text", "source", "added", "created", "metadata", "attributes"]
    assert record["id"] == hashlib.sha1(text.encode()).hexdigest()
    assert record["text"] == text
    assert record["source"] == "olmocr"
    assert record["added"] == date.today().isoformat()
    assert record["created"] == "2024-02-29"
    assert list(record["metadata"])[:6] == [
        "Source-File",
        "olmocr-version",
        "pdf-total-pages",
        "total-input-tokens",
        "total-output-tokens",
        "total-fallback-pages",
    ]
    metadata = record["metadata"]
    assert metadata["Source-File"] == "s3://bucket/in/doc.pdf"
    assert metadata["olmocr-version"] == OLMOCR_COMPAT_VERSION
    assert metadata["pdf-total-pages"] == 4
    assert metadata["total-input-tokens"] == 101 + 103
    assert metadata["total-output-tokens"] == 11 + 13
    assert metadata["total-fallback-pages"] == 2
    assert metadata["olmocr-airflow-version"] == "0.1.0"
    assert metadata["model"] == "m/x" and metadata["prompt-version"] == "v4"
    assert metadata["source-sha256"] == "ab" * 32 and metadata["source-size"] == 1234
    assert metadata["fallback-page-numbers"] == [2, 4]
    assert metadata["fallback-reasons"] == ["no valid response", "blank"]
    assert metadata["conversion-seconds"] == 1.235

    attributes = record["attributes"]
    assert list(attributes)[:6] == [
        "pdf_page_numbers",
        "primary_language",
        "is_rotation_valid",
        "rotation_correction",
        "is_table",
        "is_diagram",
    ]
    # A None page contributes an empty span and no separator; the last page keeps no newline of
    # its own, but page 3's text is followed by page 4 (None), so it keeps its "\n".
    assert attributes["pdf_page_numbers"] == [[0, 11, 1], [11, 11, 2], [11, 24, 3], [24, 24, 4]]
    for start, end, number in attributes["pdf_page_numbers"]:
        expected = pages[number - 1].text
        assert text[start:end].rstrip("\n") == (expected or "")
    assert attributes["primary_language"] == ["en", "en", None, "en"]
    assert attributes["rotation_correction"] == [0, 0, 90, 0]
    assert attributes["is_table"] == [False, False, True, False]
    assert attributes["is_fallback"] == [False, True, False, True]
    assert attributes["accepted_attempt"] == [1, None, 1, None]
    assert attributes["attempts"] == [1, 8, 1, 1]
    assert attributes["latency_ms"] == [250, 250, 250, 250]
    for name in ("input_tokens", "output_tokens", "latency_ms", "is_fallback", "attempts"):
        assert len(attributes[name]) == 4


def test_dolma_line_is_ascii_escaped_json_with_default_separators() -> None:
    record = dolma_record(_result([_page(1, "Grüße “quoted”")]), model="m", prompt_version="p", package_version="v")
    line = dolma_line(record)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert line.decode("ascii") == json.dumps(record) + "\n"
    assert b"\\u00fc" in line and b'"id": "' in line
    assert json.loads(line) == record


# ----------------------------------------------------------------------------------- writing


def _write(result: DocumentResult, output_uri: str, storage: Storage, *, markdown: bool = True) -> dict[str, str]:
    return write_document_outputs(
        result,
        output_uri=output_uri,
        stem=output_stem(result.source, "s3://bucket/in"),
        storage=storage,
        write_markdown=markdown,
        model="m",
        prompt_version="p",
        package_version="v",
    )


def test_write_outputs_local_and_rerun_overwrites(tmp_path: Path) -> None:
    storage = Storage()
    result = _result([_page(1, "Hello"), _page(2, "World")], source="s3://bucket/in/sub/Doc.PDF")
    out = str(tmp_path / "out")
    uris = _write(result, out, storage)
    assert uris == {"dolma": f"{out}/dolma/sub/Doc.jsonl", "markdown": f"{out}/markdown/sub/Doc.md"}
    assert (tmp_path / "out/markdown/sub/Doc.md").read_text() == "Hello\nWorld"
    [line] = (tmp_path / "out/dolma/sub/Doc.jsonl").read_text().splitlines()
    assert json.loads(line)["text"] == "Hello\nWorld"
    # A rerun with a changed result overwrites the same two files.
    result.pages[1].text = "World, again"
    assert _write(result, out, storage) == uris
    files = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert files == ["out/dolma/sub/Doc.jsonl", "out/markdown/sub/Doc.md"]
    assert (tmp_path / "out/markdown/sub/Doc.md").read_text() == "Hello\nWorld, again"


def test_write_outputs_without_markdown(tmp_path: Path) -> None:
    uris = _write(_result([_page(1, "x")]), str(tmp_path), Storage(), markdown=False)
    assert list(uris) == ["dolma"]
    assert not (tmp_path / "markdown").exists()


def test_blank_document_is_recorded_with_empty_text(tmp_path: Path) -> None:
    uris = _write(_result([_page(1, None), _page(2, None)]), str(tmp_path), Storage())
    [line] = (tmp_path / "dolma").rglob("*.jsonl").__next__().read_text().splitlines()
    record = json.loads(line)
    assert record["text"] == "" and record["metadata"]["pdf-total-pages"] == 2
    assert record["attributes"]["pdf_page_numbers"] == [[0, 0, 1], [0, 0, 2]]
    assert Path(uris["markdown"]).read_text() == ""


def test_write_outputs_s3(s3_bucket: str, s3_storage_options: dict[str, Any]) -> None:
    storage = Storage(s3_storage_options)
    result = _result([_page(1, "Ünïcode page"), _page(2, None)], source="s3://bucket/in/../../evil.pdf")
    uris = _write(result, f"s3://{s3_bucket}/out", storage)
    stem = output_stem(result.source, "s3://bucket/in")
    assert re.fullmatch("evil~[0-9a-f]{10}", stem)
    assert uris == {
        "dolma": f"s3://{s3_bucket}/out/dolma/{stem}.jsonl",
        "markdown": f"s3://{s3_bucket}/out/markdown/{stem}.md",
    }
    assert storage.read_bytes(uris["markdown"]).decode() == "Ünïcode page\n"
    assert json.loads(storage.read_bytes(uris["dolma"]))["metadata"]["Source-File"] == result.source
    _write(result, f"s3://{s3_bucket}/out", storage)
    assert len(list(storage.list_objects(f"s3://{s3_bucket}/out"))) == 2
