"""Dolma records, markdown and output keys, written to real local folders and moto S3."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path
from typing import Any

import pytest

from olmocr_tasks.location.layout import safe_run_id
from olmocr_tasks.location.outputs import (
    OLMOCR_COMPAT_VERSION,
    claim_stem,
    dolma_line,
    dolma_record,
    output_stem,
    output_uris,
    write_document_outputs,
)
from olmocr_tasks.page.results import DocumentResult, PageResult
from olmocr_tasks.run.pipeline import run_conversion
from olmocr_tasks.run.request import RunRequest
from olmocr_tasks.storage.store import Storage
from olmocr_testkit.airflow_env import AirflowEnv
from olmocr_testkit.pdfgen import text_pdf
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.cli_process import run_cli
from tests.fixtures.manifests import load_whole
from tests.fixtures.pages import page_result
from tests.fixtures.reader_view import quick_settings


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
        ("s3://b/input/a.pdf", "s3://b/in", "a"),  # not under "in/": its file name
        ("s3://b/in/single.pdf", "s3://b/in/single.pdf", "single"),
        ("s3://other/x/y.pdf", "s3://b/in", "y"),
        ("/data/in/sub/a.pdf", "/data/in", "sub/a"),
        ("file:///data/in/sub/a.pdf", "/data/in/", "sub/a"),
        ("/data/in/sub/a.pdf", "file:///data/in", "sub/a"),
        ("/elsewhere/b.pdf", "/data/in", "b"),  # not a folder's absolute path
        ("s3://b/in/../../etc/passwd.pdf", "s3://b/in", "etc/passwd~"),  # "~": plus a hash of the original
        ("s3://b/in/a/./b//c.pdf", "s3://b/in", "a/b/c~"),
        ("/abs/x.pdf", "s3://b/in", "x"),
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


def test_output_stem_unicode_is_nfc_whichever_way_the_name_is_spelled() -> None:
    nfd = unicodedata.normalize("NFD", "s3://b/in/Résumé/Ölçek.pdf")
    nfc = unicodedata.normalize("NFC", "Résumé/Ölçek")
    assert nfd != unicodedata.normalize("NFC", nfd), "the test needs a name whose spellings differ"
    # Both spellings of one name (macOS writes NFD, most tools NFC) land on the same outputs.
    assert output_stem(nfd, "s3://b/in") == output_stem(unicodedata.normalize("NFC", nfd), "s3://b/in") == nfc
    # Different unnamed sources get different stems.
    assert output_stem("s3://b/in/.pdf", "s3://b/in") != output_stem("s3://b/in/x/.pdf", "s3://b/in")


def test_output_uris_cannot_escape_the_output_prefix() -> None:
    uris = output_uris("s3://b/out/", "../../x")
    assert uris == {"dolma": "s3://b/out/dolma/x.jsonl", "markdown": "s3://b/out/markdown/x.md"}


# ------------------------------------------------------------------------------------- dolma


def test_dolma_record_schema_key_order_and_spans() -> None:
    pages = [
        page_result(1, "First page"),
        page_result(2, None, is_fallback=True, accepted_attempt=None, input_tokens=0, output_tokens=0, attempts=8),
        page_result(3, "Third — page", primary_language=None, is_table=True, rotation_correction=90),
        page_result(4, None, is_fallback=True, accepted_attempt=None, input_tokens=0, output_tokens=0),
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
    document = _result([page_result(1, "Grüße “quoted”")])
    record = dolma_record(document, model="m", prompt_version="p", package_version="v")
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
    result = _result([page_result(1, "Hello"), page_result(2, "World")], source="s3://bucket/in/sub/Doc.PDF")
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
    # The two outputs, and the record saying they belong to this source.
    assert files[1:] == ["out/dolma/sub/Doc.jsonl", "out/markdown/sub/Doc.md"]
    assert len(files) == 3 and files[0].startswith("out/_state/output-owners/")
    assert (tmp_path / "out/markdown/sub/Doc.md").read_text() == "Hello\nWorld, again"


def test_write_outputs_without_markdown(tmp_path: Path) -> None:
    uris = _write(_result([page_result(1, "x")]), str(tmp_path), Storage(), markdown=False)
    assert list(uris) == ["dolma"]
    assert not (tmp_path / "markdown").exists()


def test_blank_document_is_recorded_with_empty_text(tmp_path: Path) -> None:
    uris = _write(_result([page_result(1, None), page_result(2, None)]), str(tmp_path), Storage())
    [line] = (tmp_path / "dolma").rglob("*.jsonl").__next__().read_text().splitlines()
    record = json.loads(line)
    assert record["text"] == "" and record["metadata"]["pdf-total-pages"] == 2
    assert record["attributes"]["pdf_page_numbers"] == [[0, 0, 1], [0, 0, 2]]
    assert Path(uris["markdown"]).read_text() == ""


def test_write_outputs_s3(s3_bucket: str, s3_storage_options: dict[str, Any]) -> None:
    storage = Storage(s3_storage_options)
    result = _result([page_result(1, "Ünïcode page"), page_result(2, None)], source="s3://bucket/in/../../evil.pdf")
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
    # The two outputs and the record saying they belong to this source.
    assert len(list(storage.list_objects(f"s3://{s3_bucket}/out"))) == 3


# ------------------------------------------------------------- no document overwrites another's


def _text_of(markdown_uri: str, storage: Storage) -> str:
    return storage.read_bytes(markdown_uri).decode()


def _outputs(manifest: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {doc["source"]: doc["outputs"] for doc in manifest["documents"]}


def test_another_folder_into_the_same_output_never_replaces_a_documents_outputs(
    tmp_path: Path, standin: StandinServer
) -> None:
    """The issue's case: the same file name in a second input folder, converted into the same output."""
    first, second, out = tmp_path / "demo", tmp_path / "elsewhere", tmp_path / "out"
    first.mkdir()
    second.mkdir()
    (first / "annual-report.pdf").write_bytes(text_pdf(1, 201))
    (second / "annual-report.pdf").write_bytes(text_pdf(1, 202))
    common = ("--server", standin.url, "--model", standin.model, "--target-longest-image-dim", "512")
    for folder, run_id in ((first, "demo"), (second, "other")):
        result = run_cli("convert", str(folder), str(out), "--run-id", run_id, *common)
        assert result.returncode == 0, result.stderr[-3000:]
    storage = Storage()
    demo = _outputs(load_whole(str(out / "manifests" / "demo.json")))[str(first / "annual-report.pdf")]
    other = _outputs(load_whole(str(out / "manifests" / "other.json")))[str(second / "annual-report.pdf")]
    assert demo["markdown"] == str(out / "markdown" / "annual-report.md")
    assert "document 201 page 1" in _text_of(demo["markdown"], storage)
    # The second source's outputs are beside the first's, named after its own location.
    assert re.fullmatch(re.escape(str(out / "markdown" / "annual-report~")) + "[0-9a-f]{10}\\.md", other["markdown"])
    assert "document 202 page 1" in _text_of(other["markdown"], storage)
    assert json.loads(storage.read_bytes(other["dolma"]))["metadata"]["Source-File"] == str(
        second / "annual-report.pdf"
    )
    # Rerunning either folder with --reprocess writes to the same keys again: nothing moves or multiplies.
    result = run_cli("convert", str(second), str(out), "--run-id", "again", "--reprocess", *common)
    assert result.returncode == 0, result.stderr[-3000:]
    again = _outputs(load_whole(str(out / "manifests" / "again.json")))[str(second / "annual-report.pdf")]
    assert again == other
    assert sorted(p.name for p in (out / "markdown").iterdir()) == sorted(
        ["annual-report.md", Path(other["markdown"]).name]
    )


