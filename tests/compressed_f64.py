"""The attention of a compressed-KV source layer (compressor, indexer, sparse attention) in float64, written
from the reference's definition independently of engram_viz.core (not a test module).

Reads the checkpoint with ``safetensors`` (``block0_kit.load_all``); every product, softmax and score is
float64. The reference's quantisation steps are applied in float64 (e4m3 activations before each fp8
GEMM, the window KV's e4m3 round trip, the fp4 round trips of the index q / k and of the compressed KV,
nearest e2m1 value by distance with ties to the even code) and so are its bf16 activations (``rb``); the
attention probabilities are rounded to bf16 before the value product as the kernel does (one block of
at most 64 keys here, so its running maximum is the final one); the index scores are NOT rounded to bf16.
"""

from __future__ import annotations

import math

import torch
from block0_kit import deq_fp8, qdq

GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def rb(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).double()


def fp4_rt(x: torch.Tensor, block: int, e4m3: bool) -> torch.Tensor:
    g = x.unflatten(-1, (-1, block))
    amax = g.abs().amax(-1, keepdim=True)
    if e4m3:
        s = (amax.clamp_min(6 * 2**-9) / 6).to(torch.float8_e4m3fn).double()
    else:
        s = torch.exp2(torch.ceil(torch.log2(amax.clamp_min(6 * 2**-126) / 6)))
    v = (g / s).clamp(-6, 6)
    dist = (v.abs().unsqueeze(-1) - GRID).abs()
    best = dist.min(-1, keepdim=True).values
    even = torch.arange(8) % 2 == 0
    code = torch.where((dist == best) & even, 0, torch.where(dist == best, 1, 2)).argmin(-1)  # ties: even code
    return (torch.sign(v) * GRID[code] * s).flatten(-2)


class F64CompressedAttention:
    """float64 attention of compressed source block ``layer`` on a checkpoint's tensors ``t``."""

    def __init__(self, t: dict[str, torch.Tensor], cfg, layer: int):
        self.t, self.cfg, self.p, self.ratio = t, cfg, f"layers.{layer}.attn.", cfg.compress_ratios[layer]

    def w(self, name: str) -> torch.Tensor:
        return self.t[self.p + name].double()

    def lin8(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return rb(qdq(x) @ deq_fp8(self.t[self.p + name + ".weight"], self.t[self.p + name + ".scale"]).T)

    def norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return rb(x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.cfg.norm_eps) * self.w(name))

    def angles(self, positions: torch.Tensor) -> torch.Tensor:
        c, r = self.cfg, self.cfg.rope_head_dim
        base = c.compress_rope_theta
        freqs = base ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
        lo = max(math.floor(r * math.log(c.original_seq_len / (c.beta_fast * 2 * math.pi)) / (2 * math.log(base))), 0)
        hi = min(
            math.ceil(r * math.log(c.original_seq_len / (c.beta_slow * 2 * math.pi)) / (2 * math.log(base))), r - 1
        )
        ramp = ((torch.arange(r // 2, dtype=torch.float64) - lo) / max(hi - lo, 1e-3)).clamp(0, 1)
        freqs = freqs * (1 - ramp) + freqs / c.rope_factor * ramp
        return positions.double()[:, None] * freqs

    def rope(self, x: torch.Tensor, ang: torch.Tensor, sign: float = 1.0) -> torch.Tensor:
        r = self.cfg.rope_head_dim
        shape = (1, x.shape[1]) + (1,) * (x.dim() - 3) + (r // 2,)
        cos, sin = torch.cos(ang).view(shape), sign * torch.sin(ang).view(shape)
        a, b = x[..., -r::2], x[..., -r + 1 :: 2]
        return rb(torch.cat([x[..., :-r], torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)], -1))

    def chosen(self, x: torch.Tensor, qr: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        """``[B, T, k]`` chosen compressed positions (ascending, -1 past the visible ones), float64 scores."""
        c, (b, t, _) = self.cfg, x.shape
        tc, nh, ihd = latent.shape[1], c.index_n_heads, c.index_head_dim
        k = self.norm(rb(latent @ self.w("indexer.wk.weight").T), "indexer.k_norm.weight")
        k = fp4_rt(self.rope(k, self.angles(torch.arange(tc) * self.ratio)), 32, False)
        q = self.rope(self.lin8("indexer.wq_b", qr).view(b, t, nh, ihd), self.angles(torch.arange(t)))
        q = fp4_rt(q, 32, False)
        weights = rb(x @ self.w("indexer.weights_proj.weight").T) / math.sqrt(ihd * nh)
        score = (torch.einsum("bshd,btd->bsht", q, k).clamp_min(0) * weights.unsqueeze(-1)).sum(2)
        visible = (torch.arange(1, t + 1) // self.ratio)[:, None]
        score = score.masked_fill(torch.arange(tc) >= visible, -math.inf)
        self.scores = score  # [B, T, Tc] float64, for the tests
        top = score.topk(min(c.index_topk, tc), -1).indices.sort(-1).values
        return torch.where(top < visible, top, -1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [B, T, dim]`` (bf16 values) -> (attention output [B, T, dim], chosen positions [B, T, k])."""
        c, (b, t, _) = self.cfg, x.shape
        h, d, r = c.n_heads, c.head_dim, self.ratio
        ang = self.angles(torch.arange(t))
        qr = self.norm(self.lin8("wq_a", x), "q_norm.weight")
        q = self.rope(self.lin8("wq_b", qr).view(b, t, h, d), ang)
        kv = rb(qdq(self.rope(self.norm(self.lin8("wkv", x), "kv_norm.weight"), ang)))
        g = x[:, : t - t % r].view(b, -1, r, c.dim)
        pooled = (
            torch.softmax(g @ self.w("compressor.wgate.weight").T, 2) * (g @ self.w("compressor.wkv.weight").T)
        ).sum(2)
        latent = self.norm(rb(pooled), "compressor.norm.weight")
        chosen = self.chosen(x, qr, latent)
        ckv = fp4_rt(self.rope(latent, self.angles(torch.arange(latent.shape[1]) * r)), 16, True)
        s = torch.einsum("bqhd,bkd->bhqk", q, torch.cat([kv, ckv], 1)) / math.sqrt(d)
        qi, ki = torch.arange(t)[:, None], torch.arange(t)[None, :]
        allowed = torch.zeros(b, t, t + ckv.shape[1], dtype=torch.bool)
        allowed[:, :, :t] = (ki <= qi) & (ki > qi - c.window_size)
        rows = torch.arange(t)[None, :, None].expand_as(chosen)
        allowed[
            torch.arange(b)[:, None, None].expand_as(chosen)[chosen >= 0], rows[chosen >= 0], t + chosen[chosen >= 0]
        ] = True
        s = s.masked_fill(~allowed.unsqueeze(1), -math.inf)
        top = s.amax(-1, keepdim=True)
        e = torch.exp(s - top)
        denom = e.sum(-1, keepdim=True) + torch.exp(self.w("attn_sink").view(1, h, 1, 1) - top)
        o = rb(torch.einsum("bhqk,bkd->bqhd", rb(e) / denom, torch.cat([kv, ckv], 1)))  # bf16 probabilities in PV
        o = self.rope(o, ang, sign=-1.0)
        wo_a = self.w("wo_a.weight").view(c.o_groups, c.o_lora_rank, -1)
        o = rb(torch.einsum("bsgd,grd->bsgr", o.reshape(b, t, c.o_groups, -1), wo_a))
        return self.lin8("wo_b", o.flatten(2)), chosen
