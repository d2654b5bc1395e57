"""Attention of a compressed-KV block (reference ``Attention`` with ``compress_ratio > 0``, ``Compressor``,
``Indexer``, the ``sparse_attn`` kernel), prefill from position 0.

For ``x [B, T, dim]`` bf16, ratio ``r``, ``Tc = T // r`` compressed positions, RoPE at
``compress_rope_theta`` with YaRN (``rot``), one shared key-value head::

    q, kv     as block 0 (window KV: RMSNorm, RoPE, e4m3 round trip)                 bf16
    latent    = RMSNorm(sum_{i<r} softmax_i(x W_gate) * (x W_kv))  per group of r    [B, Tc, D]  (fp32, then bf16)
              (kv sources only; ratio 1: RMSNorm(x W_kv) in bf16)
    index_k   = fp4_32(RoPE_{j r}(RMSNorm(latent W_k)))                               [B, Tc, ihd]  (kv + index sources)
    q_idx     = fp4_32(RoPE_t(wq_b(qr)))                                              [B, T, nh, ihd]
    score     = sum_h relu(q_idx_h . index_k) * (x W_proj)_h / sqrt(ihd nh)          bf16 [B, T, Tc]
    chosen    = top-min(index_topk, Tc) of score over the positions j < (t + 1) // r  (index sources;
                the layers up to the next index source reuse it)
    ckv       = fp4_16/e4m3(RoPE_{j r}(latent))                                       [B, Tc, D]  (kv sources publish it)
    o         = sink-softmax attention over window keys t-W+1..t and ckv[chosen]     bf16 [B, T, H, D]

The shared tensors (``ckv``, ``index_k``, ``chosen``) pass from source layers to the layers after them
in a :class:`SharedKV`; the attention itself is ``core.sparse_attention.sparse_attend``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engram_viz.core.fp4 import fp4_act_round_trip
from engram_viz.core.hyper import rms_norm
from engram_viz.core.sparse_attention import sparse_attend, window_indices
from engram_viz.core.window_attention import Linear, fp8_round_trip, project_out, rope, rope_angles

INDEX_CHUNK = 256  # queries per index-score block: [B, 256, nh, Tc] bf16


@dataclass
class SharedKV:
    """What source layers hand to the layers after them (reference ``SharedAttentionRuntime``)."""

    compress_kv: torch.Tensor | None = None  # [B, Tc, D] bf16, RoPE'd and fp4-rounded
    index_k: torch.Tensor | None = None  # [B, Tc, ihd] bf16
    chosen: torch.Tensor | None = None  # [B, T, k] int64 compressed positions, -1 where none


def compress(x: torch.Tensor, w: dict[str, torch.Tensor], ratio: int, eps: float) -> torch.Tensor | None:
    """The compressor's latent ``[B, T // r, D]`` bf16 before RoPE, or None when ``T < r`` (the trailing
    partial group waits for decode). ``w``: ``wkv``, ``wgate`` (ratio > 1), ``norm``."""
    if ratio == 1:  # nothing to pool: a bf16 projection
        return rms_norm(F.linear(x, w["wkv"].to(x.dtype)), w["norm"], eps)
    cut = x.shape[1] - x.shape[1] % ratio
    if cut == 0:
        return None
    xf = x[:, :cut].float()
    kv = F.linear(xf, w["wkv"].float()).unflatten(1, (-1, ratio))  # [B, Tc, r, D] float32
    score = F.linear(xf, w["wgate"].float()).unflatten(1, (-1, ratio))
    return rms_norm((kv * score.softmax(dim=2)).sum(dim=2).to(x.dtype), w["norm"], eps)


def index_keys(latent: torch.Tensor, w: dict[str, torch.Tensor], rot_c: torch.Tensor, eps: float) -> torch.Tensor:
    """The indexer keys ``[B, Tc, ihd]`` bf16 of a latent; ``rot_c`` the rotations at positions ``j r``."""
    k = rms_norm(F.linear(latent, w["wk"]), w["k_norm"], eps)
    return fp4_act_round_trip(rope(k, rot_c))


def index_queries(
    x: torch.Tensor, qr: torch.Tensor, w: dict[str, torch.Tensor], wq_b: Linear, rot: torch.Tensor, cfg
) -> tuple[torch.Tensor, torch.Tensor]:
    """The indexer's fp4 queries ``[B, T, nh, ihd]`` bf16 and head weights ``[B, T, nh]`` bf16."""
    nh, ihd = cfg.index_n_heads, cfg.index_head_dim
    q = fp4_act_round_trip(rope(wq_b(qr).unflatten(-1, (nh, ihd)), rot))
    return q, F.linear(x, w["weights_proj"]) * (ihd**-0.5 * nh**-0.5)


