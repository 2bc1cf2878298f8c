"""Image documents end to end beside PDFs: the engine, the real render pool, the vLLM stand-in over
HTTP and real storage, over a scanned archive's mix of formats, modes and broken files.

The stand-in answers each page with the document and page its marker shows, so the outputs prove
every image page reached the model upright, in order, and attributed to its own document; content
addressing, re-runs and the formats restriction are held to what they are for PDFs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from olmocr_testkit import imagegen, pdfgen
from olmocr_testkit.standin.server import StandinServer
from tests.fixtures.reader_view import assert_reader_view_consistent
from tests.run.test_conversion import by_name, fast_settings, page_answers, run

SAFE = imagegen.JPEG_SAFE_DOC_IDS


def write(folder: Path, name: str, data: bytes) -> None:
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)


def mixed_archive(inbox: Path) -> tuple[dict[str, tuple[int, int]], dict[str, str]]:
    """Writes the archive; returns the convertible documents (name -> (doc id, pages)) and the broken
    ones (name -> the error class each must fail with)."""
    good = {
        "report.pdf": (pdfgen.text_pdf(2, 1), 1, 2),
        "scans/page.PNG": (imagegen.encode(imagegen.page_image(3), "PNG"), 3, 1),
        "scans/photo.jpg": (imagegen.encode(imagegen.page_image(SAFE[0]), "JPEG"), SAFE[0], 1),
        "scans/phone.jpeg": (imagegen.exif_rotated_jpeg(SAFE[1]), SAFE[1], 1),
        "scans/print.jpg": (imagegen.cmyk_jpeg(5), 5, 1),
        "scans/bundle.tif": (imagegen.multipage_tiff(6, 5), 6, 5),
        "scans/web.webp": (imagegen.encode(imagegen.page_image(7), "WEBP"), 7, 1),
        "scans/deep.png": (imagegen.gray16_png(), 0, 1),  # grey only: no marker, the stand-in answers anyway
    }
    bad = {
        "scans/liar.TIFF": (imagegen.encode(imagegen.page_image(8), "PNG"), "unsupported_format"),
        "scans/png-inside.pdf": (imagegen.encode(imagegen.page_image(8), "PNG"), "not_pdf"),
        "scans/cut.png": (imagegen.truncated(imagegen.encode(imagegen.page_image(9), "PNG")), "corrupt"),
        "scans/bomb.png": (imagegen.decompression_bomb_png(), "too_large"),
        "scans/moving.webp": (imagegen.animated_webp(11), "unsupported_format"),
        "scans/empty.tif": (b"", "empty"),
    }
    for name, (data, *_) in {**good, **bad}.items():
        write(inbox, name, data)
    # Not documents by name: never listed.
    write(inbox, "scans/anim.gif", imagegen.encode(imagegen.page_image(12), "GIF"))
    write(inbox, "scans/notes.txt", b"not a page")
    return {name: (doc_id, pages) for name, (_, doc_id, pages) in good.items()}, {
        name: error_class for name, (_, error_class) in bad.items()
    }


def test_a_mixed_archive_converts_images_like_pdfs_and_types_every_bad_file(
    tmp_path: Path, standin: StandinServer
) -> None:
    good, bad = mixed_archive(tmp_path / "in")
    manifest = run(tmp_path, fast_settings(standin.url), "archive")

    docs = {str(Path(doc.source).relative_to(tmp_path / "in")): doc for doc in manifest.documents}
    assert set(docs) == set(good) | set(bad)  # the GIF and the text file were not listed
    for name, error_class in bad.items():
        assert (docs[name].status, docs[name].error_class) == ("failed", error_class), (name, docs[name].error)
    assert "named .TIFF but the content is png" in (docs["scans/liar.TIFF"].error or "")
    assert "(content: png)" in (docs["scans/png-inside.pdf"].error or "")
    assert "pixels" in (docs["scans/bomb.png"].error or "")
    for name, (doc_id, pages) in good.items():
        doc = docs[name]
        assert (doc.status, doc.pages, doc.fallback_pages) == ("converted", pages, 0), (name, doc.error)
        record = json.loads(Path(doc.outputs["dolma"]).read_text())
        assert record["metadata"]["Source-File"] == doc.source and record["metadata"]["pdf-total-pages"] == pages
        assert [span[2] for span in record["attributes"]["pdf_page_numbers"]] == list(range(1, pages + 1))
        if doc_id:
            assert page_answers(Path(doc.outputs["markdown"])) == [(doc_id, n) for n in range(1, pages + 1)]
    # Outputs are named like a PDF's: the extension goes, whatever it was.
    assert Path(docs["scans/bundle.tif"].outputs["markdown"]).name == "bundle.md"
    # The phone picture reached the model upright on its first request: EXIF orientation was applied.
    phone = [r for r in standin.requests() if (r["marker"] or {}).get("doc_id") == SAFE[1]]
    assert len(phone) == 1 and phone[0]["marker"]["rotation_correction"] == 0
    assert_reader_view_consistent(
        str(tmp_path / "out"),
        doc_ids={Path(name).name: doc_id for name, (doc_id, _) in good.items() if doc_id},
    )


def test_images_are_content_addressed_and_formats_restrict_a_run(tmp_path: Path, standin: StandinServer) -> None:
    inbox = tmp_path / "in"
    write(inbox, "scan.tif", imagegen.multipage_tiff(21, 3))
    write(inbox, "letter.pdf", pdfgen.text_pdf(1, 22))
    settings = fast_settings(standin.url)

    # A run that converts PDFs only leaves the scan alone: not listed, not failed.
    pdf_only = run(tmp_path, fast_settings(standin.url, formats=("pdf",)), "pdf-only")
    assert [Path(doc.source).name for doc in pdf_only.documents] == ["letter.pdf"]

    first = run(tmp_path, settings, "first")
    (scan,) = [doc for doc in first.documents if doc.source.endswith("scan.tif")]
    assert scan.status == "converted" and scan.pages == 3
    assert run(tmp_path, settings, "again").already_converted == 2

    # A renamed copy is the same content: not converted twice.
    shutil.copy(inbox / "scan.tif", inbox / "copy of scan.TIFF")
    requests = len(standin.requests())
    copied = run(tmp_path, settings, "copied")
    (dup,) = copied.documents
    assert (dup.status, dup.skip_reason, dup.duplicate_of) == ("skipped", "duplicate_content", scan.source)
    assert len(standin.requests()) == requests

    # A changed scan under the same name is converted again.
    write(inbox, "scan.tif", imagegen.multipage_tiff(23, 4))
    changed = run(tmp_path, settings, "changed")
    (doc,) = changed.documents
    assert doc.status == "converted" and page_answers(Path(doc.outputs["markdown"])) == [(23, n) for n in range(1, 5)]


def test_an_image_page_without_a_valid_answer_has_no_text_layer_and_follows_the_error_rate(
    tmp_path: Path, standin: StandinServer
) -> None:
    write(tmp_path / "in", "scan.tif", imagegen.multipage_tiff(31, 3))
    standin.configure(always={"31:2": "garbage"})
    strict = run(tmp_path, fast_settings(standin.url), "strict")
    (doc,) = strict.documents
    assert (doc.status, doc.error_class, doc.fallback_pages) == ("failed", "error_rate_exceeded", 1)
    assert "1 of 3 pages failed (an image has no text layer)" in (doc.error or "")

    tolerant = run(tmp_path, fast_settings(standin.url, max_page_error_rate=0.5), "tolerant")
    (doc,) = by_name(tolerant).values()
    assert doc.status == "converted" and doc.fallback_pages == 1
    record = json.loads(Path(doc.outputs["dolma"]).read_text())
    assert record["attributes"]["is_fallback"] == [False, True, False]
    assert page_answers(Path(doc.outputs["markdown"])) == [(31, 1), (31, 3)]  # page 2 is empty


def test_a_run_that_leaves_a_format_out_does_not_redrive_its_failures(tmp_path: Path, standin: StandinServer) -> None:
    write(tmp_path / "in", "cut.tif", imagegen.truncated(imagegen.multipage_tiff(41, 2), keep=0.6))
    write(tmp_path / "in", "letter.pdf", pdfgen.text_pdf(1, 42))
    failing = by_name(run(tmp_path, fast_settings(standin.url), "all-1"))["cut.tif"]
    assert (failing.status, failing.error_class, failing.failed_attempts) == ("failed", "corrupt", 1)

    # Neither listed nor re-driven by a PDF-only run: failing it again as unsupported_format would
    # count an attempt against a document that run was never asked to convert.
    pdf_only = run(tmp_path, fast_settings(standin.url, formats=("pdf",)), "pdf-only")
    assert pdf_only.documents == [] and pdf_only.already_converted == 1

    again = by_name(run(tmp_path, fast_settings(standin.url), "all-2"))["cut.tif"]
    assert (again.status, again.error_class, again.failed_attempts) == ("failed", "corrupt", 2)
