"""The reference's grid planning: an image size -> the pixel size the ViT sees and the token grid.

``plan_image(width, height, ...)`` is ``plan_image_grid`` of the reference ``image_processor.py``
(ENGRAM_REFERENCE.md section 6), with patch p, downsample d, span cap N (``vision_max_n_token``,
a cap on the whole span ``h * (w + 1) + 2``) and a minimum area:

1. if a max width / height ratio is set and width > height * ratio, width = height * ratio;
2. if 0 < width * height < min_pixels, scale both sides by sqrt(min_pixels / (width * height)) and
   truncate each to an integer;
3. round each side UP to a multiple of p (the ViT's pixel size W' x H');
4. the token grid is h = ceil((H' // p) / d), w = ceil((W' // p) / d) (partial cells count);
5. if the span exceeds N, shrink to the largest aspect-preserving size whose span fits (a single
   column or a single row for extreme aspect ratios) and take the grid of step 4 from it.

The arithmetic is the reference's, in float64 where it uses floats: 640x480 -> 16x12 tokens on a
672x504 ViT canvas, 1920x1080 -> 41x23, 100x100 -> 13x13 (raised to the minimum area).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ImagePlan:
    """Where an image of some size goes: the token grid and the ViT's canvas."""

    w: int  # image tokens per row (after the d x d downsample)
    h: int  # rows of image tokens
    canvas_w: int  # pixels, a multiple of the patch: the width the picture is fitted into
    canvas_h: int
    patch: int

    @property
    def vit_w(self) -> int:
        """Patches per row of the ViT grid."""
        return self.canvas_w // self.patch

    @property
    def vit_h(self) -> int:
        return self.canvas_h // self.patch

    @property
    def span_length(self) -> int:
        """Positions of the span: START, h rows of w IMAGE + NEWLINE, END."""
        return self.h * (self.w + 1) + 2


def token_grid(canvas_w: float, canvas_h: float, patch: int, down: int) -> tuple[int, int]:
    """``(w, h)``: the ViT patch grid of a pixel size, downsampled d x d (partial cells count)."""
    return math.ceil((canvas_w // patch) / down), math.ceil((canvas_h // patch) / down)


def largest_fitting_canvas(width: float, height: float, patch: int, down: int, max_span: int) -> tuple[int, int]:
    """Pixel size ``(W', H')``, multiples of the patch, of the largest aspect-preserving resize whose
    span fits ``max_span``. Solving ``h (w + 1) + 2 = N`` with ``h = w r`` for w gives
    ``w = sqrt((N - 2) / r + 1/4) - 1/2``; a whole number of cells per side is then kept."""
    ratio = height / width
    w_cells = math.sqrt((max_span - 2) / ratio + 0.25) - 0.5
    h_cells = w_cells * ratio
    cell = patch * down
    if w_cells < 1.0:  # taller than even one column allows: one column of (N - 2) // 2 rows
        return cell, (max_span - 2) // 2 * cell
    if h_cells < 1.0:  # wider than one row allows: one row of N - 3 tokens
        return (max_span - 3) * cell, cell
    beta = min(math.floor(w_cells) * cell / width, math.floor(h_cells) * cell / height)
    return math.floor(width * beta / patch) * patch, math.floor(height * beta / patch) * patch


def plan_image(
    width: int,
    height: int,
    *,
    patch: int = 14,
    down: int = 3,
    max_span: int = 1024,
    min_pixels: int = 295936,
    max_wh_ratio: float | None = None,
) -> ImagePlan:
    """The plan for an image of ``width x height`` pixels (rule in the module docstring; defaults:
    V4.1-Flash). The caller checks that the grid is usable (the reference asserts it)."""
    w_px: float = width
    h_px: float = height
    if max_wh_ratio is not None and w_px > h_px * max_wh_ratio:
        w_px = h_px * max_wh_ratio
    if 0 < w_px * h_px < min_pixels:  # raise small images to the minimum area
        scale = (min_pixels / (w_px * h_px)) ** 0.5
        w_px, h_px = int(w_px * scale), int(h_px * scale)
    canvas_w, canvas_h = math.ceil(w_px / patch) * patch, math.ceil(h_px / patch) * patch
    w, h = token_grid(canvas_w, canvas_h, patch, down)
    if h * (w + 1) + 2 > max_span:
        canvas_w, canvas_h = largest_fitting_canvas(w_px, h_px, patch, down, max_span)
        w, h = token_grid(canvas_w, canvas_h, patch, down)
    return ImagePlan(w, h, int(canvas_w), int(canvas_h), patch)
