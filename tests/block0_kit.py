"""Block 0 in float64, written from the reference's definition independently of engram_viz.core (not a test module).

Reads the checkpoint with ``safetensors.torch.load_file`` (not the suite's reader), dequantises fp8 /
fp4 by hand (the reference's nibble order: even element in the low nibble) and runs every sublayer in
float64. Quantisation steps the reference applies to activations (e4m3 with power-of-two scales per 32
values before each fp8 / fp4 GEMM, the KV round trip) are applied in float64 too, and so are the
reference's bf16 activations (every tensor its code holds in bf16 is rounded to bf16 here,
``bf16=True``): an e4m3 step is 2^-3 relative, so without them a bf16-sized difference ahead of an
activation quantisation flips elements by a whole e4m3 step and the two sides drift by a few percent
per GEMM (measured: 5% median stream error, gates 0.1 apart at dim 512). ``bf16=False`` skips them.
"""

from __future__ import annotations

import math

import torch
from safetensors.torch import load_file

from engram_viz.core.block0_config import Block0Config

SMALL_WIDTHS = {
    "dim": 64,
    "n_heads": 4,
    "head_dim": 64,
    "rope_head_dim": 16,
    "q_lora_rank": 32,
    "o_groups": 2,
    "o_lora_rank": 32,
    "window_size": 8,
    "n_routed_experts": 8,
    "n_activated_experts": 3,
    "moe_inter_dim": 64,
}  # small widths of block 0's fields, shared with blocks_kit
SMALL = Block0Config(**SMALL_WIDTHS)
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def load_all(folder) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def qdq(x: torch.Tensor) -> torch.Tensor:
    """e4m3 quantise + dequantise per 32 values with power-of-two scales, float64."""
    g = x.unflatten(-1, (-1, 32))
    amax = g.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    s = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
    return ((g / s).clamp(-448, 448).to(torch.float8_e4m3fn).double() * s).flatten(-2)


