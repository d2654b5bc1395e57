"""Exactness of the gate attribution (analysis/explain/attribution.py) on one Engram layer with random
tiny-preset weights: shares sum to the module's dot and value, Shapley efficiency, and every
left-out gate equals a forward with those rows zeroed through the module's ``rows`` hook."""

from __future__ import annotations

import itertools

import pytest
import torch

from engram_viz.analysis.explain.attribution import attribute_layer, shapley_values
from engram_viz.config import load_config
from engram_viz.core import fp8
from engram_viz.core.engram import Engram

pytestmark = pytest.mark.unit
LAYER, T = 1, 11
BF16_REL = 2.0**-8  # one bf16 ulp, relative (the key/value rounding of the fp8 and bf16 modes)


def _module(mode: str) -> Engram:
    config = load_config("tiny")
    g = torch.Generator().manual_seed(1)
    n_rows = config.engram_num_embeddings[config.engram_layer_ids.index(LAYER)]
    raw = torch.randn(n_rows, config.engram_head_dim, generator=g) * torch.exp(torch.randn(n_rows, 1, generator=g))
    w, s = fp8.quantize_rows(raw)
    n, k = config.dim * (config.hc_mult + 1), config.n_hash_cols * config.engram_head_dim
    q = 1 + 0.3 * torch.randn(config.hc_mult, config.dim, generator=g)
    kw = 1 + 0.3 * torch.randn(config.hc_mult, config.dim, generator=g)
    wkv = torch.randn(n, k, generator=g) * k**-0.5
    return Engram(config, LAYER, lambda ids: fp8.dequantize_rows(w[ids], s[ids]), wkv, q, kw, mode=mode, device="cpu")


def _inputs(engram: Engram) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, T, engram.hc_mult, engram.dim, generator=g) * 3
    n_rows = engram.config.engram_num_embeddings[engram.layer_hash_index]
    ids = torch.randint(0, n_rows, (1, T, engram.n_hash_cols), generator=g)
    mask = torch.ones(1, T, dtype=torch.bool)
    mask[0, 5] = False  # an image position: gate shut in every variant
    return x, ids, mask


def _forward(engram: Engram, x, ids, mask, zero_cols=()) -> dict[str, torch.Tensor]:
    """A plain forward, rows of ``zero_cols`` zeroed through the rows hook; captures key/value/dot/gate."""
    seen: dict[str, torch.Tensor] = {}
    handles = [
        getattr(engram, f"hook_{site}").add_hook(lambda t, name, site=site: seen.__setitem__(site, t[0]))
        for site in ("rows", "key", "value", "dot", "gate")
    ]
    cols = torch.as_tensor(list(zero_cols), dtype=torch.int64)
    handles.insert(0, engram.hook_rows.add_hook(lambda t, name: t.index_fill(-2, cols, 0) if len(cols) else None))
    try:
        with torch.no_grad():
            engram(x, ids, mask)
    finally:
        for h in handles:
            h.remove()
    return seen


@pytest.fixture(scope="module", params=["fp8", "float32"])
def case(request):
    engram = _module(request.param)
    x, ids, mask = _inputs(engram)
    ref = _forward(engram, x, ids, mask)
    return engram, x, ids, mask, ref, attribute_layer(engram, x[0], ref["rows"], mask[0])


def test_variant_zero_is_the_module(case):
    *_, ref, a = case
    torch.testing.assert_close(a.gate, ref["gate"], atol=1e-6, rtol=0)
    torch.testing.assert_close(a.dot, ref["dot"], atol=1e-5, rtol=1e-6)
    assert (a.gate[5] == 0).all() and (a.loo_row[5] == 0).all() and (a.coalitions[5] == 0).all()


def test_dot_shares_sum_to_the_module_dot(case):
    engram, x, *_, ref, a = case
    total = a.dot_share.sum(1)
    torch.testing.assert_close(total + a.dot_rounding, a.dot, atol=1e-6, rtol=0)
    g = x[0].float() * engram.q_weight * engram.k_weight
    numerator = (g * ref["key"]).sum(-1)
    factor = (ref["dot"] / numerator).abs()
    if engram.mode == "float32":
        torch.testing.assert_close(total, ref["dot"], atol=1e-5, rtol=1e-5)
    else:  # the key is rounded to bf16: each element moves at most half an ulp
        bound = factor * (g.abs() * ref["key"].abs()).sum(-1) * BF16_REL
        assert (a.dot_rounding.abs() <= bound + 1e-6).all()
        assert a.dot_rounding.abs().max() > 0  # the rounding is really there and reported
    # per order and per head: the same total
    torch.testing.assert_close(a.group(a.dot_share, "order").sum(1), total, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.group(a.dot_share, "head").sum(1), total, atol=1e-5, rtol=1e-5)


