"""Why a gate opened: the exact split of one Engram layer's key, value and ``dot`` into its 24 rows.

``wkv`` is linear in the 24 gathered rows, and each row's activations are its own (every fp8
32-block lies inside one row, ``WkvLinear.inputs``), so before the output rounding::

    kv_f32 = wkv.inputs(rows) @ W.T = sum_r part_r,   part_r = inputs_r @ W[:, r * head_dim : (r + 1) * head_dim].T

and ``key`` (per stream) and the shared ``value`` split the same way (per row, per order = its 8
heads, per head = its 3 orders). ``dot`` is ``numerator * f`` with ``numerator = sum(h * q * k *
key)`` linear in the key and ``f`` (the rstd of h and of the key, and ``1 / sqrt(dim)``) shared by
all rows, so a row's share of ``dot`` is ``dot * numerator_r / numerator`` and the shares sum to
``dot``'s numerator as it would be with the unrounded key.

**Exact** (float32 arithmetic only, summation order aside):

- ``dot_share`` ``[T, 24, hc]``: sums to ``dot`` up to ``dot_rounding`` ``[T, hc]`` = ``dot -
  sum(dot_share)``, which is the bf16 rounding of the key in the ``fp8`` / ``bf16`` modes (the
  reference path rounds ``kv`` to bf16; half a bf16 ulp per key element) and float32 noise in the
  ``float32`` mode.
- ``value_proj`` ``[T, 24]``: each row's value part projected on the module's (rounded) value,
  ``<part_r, value> / |value|``; they sum to ``|value|`` up to the value's bf16 rounding.
  ``value_norm`` ``[T, 24]``: ``|part_r|`` (not additive; the per-order and per-head norms are
  the norms of the group's summed parts).
- Gates with something left out (``loo_row`` ``[T, 24, hc]``, ``loo_head`` ``[T, n_heads, hc]``,
  ``loo_order`` ``[T, n_orders, hc]``) and of every coalition of n-gram orders (``coalitions``
  ``[T, 2**n_orders, hc]``, bit i of the index set = order ``orders[i]`` kept): the rows' parts
  kept are summed in float32 (never subtracted from the total: with everything left out the
  key must be exactly 0, as in the re-run, not float noise that the key's rstd would blow up),
  rounded as the module rounds (``WkvLinear.out_dtype``) and
  put through :func:`engram_viz.core.engram.engram_steps` itself - the same arithmetic as a
  forward with those rows zeroed (a zero row quantises to zero and leaves the others' scales
  alone), up to float32 summation order, i.e. a key/value element may land one bf16 ulp apart.
- ``shapley`` ``[T, n_orders, hc]``: exact Shapley values of the orders for the gate over the
  coalition gates; they sum to ``gate - coalitions[:, 0]`` (all orders minus none).

``gate`` ``[T, hc]`` is variant 0 (nothing left out) of the same call: the module's gate, bit for
bit up to the GEMM's summation order. Image positions (``token_mask`` False) have gate 0 in every
variant; their shares are still given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import torch

from engram_viz.core.engram import Engram, engram_steps
from engram_viz.core.layout import EngramLayout

CHUNK_FLOATS = 1 << 24  # float32 elements of the variants' kv per chunk of positions (64 MiB)


@dataclass
class LayerAttribution:
    """One Engram layer's attribution over the positions of one prompt (shapes in the module
    docstring; float32 CPU tensors). ``orders [24]`` / ``heads [24]``: the (order, head) owning
    each of the 24 columns (``EngramLayout.column``)."""

    layer: int
    orders: np.ndarray
    heads: np.ndarray
    gate: torch.Tensor
    dot: torch.Tensor
    dot_share: torch.Tensor
    dot_rounding: torch.Tensor
    value_norm: torch.Tensor
    value_proj: torch.Tensor
    value_rounding: torch.Tensor  # [T]: |value - sum of parts|
    order_value_norm: torch.Tensor  # [T, n_orders]
    head_value_norm: torch.Tensor  # [T, n_heads]
    loo_row: torch.Tensor
    loo_head: torch.Tensor
    coalitions: torch.Tensor
    loo_order: torch.Tensor
    shapley: torch.Tensor

    @property
    def order_ids(self) -> list[int]:
        return sorted(set(self.orders.tolist()))

    @property
    def head_ids(self) -> list[int]:
        return sorted(set(self.heads.tolist()))

    def group(self, t: torch.Tensor, kind: str) -> torch.Tensor:
        """Sum a per-column tensor ``[T, 24, ...]`` into ``[T, n_orders | n_heads, ...]`` (kind ``order`` or ``head``)."""
        owner = {"order": self.orders, "head": self.heads}.get(kind)
        if owner is None:
            raise ValueError(f"group kind {kind!r} unknown; expected 'order' or 'head'")
        ids = sorted(set(owner.tolist()))
        index = torch.as_tensor([ids.index(o) for o in owner.tolist()])
        out = t.new_zeros((t.shape[0], len(ids), *t.shape[2:]))
        return out.index_add_(1, index, t)


def column_owners(layout: EngramLayout) -> tuple[np.ndarray, np.ndarray]:
    """``(orders [24], heads [24])``: the order and head of each column, from ``layout.column``."""
    cfg = layout.config
    orders = np.zeros(cfg.n_hash_cols, dtype=np.int64)
    heads = np.zeros(cfg.n_hash_cols, dtype=np.int64)
    for order in cfg.ngram_orders:
        for head in range(cfg.engram_n_heads):
            col = layout.column(order, head)
            orders[col], heads[col] = order, head
    return orders, heads


def _group_index(owner: np.ndarray) -> torch.Tensor:
    """Column -> index of its group (order or head) among the sorted group ids: int64 ``[24]``."""
    ids = sorted(set(owner.tolist()))
    return torch.as_tensor([ids.index(o) for o in owner.tolist()], dtype=torch.int64)


def _coalition_masks(n_orders: int) -> torch.Tensor:
    """float ``[2**n_orders, n_orders]``: row ``bits`` keeps order i when bit i is set."""
    return torch.tensor([[bits >> i & 1 for i in range(n_orders)] for bits in range(2**n_orders)], dtype=torch.float32)


def shapley_values(coalitions: torch.Tensor) -> torch.Tensor:
    """Exact Shapley values ``[..., P, hc]`` of P players from coalition values ``[..., 2**P, hc]``
    (bit i of the index = player i in the coalition); they sum to ``v(all) - v(none)``."""
    p = coalitions.shape[-2].bit_length() - 1
    if 2**p != coalitions.shape[-2]:
        raise ValueError(f"coalition values must number a power of two, got {coalitions.shape[-2]}")
    out = coalitions.new_zeros((*coalitions.shape[:-2], p, coalitions.shape[-1]))
    for i in range(p):
        others = [j for j in range(p) if j != i]
        for size in range(p):
            weight = math.factorial(size) * math.factorial(p - size - 1) / math.factorial(p)
            for members in combinations(others, size):
                s = sum(1 << j for j in members)
                out[..., i, :] += weight * (coalitions[..., s | 1 << i, :] - coalitions[..., s, :])
    return out


def _row_parts(engram: Engram, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(parts [24, n, N], kv_f32 [n, N])``: each row's share of the float32 wkv output (row-major,
    one GEMM per row), and the output itself as the module's GEMM computes it (before rounding)."""
    w = engram.wkv.weight.detach()
    a = engram.wkv.inputs(rows.flatten(-2))  # [n, K]
    n_cols = rows.shape[-2]
    per_row = a.unflatten(-1, (n_cols, -1)).transpose(0, 1)  # [24, n, head_dim]
    parts = torch.bmm(per_row, w.unflatten(-1, (n_cols, -1)).permute(1, 2, 0))  # [24, n, N]
    return parts, torch.nn.functional.linear(a, w)