def deq_fp8(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    n, k = w.shape
    full = s.double().repeat_interleave(32, 0)[:n].repeat_interleave(32, 1)[:, :k]
    return w.double() * full


def deq_fp4(w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    b = w.view(torch.uint8).long()
    table = torch.tensor(E2M1 + [-v for v in E2M1], dtype=torch.float64)
    vals = torch.stack([table[b % 16], table[b // 16]], -1).flatten(-2)
    return vals * s.double().repeat_interleave(32, 1)


class F64Block0:
    """float64 embed + block 0 on a checkpoint's tensors ``t`` (name -> tensor)."""

    def __init__(self, t: dict[str, torch.Tensor], cfg: Block0Config, bf16: bool = True):
        self.t, self.cfg, self.bf16 = t, cfg, bf16

    def rb(self, x: torch.Tensor) -> torch.Tensor:
        """Round to bf16 where the reference holds a bf16 tensor."""
        return x.to(torch.bfloat16).double() if self.bf16 else x

    def w(self, name: str) -> torch.Tensor:
        return self.t["layers.0." + name].double()

    def lin8(self, name: str, x: torch.Tensor) -> torch.Tensor:
        w = deq_fp8(self.t[f"layers.0.{name}.weight"], self.t[f"layers.0.{name}.scale"])
        return self.rb(qdq(x) @ w.T)

    def norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return self.rb(x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.cfg.norm_eps) * self.w(name))

    def mixes(self, x: torch.Tensor, sub: str):
        hc, c = self.cfg.hc_mult, self.cfg
        flat = x.flatten(2)
        m = (flat @ self.w(f"hc_{sub}_fn").T) / torch.sqrt((flat * flat).mean(-1, keepdim=True) + c.norm_eps)
        sc, base = self.w(f"hc_{sub}_scale"), self.w(f"hc_{sub}_base")
        pre = 1 / (1 + torch.exp(-(m[..., :hc] * sc[0] + base[:hc]))) + c.hc_eps
        post = 2 / (1 + torch.exp(-(m[..., hc : 2 * hc] * sc[1] + base[hc : 2 * hc])))
        a = (m[..., 2 * hc :] * sc[2] + base[2 * hc :]).reshape(*m.shape[:-1], hc, hc)
        comb = torch.softmax(a, -1) + c.hc_eps
        comb = comb / (comb.sum(-2, keepdim=True) + c.hc_eps)
        for _ in range(c.hc_sinkhorn_iters - 1):
            comb = comb / (comb.sum(-1, keepdim=True) + c.hc_eps)
            comb = comb / (comb.sum(-2, keepdim=True) + c.hc_eps)
        return pre, post, comb

    def rope(self, x: torch.Tensor, inverse: bool = False) -> torch.Tensor:
        r, t = self.cfg.rope_head_dim, x.shape[1]
        i = torch.arange(r // 2, dtype=torch.float64)
        ang = torch.arange(t, dtype=torch.float64)[:, None] * self.cfg.rope_theta ** (-2 * i / r)
        ang = -ang if inverse else ang
        shape = (1, t) + (1,) * (x.dim() - 3) + (r // 2,)
        cos, sin = torch.cos(ang).view(shape), torch.sin(ang).view(shape)
        a, b = x[..., -r::2], x[..., -r + 1 :: 2]
        turned = torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)
        return self.rb(torch.cat([x[..., :-r], turned], -1))

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        b, t, _ = x.shape
        q = self.rope(
            self.lin8("attn.wq_b", self.norm(self.lin8("attn.wq_a", x), "attn.q_norm.weight")).view(
                b, t, c.n_heads, c.head_dim
            )
        )
        kv = self.rb(qdq(self.rope(self.norm(self.lin8("attn.wkv", x), "attn.kv_norm.weight"))))
        s = torch.einsum("bqhd,bkd->bhqk", q, kv) / math.sqrt(c.head_dim)
        qi, ki = torch.arange(t)[:, None], torch.arange(t)[None, :]
        s = s.masked_fill(~((ki <= qi) & (ki > qi - c.window_size)), -math.inf)
        sink = self.w("attn.attn_sink").view(1, -1, 1, 1).expand(b, -1, t, 1)
        top = s.amax(-1, keepdim=True)
        e = torch.exp(s - top)
        denom = e.sum(-1, keepdim=True) + torch.exp(sink - top)
        o = torch.einsum("bhqk,bkd->bqhd", self.rb(e) / denom, kv)  # probabilities in bf16 for PV, as the kernel
        o = self.rope(self.rb(o), inverse=True)
        wo_a = self.w("attn.wo_a.weight").view(c.o_groups, c.o_lora_rank, -1)
        o = self.rb(torch.einsum("bsgd,grd->bsgr", o.reshape(b, t, c.o_groups, -1), wo_a))
        return self.lin8("attn.wo_b", o.flatten(2))

    def expert(self, x: torch.Tensor, e: int | None) -> torch.Tensor:
        lim = self.cfg.swiglu_limit
        if e is None:
            w = {
                k: deq_fp8(
                    self.t[f"layers.0.ffn.shared_experts.{k}.weight"], self.t[f"layers.0.ffn.shared_experts.{k}.scale"]
                )
                for k in ("w1", "w2", "w3")
            }
        else:
            w = {
                k: deq_fp4(
                    self.t[f"layers.0.ffn.experts.{e}.{k}.weight"], self.t[f"layers.0.ffn.experts.{e}.{k}.scale"]
                )
                for k in ("w1", "w2", "w3")
            }
        g, u = self.rb(qdq(x) @ w["w1"].T).clamp(max=lim), self.rb(qdq(x) @ w["w3"].T).clamp(-lim, lim)
        return g / (1 + torch.exp(-g)) * u, w["w2"]

    def moe(self, x: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        flat, img = x.reshape(-1, c.dim), image.reshape(-1)
        scores = torch.sqrt(torch.nn.functional.softplus(flat @ self.w("ffn.gate.weight").T))
        bias = torch.where(img[:, None], self.w("ffn.gate.bias_vl"), self.w("ffn.gate.bias"))
        chosen = (scores + bias).topk(c.n_activated_experts, -1).indices
        weights = scores.gather(1, chosen)
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20) * c.route_scale
        y = torch.zeros_like(flat)
        for n in range(flat.shape[0]):
            for k in range(c.n_activated_experts):
                h, w2 = self.expert(flat[n : n + 1], int(chosen[n, k]))
                y[n] += self.rb(qdq(self.rb(weights[n, k] * h)) @ w2.T)[0]
        h, w2 = self.expert(flat, None)
        return self.rb(y + self.rb(qdq(self.rb(h)) @ w2.T)).view(x.shape)

    def streams(self, ids: torch.Tensor, image: torch.Tensor, h0: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, T]`` raw ids -> float64 streams entering layer 1 ``[B, T, hc, dim]``; ``h0 [B, T, dim]``: the
        embeddings to start from instead of ``embed.weight`` rows (pictures merged in)."""
        h0 = self.t["embed.weight"][ids] if h0 is None else h0
        h = h0.double().unsqueeze(2).repeat(1, 1, self.cfg.hc_mult, 1)
        a_pre, a_post, a_comb = self.mixes(h, "attn")
        y = self.attention(self.norm(h[:, :, 0], "attn_norm.weight"))
        x = self.rb(a_post[..., None] * y[:, :, None] + torch.einsum("btij,btid->btjd", a_comb, h))
        _, f_post, f_comb = self.mixes(x, "ffn")
        y = self.moe(self.norm(self.rb((a_pre[..., None] * x).sum(2)), "ffn_norm.weight"), image)
        return self.rb(f_post[..., None] * y[:, :, None] + torch.einsum("btij,btid->btjd", f_comb, x))
