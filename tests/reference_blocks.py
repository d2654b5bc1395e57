"""The blocks before the last Engram layer written with the reference's structure (seed: ``inference/model.py``
and the kernel ports), for the tests of ``engram_viz.core.blocks`` (not a test module).

Nothing here imports the suite's block code (``core.blocks``, ``compressed_attention``, ``window_attention``,
``hyper``, ``moe``, ``fp4``): ``Compressor``, ``Indexer`` and ``Attention`` keep the reference's caches and its
shared runtime (the window ring, the compressed KV and index-key caches written in place, ``topk_idxs``
handed down), ``sparse_attn`` gathers by index with an online softmax over blocks of 64, ``Block`` mixes
hyper-connections, ``MoE`` loops experts by count, and ``Transformer`` embeds, hashes, applies the Engram
layers (``tests/reference_model.Engram``) and keeps the streams entering each. The fp8 GEMM is the suite's
``core.fp8.fp8_linear`` (as in ``reference_model``); the fp4 tables, the fp4 activation quantisation and
RoPE with YaRN are written here. Weights come from a checkpoint folder via ``safetensors.torch.load_file``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from reference_model import Engram

from engram_viz.config import EngramConfig
from engram_viz.core import fp8
from engram_viz.core.hashing import NgramHasher

FP4_GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
FP4_TABLE = torch.tensor(FP4_GRID + [-v for v in FP4_GRID])
FP4_PAIRS = torch.stack([FP4_TABLE[torch.arange(256) & 15], FP4_TABLE[torch.arange(256) >> 4]], -1)  # [256, 2]
MIDS = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]


def load_folder(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def fp4_act_quant_(x: torch.Tensor, block: int, e4m3: bool) -> torch.Tensor:
    """In place on bf16 x: per ``block`` values, round to e2m1 times a scale (e4m3 amax/6 or power of two)."""
    g = x.float().unflatten(-1, (-1, block))
    amax = g.abs().amax(-1)
    if e4m3:
        s = (amax.clamp_min(6 * 2**-9) / 6.0).to(torch.float8_e4m3fn).float()
    else:
        s = torch.exp2(torch.ceil(torch.log2((amax.clamp_min(6 * 2**-126) * torch.tensor(1 / 6.0)).double()))).float()
    v = (g / s.unsqueeze(-1)).clamp(-6, 6)
    mag, code = v.abs(), torch.zeros_like(v, dtype=torch.long)
    for i, m in enumerate(MIDS):  # round to nearest, ties to the even code
        code += (mag > m).long() + ((mag == m) & ((i + 1) % 2 == 0)).long()
    q = FP4_TABLE[code] * torch.where(torch.signbit(v), -1.0, 1.0)
    x.copy_((q * s.unsqueeze(-1)).flatten(-2))
    return x


def freqs_cis(dim: int, seqlen: int, original: int, base: float, factor: float, fast: int, slow: int) -> torch.Tensor:
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if original > 0:

        def corrected(rot: float) -> float:
            return dim * math.log(original / (rot * 2 * math.pi)) / (2 * math.log(base))

        low, high = max(math.floor(corrected(fast)), 0), min(math.ceil(corrected(slow)), dim - 1)
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / max(high - low, 1e-3)).clamp(0, 1)
        freqs = freqs / factor * ramp + freqs * (1 - ramp)
    angles = torch.outer(torch.arange(seqlen, dtype=torch.float32), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def rotary_(x: torch.Tensor, f: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """In place on the slice ``x [b, s, (h,) r]``."""
    c = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)).contiguous())
    f = f.conj() if inverse else f
    f = f.view(1, x.size(1), x.size(-1) // 2) if x.dim() == 3 else f.view(1, x.size(1), 1, x.size(-1) // 2)
    x.copy_(torch.view_as_real(c * f).flatten(-2))
    return x


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (w * (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps))).to(x.dtype)


def kv_quant_(x: torch.Tensor) -> torch.Tensor:
    x.copy_(fp8.dequantize_blockwise(*fp8.quantize_blockwise(x)).to(x.dtype))
    return x


def sparse_attn(q, kv, sink, idxs, scale):
    b, m, h, d = q.shape
    qf, kvf = q.float(), kv.float()
    acc = torch.zeros(b, m, h, d)
    sum_exp = torch.zeros(b, m, h)
    smax = torch.full((b, m, h), -1e30)
    bi = torch.arange(b).view(b, 1, 1)
    for t in range(0, idxs.size(-1), 64):
        ids = idxs[:, :, t : t + 64].long()
        ok = ids != -1
        blk = kvf[bi, ids.clamp_min(0)] * ok.unsqueeze(-1)
        s = torch.where(ok.unsqueeze(2), torch.einsum("bmhd,bmkd->bmhk", qf, blk), -torch.inf) * torch.tensor(scale)
        prev, smax = smax, torch.maximum(smax, s.amax(-1))
        sc = torch.exp(prev - smax)
        p = torch.exp(s - smax.unsqueeze(-1))
        sum_exp = sum_exp * sc + p.sum(-1)
        acc = acc * sc.unsqueeze(-1) + torch.einsum("bmhk,bmkd->bmhd", p.to(torch.bfloat16).float(), blk)
    sum_exp = sum_exp + torch.exp(sink.float() - smax)
    return (acc / sum_exp.unsqueeze(-1)).to(torch.bfloat16)


class Shared:
    compress_kv = index_k = topk_idxs = None


class Weights:
    def __init__(self, t: dict[str, torch.Tensor], prefix: str):
        self.t, self.p = t, prefix

    def __call__(self, name: str) -> torch.Tensor:
        return self.t[self.p + name]

    def has(self, name: str) -> bool:
        return self.p + name in self.t

    def lin8(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return fp8.fp8_linear(x, self(name + ".weight"), self(name + ".scale"))

    def lin4(self, name: str, x: torch.Tensor) -> torch.Tensor:
        b = self(name + ".weight").view(torch.uint8)
        vals = FP4_PAIRS[b.int()].flatten(-2)  # [N, K / 2, 2] -> [N, K]: even element in the low nibble
        w = vals * self(name + ".scale").float().repeat_interleave(32, 1)
        return F.linear(fp8.dequantize_blockwise(*fp8.quantize_blockwise(x)), w).to(torch.bfloat16)


class Compressor:
    def __init__(self, w: Weights, a, ratio: int):
        self.w, self.a, self.ratio = w, a, ratio

    def forward(self, x):
        ratio, eps = self.ratio, self.a["norm_eps"]
        if ratio == 1:
            return rms(
                F.linear(x, self.w("attn.compressor.wkv.weight").to(x.dtype)),
                self.w("attn.compressor.norm.weight"),
                eps,
            )
        s = x.size(1)
        if s < ratio:
            return None
        xf = x.float()
        kv, score = (
            F.linear(xf, self.w("attn.compressor.wkv.weight").float()),
            F.linear(xf, self.w("attn.compressor.wgate.weight").float()),
        )
        cut = s - s % ratio
        kv, score = kv[:, :cut].unflatten(1, (-1, ratio)), score[:, :cut].unflatten(1, (-1, ratio))
        return rms((kv * score.softmax(dim=2)).sum(dim=2).to(x.dtype), self.w("attn.compressor.norm.weight"), eps)


class Indexer:
    def __init__(self, w: Weights, a, ratio: int, owns_k: bool, freqs):
        self.w, self.a, self.ratio, self.owns_k, self.freqs = w, a, ratio, owns_k, freqs

    def forward(self, x, qr, latent, shared: Shared):
        b, s, _ = x.shape
        ratio, rd, nh, hd = self.ratio, self.a["rope_head_dim"], self.a["index_n_heads"], self.a["index_head_dim"]
        if self.owns_k and latent is not None:
            k = rms(
                F.linear(latent, self.w("attn.indexer.wk.weight")),
                self.w("attn.indexer.k_norm.weight"),
                self.a["norm_eps"],
            )
            rotary_(k[..., -rd:], self.freqs[: s - s % ratio : ratio])
            shared.index_k = fp4_act_quant_(k, 32, False)
        q = self.w.lin8("attn.indexer.wq_b", qr).unflatten(-1, (nh, hd))
        rotary_(q[..., -rd:], self.freqs[:s])
        fp4_act_quant_(q, 32, False)
        index_k = shared.index_k[:b, : s // ratio]
        weights = F.linear(x, self.w("attn.indexer.weights_proj.weight")) * (hd**-0.5 * nh**-0.5)
        score = torch.einsum("bshd,btd->bsht", q, index_k)
        score = (score.relu_() * weights.unsqueeze(-1)).sum(dim=2)
        lens = (torch.arange(1, s + 1) // ratio).unsqueeze(-1)
        score.masked_fill_(torch.arange(s // ratio) >= lens, -torch.inf)
        idxs = score.topk(min(self.a["index_topk"], s // ratio), dim=-1, sorted=False).indices.sort(dim=-1).values
        return torch.where(idxs < lens, idxs + s, -1)


class Attention:
    def __init__(self, w: Weights, a, layer: int, seqlen: int):
        self.w, self.a, self.layer = w, a, layer
        self.ratio = a["compress_ratios"][layer]
        yarn = (a["original_seq_len"], a["compress_rope_theta"]) if self.ratio else (0, a["rope_theta"])
        rd = a["rope_head_dim"]
        self.freqs = freqs_cis(rd, seqlen, yarn[0], yarn[1], a["rope_factor"], a["beta_fast"], a["beta_slow"])
        self.kv_source = layer in a["kv_source_layers"] and self.ratio
        self.index_source = layer in a["index_source_layers"] and self.ratio
        self.compressor = Compressor(w, a, self.ratio) if self.kv_source else None
        self.indexer = Indexer(w, a, self.ratio, bool(self.kv_source), self.freqs) if self.index_source else None

    def forward(self, x, shared: Shared):
        a, w = self.a, self.w
        b, s, _ = x.shape
        h, d, rd, win = a["n_heads"], a["head_dim"], a["rope_head_dim"], a["window_size"]
        f = self.freqs[:s]
        qr = rms(w.lin8("attn.wq_a", x), w("attn.q_norm.weight"), a["norm_eps"])
        q = w.lin8("attn.wq_b", qr).unflatten(-1, (h, d))
        rotary_(q[..., -rd:], f)
        kv = rms(w.lin8("attn.wkv", x), w("attn.kv_norm.weight"), a["norm_eps"])
        rotary_(kv[..., -rd:], f)
        kv_quant_(kv)
        end = torch.arange(s).unsqueeze(1)
        win_idx = (end - win + 1).clamp(0) + torch.arange(min(s, win))
        idxs = torch.where(win_idx > end, -1, win_idx).unsqueeze(0).expand(b, -1, -1)
        if self.ratio:
            latent = self.compressor.forward(x) if self.compressor else None
            if self.index_source:
                comp_idx = torch.empty(b, s, 0, dtype=torch.long) if s // self.ratio == 0 else None
                if comp_idx is None:
                    comp_idx = self.indexer.forward(x, qr, latent, shared)
                shared.topk_idxs = comp_idx
            if latent is not None:
                rotary_(latent[..., -rd:], f[: s - s % self.ratio : self.ratio])
                shared.compress_kv = fp4_act_quant_(latent, 16, True)
            ckv = shared.compress_kv[:, : s // self.ratio] if s // self.ratio else kv[:, :0]
            kv = torch.cat([kv, ckv], 1)
            idxs = torch.cat([idxs, shared.topk_idxs], -1)
        o = sparse_attn(q, kv, w("attn.attn_sink"), idxs, d**-0.5)
        rotary_(o[..., -rd:], f, True)
        g = a["o_groups"]
        o = torch.einsum("bsgd,grd->bsgr", o.view(b, s, g, -1), w("attn.wo_a.weight").view(g, a["o_lora_rank"], -1))
        return w.lin8("attn.wo_b", o.flatten(2))


def moe(w: Weights, a, x, image):
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    scores = F.softplus(F.linear(x.float(), w("ffn.gate.weight").float())).sqrt()
    bias = torch.where(image.reshape(-1, 1), w("ffn.gate.bias_vl"), w("ffn.gate.bias"))
    idx = (scores + bias).topk(a["n_activated_experts"], dim=-1)[1]
    weights = scores.gather(1, idx)
    weights = weights / (weights.sum(-1, keepdim=True) + 1e-20) * a["route_scale"]
    lim = a["swiglu_limit"]

    def expert(xe, lin, name, wt=None):
        gate = lin(f"{name}.w1", xe).float().clamp(max=lim)
        up = lin(f"{name}.w3", xe).float().clamp(-lim, lim)
        hh = F.silu(gate) * up
        hh = hh if wt is None else wt * hh
        return lin(f"{name}.w2", hh.to(xe.dtype))

    y = torch.zeros_like(x, dtype=torch.float32)
    counts = torch.bincount(idx.flatten(), minlength=a["n_routed_experts"]).tolist()
    for e in range(a["n_routed_experts"]):
        if counts[e]:
            r, c = torch.where(idx == e)
            y[r] += expert(x[r], w.lin4, f"ffn.experts.{e}", weights[r, c, None])
    y += expert(x, w.lin8, "ffn.shared_experts")
    return y.type_as(x).view(shape)


def hc_mixes(w: Weights, a, x, sub: str):
    hc, eps = a["hc_mult"], a["hc_eps"]
    xf = x.flatten(2).float()
    m = F.linear(xf, w(f"hc_{sub}_fn")) * torch.rsqrt(xf.square().mean(-1, keepdim=True) + a["norm_eps"])
    sc, base = w(f"hc_{sub}_scale"), w(f"hc_{sub}_base")
    pre = torch.sigmoid(m[..., :hc] * sc[0] + base[:hc]) + eps
    post = 2 * torch.sigmoid(m[..., hc : 2 * hc] * sc[1] + base[hc : 2 * hc])
    comb = (m[..., 2 * hc :] * sc[2] + base[2 * hc :]).unflatten(-1, (hc, hc))
    comb = torch.exp(comb - comb.amax(-1, keepdim=True))  # the kernel's softmax, written out
    comb = comb / comb.sum(-1, keepdim=True) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(a["hc_sinkhorn_iters"] - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return pre, post, comb


def block(w: Weights, a, attn: Attention, x, pre_mix, image, shared):
    def post(y, res, p, c):
        return (p.unsqueeze(-1) * y.unsqueeze(-2) + (c.unsqueeze(-1) * res.unsqueeze(-2)).sum(2)).type_as(y)

    res = x
    a_pre, a_post, a_comb = hc_mixes(w, a, x, "attn")
    y = rms((pre_mix.unsqueeze(-1) * x.float()).sum(2).to(x.dtype), w("attn_norm.weight"), a["norm_eps"])
    x = post(attn.forward(y, shared), res, a_post, a_comb)
    res = x
    f_pre, f_post, f_comb = hc_mixes(w, a, x, "ffn")
    y = rms((a_pre.unsqueeze(-1) * x.float()).sum(2).to(x.dtype), w("ffn_norm.weight"), a["norm_eps"])
    return post(moe(w, a, y, image), res, f_post, f_comb), f_pre


class Transformer:
    """``streams(input_ids [B, T], token_types [B, T]) -> {Engram layer: streams entering it}``."""

    def __init__(self, folder: Path, config: EngramConfig, token_map):
        self.t = load_folder(folder)
        self.a = json.loads((Path(folder) / "config.json").read_text())
        self.config = config
        self.hasher = NgramHasher(config, token_map, max_batch=4, max_seq_len=2048)
        self.engrams = {}
        for n in config.engram_layer_ids:
            e = Engram(config, n)
            for name, p in e.named_parameters():
                p.data = self.t[f"layers.{n}.engram.{name}"].to(p.dtype)
            self.engrams[n] = e

    @torch.no_grad()
    def streams(
        self, ids: torch.Tensor, types: torch.Tensor, embedded: torch.Tensor | None = None
    ) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """(streams entering each Engram layer, that layer's gates [B, T, hc]); ``embedded`` ``[B, T, dim]``
        bf16 replaces ``embed(ids)`` (the embeddings with pictures merged)."""
        a, image = self.a, types >= 0
        hashes = self.hasher(ids, 0, ~image)
        h = self.t["embed.weight"][ids] if embedded is None else embedded
        h = h.unsqueeze(2).repeat(1, 1, a["hc_mult"], 1)
        pre_mix = torch.zeros(*h.shape[:3])
        pre_mix[..., 0] = 1.0
        shared, out, gates = Shared(), {}, {}
        for n in range(max(self.config.engram_layer_ids) + 1):
            if n in self.engrams:
                out[n] = h
                gates[n] = self.gates(n, h, hashes, image)
                if n == max(self.config.engram_layer_ids):
                    break
                h = self.engrams[n](h, hashes[:, :, self.engrams[n].layer_hash_index], ~image)
            w = Weights(self.t, f"layers.{n}.")
            h, pre_mix = block(w, a, Attention(w, a, n, ids.shape[1]), h, pre_mix, image, shared)
        return out, gates

    def gates(self, n, h, hashes, image):
        e = self.engrams[n]
        kv = e.wkv(e.embed(hashes[:, :, e.layer_hash_index]).flatten(-2))
        key = kv.split([e.hc_mult * e.dim, e.dim], dim=-1)[0].float().unflatten(-1, (e.hc_mult, e.dim))
        hf = h.float()
        rstd = torch.rsqrt(hf.square().mean(-1) + e.eps) * torch.rsqrt(key.square().mean(-1) + e.eps)
        dot = (hf * e.q_weight.float() * e.k_weight.float() * key).sum(-1) * rstd * e.dim**-0.5
        gate = torch.sigmoid(torch.copysign(dot.abs().clamp_min(1e-6).sqrt(), dot))
        return gate.masked_fill(image.unsqueeze(-1), 0)