def index_scores(
    q: torch.Tensor, weights: torch.Tensor, index_k: torch.Tensor, a: int, z: int, ratio: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores ``[B, z - a, Tc]`` bf16 of queries a..z-1, -inf where not yet visible; visible counts ``[z - a, 1]``)."""
    score = torch.einsum("bshd,btd->bsht", q[:, a:z], index_k)  # bf16, as the reference
    score = (score.relu_() * weights[:, a:z].unsqueeze(-1)).sum(dim=2)
    visible = (torch.arange(a + 1, z + 1, device=q.device) // ratio).unsqueeze(-1)  # [q, 1]
    return score.masked_fill(torch.arange(index_k.shape[1], device=q.device) >= visible, -torch.inf), visible


def choose_positions(
    x: torch.Tensor,
    qr: torch.Tensor,
    index_k: torch.Tensor,
    w: dict[str, torch.Tensor],
    wq_b: Linear,
    rot: torch.Tensor,
    cfg,
    ratio: int,
) -> torch.Tensor:
    """The indexer: ``[B, T, min(index_topk, Tc)]`` int64 compressed positions in ascending order per query,
    -1 where fewer than that are visible (position j is visible to query s once ``j < (s + 1) // r``)."""
    b, t, _ = x.shape
    q, weights = index_queries(x, qr, w, wq_b, rot, cfg)
    k = min(cfg.index_topk, index_k.shape[1])
    out = torch.empty(b, t, k, dtype=torch.int64, device=x.device)
    for a in range(0, t, INDEX_CHUNK):
        z = min(a + INDEX_CHUNK, t)
        score, visible = index_scores(q, weights, index_k, a, z, ratio)
        top = score.topk(k, dim=-1, sorted=False).indices.sort(dim=-1).values
        out[:, a:z] = torch.where(top < visible, top, -1)
    return out


def compressed_attention(
    x: torch.Tensor,
    w: dict[str, torch.Tensor],
    lin: dict[str, Linear],
    cfg,
    layer: int,
    shared: SharedKV,
) -> torch.Tensor:
    """The attention of compressed block ``layer`` on ``x [B, T, dim]`` bf16 -> bf16 ``[B, T, dim]``.

    ``w``/``lin`` as ``window_attention`` plus, where the layer owns them, ``compressor.{wkv,wgate,norm}``,
    ``indexer.{weights_proj,wk,k_norm}`` tensors and the ``indexer.wq_b`` GEMM; ``shared`` is read and,
    on source layers, written."""
    b, t, _ = x.shape
    h, d, ratio, eps = cfg.n_heads, cfg.head_dim, cfg.ratio(layer), cfg.norm_eps
    yarn = (cfg.original_seq_len, cfg.rope_factor, cfg.beta_fast, cfg.beta_slow)
    rot = rope_angles(cfg.rope_head_dim, t, cfg.compress_rope_theta, x.device, yarn)
    qr = rms_norm(lin["wq_a"](x), w["q_norm"], eps)
    q = rope(lin["wq_b"](qr).unflatten(-1, (h, d)), rot)
    kv = fp8_round_trip(rope(rms_norm(lin["wkv"](x), w["kv_norm"], eps), rot))
    tc = t // ratio
    rot_c = rot[: tc * ratio : ratio]  # a latent stands for the first token of its group
    latent = None
    if layer in cfg.kv_source_layers:
        comp = {k: w[f"compressor.{k}"] for k in ("wkv", "wgate", "norm") if f"compressor.{k}" in w}
        latent = compress(x, comp, ratio, eps)
    if layer in cfg.index_source_layers:
        if latent is not None and layer in cfg.kv_source_layers:
            shared.index_k = index_keys(latent, {"wk": w["indexer.wk"], "k_norm": w["indexer.k_norm"]}, rot_c, eps)
        if tc == 0:
            shared.chosen = torch.empty(b, t, 0, dtype=torch.int64, device=x.device)
        else:
            assert shared.index_k is not None  # its kv source ran first (BlocksConfig checks the order)
            iw = {"weights_proj": w["indexer.weights_proj"]}
            shared.chosen = choose_positions(x, qr, shared.index_k, iw, lin["indexer.wq_b"], rot, cfg, ratio)
    if latent is not None:
        shared.compress_kv = fp4_act_round_trip(rope(latent, rot_c), 16, e4m3_scale=True)
    assert shared.chosen is not None
    ckv = shared.compress_kv[:, :tc] if tc and shared.compress_kv is not None else kv[:, :0]
    window = window_indices(t, cfg.window_size, x.device).expand(b, -1, -1)
    chosen = torch.where(shared.chosen >= 0, shared.chosen + t, -1)  # after the t window keys
    o = sparse_attend(q, torch.cat([kv, ckv], 1), w["attn_sink"], torch.cat([window, chosen], -1), d**-0.5)
    return project_out(rope(o, rot, inverse=True), w["wo_a"], lin["wo_b"], cfg)
