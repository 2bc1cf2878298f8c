"""Image documents through the real render workers: every format, the awkward modes a scanned archive
holds, EXIF orientation, multi-page TIFF, and the typed failures (truncated, decompression bomb,
animated, too many pages), each a page image the model sees exactly as a rendered PDF page."""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from PIL import Image

from olmocr_tasks.core.config import DocumentLimits
from olmocr_tasks.core.errors import CorruptPdfError, TooLargeError, TooManyPagesError, UnsupportedFormatError
from olmocr_tasks.page.render_pool import RenderPool
from olmocr_testkit import imagegen, pdfgen
from olmocr_testkit.page_marker import Marker, read_marker

T = TypeVar("T")
TARGET = 1288


def run(pool: RenderPool, body: Callable[[RenderPool], Awaitable[T]]) -> T:
    async def main() -> T:
        return await body(pool)

    return asyncio.run(main())


def render(pool: RenderPool, path: Path, page_index: int = 0, rotation: int = 0) -> Image.Image:
    png = run(pool, lambda p: p.render_page(str(path), page_index, TARGET, rotation))
    image = Image.open(io.BytesIO(base64.b64decode(png, validate=True)))
    assert image.format == "PNG"
    return image


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def upright(doc_id: int, page_number: int = 1) -> Marker:
    return Marker(doc_id=doc_id, page_number=page_number, rotation_correction=0)


@pytest.mark.parametrize(
    ("name", "data", "doc_id"),
    [
        ("page.png", imagegen.encode(imagegen.page_image(1), "PNG"), 1),
        ("page.jpg", imagegen.encode(imagegen.page_image(2), "JPEG"), 2),
        ("page.webp", imagegen.encode(imagegen.page_image(3), "WEBP"), 3),
        ("page.tif", imagegen.encode(imagegen.page_image(5), "TIFF", compression="tiff_lzw"), 5),
        # Palette and CMYK pages, as scanners and print workflows save them.
        ("palette.png", imagegen.encode(imagegen.page_image(6).quantize(colors=32), "PNG"), 6),
        ("cmyk.jpg", imagegen.cmyk_jpeg(7), 7),
        # Transparent background: the page must come out on white, as a PDF page does.
        ("transparent.png", imagegen.transparent_png(8), 8),
    ],
)
def test_each_format_renders_like_a_pdf_page(render_pool: RenderPool, tmp_path: Path, name: str, data: bytes,
                                             doc_id: int) -> None:  # fmt: skip
    path = write(tmp_path, name, data)
    info = run(render_pool, lambda pool: pool.inspect(str(path)))
    assert (info.page_count, info.size_bytes, info.pdf_version) == (1, len(data), None)
    image = render(render_pool, path)
    # An 850 x 1100 page at a longest side of 1288, rounded as a PDF page's size is.
    assert (image.mode, image.size) == ("RGB", (995, 1288))
    assert read_marker(image) == upright(doc_id)
    assert image.getpixel((image.width - 3, image.height - 3)) == (255, 255, 255)
    # The retry ladder's turns work as on PDF pages (PIL's counter-clockwise ROTATE_R).
    assert read_marker(render(render_pool, path, rotation=90)) == Marker(doc_id, 1, rotation_correction=270)
    # An image has no text layer: a page that falls back has no text to offer.
    assert run(render_pool, lambda pool: pool.page_text(str(path), 0)) == ""


def test_exif_orientation_is_applied_before_the_model_sees_the_page(render_pool: RenderPool, tmp_path: Path) -> None:
    data = imagegen.exif_rotated_jpeg(10)
    with Image.open(io.BytesIO(data)) as stored:
        assert stored.size == (1100, 850)  # stored sideways...
        assert read_marker(stored.convert("RGB")) == Marker(10, 1, rotation_correction=270)
    image = render(render_pool, write(tmp_path, "phone.jpg", data))
    assert image.size == (995, 1288) and read_marker(image) == upright(10)  # ...shown upright


