"""A fitted picture -> the ViT's input: normalised, cut into patches (the end of the reference's ``load_image``).

The picture arrives already fitted to its canvas (``core.image_plan``; ``run.pictures`` does the
Pillow part) as RGB bytes ``uint8 [H', W', 3]`` with H', W' multiples of the patch p::

    x       = rgb / 255                       float32 [3, H', W']   (channels first)
    x       = ((x - 0.5) / 0.5) -> bf16       bf16    [3, H', W']   values in [-1, 1]
    patches = x cut into p x p squares        bf16    [n_h * n_w, 3, p, p], row-major over the grid

Each float32 step is the reference's own (same operations, same order), so the bf16 values are its
values bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch

from engram_viz.errors import InputError


def normalise(rgb: np.ndarray) -> torch.Tensor:
    """``uint8 [H, W, 3]`` -> bf16 ``[3, H, W]`` in [-1, 1] (mean 0.5, std 0.5 per channel)."""
    if rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise InputError(f"expected RGB bytes uint8 [H, W, 3], got {rgb.dtype} {list(rgb.shape)}")
    x = torch.from_numpy(np.asarray(rgb, dtype=np.float32)).permute(2, 0, 1) / 255
    return ((x - 0.5) / 0.5).to(torch.bfloat16)


def to_patches(x: torch.Tensor, patch: int) -> torch.Tensor:
    """``[3, H, W]`` (H, W multiples of ``patch``) -> ``[H / p * W / p, 3, p, p]``, patches in
    reading order (row of patches by row of patches)."""
    c, height, width = x.shape
    if height % patch or width % patch:
        raise InputError(f"a {width}x{height} canvas does not split into {patch}x{patch} patches")
    n_h, n_w = height // patch, width // patch
    # [c, n_h, p, n_w, p] -> [n_h, n_w, c, p, p]
    return x.reshape(c, n_h, patch, n_w, patch).permute(1, 3, 0, 2, 4).reshape(n_h * n_w, c, patch, patch)


def picture_patches(rgb: np.ndarray, patch: int) -> torch.Tensor:
    """A fitted picture's RGB bytes ``uint8 [H', W', 3]`` -> its ViT patches bf16 ``[n_h * n_w, 3, p, p]``."""
    return to_patches(normalise(rgb), patch)