def test_outputs_written_before_owner_records_keep_their_owner(tmp_path: Path, standin: StandinServer) -> None:
    """An output tree from an earlier version has no owner records: its Dolma records say who wrote what."""
    first, second, out = tmp_path / "a", tmp_path / "b", tmp_path / "out"
    for folder, doc_id in ((first, 211), (second, 212)):
        folder.mkdir()
        (folder / "x.pdf").write_bytes(text_pdf(1, doc_id))
    storage = Storage()
    settings = quick_settings(standin.url)
    run_conversion(RunRequest(str(first), str(out), "old", settings=settings), storage)
    shutil.rmtree(out / "_state" / "output-owners")  # as written before this change
    manifest, _ = run_conversion(RunRequest(str(second), str(out), "new", settings=settings), storage)
    [entry] = manifest.documents
    assert entry.status == "converted" and entry.outputs["markdown"] != str(out / "markdown" / "x.md")
    assert "document 211 page 1" in _text_of(str(out / "markdown" / "x.md"), storage)
    assert "document 212 page 1" in _text_of(entry.outputs["markdown"], storage)


def test_case_and_unicode_twins_get_distinct_outputs(tmp_path: Path, standin: StandinServer) -> None:
    inbox, out = tmp_path / "in", tmp_path / "out"
    inbox.mkdir()
    names = {
        "scan.pdf": 221,
        "scan.PDF": 222,
        unicodedata.normalize("NFC", "Café.pdf"): 223,
        unicodedata.normalize("NFD", "Café.pdf"): 224,
        "Memo.pdf": 225,
        "memo.pdf": 226,
    }
    for name, doc_id in names.items():
        (inbox / name).write_bytes(text_pdf(1, doc_id))
    assert len(list(inbox.iterdir())) == len(names)
    storage = Storage()
    manifest, _ = run_conversion(
        RunRequest(str(inbox), str(out), "twins", settings=quick_settings(standin.url)), storage
    )
    by_source = {Path(doc.source).name: doc for doc in manifest.documents}
    assert {doc.status for doc in by_source.values()} == {"converted"}
    markdown = [by_source[name].outputs["markdown"] for name in names]
    # Distinct even where only letter case differs, so a copy onto a case-insensitive disk keeps them all.
    assert len({uri.casefold() for uri in markdown}) == len(names)
    for name, doc_id in names.items():
        assert f"document {doc_id} page 1" in _text_of(by_source[name].outputs["markdown"], storage), name


