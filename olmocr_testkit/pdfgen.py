"""Real PDFs for the tests, generated on the fly with reportlab (and pypdf where reportlab cannot).

Every page that has content carries the identity marker of ``olmocr_testkit.page_marker`` so a render can be
traced back to its document and page, and a line of real text ``Document {doc_id} page {n}: ...``.
The hostile inputs (encrypted, truncated, malformed, ...) are built from the same generator so they
differ from a good PDF only in the property under test.

All generators are deterministic (``invariant=1`` keeps reportlab from stamping the date and a random
document id) and fast enough to build thousands of pages in a test.
"""

from __future__ import annotations

import io
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont
from pypdf import PdfReader, PdfWriter
from pypdf.generic import NameObject, NumberObject
from reportlab.lib.pagesizes import letter
from reportlab.lib.pdfencrypt import StandardEncryption
from reportlab.lib.utils import ImageReader
from reportlab.pdfgen.canvas import Canvas

from olmocr_testkit.page_marker import SENTINEL_RGB, identity_rgb, square_boxes

PageSize = tuple[float, float]

SENTENCES: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "Pack my box with five dozen liquor jugs.",
    "Sphinx of black quartz, judge my vow.",
    "How vexingly quick daft zebras jump.",
    "The five boxing wizards jump quickly.",
)
FONT_SIZE = 14
BODY_FONT_SIZE = 10


def page_line(doc_id: int, page_number: int, sentences: Sequence[str] | None = None) -> str:
    """The visible text line of a generated page (what text extraction must return)."""
    pool = sentences or SENTENCES
    return f"Document {doc_id} page {page_number}: {pool[(page_number - 1) % len(pool)]}"


def _pdf_rect(box: tuple[float, float, float, float], height: float) -> tuple[float, float, float, float]:
    """(x, y, width, height) in PDF space of a (left, top, right, bottom) box whose y grows downwards."""
    left, top, right, bottom = box
    return left, height - bottom, right - left, bottom - top


def _draw_marker(canvas: Canvas, width: float, height: float, doc_id: int, page_number: int) -> None:
    sentinel, identity = square_boxes(width, height)
    for box, rgb in ((sentinel, SENTINEL_RGB), (identity, identity_rgb(doc_id, page_number))):
        canvas.setFillColorRGB(*(channel / 255 for channel in rgb))
        canvas.rect(*_pdf_rect(box, height), stroke=0, fill=1)
    canvas.setFillColorRGB(0, 0, 0)


def _text_position(width: float, height: float) -> tuple[float, float]:
    """(left, top) of the text line, y growing downwards: under the marker squares, never on them."""
    sentinel, identity = square_boxes(width, height)
    return sentinel[0], identity[3] + FONT_SIZE


def _canvas(buffer: io.BytesIO, page_size: PageSize, encrypt: StandardEncryption | None = None) -> Canvas:
    return Canvas(buffer, pagesize=page_size, invariant=1, encrypt=encrypt)


def _text_pages(
    canvas: Canvas,
    pages: int,
    doc_id: int,
    sentences: Sequence[str] | None,
    page_size: PageSize,
    body_lines: int = 0,
) -> None:
    width, height = page_size
    for page_number in range(1, pages + 1):
        _draw_marker(canvas, width, height, doc_id, page_number)
        canvas.setFont("Helvetica", FONT_SIZE)
        left, top = _text_position(width, height)
        canvas.drawString(left, height - top - FONT_SIZE, page_line(doc_id, page_number, sentences))
        canvas.setFont("Times-Roman", BODY_FONT_SIZE)
        for line in range(body_lines):
            baseline = height - top - 2 * FONT_SIZE - (line + 1) * BODY_FONT_SIZE * 1.25
            if baseline < BODY_FONT_SIZE:
                break
            canvas.drawString(left, baseline, _filler(page_number + line))
        canvas.showPage()


def _filler(seed: int) -> str:
    words = " ".join(SENTENCES).split()
    return " ".join(words[(seed * 7 + i) % len(words)] for i in range(16))


def text_pdf(
    pages: int = 1,
    doc_id: int = 1,
    sentences: Sequence[str] | None = None,
    page_size: PageSize = letter,
    body_lines: int = 0,
) -> bytes:
    """Pages with a marker and one line of selectable text each.

    ``body_lines`` adds that many lines of filler prose under it (as many as fit), for realistic
    rendering and encoding costs.
    """
    buffer = io.BytesIO()
    canvas = _canvas(buffer, page_size)
    _text_pages(canvas, pages, doc_id, sentences, page_size, body_lines)
    canvas.save()
    return buffer.getvalue()