def _variants(
    kv_f32: torch.Tensor, parts: torch.Tensor, order_index: torch.Tensor, head_index: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """The wkv output of every variant, rounded to ``dtype`` (the module's), ``[V, n, N]``: nothing
    left out (the module's GEMM), each row left out, each head left out (the float32 total minus
    the left-out parts), then every coalition of orders (the sum of the kept orders' parts, so
    keeping none is exactly 0). Written into one preallocated tensor (no concatenation)."""
    n_orders, n_heads = int(order_index.max()) + 1, int(head_index.max()) + 1
    n_rows = parts.shape[0]
    kv = kv_f32.new_empty((1 + n_rows + n_heads + 2**n_orders, *kv_f32.shape), dtype=dtype)
    kv[0] = kv_f32
    kv[1 : 1 + n_rows] = kv_f32 - parts
    group = parts.new_zeros((n_heads, *parts.shape[1:])).index_add_(0, head_index, parts)
    kv[1 + n_rows : 1 + n_rows + n_heads] = kv_f32 - group
    group = parts.new_zeros((n_orders, *parts.shape[1:])).index_add_(0, order_index, parts)
    kv[1 + n_rows + n_heads :] = torch.einsum("co,onj->cnj", _coalition_masks(n_orders).to(parts.device), group)
    return kv


class _GateReached(Exception):
    """Stops engram_steps once the gate is known (the streams' update is not needed here)."""


def _run_variants(engram: Engram, x: torch.Tensor, mask: torch.Tensor, kv: torch.Tensor) -> dict[str, torch.Tensor]:
    """engram_steps on ``kv [V, n, N]`` (already rounded) with streams ``x [n, hc, dim]`` shared by
    the variants (broadcast, not copied): the captured ``key``, ``value``, ``dot`` and ``gate``."""
    seen: dict[str, torch.Tensor] = {}

    def hook(site: str, t: torch.Tensor) -> torch.Tensor:
        seen[site] = t
        if site == "gate":
            raise _GateReached
        return t

    n = kv.shape[1]
    try:
        engram_steps(
            x.unsqueeze(0),
            torch.zeros((1, n, engram.n_hash_cols), dtype=torch.int64, device=kv.device),
            mask.unsqueeze(0),
            gather=lambda ids: kv.new_empty((*ids.shape, 0)),  # the rows are already inside kv
            wkv=lambda _a: kv,
            q_weight=engram.q_weight.detach(),
            k_weight=engram.k_weight.detach(),
            eps=engram.eps,
            clamp=engram.clamp_value,
            hook=hook,
        )
    except _GateReached:
        pass
    return seen


def _chunk(engram: Engram, x: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor, groups: tuple) -> dict:
    """The attribution of n positions: x ``[n, hc, dim]``, rows ``[n, 24, head_dim]``, mask ``[n]``."""
    hc, dim = engram.q_weight.shape
    order_index, head_index = groups
    parts, kv_f32 = _row_parts(engram, rows)
    seen = _run_variants(engram, x, mask, _variants(kv_f32, parts, order_index, head_index, engram.wkv.out_dtype))
    key, value, dot = seen["key"][0], seen["value"][0], seen["dot"][0]
    # dot = numerator * f, numerator = sum(h * q * k * key) linear in the key, f shared by the rows
    g = x.float() * (engram.q_weight.float() * engram.k_weight.float()).detach()  # [n, hc, dim]
    numerator = (g * key).sum(-1)  # [n, hc], with the rounded key, as dot's
    ratio = torch.where(numerator != 0, dot / numerator, torch.zeros_like(dot))
    key_num = (parts[..., : hc * dim].unflatten(-1, (hc, dim)) * g).sum(-1)  # [24, n, hc]
    dot_share = key_num.transpose(0, 1) * ratio.unsqueeze(1)  # [n, 24, hc]
    value_parts = parts[..., hc * dim :]  # [24, n, dim]
    unit = value / value.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    value_by = {
        kind: value_parts.new_zeros((int(ix.max()) + 1, *value_parts.shape[1:])).index_add_(0, ix, value_parts)
        for kind, ix in (("order", order_index), ("head", head_index))
    }
    return {
        "gate": seen["gate"].transpose(0, 1),  # [n, V, hc]
        "dot": dot,
        "dot_share": dot_share,
        "dot_rounding": dot - dot_share.sum(1),
        "value_norm": value_parts.norm(dim=-1).T,
        "value_proj": (value_parts * unit).sum(-1).T,
        "value_rounding": (value - value_parts.sum(0)).norm(dim=-1),
        "order_value_norm": value_by["order"].norm(dim=-1).T,
        "head_value_norm": value_by["head"].norm(dim=-1).T,
    }


def _chunk_size(engram: Engram, n_variants: int) -> int:
    n_out = engram.wkv.weight.shape[0]
    return max(1, CHUNK_FLOATS // (n_variants * n_out))


def attribute_layer(
    engram: Engram,
    x: torch.Tensor,
    rows: torch.Tensor,
    token_mask: torch.Tensor,
    layout: EngramLayout | None = None,
) -> LayerAttribution:
    """The attribution of every position of one sequence at one Engram layer.

    x ``[T, hc, dim]`` (the streams the layer read), rows ``[T, 24, head_dim]`` (as gathered,
    ``engram.L{n}.rows``), token_mask ``[T]`` bool. Computed on the module's device in chunks of
    positions (memory bounded by :data:`CHUNK_FLOATS`); returned on the CPU."""
    layout = layout or EngramLayout(engram.config)
    orders, heads = column_owners(layout)
    dev = engram.device
    groups = (_group_index(orders).to(dev), _group_index(heads).to(dev))
    n_orders, n_heads = len(set(orders.tolist())), len(set(heads.tolist()))
    n_variants = 1 + len(orders) + n_heads + 2**n_orders
    step = _chunk_size(engram, 2 * n_variants)  # the variants and the row parts
    out: list[dict] = []
    with torch.no_grad():
        for s in range(0, x.shape[0], step):
            sl = slice(s, s + step)
            c = _chunk(engram, x[sl].to(dev), rows[sl].to(dev), token_mask[sl].to(dev), groups)
            out.append({k: v.cpu() for k, v in c.items()})
    cat = {k: torch.cat([p[k] for p in out]) for k in out[0]}
    spans = {"row": slice(1, 1 + len(orders)), "head": slice(1 + len(orders), 1 + len(orders) + n_heads)}
    spans["coalition"] = slice(spans["head"].stop, n_variants)
    return _assemble(engram.layer_id, orders, heads, cat, spans)


def _assemble(
    layer: int, orders: np.ndarray, heads: np.ndarray, cat: dict, spans: dict[str, slice]
) -> LayerAttribution:
    gates = cat.pop("gate")  # [T, V, hc]
    coalitions = gates[:, spans["coalition"]].clone()
    coalitions[:, -1] = gates[:, 0]  # all orders kept is variant 0 (equal up to the batch's reduction order)
    n_orders = coalitions.shape[1].bit_length() - 1
    everything = 2**n_orders - 1
    loo_order = torch.stack([coalitions[:, everything ^ (1 << i)] for i in range(n_orders)], dim=1)
    return LayerAttribution(
        layer=layer,
        orders=orders,
        heads=heads,
        gate=gates[:, 0],
        loo_row=gates[:, spans["row"]],
        loo_head=gates[:, spans["head"]],
        coalitions=coalitions,
        loo_order=loo_order,
        shapley=shapley_values(coalitions),
        **cat,
    )
