"""Image documents (PNG, JPEG, TIFF, WebP) as pages: what a render worker does instead of PDFium.

An image document has one page per frame for TIFF (a multi-page scan is one document of N pages) and
one page otherwise. Each page leaves here exactly as a rendered PDF page does (``render_worker``): an
RGB PNG whose longest side is ``target_longest_image_dim``, within ``max_render_pixels``, turned by
the ladder's ``rotation`` (PIL's counter-clockwise ``ROTATE_R``). That matches olmOCR 0.4.27, which
wraps a PNG or JPEG in a one-page PDF (img2pdf) and renders that at the same target size.

On the way the page is made what a reader sees:

* its EXIF orientation is applied (the table of ``ImageOps.exif_transpose``), after scaling, since
  those turns and flips are exact and cost less on the small image;
* its mode becomes RGB: 16-bit and 32-bit grayscale are scaled to 8 bits (Pillow's own conversion
  clips them to white), CMYK, palette and bilevel images are converted, and transparency is laid on
  white, as a PDF page's background is;
* a frame over ``DocumentLimits.max_image_pixels`` fails the document as ``too_large`` before it is
  decoded (a decompression bomb declares its size in a few bytes), and a frame that cannot be decoded
  (a truncated file) as ``corrupt``.

Animated images (an animated WebP or PNG) are refused as ``unsupported_format``: their frames are not
pages, and converting only the first would drop the rest without a word. A JPEG's extra MPO frames
(camera previews) are ignored: it is one page.

An image has no text layer: ``page_text`` is empty, so a page whose model answers never validate is a
fallback page with no text, and the document follows the error-rate rules like a PDF's.

Like the PDFium helpers, this runs only inside a render worker, under its memory and CPU limits.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from olmocr_tasks.core.config import DocumentLimits
from olmocr_tasks.core.errors import (
    CorruptPdfError,
    TooLargeError,
    TooManyPagesError,
    UnsupportedFormatError,
)
from olmocr_tasks.page.geometry import ROTATIONS, target_size

__all__ = ["ImageDocument", "open_image_document"]

# Our format names (core.formats) -> the only Pillow plugin allowed to read each: the content was
# identified before, and Pillow must not fall back to guessing among its other readers.
_PILLOW_FORMATS = {"png": "PNG", "jpeg": "JPEG", "tiff": "TIFF", "webp": "WEBP"}

# EXIF orientation -> the transpose that makes the image upright, as in ``ImageOps.exif_transpose``.
_ORIENTATIONS = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_EXIF_ORIENTATION = 0x0112
_QUARTER_TURNS = {5, 6, 7, 8}
_ROTATIONS = {90: Image.Transpose.ROTATE_90, 180: Image.Transpose.ROTATE_180, 270: Image.Transpose.ROTATE_270}


@dataclass
class ImageDocument:
    """An image file and its pages (frames). Close it to release the file.

    A TIFF stays open between pages, so that its page chain is walked once and a page's pixels are
    decoded into the buffer of the page before; a single-page image is opened again for each render,
    so that no decoded pixels stay behind in the worker's document cache.
    """

    path: str
    format: str
    page_count: int
    limits: DocumentLimits
    image: Any = None  # the open TIFF (PIL.Image.Image), None for other formats
    _closed: bool = field(default=False, repr=False)

    def __len__(self) -> int:
        return self.page_count

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self.image is not None:
                self.image.close()

    def render_png(
        self,
        page_index: int,
        target_longest_image_dim: int,
        png_compress_level: int = 1,
        rotation: int = 0,
        max_render_pixels: int = DocumentLimits.max_render_pixels,
    ) -> bytes:
        """PNG bytes (RGB) of one page, as ``render_worker.render_page_png_sync`` makes them of a PDF page."""
        if rotation not in ROTATIONS:
            raise ValueError(f"rotation must be one of {ROTATIONS}, got {rotation}")
        if not 0 <= page_index < self.page_count:
            raise IndexError(f"page index {page_index} is out of range (document has {self.page_count} pages)")
        if self.image is not None:
            return self._render(self._frame(page_index), page_index, target_longest_image_dim, png_compress_level,
                                rotation, max_render_pixels)  # fmt: skip
        with _open(self.path, self.format, self.limits) as image:
            return self._render(image, 0, target_longest_image_dim, png_compress_level, rotation, max_render_pixels)

    def _render(
        self, frame: Any, page_index: int, target_longest_image_dim: int, png_compress_level: int, rotation: int,
        max_render_pixels: int,
    ) -> bytes:  # fmt: skip
        orientation = _orientation(frame)
        # Sides as stored; a quarter turn swaps them, and target_size gives the swapped answer for
        # swapped sides, so scaling before the turn lands on the same size as scaling after it.
        size = target_size(frame.width, frame.height, target_longest_image_dim, max_render_pixels)
        if self.format == "jpeg":
            # libjpeg decodes at 1/2, 1/4 or 1/8 scale directly, never below the size asked for: a
            # 600 dpi scan costs a fraction of its full decode.
            frame.draft(frame.mode if frame.mode in ("L", "CMYK") else "RGB", size)
        try:
            frame.load()
        except (OSError, SyntaxError, ValueError, EOFError) as exc:
            raise CorruptPdfError(f"{self.format.upper()} page {page_index + 1} cannot be decoded: {exc}") from None
        picture = _flatten(frame)
        if picture.size != size:
            picture = picture.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
        if orientation in _ORIENTATIONS:
            picture = picture.transpose(_ORIENTATIONS[orientation])
        if picture.mode != "RGB":
            picture = picture.convert("RGB")
        if rotation:
            picture = picture.transpose(_ROTATIONS[rotation])
        out = io.BytesIO()
        picture.save(out, format="PNG", compress_level=png_compress_level)
        return out.getvalue()

    def _frame(self, page_index: int) -> Any:
        try:
            self.image.seek(page_index)
        except (OSError, EOFError, ValueError, SyntaxError) as exc:
            raise CorruptPdfError(f"{self.format.upper()} page {page_index + 1} cannot be read: {exc}") from None
        _check_pixels(self.image, self.limits, page_index)
        return self.image


def open_image_document(path: str, image_format: str, limits: DocumentLimits) -> ImageDocument:
    """Open an image file whose content was identified as ``image_format`` (a ``core.formats`` name).

    Reads headers only (for a TIFF, every page's); pixels are decoded when a page is rendered.
    """
    image = _open(path, image_format, limits)
    try:
        pages = _page_count(image, image_format, limits)
    except BaseException:
        image.close()
        raise
    if image_format == "tiff":
        return ImageDocument(path, image_format, pages, limits, image=image)
    image.close()
    return ImageDocument(path, image_format, pages, limits)


def _open(path: str, image_format: str, limits: DocumentLimits) -> Any:
    """The image with its first frame's size checked; no pixels decoded yet."""
    # Our own limit decides (_check_pixels, per frame); Pillow's check stays as the backstop for what
    # we do not look at, at the same level.
    Image.MAX_IMAGE_PIXELS = limits.max_image_pixels
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(path, formats=[_PILLOW_FORMATS[image_format]])
    except Image.DecompressionBombError as exc:
        # Pillow's own check, at twice our limit: the size it read is in its message.
        raise TooLargeError(
            f"{image_format.upper()} is over the limit of {limits.max_image_pixels:,} pixels: {exc}"
        ) from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:  # UnidentifiedImageError is an OSError
        raise CorruptPdfError(f"{image_format.upper()} is damaged and cannot be read: {exc}") from None
    try:
        _check_pixels(image, limits, 0)
    except BaseException:
        image.close()
        raise
    return image


def _page_count(image: Any, image_format: str, limits: DocumentLimits) -> int:
    if image_format == "jpeg":
        return 1
    frames = _count_frames(image, limits.max_pages + 1)
    if image_format != "tiff" and frames > 1:
        raise UnsupportedFormatError(
            f"animated {image_format.upper()} ({frames} frames): its frames are not pages; "
            "save the page as a still image or a multi-page TIFF",
            detected=f"animated {image_format}",
        )
    if frames > limits.max_pages:
        raise TooManyPagesError(f"TIFF has more than {limits.max_pages} pages, the limit")
    return frames


def _count_frames(image: Any, cap: int) -> int:
    """Frames in the file, counting no further than ``cap`` (a TIFF's page chain is walked)."""
    if not getattr(image, "is_animated", False):
        return 1
    if image.format != "TIFF":
        return int(image.n_frames)
    count = 1
    try:
        while count < cap:
            image.seek(count)
            count += 1
    except EOFError:
        pass
    except (OSError, ValueError, SyntaxError) as exc:
        raise CorruptPdfError(f"TIFF page {count + 1} cannot be read: {exc}") from None
    image.seek(0)
    return count


def _check_pixels(image: Any, limits: DocumentLimits, page_index: int) -> None:
    width, height = image.size
    if width < 1 or height < 1:
        raise CorruptPdfError(f"page {page_index + 1} has no pixels ({width} x {height})")
    if width * height > limits.max_image_pixels:
        raise TooLargeError(
            f"page {page_index + 1} is {width} x {height} = {width * height:,} pixels, "
            f"the limit is {limits.max_image_pixels:,}"
        )


def _orientation(frame: Any) -> int:
    try:
        value = frame.getexif().get(_EXIF_ORIENTATION, 1)
    except Exception:  # broken EXIF is not worth a page: upright as stored, like most viewers
        return 1
    return value if isinstance(value, int) else 1


def _flatten(frame: Any) -> Any:
    """The frame as "L" or "RGB", ready to scale: deep grayscale scaled down, transparency on white."""
    mode = frame.mode
    if mode in ("L", "RGB"):
        return frame
    if mode.startswith("I;16") or mode == "I":
        wide = frame.convert("I") if mode != "I" else frame
        _, highest = wide.getextrema()
        # 16-bit samples; a 32-bit image whose values stay within 16 bits reads the same way.
        divisor = 256 if highest > 255 and highest <= 65535 else max(1, (highest + 255) // 256)
        return wide.point(lambda value: value * (1 / divisor)).convert("L")
    if mode == "F":
        lowest, highest = frame.getextrema()
        span = (highest - lowest) or 1.0
        return frame.point(lambda value: (value - lowest) * (255.0 / span)).convert("L")
    if mode == "1":
        return frame.convert("L")
    if mode in ("LA", "La", "RGBA", "RGBa", "PA") or (mode == "P" and "transparency" in frame.info):
        rgba = frame.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return frame.convert("RGB")  # CMYK, P, YCbCr, LAB, HSV, RGBX...
