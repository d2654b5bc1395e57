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

- ``gate``, ``dot`` ``[T, hc]``: ``kv_f32`` rounded as the module rounds (``WkvLinear.out_dtype``)
  and put through ``core.engram``'s own formula (:func:`~engram_viz.core.engram.engram_dot`,
  :func:`~engram_viz.core.engram.engram_gate`): the module's gate up to the GEMM's summation order.
- ``dot_share`` ``[T, 24, hc]``: sums to ``dot`` up to ``dot_rounding`` ``[T, hc]`` = ``dot -
  sum(dot_share)``, which is the bf16 rounding of the key in the ``fp8`` / ``bf16`` modes (the
  reference path rounds ``kv`` to bf16; half a bf16 ulp per key element) and float32 noise in the
  ``float32`` mode.
- ``value_proj`` ``[T, 24]``: each row's value part projected on the module's (rounded) value,
  ``<part_r, value> / |value|``; they sum to ``|value|`` up to the value's bf16 rounding.
  ``value_norm`` ``[T, 24]``: ``|part_r|`` (not additive; the per-order and per-head norms are
  the norms of the group's summed parts).
- Gates with something left out (:meth:`LayerAttribution.left_out`: ``loo_row`` ``[P, 24, hc]``,
  ``loo_head`` ``[P, n_heads, hc]``, ``loo_order`` ``[P, n_orders, hc]``) and of every coalition of
  n-gram orders (``coalitions`` ``[P, 2**n_orders, hc]``, bit i of the index set = order
  ``orders[i]`` kept): the key of a left-out set is ``kv_f32 - (its parts)`` (a coalition's: the
  kept orders' parts summed, never subtracted from the total, so keeping none is exactly 0, as in
  the re-run, not float noise that the key's rstd would blow up), rounded as the module rounds and
  put through the same two functions - the arithmetic of a forward with those rows zeroed (a zero
  row quantises to zero and leaves the others' scales alone), up to float32 summation order, i.e.
  a key element may land one bf16 ulp apart. The gate never reads the value, so only the key
  columns are formed. Computed on demand, for the positions asked, and kept.
- ``shapley`` ``[P, n_orders, hc]``: exact Shapley values of the orders for the gate over the
  coalition gates; they sum to ``gate - coalitions[:, 0]`` (all orders minus none).

Image positions (``token_mask`` False) have gate 0 in every variant; their shares are still given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
import torch

from engram_viz.core.engram import Engram, engram_dot, engram_gate
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import InputError

CHUNK_FLOATS = 1 << 24  # float32 elements of the left-out keys per chunk of positions (64 MiB)
LEFT_OUT = ("loo_row", "loo_head", "coalitions", "loo_order", "shapley")


@dataclass
class LeftOutGates:
    """Gates with rows, heads or orders left out, coalitions of orders and the orders' Shapley
    values, for P positions (shapes in the module docstring)."""

    loo_row: torch.Tensor
    loo_head: torch.Tensor
    coalitions: torch.Tensor
    loo_order: torch.Tensor
    shapley: torch.Tensor


@dataclass
class _Source:
    """What the left-out gates are computed from: the module, its input streams ``x [T, hc, dim]``,
    the gathered rows ``[T, 24, head_dim]`` and the token mask ``[T]``, on the module's device."""

    engram: Engram
    x: torch.Tensor
    rows: torch.Tensor
    mask: torch.Tensor
    grid: torch.Tensor  # [n_orders, n_heads]: the column of each (order, head)


@dataclass
class LayerAttribution:
    """One Engram layer's attribution over the positions of one prompt (shapes in the module
    docstring; float32 CPU tensors). ``orders [24]`` / ``heads [24]``: the (order, head) owning
    each of the 24 columns (``EngramLayout.column``). The left-out gates are computed on demand:
    :meth:`left_out` for some positions, or the properties ``loo_row`` ... ``shapley`` for all."""

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
    source: _Source = field(repr=False)
    _kept: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)  # left-out gates [T, ...]

    def __post_init__(self) -> None:
        self._done = torch.zeros(self.gate.shape[0], dtype=torch.bool)  # positions in _kept

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
            raise InputError(f"group kind {kind!r} unknown; expected 'order' or 'head'")
        ids = sorted(set(owner.tolist()))
        index = torch.as_tensor([ids.index(o) for o in owner.tolist()])
        out = t.new_zeros((t.shape[0], len(ids), *t.shape[2:]))
        return out.index_add_(1, index, t)

    def left_out(self, index: Sequence[int] | None = None) -> LeftOutGates:
        """The left-out gates at ``index`` (indices into this attribution's positions; default all),
        computed for the positions not asked before, in chunks (:data:`CHUNK_FLOATS`)."""
        n = self.gate.shape[0]
        idx = list(range(n)) if index is None else [int(i) for i in index]
        bad = [i for i in idx if not 0 <= i < n]
        if bad:
            raise IndexError(f"position index {bad[0]} is outside this attribution's {n} positions")
        if not idx:
            raise IndexError("no position asked for; give at least one index (or None for all)")
        done = self._done.tolist()
        todo = [i for i in sorted(set(idx)) if not done[i]]
        step = _chunk_size(self.source)
        for s in range(0, len(todo), step):
            part = torch.as_tensor(todo[s : s + step])
            for name, t in zip(
                ("loo_row", "loo_head", "some", "loo_order"),
                _left_out_chunk(self.source, part.to(self.source.x.device)),
            ):
                if name not in self._kept:
                    self._kept[name] = t.new_full((n, *t.shape[1:]), torch.nan)
                self._kept[name][part] = t
            self._done[part] = True
        at = torch.as_tensor(idx)
        loo_row, loo_head, some, loo_order = (self._kept[k][at] for k in ("loo_row", "loo_head", "some", "loo_order"))
        coalitions = torch.cat([some, self.gate[at].unsqueeze(1)], dim=1)  # all orders kept: the gate
        return LeftOutGates(loo_row, loo_head, coalitions, loo_order, shapley_values(coalitions))

    loo_row = property(lambda self: self.left_out().loo_row)
    loo_head = property(lambda self: self.left_out().loo_head)
    coalitions = property(lambda self: self.left_out().coalitions)
    loo_order = property(lambda self: self.left_out().loo_order)
    shapley = property(lambda self: self.left_out().shapley)


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


def _column_grid(layout: EngramLayout) -> torch.Tensor:
    """int64 ``[n_orders, n_heads]``: the column owned by each (order, head), orders ascending."""
    cfg = layout.config
    return torch.as_tensor([[layout.column(o, h) for h in range(cfg.engram_n_heads)] for o in sorted(cfg.ngram_orders)])


def _by_grid(t: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
    """A per-column tensor ``[24, ...]`` as ``[n_orders, n_heads, ...]`` (a view when the columns
    are already order-major, as in the reference layout)."""
    flat = grid.flatten()
    if not torch.equal(flat, torch.arange(len(flat), device=flat.device)):
        t = t.index_select(0, flat)
    return t.view(*grid.shape, *t.shape[1:])


def shapley_values(coalitions: torch.Tensor) -> torch.Tensor:
    """Exact Shapley values ``[..., P, hc]`` of P players from coalition values ``[..., 2**P, hc]``
    (bit i of the index = player i in the coalition); they sum to ``v(all) - v(none)``."""
    p = coalitions.shape[-2].bit_length() - 1
    if 2**p != coalitions.shape[-2]:
        raise InputError(f"coalition values must number a power of two, got {coalitions.shape[-2]}")
    out = coalitions.new_zeros((*coalitions.shape[:-2], p, coalitions.shape[-1]))
    for i in range(p):
        others = [j for j in range(p) if j != i]
        for size in range(p):
            weight = math.factorial(size) * math.factorial(p - size - 1) / math.factorial(p)
            for members in combinations(others, size):
                s = sum(1 << j for j in members)
                out[..., i, :] += weight * (coalitions[..., s | 1 << i, :] - coalitions[..., s, :])
    return out


def _row_parts(
    engram: Engram, rows: torch.Tensor, cols: slice = slice(None), total: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(parts [24, n, N'], kv_f32 [n, N'])`` over the wkv output columns ``cols``: each row's
    share of the float32 wkv output (one GEMM per row), and (``total``) the output itself as the
    module's float32 GEMM computes it (before rounding)."""
    w = engram.wkv.weight.detach()[cols]
    a = engram.wkv.inputs(rows.flatten(-2))  # [n, K]
    n_cols = rows.shape[-2]
    per_row = a.unflatten(-1, (n_cols, -1)).transpose(0, 1)  # [24, n, head_dim]
    parts = torch.bmm(per_row, w.unflatten(-1, (n_cols, -1)).permute(1, 2, 0))  # [24, n, N']
    return parts, torch.nn.functional.linear(a, w) if total else None


def _gates(engram: Engram, h: torch.Tensor, mask: torch.Tensor, kv: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(numerator, dot, gate)`` ``[n, hc, V]`` of V keys per position and stream, ``kv [n, hc, V,
    dim]`` (float32, not yet rounded), for streams ``h [n, hc, dim]``: the key rounded as the
    module rounds it, then ``core.engram``'s formula, with ``numerator = sum(h * q * k * key)``
    and ``mean(key^2)`` reduced per variant (a batched matrix-vector product and a norm, so no
    temporary of the keys' size)."""
    dim = kv.shape[-1]
    dtype = engram.wkv.out_dtype
    key = kv if dtype == torch.float32 else kv.to(dtype).float()
    g = h * (engram.q_weight.float() * engram.k_weight.float()).detach()  # as engram_steps: (h * weight) * key
    numerator = torch.matmul(key, g.unsqueeze(-1)).squeeze(-1)
    key_sq = torch.linalg.vector_norm(key, dim=-1).square() / dim
    dot = engram_dot(numerator, h.square().mean(-1, keepdim=True), key_sq, engram.eps, dim)
    return numerator, dot, engram_gate(dot, engram.clamp_value).masked_fill(~mask.view(-1, 1, 1), 0)


def _left_out_chunk(src: _Source, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(loo_row [n, 24, hc], loo_head [n, H, hc], coalitions [n, 2**O - 1, hc] (all but the
    full one), loo_order [n, O, hc])`` at positions ``idx``: every left-out key formed by
    subtraction (rows, heads) or by the kept orders' sums (coalitions) into one preallocated
    tensor ``[n, hc, V, dim]``, then one pass of :func:`_gates`."""
    engram = src.engram
    hc, dim = engram.q_weight.shape
    n = len(idx)
    with torch.no_grad():
        parts, kv_f32 = _row_parts(engram, src.rows[idx], slice(0, hc * dim))  # key columns only
        parts, kv_f32 = parts.view(-1, n, hc, dim), kv_f32.view(n, hc, dim)
        n_orders, n_heads = src.grid.shape
        n_rows = parts.shape[0]
        grid = _by_grid(parts, src.grid)
        by_head, by_order = grid.sum(0), grid.sum(1)
        n_minus = n_rows + n_heads
        kv = kv_f32.new_empty((n, hc, n_minus + 2**n_orders - 1, dim))
        variant = kv.permute(2, 0, 1, 3)  # [V, n, hc, dim], written in place
        torch.sub(kv_f32, parts, out=variant[:n_rows])
        torch.sub(kv_f32, by_head, out=variant[n_rows:n_minus])
        variant[n_minus] = 0  # no order kept: the key is exactly 0
        for bits in range(1, 2**n_orders - 1):  # the full coalition is the gate itself
            torch.sum(by_order[[o for o in range(n_orders) if bits >> o & 1]], 0, out=variant[n_minus + bits])
        gate = _gates(engram, src.x[idx].float(), src.mask[idx], kv)[-1].transpose(1, 2).cpu()  # [n, V, hc]
    everything = 2**n_orders - 1
    loo_order = torch.stack([gate[:, n_minus + (everything ^ (1 << i))] for i in range(n_orders)], dim=1)
    return gate[:, :n_rows], gate[:, n_rows:n_minus], gate[:, n_minus:], loo_order


def _chunk_size(src: _Source) -> int:
    """Positions per chunk of left-out gates: their keys and the row parts within :data:`CHUNK_FLOATS`."""
    n_orders, n_heads = src.grid.shape
    n_variants = 2 * n_orders * n_heads + n_heads + 2**n_orders
    return max(1, CHUNK_FLOATS // (n_variants * src.x.shape[1] * src.x.shape[2]))


def _shares(
    engram: Engram, x: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor, grid: torch.Tensor, fwd: dict
) -> dict:
    """The shares of n positions: x ``[n, hc, dim]``, rows ``[n, 24, head_dim]``, mask ``[n]``;
    ``fwd``: the module's own key, value, dot and gate at these positions, or empty."""
    hc, dim = engram.q_weight.shape
    h = x.float()
    g = h * (engram.q_weight.float() * engram.k_weight.float()).detach()  # [n, hc, dim]
    parts, kv_f32 = _row_parts(engram, rows, total=not fwd)
    if fwd:
        dot, gate, value = fwd["dot"].float(), fwd["gate"].float(), fwd["value"].float()
        numerator = torch.linalg.vecdot(fwd["key"].float(), g)
    else:
        numerator, dot, gate = (
            t.squeeze(-1) for t in _gates(engram, h, mask, kv_f32[:, : hc * dim].view(-1, hc, 1, dim))
        )
        value = kv_f32[:, hc * dim :].to(engram.wkv.out_dtype).float()  # [n, dim], as the module's
    # dot = numerator * f, numerator = sum(h * q * k * key) linear in the key, f shared by the rows
    ratio = torch.where(numerator != 0, dot / numerator, torch.zeros_like(dot))
    key_num = torch.linalg.vecdot(parts[..., : hc * dim].unflatten(-1, (hc, dim)), g)  # [24, n, hc]
    dot_share = key_num.transpose(0, 1) * ratio.unsqueeze(1)  # [n, 24, hc]
    value_parts = parts[..., hc * dim :]  # [24, n, dim]
    unit = value / value.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    value_grid = _by_grid(value_parts, grid)  # [n_orders, n_heads, n, dim]
    value_by = {"order": value_grid.sum(1), "head": value_grid.sum(0)}
    return {
        "gate": gate,
        "dot": dot,
        "dot_share": dot_share,
        "dot_rounding": dot - dot_share.sum(1),
        "value_norm": value_parts.norm(dim=-1).T,
        "value_proj": torch.linalg.vecdot(value_parts, unit).T,
        "value_rounding": (value - value_parts.sum(0)).norm(dim=-1),
        "order_value_norm": value_by["order"].norm(dim=-1).T,
        "head_value_norm": value_by["head"].norm(dim=-1).T,
    }


def attribute_layer(
    engram: Engram,
    x: torch.Tensor,
    rows: torch.Tensor,
    token_mask: torch.Tensor,
    layout: EngramLayout | None = None,
    *,
    forward: dict[str, torch.Tensor] | None = None,
) -> LayerAttribution:
    """The attribution of every position of one sequence at one Engram layer.

    x ``[T, hc, dim]`` (the streams the layer read), rows ``[T, 24, head_dim]`` (as gathered,
    ``engram.L{n}.rows``), token_mask ``[T]`` bool. The shares are computed now, on the module's
    device in chunks of positions (memory bounded by :data:`CHUNK_FLOATS`), and returned on the
    CPU; the left-out gates when asked (:meth:`LayerAttribution.left_out`), from the module's
    weights as they are then. ``forward``: what the module computed on these inputs, ``key [T, hc,
    dim]``, ``value [T, dim]``, ``dot`` and ``gate [T, hc]`` (its hook captures): then ``gate``,
    ``dot`` and the value are the module's, bit for bit, and its GEMM is not repeated."""
    layout = layout or EngramLayout(engram.config)
    orders, heads = column_owners(layout)
    dev = engram.device
    grid = _column_grid(layout).to(dev)
    src = _Source(engram, x.to(dev), rows.to(dev), token_mask.to(dev), grid)
    step = max(1, CHUNK_FLOATS // (2 * rows.shape[1] * engram.wkv.weight.shape[0]))
    out: list[dict] = []
    with torch.no_grad():
        for s in range(0, x.shape[0], step):
            sl = slice(s, s + step)
            fwd = {k: forward[k][sl].to(dev) for k in ("key", "value", "dot", "gate")} if forward else {}
            c = _shares(engram, src.x[sl], src.rows[sl], src.mask[sl], grid, fwd)
            out.append({k: v.cpu() for k, v in c.items()})
    cat = {k: torch.cat([p[k] for p in out]) for k in out[0]}
    return LayerAttribution(layer=engram.layer_id, orders=orders, heads=heads, source=src, **cat)
