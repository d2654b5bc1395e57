"""Real pictures in prompts: a file, bytes or a Pillow image -> the ViT patches the model would see.

``load_picture(source, config, folder=..., confined=...)`` reads a PNG or JPEG (any format Pillow
opens), plans it (``core.image_plan``), fits it to its canvas as the reference's ``load_image`` does,
and cuts it into patches (``core.image_patches``)::

    image   = Image.open(bytes).convert("RGB")                       (no EXIF rotation, as the reference)
    plan    = plan_image(image.width, image.height)                  canvas W' x H', grid w x h
    fitted  = resize(image, (W', H'))      if vision_max_wh_ratio is set and width >= ratio * height
            = ImageOps.pad(image, (W', H'), color=(127, 127, 127))   otherwise (V4.1-Flash: always):
              scaled (bicubic) to fit inside the canvas keeping its aspect ratio, centred on grey
    patches = picture_patches(fitted)                                bf16 [H'/14 * W'/14, 3, 14, 14]

Every bad input is one :class:`PictureError` naming the picture: a missing file, an empty (0-byte)
file, bytes Pillow cannot read or that end early (a truncated PNG or JPEG), and, for a prompt file
(``confined=True``), a path that leads outside the prompt file's folder.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from engram_viz.config import EngramConfig, load_config
from engram_viz.core.image_patches import picture_patches
from engram_viz.core.image_plan import ImagePlan, plan_image
from engram_viz.errors import ImagePromptError, PictureError

PAD_GREY = (127, 127, 127)  # the reference's padding colour
MAX_PICTURE_BYTES = 200 * 2**20  # a prompt's picture file; larger files are refused before reading
MAX_IMAGE_SIDE = 1_000_000  # pixels per side of <image:WxHpx>


@dataclass(frozen=True, eq=False)
class Picture:
    """A picture of a prompt, ready for the vision encoder."""

    source: str  # the path as written, or "<N bytes>" / "<Pillow image>"
    size: tuple[int, int]  # (width, height) of the picture as read, pixels
    plan: ImagePlan  # grid and canvas (core.image_plan)
    patches: torch.Tensor = field(repr=False)  # bf16 [plan.vit_h * plan.vit_w, 3, p, p]

    @property
    def label(self) -> str:
        return f"{self.source} ({self.size[0]}x{self.size[1]}px)"


def plan_for(width_px: int, height_px: int, config: EngramConfig | str = "tiny") -> ImagePlan:
    """The reference's plan (``core.image_plan.plan_image``) for an image of ``width_px x height_px``
    pixels under ``config``'s vision fields, checked: each side 1..1,000,000, a usable grid."""
    cfg = load_config(config)
    for side in (width_px, height_px):
        if not 1 <= side <= MAX_IMAGE_SIDE:
            raise ImagePromptError(
                f"image size {width_px}x{height_px}px: each side must be 1..{MAX_IMAGE_SIDE:,} pixels"
            )
    plan = plan_image(
        int(width_px),
        int(height_px),
        patch=cfg.vision_patch_size,
        down=cfg.vision_downsample_ratio,
        max_span=cfg.vision_max_n_token,
        min_pixels=cfg.vision_min_pixels,
        max_wh_ratio=cfg.vision_max_wh_ratio,
    )
    if plan.w < 1 or plan.h < 1 or plan.span_length > cfg.vision_max_n_token:  # the reference asserts this
        raise ImagePromptError(f"image size {width_px}x{height_px}px gives no usable grid ({plan.w}x{plan.h})")
    return plan


def _read_path(source: str | os.PathLike, folder: Path | None, confined: bool) -> bytes:
    raw = Path(source).expanduser()
    path = raw if raw.is_absolute() or folder is None else folder / raw
    if confined and folder is not None:
        inside, real = os.path.realpath(folder), os.path.realpath(path)
        if os.path.commonpath([inside, real]) != inside:
            raise PictureError(
                f"picture {str(source)!r} leads outside {folder}, the one folder this prompt's pictures are read "
                "from (a prompt file's own folder, the comparison's upload folder); name pictures inside it"
            )
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise PictureError(f"picture {str(source)!r} {what} (looked for {path}); expected a PNG or JPEG file")
    size = path.stat().st_size
    if size == 0:
        raise PictureError(f"picture {str(source)!r} is empty (0 bytes); expected a PNG or JPEG file")
    if size > MAX_PICTURE_BYTES:
        raise PictureError(f"picture {str(source)!r} has {size:,} bytes; at most {MAX_PICTURE_BYTES:,} are read")
    try:
        return path.read_bytes()
    except OSError as err:
        raise PictureError(f"picture {str(source)!r} cannot be read: {err.strerror or err}") from None


def _decode(data: bytes, name: str) -> Image.Image:
    """RGB image of encoded bytes; a truncated or foreign file is a PictureError."""
    if not data:
        raise PictureError(f"picture {name} is empty (0 bytes); expected a PNG or JPEG file")
    try:
        with Image.open(io.BytesIO(data)) as source:
            return source.convert("RGB")  # reads every pixel: a truncated file fails here
    except Image.DecompressionBombError as err:
        raise PictureError(f"picture {name} is too large to decode safely: {err}") from None
    except (OSError, SyntaxError, ValueError) as err:  # UnidentifiedImageError, "image file is truncated", ...
        why = "no image format Pillow reads" if isinstance(err, UnidentifiedImageError) else str(err)
        raise PictureError(f"picture {name} is not a readable image ({why}); expected a complete PNG or JPEG") from None


def fit_to_canvas(image: Image.Image, plan: ImagePlan, max_wh_ratio: float | None = None) -> np.ndarray:
    """The picture fitted to its canvas as the reference does: RGB bytes ``uint8 [H', W', 3]``."""
    size = (plan.canvas_w, plan.canvas_h)
    if max_wh_ratio is not None and image.width >= max_wh_ratio * image.height:
        fitted = image.resize(size)
    else:
        fitted = ImageOps.pad(image, size, color=PAD_GREY)
    return np.asarray(fitted, dtype=np.uint8)


def open_image(source: Any, folder: Path | None = None, confined: bool = False) -> tuple[Image.Image, str]:
    """``(RGB image, name)`` of a path, encoded bytes or a Pillow image."""
    if isinstance(source, Image.Image):
        if source.width < 1 or source.height < 1:
            raise PictureError(f"picture (a Pillow image) is {source.width}x{source.height}; expected at least 1x1")
        return source.convert("RGB"), "<Pillow image>"
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        return _decode(data, f"<{len(data):,} bytes>"), f"<{len(data):,} bytes>"
    if isinstance(source, (str, os.PathLike)):
        return _decode(_read_path(source, folder, confined), repr(str(source))), str(source)
    raise PictureError(
        f"a picture must be a file path, encoded bytes (PNG, JPEG) or a Pillow image, got {type(source).__name__}"
    )


def load_picture(
    source: Any, config: EngramConfig | str = "tiny", *, folder: Path | None = None, confined: bool = False
) -> Picture:
    """A :class:`Picture` of ``source`` (a path, relative to ``folder`` when given; bytes; a Pillow
    image) for ``config``'s vision fields; ``confined``: the path must stay inside ``folder``."""
    cfg = load_config(config)
    image, name = open_image(source, folder, confined)
    plan = plan_for(image.width, image.height, cfg)
    rgb = fit_to_canvas(image, plan, cfg.vision_max_wh_ratio)
    return Picture(name, (image.width, image.height), plan, picture_patches(rgb, plan.patch))
