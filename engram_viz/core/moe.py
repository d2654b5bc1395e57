"""Block 0's MoE FFN (reference ``Gate``, ``Expert``, ``MoE``): routed fp4 experts plus one fp8 shared expert.

For tokens ``x [N, dim]`` bf16::

    s       = sqrt(softplus(x @ gate^T))                       float32 [N, E]
    chosen  = top-k of (s + bias), bias_vl inside image spans  [N, k]   (the bias picks, it does not weigh)
    weight  = s[chosen] / (sum + 1e-20) * route_scale          [N, k]   (normalised when k > 1)
    expert  = w2( (silu(min(w1 x, L)) * clamp(w3 x, -L, L)) * weight )  each GEMM bf16 out, SwiGLU float32
    y       = sum over chosen experts (float32) + shared(x) -> bf16 [N, dim]

Each routed expert runs once per call on all the tokens that chose it, so a batch of prompts reads
each expert's weights at most once; ``expert(e)`` returns its three GEMMs (loaded on demand).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

Linear = Callable[[torch.Tensor], torch.Tensor]
ExpertFn = Callable[[int], tuple[Linear, Linear, Linear]]  # e -> (w1, w2, w3)
ROUTE_EPS = 1e-20  # the reference's normaliser (not norm_eps; matches training)


def route(
    x: torch.Tensor,
    gate: torch.Tensor,
    bias: torch.Tensor,
    bias_vl: torch.Tensor | None,
    image: torch.Tensor | None,
    cfg,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights [N, k] float32, experts [N, k] int64)`` for tokens ``x [N, dim]``; ``image [N]`` bool."""
    scores = F.softplus(F.linear(x.float(), gate.float())).sqrt()
    b = bias.float()
    if image is not None and bias_vl is not None:
        b = torch.where(image.unsqueeze(-1), bias_vl.float(), b)
    chosen = (scores + b).topk(cfg.n_activated_experts, dim=-1).indices
    weights = scores.gather(1, chosen)
    if cfg.norm_topk_prob and cfg.n_activated_experts > 1:
        weights = weights / (weights.sum(-1, keepdim=True) + ROUTE_EPS)
    return weights * cfg.route_scale, chosen


def swiglu(
    x: torch.Tensor, w1: Linear, w2: Linear, w3: Linear, limit: float, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """One expert on ``x [n, dim]`` bf16: clamped SwiGLU (up both sides, gate from above), bf16 out."""
    gate, up = w1(x).float(), w3(x).float()
    if limit > 0:
        up, gate = up.clamp(-limit, limit), gate.clamp(max=limit)
    h = F.silu(gate) * up
    if weights is not None:
        h = weights * h
    return w2(h.to(x.dtype))


def moe(
    x: torch.Tensor,
    w: dict[str, torch.Tensor],
    shared: tuple[Linear, Linear, Linear],
    expert: ExpertFn,
    cfg,
    image: torch.Tensor | None = None,
) -> torch.Tensor:
    """The MoE FFN on ``x [B, T, dim]`` bf16 (``image [B, T]`` bool selects ``bias_vl``) -> bf16 ``[B, T, dim]``.

    ``w``: ``gate`` ``[E, dim]``, ``bias``, ``bias_vl`` ``[E]``; ``shared``: the shared expert's GEMMs."""
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    weights, chosen = route(
        flat, w["gate"], w["bias"], w.get("bias_vl"), None if image is None else image.reshape(-1), cfg
    )
    y = torch.zeros(flat.shape, dtype=torch.float32, device=x.device)
    for e in torch.unique(chosen).tolist():  # each used expert once, in id order
        tok, slot = torch.where(chosen == e)
        w1, w2, w3 = expert(e)
        y[tok] += swiglu(flat[tok], w1, w2, w3, cfg.swiglu_limit, weights[tok, slot, None])
    y += swiglu(flat, *shared, cfg.swiglu_limit)
    return y.to(x.dtype).view(shape)
