"""The reference's sparse attention kernel (``sparse_attn``): one shared key-value head, keys gathered by index.

For queries ``q [B, T, H, D]`` and the keys ``kv [B, N, D]`` (K = V) each query lists ``idx [B, T, K]``
(-1: no key). Per query and head, float32::

    s_k   = q . kv[idx_k] * scale                    (-inf where idx_k = -1)
    m     = running maximum over blocks of 64 indices (starting at -1e30, so an all -1 row gives 0)
    p_k   = exp(s_k - m)    summed in float32 for the denominator; rounded to bf16 for the value product
    o     = sum_k p_k kv[idx_k] / (sum_k p_k + exp(sink_h - m))      (earlier blocks rescaled by exp(m_old - m))

The online maximum matters: probabilities are rounded to bf16 relative to the maximum seen so far, as the
kernel does, so a window of 128 keys (two blocks) gives the kernel's bits, not a final-maximum softmax's.
"""

from __future__ import annotations

import torch

SPARSE_BLOCK = 64  # indices per online-softmax step (the kernel's block)
QUERY_CHUNK = 64  # queries per gather: [B, 64, 64, D] float32 keys at a time


def window_indices(t: int, window: int, device: torch.device | None = None) -> torch.Tensor:
    """``[T, min(T, W)]`` int64: query s attends to keys ``max(0, s - W + 1) ..`` in order, -1 past s."""
    end = torch.arange(t, device=device).unsqueeze(1)
    idx = (end - window + 1).clamp_min(0) + torch.arange(min(t, window), device=device)
    return torch.where(idx > end, -1, idx)


def sparse_attend(
    q: torch.Tensor, kv: torch.Tensor, sink: torch.Tensor, idx: torch.Tensor, scale: float
) -> torch.Tensor:
    """``q [B, T, H, D]``, ``kv [B, N, D]``, ``idx [B, T, K]`` (-1: nothing), ``sink [H]`` -> bf16 ``[B, T, H, D]``."""
    b, t, h, d = q.shape
    kvf = kv.float()
    out = torch.empty(b, t, h, d, dtype=torch.bfloat16, device=q.device)
    batch = torch.arange(b, device=q.device).view(b, 1, 1)
    scale_t = torch.tensor(scale, dtype=torch.float32)
    for a in range(0, t, QUERY_CHUNK):
        z = min(a + QUERY_CHUNK, t)
        qf = q[:, a:z].float()
        acc = torch.zeros(b, z - a, h, d, dtype=torch.float32, device=q.device)
        total = torch.zeros(b, z - a, h, dtype=torch.float32, device=q.device)
        top = torch.full((b, z - a, h), -1e30, dtype=torch.float32, device=q.device)  # all -1 rows give 0
        for k in range(0, idx.shape[-1], SPARSE_BLOCK):
            ids = idx[:, a:z, k : k + SPARSE_BLOCK]
            valid = ids >= 0
            keys = kvf[batch, ids.clamp_min(0)] * valid.unsqueeze(-1)  # [B, q, blk, D]
            s = torch.einsum("bmhd,bmkd->bmhk", qf, keys)
            s = torch.where(valid.unsqueeze(2), s, -torch.inf) * scale_t
            prev, top = top, torch.maximum(top, s.amax(-1))
            rescale = torch.exp(prev - top)
            p = torch.exp(s - top.unsqueeze(-1))
            total = total * rescale + p.sum(-1)
            pv = torch.einsum("bmhk,bmkd->bmhd", p.to(torch.bfloat16).float(), keys)
            acc = acc * rescale.unsqueeze(-1) + pv
        total = total + torch.exp(sink.float() - top)
        out[:, a:z] = (acc / total.unsqueeze(-1)).to(torch.bfloat16)
    return out
