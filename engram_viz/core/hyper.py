"""Hyper-connections: the residual carried as ``hc`` streams, collapsed before a sublayer and expanded after.

Per sublayer (attention, FFN) the block derives three coefficient sets from its input streams
(reference ``Block.hc_mixes`` and the ``hc_split_sinkhorn`` kernel), all float32::

    r      = rsqrt(mean(x_flat^2) + norm_eps)             x_flat [B, T, hc*dim], one statistic per token
    m      = (x_flat @ fn^T) * r                          [B, T, (2 + hc) * hc]
    pre    = sigmoid(m[:hc] * scale[0] + base[:hc]) + eps                     [B, T, hc]
    post   = 2 * sigmoid(m[hc:2hc] * scale[1] + base[hc:2hc])                 [B, T, hc]
    comb   = softmax over the last axis of (m[2hc:] * scale[2] + base[2hc:]) as [hc, hc], + eps,
             then column-normalised, then (iters - 1) x (row-normalise, column-normalise), each
             division by (sum + eps)                                          [B, T, hc, hc]

``collapse(x, pre)`` = sum_i pre_i x_i (float32, back to x's dtype); ``expand(y, residual, post, comb)``
= stream j: post_j * y + sum_i comb[i, j] * residual_i (in y's dtype). Order of use (reference
``Block.forward``): the attention input is collapsed with the *previous* block's FFN ``pre`` (for
block 0 the one-hot on stream 0), the FFN input with this block's attention ``pre``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Reference RMSNorm: float32 ``x * rsqrt(mean(x^2) + eps) * weight``, back to x's dtype."""
    xf = x.float()
    return (weight * (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps))).to(x.dtype)


def sinkhorn_split(
    mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, hc: int, iters: int, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``mixes [..., (2 + hc) * hc]`` -> ``pre [..., hc]``, ``post [..., hc]``, ``comb [..., hc, hc]`` (float32)."""
    m, scale, base = mixes.float(), scale.float(), base.float()
    pre = torch.sigmoid(m[..., :hc] * scale[0] + base[:hc]) + eps
    post = 2 * torch.sigmoid(m[..., hc : 2 * hc] * scale[1] + base[hc : 2 * hc])
    comb = (m[..., 2 * hc :] * scale[2] + base[2 * hc :]).unflatten(-1, (hc, hc))
    comb = torch.exp(comb - comb.amax(-1, keepdim=True))
    comb = comb / comb.sum(-1, keepdim=True) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return pre, post, comb


def hc_mixes(
    x: torch.Tensor,
    fn: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    *,
    norm_eps: float,
    iters: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three coefficient sets of one sublayer from its input streams ``x [B, T, hc, dim]``."""
    flat = x.flatten(2).float()
    mixes = F.linear(flat, fn.float()) * torch.rsqrt(flat.square().mean(-1, keepdim=True) + norm_eps)
    return sinkhorn_split(mixes, scale, base, x.shape[2], iters, eps)


def collapse(x: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """``[B, T, hc, dim]`` x ``[B, T, hc]`` -> ``[B, T, dim]``: the weighted sum of the streams."""
    return (pre.unsqueeze(-1) * x.float()).sum(2).to(x.dtype)


def expand(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """Sublayer output ``y [B, T, dim]`` back into ``hc`` streams with the residual mixed by ``comb``."""
    mixed = (comb.unsqueeze(-1) * residual.unsqueeze(-2)).sum(2)  # stream j: sum_i comb[i, j] residual_i
    return (post.unsqueeze(-1) * y.unsqueeze(-2) + mixed).to(y.dtype)


def stream0(x: torch.Tensor) -> torch.Tensor:
    """The one-hot collapse weights on stream 0 ``[B, T, hc]`` float32 (what block 0's attention uses)."""
    pre = torch.zeros(*x.shape[:3], dtype=torch.float32, device=x.device)
    pre[..., 0] = 1.0
    return pre