def test_explicit_documents_from_other_buckets_and_folders_get_readable_distinct_keys(
    tmp_path: Path, standin: StandinServer, s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    import boto3

    storage = Storage(s3_storage_options)
    client = boto3.client("s3", **_boto_options(s3_storage_options))
    other_bucket = f"{s3_bucket}-other"
    client.create_bucket(Bucket=other_bucket)
    client.put_object(Bucket=s3_bucket, Key="in/x.pdf", Body=text_pdf(1, 231))
    client.put_object(Bucket=other_bucket, Key="in/x.pdf", Body=text_pdf(1, 232))
    local = tmp_path / "elsewhere" / "alpha.pdf"
    local.parent.mkdir()
    local.write_bytes(text_pdf(1, 233))
    documents = (f"s3://{s3_bucket}/in/x.pdf", f"s3://{other_bucket}/in/x.pdf", str(local))
    out = f"s3://{s3_bucket}/out"
    request = RunRequest(
        f"s3://{s3_bucket}/in", out, "explicit", settings=quick_settings(standin.url), documents=documents
    )
    manifest, _ = run_conversion(request, storage)
    outputs = {doc.source: doc.outputs["markdown"] for doc in manifest.documents}
    # The two x.pdf convert concurrently: whichever claims "x" first keeps it, the other gets a suffix.
    plain, suffixed = sorted([outputs[documents[0]], outputs[documents[1]]], key=len)
    assert plain == f"{out}/markdown/x.md"
    assert re.fullmatch(re.escape(f"{out}/markdown/x~") + "[0-9a-f]{10}\\.md", suffixed)
    # Outside the input folder: the file name, not the folder's absolute path.
    assert outputs[documents[2]] == f"{out}/markdown/alpha.md"
    for source, doc_id in zip(documents, (231, 232, 233), strict=True):
        assert f"document {doc_id} page 1" in _text_of(outputs[source], storage)


def _boto_options(options: dict[str, Any]) -> dict[str, Any]:
    return {
        "aws_access_key_id": options["key"],
        "aws_secret_access_key": options["secret"],
        **options["client_kwargs"],
    }


def test_concurrent_claims_of_one_stem_have_exactly_one_winner(tmp_path: Path) -> None:
    storage = Storage()
    out = str(tmp_path / "out")
    sources = [f"s3://bucket-{i}/in/x.pdf" for i in range(8)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        stems = list(pool.map(lambda source: claim_stem(storage, out, "x", source), sources))
    assert stems.count("x") == 1 and len(set(stems)) == len(sources)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_input_folders_into_one_output_through_airflow(airflow_env: AirflowEnv, tmp_path: Path) -> None:
    """The same file name in two input folders, each converted by an olmocr_ingest run into one output."""
    first, second, out = tmp_path / "demo", tmp_path / "elsewhere", tmp_path / "out"
    for folder, doc_id in ((first, 241), (second, 242)):
        folder.mkdir()
        (folder / "annual-report.pdf").write_bytes(text_pdf(1, doc_id))
    storage = Storage()
    markdown = {}
    for folder in (first, second):
        result = airflow_env.dag_test("olmocr_ingest", conf={"input_uri": str(folder), "output_uri": str(out)})
        assert result.succeeded, result.tail()
        manifest = load_whole(str(out / "manifests" / f"{safe_run_id(f'olmocr_ingest__{result.run_id}')}.json"))
        [doc] = manifest["documents"]
        assert doc["status"] == "converted"
        markdown[folder] = doc["outputs"]["markdown"]
    assert markdown[first] == str(out / "markdown" / "annual-report.md")
    assert re.fullmatch(re.escape(str(out / "markdown" / "annual-report~")) + "[0-9a-f]{10}\\.md", markdown[second])
    assert "document 241 page 1" in _text_of(markdown[first], storage)
    assert "document 242 page 1" in _text_of(markdown[second], storage)
