"""Image features into the token embeddings: the reference's ``merge_image_embeddings``.

Where the reference merges (``Transformer.forward``, given ``images``): after ``h = embed(input_ids)``
and before ``h`` is repeated into the hc streams, so block 0 (and every block after) reads them.
Inside each picture's span (``token_types``: START / IMAGE / NEWLINE / END = 0 / 1 / 2 / 3)::

    h[START]   = image_start          learned, bf16 [dim]
    h[END]     = image_end
    h[NEWLINE] = image_newline
    h[IMAGE]   = aligner(vit(patches))   the L image tokens in reading order, bf16 [L, dim]

Spans without a picture (``<image:WxH>`` placeholders) keep the image token's embedding: no image
features.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engram_viz.config import IMAGE, IMAGE_END, IMAGE_NEWLINE, IMAGE_START
from engram_viz.core.aligner import aligner
from engram_viz.core.vit import VisionSource, vit
from engram_viz.errors import InputError

DELIMITERS = {IMAGE_START: "image_start", IMAGE_END: "image_end", IMAGE_NEWLINE: "image_newline"}


@dataclass(frozen=True, eq=False)
class ImageInput:
    """One picture of one prompt, as the reference's ``ImageInput``: where its span starts, the span's
    token types ``[span]``, the ViT patches ``[n_h * n_w, 3, p, p]`` and the patch grid."""

    start: int
    types: torch.Tensor
    patches: torch.Tensor
    n_h: int
    n_w: int


def encode_image(src: VisionSource, patches: torch.Tensor, n_h: int, n_w: int) -> torch.Tensor:
    """The reference's ``encode_image``: ViT then aligner, bf16 ``[L, dim]``."""
    return aligner(vit(patches, n_h, n_w, src), n_h, n_w, src)


def merge_images(h: torch.Tensor, images: Sequence[Sequence[ImageInput]], src: VisionSource) -> torch.Tensor:
    """Write each picture's span into the embeddings ``h [B, T, dim]`` (in place; returned)."""
    for b, row in enumerate(images):
        for img in row:
            types = img.types.to(h.device)
            stop = img.start + types.numel()
            if stop > h.shape[1]:
                raise InputError(f"an image span at {img.start}..{stop} runs past the prompt's {h.shape[1]} positions")
            span = h[b, img.start : stop]
            for kind, name in DELIMITERS.items():
                span[types == kind] = src.tensor(name).to(h.dtype)
            features = encode_image(src, img.patches.to(h.device), img.n_h, img.n_w)
            slots = int((types == IMAGE).sum())
            if features.shape[0] != slots:
                raise InputError(
                    f"the picture at {img.start} gives {features.shape[0]} image tokens for a span of {slots} IMAGE slots"
                )
            span[types == IMAGE] = features.to(h.dtype)
    return h
