"""Block 0's sliding-window attention (reference ``Attention`` with ``compress_ratio == 0``, prefill).

Shapes for ``x [B, T, dim]`` bf16, ``H`` heads of ``D = head_dim``, ``r = rope_head_dim``, one shared
key-value head (K = V)::

    qr  = RMSNorm(wq_a(x))                                bf16 [B, T, q_lora_rank]     (fp8 GEMM)
    q   = wq_b(qr) -> [B, T, H, D]; RoPE on q[..., -r:]   bf16                          (fp8 GEMM)
    kv  = RMSNorm(wkv(x)) [B, T, D]; RoPE on kv[..., -r:]; e4m3 round trip per 32 values (ue8m0 scales)
    s   = q . kv * D^-0.5 over the window t-W+1 .. t                  float32 [B, H, T, W]
    o   = sum_k p_k kv_k / (sum_k p_k + exp(sink_h - max)),  p = exp(s - max)  (p rounded to bf16 in PV)
    o   -> bf16; inverse RoPE on o[..., -r:]
    o   = per group g of H / G heads: o_g @ wo_a[g]^T (bf16) -> [B, T, G, o_lora]; wo_b(o.flatten) (fp8 GEMM)

RoPE: adjacent pairs as complex numbers, frequencies ``theta^(-2i / r)`` (no YaRN for a window-only
block; YaRN for compressed ones), positions from 0 (a prefill). The softmax is the kernel's
(``core.sparse_attention``: a running maximum over blocks of 64 keys, probabilities rounded to bf16
against it), over each query's window listed as indices.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from engram_viz.core import fp8
from engram_viz.core.hyper import rms_norm
from engram_viz.core.sparse_attention import sparse_attend, window_indices

Linear = Callable[[torch.Tensor], torch.Tensor]


def rope_angles(
    rope_dim: int, length: int, theta: float, device: torch.device | None = None, yarn: tuple | None = None
) -> torch.Tensor:
    """``[T, r / 2]`` complex64 unit rotations (reference ``precompute_freqs_cis``). ``yarn`` =
    ``(original_seq_len, factor, beta_fast, beta_slow)``: the frequencies whose wavelength exceeds the
    training context are divided by ``factor``, those inside it kept, a linear ramp between."""
    freqs = 1.0 / (theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float32, device=device) / rope_dim))
    if yarn is not None and yarn[0] > 0:
        original, factor, beta_fast, beta_slow = yarn

        def dim_of(turns: float) -> float:  # the dim completing ``turns`` rotations over the training context
            return rope_dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(theta))

        low, high = max(math.floor(dim_of(beta_fast)), 0), min(math.ceil(dim_of(beta_slow)), rope_dim - 1)
        ramp = ((torch.arange(rope_dim // 2, dtype=torch.float32, device=device) - low) / max(high - low, 1e-3)).clamp(
            0, 1
        )
        smooth = 1 - ramp
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    angles = torch.outer(torch.arange(length, dtype=torch.float32, device=device), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def rope(x: torch.Tensor, rot: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Rotate the last ``r`` dims of ``x [B, T, (H,) D]`` by ``rot [T, r / 2]``; same dtype out."""
    r = 2 * rot.shape[-1]
    pairs = torch.view_as_complex(x[..., -r:].float().unflatten(-1, (-1, 2)).contiguous())
    rot = rot.conj() if inverse else rot
    rot = rot.view(1, x.shape[1], *([1] * (x.dim() - 3)), -1)
    turned = torch.view_as_real(pairs * rot).flatten(-2).to(x.dtype)
    return torch.cat([x[..., :-r], turned], dim=-1)


def fp8_round_trip(x: torch.Tensor) -> torch.Tensor:
    """e4m3 with power-of-two scales per 32 values and back, in x's dtype (the stored KV)."""
    return fp8.dequantize_blockwise(*fp8.quantize_blockwise(x)).to(x.dtype)


def window_attention(x: torch.Tensor, w: dict[str, torch.Tensor], lin: dict[str, Linear], cfg) -> torch.Tensor:
    """Block 0's attention on ``x [B, T, dim]`` bf16 (a prefill from position 0) -> bf16 ``[B, T, dim]``.

    ``w``: ``attn_sink``, ``q_norm``, ``kv_norm``, ``wo_a`` (bf16 ``[G * o_lora, H * D / G]``);
    ``lin``: the fp8 GEMMs ``wq_a``, ``wq_b``, ``wkv``, ``wo_b``; ``cfg``: a Block0Config."""
    t = x.shape[1]
    h, d = cfg.n_heads, cfg.head_dim
    rot = rope_angles(cfg.rope_head_dim, t, cfg.rope_theta, x.device)
    qr = rms_norm(lin["wq_a"](x), w["q_norm"], cfg.norm_eps)
    q = rope(lin["wq_b"](qr).unflatten(-1, (h, d)), rot)
    kv = fp8_round_trip(rope(rms_norm(lin["wkv"](x), w["kv_norm"], cfg.norm_eps), rot))
    idx = window_indices(t, cfg.window_size, x.device).expand(x.shape[0], -1, -1)
    o = rope(sparse_attend(q, kv, w["attn_sink"], idx, d**-0.5), rot, inverse=True)
    return project_out(o, w["wo_a"], lin["wo_b"], cfg)


def project_out(o: torch.Tensor, wo_a: torch.Tensor, wo_b: Linear, cfg) -> torch.Tensor:
    """Heads ``o [B, T, H, D]`` bf16 -> ``[B, T, dim]``: per group g of H / G heads ``o_g @ wo_a[g]^T``
    (bf16, block-diagonal), then the fp8 GEMM ``wo_b`` of the flattened groups."""
    b, t, g = o.shape[0], o.shape[1], cfg.o_groups
    o = torch.einsum("bsgd,grd->bsgr", o.reshape(b, t, g, -1), wo_a.view(g, cfg.o_lora_rank, -1))
    return wo_b(o.flatten(2))