def rotated_pdf(
    rotate: int,
    pages: int = 1,
    doc_id: int = 1,
    sentences: Sequence[str] | None = None,
    page_size: PageSize = letter,
) -> bytes:
    """Like ``text_pdf`` but every page dictionary has ``/Rotate rotate`` (clockwise display turn).

    The content is drawn upright in page space, so a viewer (and PDFium) shows it turned by
    ``rotate`` degrees clockwise, like a page scanned sideways. Undoing that takes PIL's
    counter-clockwise ``ROTATE_<rotate>``, so ``read_marker`` on the render reports
    ``rotation_correction == rotate``.
    """
    if rotate not in (0, 90, 180, 270):
        raise ValueError("rotate must be 0, 90, 180 or 270")
    # pypdf rather than reportlab's setPageRotation: reportlab also swaps the media box, which would
    # move the drawing instead of leaving it upright in page space.
    reader = PdfReader(io.BytesIO(text_pdf(pages, doc_id, sentences, page_size)))
    writer = PdfWriter(clone_from=reader)
    for page in writer.pages:
        page[NameObject("/Rotate")] = NumberObject(rotate)
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


def image_only_pdf(
    pages: int = 1,
    doc_id: int = 1,
    sentences: Sequence[str] | None = None,
    page_size: PageSize = letter,
    pixels_per_point: float = 1.5,
) -> bytes:
    """Pages whose only content is one raster image (marker and text as pixels, no text layer)."""
    width, height = page_size
    size = (round(width * pixels_per_point), round(height * pixels_per_point))
    font = ImageFont.load_default(size=FONT_SIZE * pixels_per_point)
    buffer = io.BytesIO()
    canvas = _canvas(buffer, page_size)
    for page_number in range(1, pages + 1):
        image = Image.new("RGB", size, "white")
        draw = ImageDraw.Draw(image)
        sentinel, identity = square_boxes(*size)
        draw.rectangle([round(v) for v in sentinel], fill=SENTINEL_RGB)
        draw.rectangle([round(v) for v in identity], fill=identity_rgb(doc_id, page_number))
        draw.text(_text_position(*size), page_line(doc_id, page_number, sentences), fill="black", font=font)
        # Lossless (Flate) embedding keeps the marker colours exact.
        canvas.drawImage(ImageReader(image), 0, 0, width=width, height=height)
        canvas.showPage()
    canvas.save()
    return buffer.getvalue()


def encrypted_pdf(user_password: str = "u", owner_password: str = "o", pages: int = 1, doc_id: int = 1) -> bytes:
    """A PDF that cannot be opened without the user password."""
    if not user_password:
        raise ValueError("an encrypted_pdf needs a user password; see owner_only_encrypted_pdf")
    buffer = io.BytesIO()
    encryption = StandardEncryption(user_password, owner_password, strength=128)
    canvas = _canvas(buffer, letter, encrypt=encryption)
    _text_pages(canvas, pages, doc_id, None, letter)
    canvas.save()
    return buffer.getvalue()


def owner_only_encrypted_pdf(owner_password: str = "o", pages: int = 1, doc_id: int = 1) -> bytes:
    """Encrypted with an empty user password: opens without a password, only restrictions apply."""
    buffer = io.BytesIO()
    encryption = StandardEncryption("", owner_password, canPrint=0, canModify=0, canCopy=0, canAnnotate=0, strength=128)
    canvas = _canvas(buffer, letter, encrypt=encryption)
    _text_pages(canvas, pages, doc_id, None, letter)
    canvas.save()
    return buffer.getvalue()


def truncated_pdf(pages: int = 4, doc_id: int = 1) -> bytes:
    """A valid PDF cut in half: no xref, no trailer, page tree gone; PDFium cannot repair it."""
    data = text_pdf(pages, doc_id)
    return data[: len(data) // 2]


def empty_file() -> bytes:
    return b""


def not_a_pdf() -> bytes:
    """A small PNG: a real file of another type."""
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), "white").save(buffer, format="PNG")
    return buffer.getvalue()


def zero_page_pdf() -> bytes:
    """A syntactically valid PDF whose page tree is empty (``/Count 0``)."""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [] /Count 0 >>",
    ]
    return assemble_pdf(objects)


def huge_page_pdf(doc_id: int = 1, side: float = 14400.0) -> bytes:
    """One page at the largest size PDF allows (14400 x 14400 pt, 200 inches square)."""
    return text_pdf(1, doc_id, page_size=(side, side))


def many_pages_pdf(n: int = 400, doc_id: int = 1) -> bytes:
    """A long document; each page still has its own marker and text line."""
    return text_pdf(n, doc_id)