def test_sixteen_bit_grayscale_is_scaled_not_clipped(render_pool: RenderPool, tmp_path: Path) -> None:
    image = render(render_pool, write(tmp_path, "deep.png", imagegen.gray16_png(level=40000, dark=2000)))
    assert image.mode == "RGB" and max(image.size) == TARGET
    # 40000 / 65535 of white is grey 156, 2000 is near black; a clipping conversion makes both 255.
    assert image.getpixel((image.width - 10, image.height - 10)) == (156, 156, 156)
    assert image.getpixel((10, 10)) == (7, 7, 7)


def test_a_300_page_tiff_is_one_document_of_300_pages_in_order(render_pool: RenderPool, tmp_path: Path) -> None:
    data = imagegen.multipage_tiff(41, 300)
    assert len(data) < 1_000_000  # small pages, compressed: the test stays light
    path = write(tmp_path, "archive.TIFF", data)
    assert run(render_pool, lambda pool: pool.inspect(str(path))).page_count == 300

    async def markers(pool: RenderPool) -> list[Marker | None]:
        pages = [0, 1, 149, 298, 299, 5, 0]  # out of order and repeated, as concurrent pages and retries ask
        rendered = await asyncio.gather(*(pool.render_page(str(path), index, TARGET) for index in pages))
        return [read_marker(Image.open(io.BytesIO(base64.b64decode(png)))) for png in rendered]

    assert run(render_pool, markers) == [upright(41, n) for n in (1, 2, 150, 299, 300, 6, 1)]


def test_typed_failures_leave_the_workers_serving(render_pool: RenderPool, tmp_path: Path) -> None:
    good = write(tmp_path, "good.png", imagegen.encode(imagegen.page_image(12), "PNG"))
    bomb = write(tmp_path, "bomb.png", imagegen.decompression_bomb_png())
    assert bomb.stat().st_size < 20_000  # a few KB that declare 10 gigapixels
    truncated = write(tmp_path, "cut.png", imagegen.truncated(good.read_bytes()))
    animated = write(tmp_path, "anim.webp", imagegen.animated_webp(13))

    with pytest.raises(TooLargeError, match="over the limit of 178,956,970 pixels") as caught:
        run(render_pool, lambda pool: pool.inspect(str(bomb)))
    assert caught.value.error_class == "too_large"
    # A truncated file opens (its header is whole) and fails when its pixels are decoded.
    with pytest.raises(CorruptPdfError, match="PNG page 1 cannot be decoded: image file is truncated") as cut:
        render(render_pool, truncated)
    assert cut.value.error_class == "corrupt"
    with pytest.raises(UnsupportedFormatError, match=r"animated WEBP \(3 frames\)"):
        run(render_pool, lambda pool: pool.inspect(str(animated)))
    # Nothing else is affected: the same workers render the next documents, PDF and image alike.
    assert read_marker(render(render_pool, good)) == upright(12)
    pdf = pdfgen.write_pdf(tmp_path / "doc.pdf", pdfgen.text_pdf(1, 14))
    assert read_marker(render(render_pool, pdf)) == upright(14)


def test_the_image_pixel_and_page_limits_are_the_documents_limits(tmp_path: Path) -> None:
    # Our own pixel limit (not Pillow's, which is twice as far): one pixel over fails before decoding.
    big = write(tmp_path, "big.png", imagegen.encode(Image.new("L", (1001, 1000), 255), "PNG"))
    fits = write(tmp_path, "fits.png", imagegen.encode(imagegen.page_image(15, size=(1000, 1000)), "PNG"))
    pages = write(tmp_path, "pages.tif", imagegen.multipage_tiff(16, 6))
    pool = RenderPool(workers=1, limits=DocumentLimits(max_image_pixels=1_000_000, max_pages=5))
    pool.start()
    try:
        with pytest.raises(TooLargeError, match="1001 x 1000 = 1,001,000 pixels, the limit is 1,000,000"):
            run(pool, lambda p: p.inspect(str(big)))
        assert read_marker(render(pool, fits)) == upright(15)
        with pytest.raises(TooManyPagesError, match="more than 5 pages") as caught:
            run(pool, lambda p: p.inspect(str(pages)))
        assert caught.value.error_class == "too_many_pages"
    finally:
        pool.close_sync()
