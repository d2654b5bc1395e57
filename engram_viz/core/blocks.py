"""The blocks of DeepSeek-V4.1-Flash before its last Engram layer: the streams every Engram layer reads.

The reference ``Transformer.forward`` (a prefill from position 0)::

    h       = embed(input_ids), pictures merged -> repeat into hc streams     bf16 [B, T, hc, dim]
    pre_mix = one-hot on stream 0                                             [B, T, hc]
    for n in 0 .. max(engram_layer_ids) - 1:
        if n is an Engram layer: h = engram_n(h)          (the streams entering it are what we want)
        # Block.forward
        a_pre, a_post, a_comb = hc_mixes(h, hc_attn_*)
        x = expand(attn_n(RMSNorm(collapse(h, pre_mix))), h, a_post, a_comb)
        f_pre, f_post, f_comb = hc_mixes(x, hc_ffn_*)
        h = expand(moe_n(RMSNorm(collapse(x, a_pre)), image), x, f_post, f_comb)
        pre_mix = f_pre                                   (each sub-block's mix feeds the next one)

``attn_n`` is the window attention (``compress_ratios[n] == 0``) or the compressed one
(``core.compressed_attention``), whose compressed KV and chosen positions pass from source layers to
later ones in one ``SharedKV``. The last Engram layer's streams are ``h`` after block
``max(engram_layer_ids) - 1``. Pictures: given ``images`` and a vision tower, their features are merged into
the embeddings before the hc repeat (:func:`embedded_streams`, block 0's path too), where the reference
merges them; spans without a picture keep the image token's embedding.

``src`` is a :class:`BlocksSource`: ``layer(n)`` gives block n's tensors (``tensor``, ``linear``,
``expert`` as ``core.block0.Block0Source``, names relative to ``layers.{n}.``); a checkpoint reader
reads them when asked and the pass drops them after the block (``weights.blocks_reader``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from engram_viz.core.blocks_config import BlocksConfig
from engram_viz.core.compressed_attention import SharedKV, compressed_attention
from engram_viz.core.hyper import collapse, expand, hc_mixes, rms_norm, stream0
from engram_viz.core.image_merge import ImageInput, merge_images
from engram_viz.core.moe import Linear, moe
from engram_viz.core.vit import VisionSource
from engram_viz.core.window_attention import window_attention
from engram_viz.errors import InputError

EngramFn = Callable[[int, torch.Tensor], torch.Tensor]  # (layer, streams entering it) -> its output streams
BlockHook = Callable[[int], None]  # called with n after block n ran


class LayerSource(Protocol):
    def tensor(self, name: str) -> torch.Tensor: ...  # e.g. "hc_attn_fn", "attn.compressor.wkv.weight"

    def linear(self, name: str) -> Linear: ...  # fp8 GEMM of e.g. "attn.wq_a", "attn.indexer.wq_b"

    def expert(self, e: int) -> tuple[Linear, Linear, Linear]: ...  # routed expert e: (w1, w2, w3)

    def has(self, name: str) -> bool: ...  # whether block n holds the tensor ``name``


class BlocksSource(Protocol):
    config: BlocksConfig
    label: str

    def layer(self, n: int) -> LayerSource: ...

    def embed(self, raw_ids: torch.Tensor) -> torch.Tensor: ...  # [B, T] -> bf16 [B, T, dim]


def _mixes(x: torch.Tensor, src: LayerSource, cfg, sub: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    fn, scale, base = (src.tensor(f"hc_{sub}_{k}") for k in ("fn", "scale", "base"))
    return hc_mixes(x, fn, scale, base, norm_eps=cfg.norm_eps, iters=cfg.hc_sinkhorn_iters, eps=cfg.hc_eps)


_ATTN_TENSORS = ("attn_sink", "q_norm.weight", "kv_norm.weight", "wo_a.weight")
_EXTRA_TENSORS = (
    "compressor.wkv.weight",
    "compressor.wgate.weight",
    "compressor.norm.weight",
    "indexer.weights_proj.weight",
    "indexer.wk.weight",
    "indexer.k_norm.weight",
)


def attention(x: torch.Tensor, src: LayerSource, cfg, layer: int, shared: SharedKV) -> torch.Tensor:
    """Block ``layer``'s attention on the normed collapsed streams ``x [B, T, dim]`` -> bf16 ``[B, T, dim]``."""
    names = _ATTN_TENSORS + (_EXTRA_TENSORS if getattr(cfg, "compress_ratios", (0,))[layer] else ())
    w = {k.removesuffix(".weight"): src.tensor(f"attn.{k}") for k in names if src.has(f"attn.{k}")}
    lin = {k: src.linear(f"attn.{k}") for k in ("wq_a", "wq_b", "wkv", "wo_b")}
    if not getattr(cfg, "compress_ratios", (0,))[layer]:
        return window_attention(x, w, lin, cfg)
    if src.has("attn.indexer.wq_b.weight"):
        lin["indexer.wq_b"] = src.linear("attn.indexer.wq_b")
    return compressed_attention(x, w, lin, cfg, layer, shared)