def test_value_parts_sum_to_the_module_value(case):
    engram, *_, ref, a = case
    norm = ref["value"].norm(dim=-1)
    rel = 1e-5 if engram.mode == "float32" else BF16_REL
    torch.testing.assert_close(a.value_proj.sum(1), norm, atol=1e-4, rtol=rel)
    assert (a.value_rounding <= norm * rel + 1e-5).all()
    assert (a.order_value_norm <= a.group(a.value_norm.unsqueeze(-1), "order").squeeze(-1) + 1e-4).all()
    assert a.value_norm.shape == (T, engram.n_hash_cols) and a.head_value_norm.shape == (T, 8)


def test_shapley_efficiency(case):
    *_, a = case
    torch.testing.assert_close(a.shapley.sum(1), a.gate - a.coalitions[:, 0], atol=1e-6, rtol=0)
    assert torch.equal(a.coalitions[:, -1], a.gate)  # all orders kept = nothing left out


def test_shapley_values_of_a_known_game():
    # v(S) = |S|^2 over 3 symmetric players: each gets v(all) / 3; an additive game gives its weights
    v = torch.tensor([[s.bit_count() ** 2 for s in range(8)]], dtype=torch.float32).unsqueeze(-1)
    torch.testing.assert_close(shapley_values(v)[0, :, 0], torch.full((3,), 3.0))
    w = torch.tensor([1.0, -2.0, 5.0])
    additive = torch.tensor([[sum(w[i] for i in range(3) if s >> i & 1) for s in range(8)]]).unsqueeze(-1)
    torch.testing.assert_close(shapley_values(additive)[0, :, 0], w)


def _close_to_rerun(engram, got: torch.Tensor, want: torch.Tensor) -> None:
    # float32 summation order differs; in fp8 mode a key element may land one bf16 ulp apart
    atol = 1e-5 if engram.mode == "float32" else 2e-3
    torch.testing.assert_close(got, want, atol=atol, rtol=0)
    assert (got - want).abs().median() <= 1e-6


def test_leave_one_row_out_equals_a_rerun_with_the_row_zeroed(case):
    engram, x, ids, mask, _, a = case
    for col in range(engram.n_hash_cols):
        _close_to_rerun(engram, a.loo_row[:, col], _forward(engram, x, ids, mask, [col])["gate"])


def test_orders_heads_and_coalitions_equal_reruns(case):
    engram, x, ids, mask, _, a = case
    for i, order in enumerate(a.order_ids):
        cols = [c for c in range(24) if a.orders[c] == order]
        _close_to_rerun(engram, a.loo_order[:, i], _forward(engram, x, ids, mask, cols)["gate"])
    for i, head in enumerate(a.head_ids):
        cols = [c for c in range(24) if a.heads[c] == head]
        _close_to_rerun(engram, a.loo_head[:, i], _forward(engram, x, ids, mask, cols)["gate"])
    for bits, kept in enumerate(itertools.chain.from_iterable(itertools.combinations(a.order_ids, k) for k in (0, 1))):
        s = sum(1 << a.order_ids.index(o) for o in kept)
        cols = [c for c in range(24) if a.orders[c] not in kept]
        _close_to_rerun(engram, a.coalitions[:, s], _forward(engram, x, ids, mask, cols)["gate"])


def test_chunks_change_nothing(case, monkeypatch):
    engram, x, _, mask, ref, a = case
    monkeypatch.setattr("engram_viz.analysis.explain.attribution.CHUNK_FLOATS", 1)  # one position per chunk
    b = attribute_layer(engram, x[0], ref["rows"], mask[0])
    torch.testing.assert_close(b.dot_share, a.dot_share, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b.shapley, a.shapley, atol=2e-5, rtol=0)


def test_left_out_on_demand_equals_all_at_once(case):
    engram, x, _, mask, ref, a = case
    b = attribute_layer(engram, x[0], ref["rows"], mask[0])
    some = b.left_out([7, 2, 7])  # asked first for two positions (one twice), then for all
    every = b.left_out()
    for name in ("loo_row", "loo_head", "coalitions", "loo_order", "shapley"):
        assert torch.equal(getattr(some, name), getattr(every, name)[[7, 2, 7]])
        _close_to_rerun(engram, getattr(every, name), getattr(a, name))  # other batches: other GEMM sums
    with pytest.raises(IndexError, match="outside"):
        b.left_out([T])


def test_the_modules_own_forward_is_taken_as_is(case):
    engram, x, _, mask, ref, a = case
    fwd = {k: ref[k] for k in ("key", "value", "dot", "gate")}
    b = attribute_layer(engram, x[0], ref["rows"], mask[0], forward=fwd)
    assert torch.equal(b.gate, ref["gate"]) and torch.equal(b.dot, ref["dot"])
    torch.testing.assert_close(b.dot_share, a.dot_share, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b.value_proj, a.value_proj, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b.loo_row, a.loo_row, atol=0, rtol=0)  # the left-out gates never read fwd
