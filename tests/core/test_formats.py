"""A document's format is its content: detected from real files of each kind, compared with its name
and the run's formats before anything renders it."""

from __future__ import annotations

from functools import cache

import pytest

from olmocr_tasks.core.errors import DocumentError, EmptyDocumentError, NotPdfError, UnsupportedFormatError
from olmocr_tasks.core.formats import FORMATS, HEAD_BYTES, check_format, detect_format, strip_document_extension
from olmocr_testkit import imagegen, pdfgen


@cache
def _files() -> dict[str, bytes]:
    page = imagegen.page_image(2)
    return {
        "pdf": pdfgen.text_pdf(1, 1),
        "png": imagegen.encode(page, "PNG"),
        "jpeg": imagegen.encode(page, "JPEG"),
        "tiff": imagegen.multipage_tiff(3, 2),
        "webp": imagegen.encode(page, "WEBP"),
        "gif": imagegen.encode(page, "GIF"),
        "bmp": imagegen.encode(page, "BMP"),
    }


def test_each_format_is_detected_from_its_first_bytes() -> None:
    files = _files()
    assert {name: detect_format(data[:HEAD_BYTES]) for name, data in files.items()} == {name: name for name in files}
    # Big-endian TIFF and BigTIFF headers (Pillow writes little-endian classic TIFF).
    assert detect_format(b"MM\x00*\x00\x00\x00\x08") == detect_format(b"II+\x00\x08\x00\x00\x00") == "tiff"
    assert detect_format(b"hello, world\n" * 100) == "unknown"
    # PDFium's leniency: a PDF header after some junk in the first kilobyte is still a PDF...
    assert detect_format(b"junk\n" * 10 + pdfgen.text_pdf(1, 1)) == "pdf"
    # ...but an image is an image even when "%PDF-" appears inside it.
    assert detect_format(files["png"][:100] + b"%PDF-1.7") == "png"


@pytest.mark.parametrize(
    ("name", "content", "error", "message"),
    [
        # A .pdf that is not one keeps the class manifests have always used for it.
        ("s3://b/in/scan.pdf", "png", NotPdfError, "no %PDF- header in the first 1024 bytes (content: png)"),
        ("s3://b/in/notes.pdf", "text", NotPdfError, "(content: unknown)"),
        # Another extension whose content is something else: the detected type is named.
        ("s3://b/in/scan.TIF", "png", UnsupportedFormatError, "named .TIF but the content is png"),
        ("s3://b/in/photo.jpg", "pdf", UnsupportedFormatError, "named .jpg but the content is pdf"),
        ("s3://b/in/anim.png", "gif", UnsupportedFormatError, "the content is gif, not a format this converts"),
        ("s3://b/in/listed", "bmp", UnsupportedFormatError, "the content is bmp"),
        ("s3://b/in/listed", "text", UnsupportedFormatError, "the content is unknown"),
    ],
)
def test_a_name_that_lies_about_its_content_fails_typed(
    name: str, content: str, error: type[DocumentError], message: str
) -> None:
    head = (b"hello\n" * 300 if content == "text" else _files()[content])[:HEAD_BYTES]
    with pytest.raises(error) as caught:
        check_format(head, name)
    assert message in str(caught.value)
    assert caught.value.error_class == ("not_pdf" if error is NotPdfError else "unsupported_format")
    # The family is catchable as one: not_pdf is the older name of one unsupported format.
    assert isinstance(caught.value, UnsupportedFormatError)


def test_names_that_fit_their_content_pass_in_any_letter_case_and_unnamed_files_go_by_content() -> None:
    files = _files()
    for name, fmt in [("a.PDF", "pdf"), ("b.Png", "png"), ("c.JPEG", "jpeg"), ("d.jpg", "jpeg"), ("e.TIFF", "tiff"),
                      ("f.tif", "tiff"), ("g.WebP", "webp"), ("listed-without-extension", "tiff")]:  # fmt: skip
        assert check_format(files[fmt][:HEAD_BYTES], f"s3://b/{name}") == fmt


def test_the_runs_formats_restrict_what_converts_and_empty_files_stay_empty() -> None:
    files = _files()
    with pytest.raises(UnsupportedFormatError, match="the content is tiff; this run converts pdf, png"):
        check_format(files["tiff"][:HEAD_BYTES], "s3://b/listed", formats={"pdf", "png"})
    assert check_format(files["png"][:HEAD_BYTES], "x.png", formats={"png"}) == "png"
    with pytest.raises(EmptyDocumentError, match="empty"):
        check_format(b"", "scan.tif")


def test_output_stems_drop_every_document_extension() -> None:
    assert [strip_document_extension(n) for n in ("x/Scan.TIFF", "a.jpg", "b.Pdf", "c.webp", "d.gif", "e")] == [
        "x/Scan",
        "a",
        "b",
        "c",
        "d.gif",
        "e",
    ]
    assert FORMATS == ("pdf", "png", "jpeg", "tiff", "webp")