def block(
    h: torch.Tensor,
    pre_mix: torch.Tensor,
    src: LayerSource,
    cfg,
    layer: int,
    shared: SharedKV,
    image: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block ``layer`` on the streams ``h [B, T, hc, dim]`` bf16 -> (streams after it, its FFN's pre mix
    ``[B, T, hc]`` float32, which collapses the next block's attention input)."""
    a_pre, a_post, a_comb = _mixes(h, src, cfg, "attn")
    y = attention(rms_norm(collapse(h, pre_mix), src.tensor("attn_norm.weight"), cfg.norm_eps), src, cfg, layer, shared)
    x = expand(y, h, a_post, a_comb)
    f_pre, f_post, f_comb = _mixes(x, src, cfg, "ffn")
    gate = {"gate": src.tensor("ffn.gate.weight"), "bias": src.tensor("ffn.gate.bias")}
    if src.has("ffn.gate.bias_vl"):
        gate["bias_vl"] = src.tensor("ffn.gate.bias_vl")
    w1, w2, w3 = (src.linear(f"ffn.shared_experts.{k}") for k in ("w1", "w2", "w3"))
    f_in = rms_norm(collapse(x, a_pre), src.tensor("ffn_norm.weight"), cfg.norm_eps)
    return expand(moe(f_in, gate, (w1, w2, w3), src.expert, cfg, image), x, f_post, f_comb), f_pre


def embedded_streams(
    embed: Callable[[torch.Tensor], torch.Tensor],
    raw_ids: torch.Tensor,
    hc_mult: int,
    images: Sequence[Sequence[ImageInput]] = (),
    vision: VisionSource | None = None,
) -> torch.Tensor:
    """The input of block 0, bf16 ``[B, T, hc, dim]``: ``embed(raw_ids)`` with each row's pictures merged by
    ``vision`` (``core.image_merge``), where the reference merges them, then repeated into hc streams."""
    h = embed(raw_ids).to(torch.bfloat16)
    if any(images):
        if vision is None:
            raise InputError("pictures were given without a vision tower (vision=None) to encode them")
        merge_images(h, images, vision)
    return h.unsqueeze(2).repeat(1, 1, hc_mult, 1)


class BlockPass:
    """One prefill through the blocks, advanced layer by layer: :meth:`streams_entering` runs the blocks
    before an Engram layer, :meth:`engram_output` hands back that layer's output to continue from.
    ``images`` / ``vision``: each row's pictures and the tower that encodes them (:func:`embedded_streams`)."""

    def __init__(
        self,
        src: BlocksSource,
        raw_ids: torch.Tensor,
        image: torch.Tensor | None = None,
        on_block: BlockHook | None = None,
        images: Sequence[Sequence[ImageInput]] = (),
        vision: VisionSource | None = None,
    ):
        self.src, self.on_block = src, on_block
        self.h = embedded_streams(src.embed, raw_ids, src.config.hc_mult, images, vision)  # on the blocks' device
        self.image = None if image is None else image.to(self.h.device)
        self.pre_mix = stream0(self.h)
        self.shared = SharedKV()
        self.next = 0  # the next block to run
        self.waiting: int | None = None  # an Engram layer whose output is awaited
        self.applied: set[int] = set()  # Engram layers whose output the pass continued from

    def streams_entering(self, layer: int) -> torch.Tensor:
        """Run blocks up to ``layer - 1`` and return the streams entering Engram layer ``layer`` bf16 ``[B, T, hc, dim]``."""
        cfg = self.src.config
        if layer not in cfg.engram_layer_ids or layer < self.next or layer in self.applied:
            raise InputError(
                f"layer {layer}: expected an Engram layer of {list(cfg.engram_layer_ids)} not yet passed "
                f"(the pass is at block {self.next})"
            )
        with torch.no_grad():
            while self.next < layer:
                if self.next in cfg.engram_layer_ids and self.next not in self.applied:
                    raise InputError(f"Engram layer {self.next}'s output is needed first (engram_output)")
                lw = self.src.layer(self.next)
                self.h, self.pre_mix = block(self.h, self.pre_mix, lw, cfg, self.next, self.shared, self.image)
                del lw  # a streamed layer's tensors go now
                if self.on_block is not None:
                    self.on_block(self.next)
                self.next += 1
        self.waiting = layer
        return self.h

    def engram_output(self, h: torch.Tensor) -> None:
        """The output of the Engram layer whose streams were last returned; the pass continues from it."""
        if self.waiting is None:
            raise InputError("engram_output() needs streams_entering(layer) first")
        self.h = h.to(torch.bfloat16)
        self.applied.add(self.waiting)
        self.waiting = None


def model_streams(
    src: BlocksSource,
    raw_ids: torch.Tensor,
    engram: EngramFn,
    image: torch.Tensor | None = None,
    on_block: BlockHook | None = None,
) -> dict[int, torch.Tensor]:
    """Raw ids ``[B, T]`` -> ``{layer: streams entering it}`` for every Engram layer, ``engram(n, h)``
    applying Engram layer n between the blocks as the reference does."""
    run = BlockPass(src, raw_ids, image, on_block)
    out = {}
    for n in sorted(src.config.engram_layer_ids):
        out[n] = run.streams_entering(n)
        if n != max(src.config.engram_layer_ids):
            run.engram_output(engram(n, out[n]))
    return out
