"""Regenerate the sample PDFs used by `make demo` (committed, so the demo needs no generator).

Run: .venv/bin/python examples/make_examples.py
"""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont
from pypdf import PdfReader, PdfWriter
from reportlab.lib.pagesizes import A4, letter
from reportlab.pdfgen import canvas

HERE = Path(__file__).parent

REPORT_PAGES = [
    [
        "Annual Report 2025",
        "",
        "The quick brown fox jumps over the lazy dog.",
        "Revenue grew by twelve percent while operating costs stayed flat.",
        "Our warehouses in Lisbon and Porto shipped more orders than ever.",
    ],
    [
        "Outlook",
        "",
        "Next year we will open a third warehouse in Coimbra.",
        "Customers asked for faster delivery and clearer invoices.",
        "The board approved a dividend of forty cents per share.",
    ],
]


def _text_pages(path: Path, pages: list[list[str]], page_size: tuple[float, float] = letter) -> None:
    pdf = canvas.Canvas(str(path), pagesize=page_size)
    pdf.setTitle(path.stem)
    for lines in pages:
        y = page_size[1] - 90
        for index, line in enumerate(lines):
            pdf.setFont("Helvetica-Bold" if index == 0 else "Helvetica", 22 if index == 0 else 14)
            pdf.drawString(72, y, line)
            y -= 30
        pdf.showPage()
    pdf.save()


def _scanned_letter(path: Path) -> None:
    """An image-only page: no text layer, so only OCR can read it."""
    image = Image.new("RGB", (1240, 1754), "white")
    draw = ImageDraw.Draw(image)
    try:
        font = ImageFont.truetype("DejaVuSans.ttf", 40)
    except OSError:
        font = ImageFont.load_default(size=40)
    lines = [
        "Dear customer,",
        "",
        "Thank you for your letter of March third.",
        "Your replacement parts were shipped today",
        "and should arrive within five working days.",
        "",
        "Kind regards,",
        "The Service Team",
    ]
    for index, line in enumerate(lines):
        draw.text((120, 160 + index * 70), line, fill="black", font=font)
    buffer = io.BytesIO()
    image.save(buffer, format="PDF", resolution=150)
    path.write_bytes(buffer.getvalue())


def _rotated_memo(path: Path) -> None:
    """A page stored with /Rotate 90: viewers (and our renderer) show it turned."""
    source = io.BytesIO()
    pdf = canvas.Canvas(source, pagesize=A4)
    y = A4[1] - 100
    for line in [
        "Internal memo",
        "",
        "The cafeteria will be closed on Friday for repairs.",
        "Please use the kitchen on the second floor instead.",
        "We apologise for the inconvenience.",
    ]:
        pdf.setFont("Helvetica", 16)
        pdf.drawString(72, y, line)
        y -= 32
    pdf.showPage()
    pdf.save()
    writer = PdfWriter()
    for page in PdfReader(io.BytesIO(source.getvalue())).pages:
        page.rotate(90)
        writer.add_page(page)
    with path.open("wb") as handle:
        writer.write(handle)


def main() -> None:
    (HERE / "nested").mkdir(exist_ok=True)
    _text_pages(HERE / "annual-report.pdf", REPORT_PAGES)
    _scanned_letter(HERE / "scanned-letter.pdf")
    _rotated_memo(HERE / "rotated-memo.pdf")
    _text_pages(
        HERE / "nested" / "Price List.PDF",
        [["Price list", "", "Blue chair: 45 euros", "Oak table: 220 euros", "Desk lamp: 18 euros"]],
        A4,
    )


if __name__ == "__main__":
    main()
