"""Page image geometry shared by every renderer (PDFium's pages and image documents' frames)."""

from __future__ import annotations

import math

__all__ = ["ROTATIONS", "target_size"]

# The turns the retry ladder may ask for (olmOCR's rotation_correction: PIL's counter-clockwise ROTATE_R).
ROTATIONS = (0, 90, 180, 270)


def target_size(width: float, height: float, target_longest: int, max_pixels: int) -> tuple[int, int]:
    """Pixel size of a render whose longest side is ``target_longest``, capped at ``max_pixels``.

    ``width`` and ``height`` are the page's in any unit (PDF points, an image's own pixels).

    Sides are rounded to the nearest pixel (never below 1) so the longest side is exactly the target;
    only a render that would exceed ``max_pixels`` is scaled down as a whole.
    """
    if not (width > 0 and height > 0 and math.isfinite(width) and math.isfinite(height)):
        raise ValueError(f"page has no usable size ({width} x {height})")
    if target_longest < 1:
        raise ValueError("target_longest_image_dim must be positive")
    scale = target_longest / max(width, height)
    width, height = max(1, round(width * scale)), max(1, round(height * scale))
    if width * height > max_pixels:
        shrink = math.sqrt(max_pixels / (width * height))
        width, height = max(1, math.floor(width * shrink)), max(1, math.floor(height * shrink))
    return width, height
