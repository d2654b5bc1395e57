"""Embed + block 0 of DeepSeek-V4.1-Flash: the residual streams entering Engram layer 1.

The reference ``Transformer.forward`` up to layer 1 (a prefill from position 0)::

    h      = embed(input_ids) -> repeat into hc streams                bf16 [B, T, hc, dim]
    # block 0 (reference Block.forward, pre_mix = one-hot on stream 0)
    a_pre, a_post, a_comb = hc_mixes(h, hc_attn_*)
    x      = expand(attn(RMSNorm(collapse(h, stream0))), h, a_post, a_comb)          [B, T, hc, dim]
    f_pre, f_post, f_comb = hc_mixes(x, hc_ffn_*)                      (f_pre feeds block 1, unused here)
    out    = expand(moe(RMSNorm(collapse(x, a_pre)), image), x, f_post, f_comb)     bf16 [B, T, hc, dim]

``out`` is the ``h`` the reference passes to ``layers[1].engram``. Image spans: given ``images`` and a
vision tower, the pictures' features are merged into ``h`` before the hc repeat, where the reference
merges them (``core.image_merge``); spans without a picture keep the image token's embedding (the
caller's label says "no image features"). ``image`` ``[B, T]`` selects the MoE's ``bias_vl`` on every
image position, as the reference's ``image_mask``.

``weights`` is any :class:`Block0Source`: tensors by name relative to ``layers.0.``, the fp8 GEMMs
by module name, the routed experts on demand and the token embedding
(``engram_viz.weights.block0_reader.Block0Weights`` reads them from a checkpoint, lazily).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from engram_viz.core.block0_config import Block0Config
from engram_viz.core.blocks import block, embedded_streams
from engram_viz.core.compressed_attention import SharedKV
from engram_viz.core.hyper import stream0
from engram_viz.core.image_merge import ImageInput
from engram_viz.core.moe import Linear
from engram_viz.core.vit import VisionSource


class Block0Source(Protocol):
    config: Block0Config
    label: str  # names the weights in messages and stream labels

    def tensor(self, name: str) -> torch.Tensor: ...  # e.g. "hc_attn_fn", "attn.attn_sink"

    def linear(self, name: str) -> Linear: ...  # fp8 GEMM of e.g. "attn.wq_a"

    def expert(self, e: int) -> tuple[Linear, Linear, Linear]: ...  # routed expert e: (w1, w2, w3)

    def embed(self, raw_ids: torch.Tensor) -> torch.Tensor: ...  # [B, T] -> bf16 [B, T, dim]


def block0(h: torch.Tensor, src: Block0Source, image: torch.Tensor | None = None) -> torch.Tensor:
    """Block 0 on the streams ``h [B, T, hc, dim]`` bf16 -> bf16 ``[B, T, hc, dim]`` (the input of layer 1):
    ``core.blocks.block`` with the one-hot pre mix on stream 0."""
    return block(h, stream0(h), _Layer0(src), src.config, 0, SharedKV(), image)[0]


class _Layer0:
    """A Block0Source seen as block 0's ``core.blocks.LayerSource``."""

    def __init__(self, src: Block0Source):
        self.tensor, self.linear, self.expert = src.tensor, src.linear, src.expert

    def has(self, name: str) -> bool:
        return True  # a Block0Source holds every block-0 tensor (checked when opened)


def block0_streams(
    src: Block0Source,
    raw_ids: torch.Tensor,
    image: torch.Tensor | None = None,
    images: Sequence[Sequence[ImageInput]] = (),
    vision: VisionSource | None = None,
) -> torch.Tensor:
    """Raw ids ``[B, T]`` (a prefill from position 0) -> the streams entering Engram layer 1, bf16 ``[B, T, hc, dim]``.
    ``images``: each row's real pictures, merged into the embeddings by ``vision`` (``core.image_merge``)."""
    h = embedded_streams(src.embed, raw_ids, src.config.hc_mult, images, vision)
    with torch.no_grad():
        return block0(h, src, image)
