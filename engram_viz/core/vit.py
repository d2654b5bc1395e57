"""The vision transformer of DeepSeek-V4.1-Flash (reference ``vision.py``: ``ViT``), one image at a time.

Bidirectional attention over the patches of one image, with a 2-D rotary embedding: half of each
head's rotation pairs turn with the patch's row, half with its column. In the reference's dtypes
(it runs under a bf16 default dtype: linear weights and biases bf16, RMSNorm weights float32)::

    x    = patch_embed(patches.flatten(1))                 bf16 [N, vd]      N = n_h * n_w, vd = vision_dim
    per block (vision_n_layers):
      a  = rms_norm1(x)                                    bf16, normalised in float32, eps 1e-6
      q, k, v = wqkv(a).chunk(3) -> [N, heads, hd]         bf16 (linear with bias)
      q, k = rotate(q), rotate(k)                          float32 rotation, back to bf16
      x  = x + wo(softmax(q k^T / sqrt(hd)) v)             bf16 (no mask: every patch sees every patch)
      x  = x + w2(silu(g) * u), (g, u) = w1(rms_norm2(x)).chunk(2)      bf16, no biases
    out  = rms_norm(x)                                     bf16 [N, vd]

Rotation (``rope_dim = hd / 2`` angles a position): angle ``j < rope_dim / 2`` is ``row * f_j``,
angle ``rope_dim / 2 + j`` is ``col * f_j``, with ``f_j = theta ** (-2j / rope_dim)``; element i of
the first half of a head turns with element i of the second half ("rotate half").

``weights`` is a :class:`VisionSource`: tensors by checkpoint name (``core.schema.vision_tensors``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Protocol

import torch
import torch.nn.functional as F

from engram_viz.core.vision_config import VisionConfig
from engram_viz.errors import InputError

VISION_NORM_EPS = 1e-6  # the reference's vision RMSNorm default
SCORES_PER_BLOCK = 2**26  # attention scores held at once (float32: 256 MiB), see _attention


class VisionSource(Protocol):
    config: VisionConfig
    label: str  # names the weights in messages and stream labels

    def tensor(self, name: str) -> torch.Tensor: ...  # e.g. "vision.blocks.0.attn.wqkv.weight", in its reference dtype


@lru_cache(8)
def rope_angles(n_h: int, n_w: int, rope_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` float32 ``[n_h * n_w, 1, rope_dim]`` of a patch grid in reading order."""
    freqs = 1.0 / (theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim))  # [rope_dim / 2]
    rows = torch.arange(n_h).unsqueeze(1).expand(n_h, n_w)
    cols = torch.arange(n_w).unsqueeze(0).expand(n_h, n_w)
    pos = torch.stack([rows, cols], dim=-1).reshape(-1, 2, 1).float()  # [N, (row, col), 1]
    angles = (pos * freqs).flatten(1)  # [N, rope_dim]: row angles, then column angles
    return angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of ``x [N, heads, hd]`` in float32, back in ``x``'s dtype."""
    first, second = x.float().chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1).to(x.dtype)


def vision_rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """RMSNorm over the last dim in float32 (weight float32), back in ``x``'s dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + VISION_NORM_EPS)
    return (weight.float() * h).to(x.dtype)


def _attention(x: torch.Tensor, src: VisionSource, p: str, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    cfg = src.config
    n = x.size(0)
    qkv = F.linear(x, src.tensor(p + "attn.wqkv.weight"), src.tensor(p + "attn.wqkv.bias"))
    q, k, v = (t.view(n, cfg.vision_n_heads, cfg.head_dim) for t in qkv.chunk(3, dim=-1))
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    q, k, v = (t.transpose(0, 1) for t in (q, k, v))  # [heads, N, hd]
    # the reference's 3-D call (torch's math path on the CPU), a block of queries at a time: each query's row
    # is computed alone, so the blocks give its output bit for bit, with [heads, rows, N] scores in memory
    # instead of [heads, N, N] (~10 GB at 1920x1080)
    rows = max(1, SCORES_PER_BLOCK // (cfg.vision_n_heads * n))
    o = torch.cat([F.scaled_dot_product_attention(q[:, i : i + rows], k, v) for i in range(0, n, rows)], dim=1)
    return F.linear(o.transpose(0, 1).reshape(n, -1), src.tensor(p + "attn.wo.weight"), src.tensor(p + "attn.wo.bias"))


def _mlp(x: torch.Tensor, src: VisionSource, p: str) -> torch.Tensor:
    gate, up = F.linear(x, src.tensor(p + "mlp.w1.weight")).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, src.tensor(p + "mlp.w2.weight"))


def vit_block(x: torch.Tensor, src: VisionSource, i: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """ViT block ``i`` on ``x [N, vd]`` bf16 -> bf16 ``[N, vd]``."""
    p = f"vision.blocks.{i}."
    x = x + _attention(vision_rms_norm(x, src.tensor(p + "norm1.weight")), src, p, cos, sin)
    return x + _mlp(vision_rms_norm(x, src.tensor(p + "norm2.weight")), src, p)


def vit(patches: torch.Tensor, n_h: int, n_w: int, src: VisionSource) -> torch.Tensor:
    """Patches bf16 ``[n_h * n_w, 3, p, p]`` (``core.image_patches``) -> features bf16 ``[n_h * n_w, vision_dim]``."""
    cfg = src.config
    if patches.shape != (n_h * n_w, 3, cfg.vision_patch_size, cfg.vision_patch_size):
        raise InputError(f"patches {list(patches.shape)} do not make a {n_h} x {n_w} grid of {cfg.vision_patch_size}px")
    with torch.no_grad():
        x = F.linear(
            patches.flatten(1), src.tensor("vision.patch_embed.proj.weight"), src.tensor("vision.patch_embed.proj.bias")
        )
        cos, sin = rope_angles(n_h, n_w, cfg.head_dim // 2, float(cfg.vision_rope_theta))
        for i in range(cfg.vision_n_layers):
            x = vit_block(x, src, i, cos, sin)
        return vision_rms_norm(x, src.tensor("vision.norm.weight"))
