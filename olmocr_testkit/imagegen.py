"""Real page images for the tests (PNG, JPEG, TIFF, WebP), generated with Pillow.

Each page carries the identity marker of ``olmocr_testkit.page_marker`` and the text line of
``pdfgen.page_line``, as a generated PDF page does, so the vLLM stand-in names the document and page
it was shown and the reader-view checks apply unchanged. The awkward inputs a scanned archive holds
(16-bit grayscale, CMYK, palettes, transparency, EXIF orientation, hundreds of TIFF pages, truncated
files, decompression bombs) are built from the same page.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Sequence

from PIL import Image, ImageDraw, ImageFont

from olmocr_testkit.page_marker import SENTINEL_RGB, identity_rgb, read_marker, square_boxes
from olmocr_testkit.pdfgen import FONT_SIZE, page_line

__all__ = [
    "EXIF_ORIENTATION",
    "JPEG_SAFE_DOC_IDS",
    "animated_webp",
    "cmyk_jpeg",
    "decompression_bomb_png",
    "encode",
    "exif_rotated_jpeg",
    "gray16_png",
    "multipage_tiff",
    "page_image",
    "transparent_png",
    "truncated",
]

EXIF_ORIENTATION = 0x0112
# Documents whose page-1 marker survives RGB JPEG coding (see ``encode``).
JPEG_SAFE_DOC_IDS = (2, 4, 9, 10, 16, 20, 26, 28, 32, 34, 39, 40)
# A page image of a US letter page at 100 dpi: big enough for a legible text line.
PAGE_SIZE = (850, 1100)


def page_image(
    doc_id: int, page_number: int = 1, size: tuple[int, int] = PAGE_SIZE, sentences: Sequence[str] | None = None
) -> Image.Image:
    """An upright RGB page: marker squares at the top left, the page's text line under them."""
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    sentinel, identity = square_boxes(*size)
    draw.rectangle([round(v) for v in sentinel], fill=SENTINEL_RGB)
    draw.rectangle([round(v) for v in identity], fill=identity_rgb(doc_id, page_number))
    scale = min(size) / 612  # the text keeps its size relative to the page, as on a letter PDF page
    font = ImageFont.load_default(size=max(6, FONT_SIZE * scale))
    top = identity[3] + FONT_SIZE * scale
    draw.text((sentinel[0], top), page_line(doc_id, page_number, sentences), fill="black", font=font)
    return image


def encode(image: Image.Image, image_format: str, **options: object) -> bytes:
    """``image`` saved as ``image_format`` (a Pillow format name): WebP lossless, JPEG at quality 95
    without chroma subsampling.

    A JPEG's YCbCr round trip moves some marker colours by one (``(7, 0, 1)`` comes back ``(6, 0,
    0)``), which would name another page; so an RGB page whose marker does not survive is refused
    here, and the tests pick identities that do (``JPEG_SAFE_DOC_IDS``). CMYK JPEGs keep them all.
    """
    if image_format == "WEBP":
        options = {"lossless": True, **options}
    if image_format == "JPEG":
        options = {"quality": 95, "subsampling": 0, **options}
    buffer = io.BytesIO()
    image.save(buffer, format=image_format, **options)
    data = buffer.getvalue()
    if image_format == "JPEG":
        expected = read_marker(image)
        with Image.open(io.BytesIO(data)) as decoded:
            found = read_marker(decoded.convert("RGB"))
        if expected is not None and found != expected:
            raise ValueError(f"the marker {expected} reads as {found} after JPEG coding: use JPEG_SAFE_DOC_IDS")
    return data


def multipage_tiff(doc_id: int, pages: int, size: tuple[int, int] = (120, 160)) -> bytes:
    """One TIFF of ``pages`` marked pages, small in bytes: small palette pages, deflate-compressed."""
    frames = [page_image(doc_id, number, size).quantize(colors=16, dither=Image.Dither.NONE) for number in
              range(1, pages + 1)]  # fmt: skip
    buffer = io.BytesIO()
    frames[0].save(buffer, format="TIFF", save_all=True, append_images=frames[1:], compression="tiff_adobe_deflate")
    return buffer.getvalue()


def gray16_png(size: tuple[int, int] = (400, 520), level: int = 40000, dark: int = 2000) -> bytes:
    """A 16-bit grayscale PNG: a ``level`` page with a ``dark`` block at the top left (values above
    255 throughout, which a naive 8-bit conversion turns all white)."""
    image = Image.new("I", size, level)
    ImageDraw.Draw(image).rectangle((0, 0, size[0] // 4 - 1, size[1] // 4 - 1), fill=dark)
    return encode(image.convert("I;16"), "PNG")


def cmyk_jpeg(doc_id: int, page_number: int = 1) -> bytes:
    return encode(page_image(doc_id, page_number).convert("CMYK"), "JPEG")


def exif_rotated_jpeg(doc_id: int, page_number: int = 1) -> bytes:
    """A JPEG stored sideways (turned a quarter counter-clockwise) whose EXIF orientation (6: turn it a
    quarter clockwise to view) makes it upright, as a phone camera writes it."""
    encode(page_image(doc_id, page_number), "JPEG")  # refuses an identity JPEG coding would change
    stored = page_image(doc_id, page_number).transpose(Image.Transpose.ROTATE_90)
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = 6
    return encode(stored, "JPEG", exif=exif.tobytes())


def transparent_png(doc_id: int, page_number: int = 1) -> bytes:
    """The page on a fully transparent background (RGBA): readable only when laid on white."""
    page = page_image(doc_id, page_number)
    alpha = Image.eval(page.convert("L"), lambda value: 0 if value == 255 else 255)
    rgba = page.convert("RGBA")
    rgba.putalpha(alpha)
    rgba.putdata([(0, 0, 0, 0) if pixel[3] == 0 else pixel for pixel in rgba.getdata()])
    return encode(rgba, "PNG")


def animated_webp(doc_id: int, frames: int = 3) -> bytes:
    images = [page_image(doc_id, number, (200, 260)) for number in range(1, frames + 1)]
    buffer = io.BytesIO()
    images[0].save(buffer, format="WEBP", save_all=True, append_images=images[1:], duration=100, lossless=True)
    return buffer.getvalue()


def truncated(data: bytes, keep: float = 0.5) -> bytes:
    """The first ``keep`` share of a file: a transfer cut short."""
    return data[: max(1, int(len(data) * keep))]


def decompression_bomb_png(width: int = 100_000, height: int = 100_000) -> bytes:
    """A valid PNG of a few hundred bytes that declares ``width`` x ``height`` 8-bit gray pixels
    (10 gigapixels by default): its rows are all zero, so they compress to almost nothing, and this
    builds them as a stream without holding them."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    compressor = zlib.compressobj(9)
    # Only the first rows: the file stays small, and a decoder that tries gets far enough to need the
    # whole buffer. The limit must refuse it before that.
    data = compressor.compress(b"\x00" * (width + 1) * 16) + compressor.flush()
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")