def memory_bomb_pdf(decoded_mib: int = 1024) -> bytes:
    """One page of a few kilobytes whose content stream (Flate applied twice) decompresses to
    ``decoded_mib`` MiB of spaces, which PDFium holds whole to parse the page: a decompression bomb
    that needs that much memory (and up to twice as much while the buffer grows) to render the page
    or read its text.

    Built without compressing a gigabyte: after the first MiB, deflate codes each further MiB of
    spaces identically (the window holds only spaces), so the inner stream is that block repeated,
    with the Adler-32 of ``n`` spaces worked out in closed form.
    """
    block = b" " * (1024 * 1024)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate; the zlib framing is added below
    first = deflate.compress(block) + deflate.flush(zlib.Z_SYNC_FLUSH)
    repeat = deflate.compress(block) + deflate.flush(zlib.Z_SYNC_FLUSH)
    end = deflate.flush()
    length = decoded_mib * len(block)
    low = (1 + ord(" ") * length) % 65521
    high = (length + ord(" ") * length * (length + 1) // 2) % 65521
    inner = b"\x78\xda" + first + repeat * (decoded_mib - 1) + end + ((high << 16) | low).to_bytes(4, "big")
    return one_page_pdf(zlib.compress(inner, 9), b"[/FlateDecode /FlateDecode]")


def one_page_pdf(stream: bytes, filters: bytes = b"/FlateDecode") -> bytes:
    """A one-page Letter PDF whose page content is ``stream``, stored with ``filters``."""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>",
        b"<< /Length %d /Filter %s >>\nstream\n" % (len(stream), filters) + stream + b"\nendstream",
    ]
    return assemble_pdf(objects)


def shared_page_pdf(pages: int) -> bytes:
    """``pages`` blank pages sharing one content stream: a page count of any size in a few bytes a page
    (the ``many_pages_pdf`` of thousands of pages takes seconds to build)."""
    content = b"0 0 m 10 10 l S"
    kids = b" ".join(b"%d 0 R" % (4 + index) for index in range(pages))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, pages),
        b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
    ]
    objects += [b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 3 0 R >>"] * pages
    return assemble_pdf(objects)


def malformed_objects_pdf(kind: str = "bad_xref", doc_id: int = 1) -> bytes:
    """A damaged PDF.

    * ``bad_xref``: every xref offset is wrong and ``startxref`` points nowhere. PDFium rebuilds the
      cross-reference table by scanning the file, so the document opens and renders normally.
    * ``broken_page_tree``: the catalog's ``/Pages`` entry points to an object that is not a page
      tree. Nothing can find the pages, so PDFium rejects the document.
    """
    data = text_pdf(2, doc_id)
    if kind == "bad_xref":
        xref_at = data.rindex(b"\nxref\n") + 1
        body, tail = data[:xref_at], data[xref_at:]
        tail = re.sub(rb"\d{10} 00000 n", b"0000000009 00000 n", tail)
        tail = re.sub(rb"startxref\n\d+", b"startxref\n123456789", tail)
        return body + tail
    if kind == "broken_page_tree":
        return re.sub(rb"/Pages (\d+) 0 R", b"/Pages 999 0 R", data, count=1)
    raise ValueError(f"unknown kind {kind!r}")


def assemble_pdf(objects: Sequence[bytes]) -> bytes:
    """A minimal PDF file around numbered objects (object 1 is the catalog)."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref_at = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref_at)
    return bytes(out)


def write_pdf(path: str | Path, data: bytes) -> Path:
    """Write generated bytes to a path (parents created) and return the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return target


@dataclass(frozen=True)
class CorpusEntry:
    """One file of the mixed corpus and what converting it must give."""

    name: str
    data: bytes
    # None for a convertible document, else the DocumentError.error_class it must fail with.
    error_class: str | None
    doc_id: int | None = None
    pages: int = 0
    rotation_correction: int = 0
    has_text_layer: bool = True


def mixed_corpus() -> list[CorpusEntry]:
    """A small corpus with good documents of every kind and one of each bad input."""
    return [
        CorpusEntry("doc01_text.pdf", text_pdf(3, 1), None, doc_id=1, pages=3),
        CorpusEntry("doc02_image_only.pdf", image_only_pdf(2, 2), None, doc_id=2, pages=2, has_text_layer=False),
        CorpusEntry("doc03_rotated90.pdf", rotated_pdf(90, 2, 3), None, doc_id=3, pages=2, rotation_correction=90),
        CorpusEntry("doc04_owner_only.pdf", owner_only_encrypted_pdf(pages=2, doc_id=4), None, doc_id=4, pages=2),
        CorpusEntry("doc05_landscape.pdf", text_pdf(1, 5, page_size=(letter[1], letter[0])), None, doc_id=5, pages=1),
        CorpusEntry("bad_encrypted.pdf", encrypted_pdf(), "encrypted"),
        CorpusEntry("bad_truncated.pdf", truncated_pdf(), "corrupt"),
        CorpusEntry("bad_empty.pdf", empty_file(), "empty"),
        CorpusEntry("bad_zero_pages.pdf", zero_page_pdf(), "empty"),
        CorpusEntry("bad_not_a_pdf.pdf", not_a_pdf(), "not_pdf"),
        CorpusEntry("bad_page_tree.pdf", malformed_objects_pdf("broken_page_tree"), "corrupt"),
    ]


def write_corpus(folder: str | Path, entries: Sequence[CorpusEntry] | None = None) -> dict[str, CorpusEntry]:
    """Write the corpus into ``folder``; returns the entries by file name."""
    chosen = mixed_corpus() if entries is None else entries
    for entry in chosen:
        write_pdf(Path(folder) / entry.name, entry.data)
    return {entry.name: entry for entry in chosen}
