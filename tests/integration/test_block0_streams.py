"""Embed + block 0 on synthetic weights with the reference's names, shapes and dtypes (fp4 experts
included), against the independent float64 formulation in tests/block0_kit.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from block0_kit import SMALL, F64Block0, load_all

from engram_viz.core import fp4
from engram_viz.core.block0 import block0_streams
from engram_viz.core.engram import Engram
from engram_viz.core.hashing import hash_prompt
from engram_viz.core.hyper import hc_mixes
from engram_viz.core.moe import moe
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.core.window_attention import window_attention
from engram_viz.errors import CheckpointError
from engram_viz.weights.block0_reader import open_block0
from engram_viz.weights.checkpoint import open_checkpoint
from engram_viz.weights.synthetic import write_synthetic_checkpoint

GATE_TOL = 1e-2  # layer-1 gates, block-0 streams vs the float64 formulation's streams


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_synthetic_checkpoint(tmp_path_factory.mktemp("b0") / "ckpt", "tiny", seed=0, block0=SMALL)


@pytest.fixture(scope="module")
def prompts():
    """Two prompts of 24 tokens (3 windows of 8), the second with an image span at 5..10."""
    ids = torch.randint(0, 129280, (2, 24), generator=torch.Generator().manual_seed(0))
    types = torch.full((2, 24), -1)
    types[1, 5:11] = torch.tensor([0, 1, 1, 2, 1, 3])
    return ids, types


@pytest.fixture(scope="module")
def both(folder, prompts):
    ids, types = prompts
    w = open_block0(folder)
    return w, F64Block0(load_all(folder), SMALL), block0_streams(w, ids, types >= 0)


def _rel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.double() - b).norm(dim=-1) / b.norm(dim=-1)


def test_hyper_connection_mixes_equal_float64(both, prompts):
    w, ref, _ = both
    h = w.embed(prompts[0]).unsqueeze(2).repeat(1, 1, SMALL.hc_mult, 1)
    args = (w.tensor("hc_attn_fn"), w.tensor("hc_attn_scale"), w.tensor("hc_attn_base"))
    mine = hc_mixes(h, *args, norm_eps=SMALL.norm_eps, iters=SMALL.hc_sinkhorn_iters, eps=SMALL.hc_eps)
    for a, b in zip(mine, ref.mixes(h.double(), "attn")):
        torch.testing.assert_close(a.double(), b, rtol=0, atol=1e-5)
    comb = mine[2]
    torch.testing.assert_close(comb.sum(-2), torch.ones_like(comb.sum(-2)), rtol=0, atol=1e-4)  # Sinkhorn


def test_attention_and_moe_equal_float64(both, prompts):
    w, ref, _ = both
    ids, types = prompts
    x = w.embed(ids)
    names = {"attn_sink": "attn.attn_sink", "q_norm": "attn.q_norm.weight", "kv_norm": "attn.kv_norm.weight"}
    attn_w = {k: w.tensor(v) for k, v in names.items()} | {"wo_a": w.tensor("attn.wo_a.weight")}
    lin = {k: w.linear(f"attn.{k}") for k in ("wq_a", "wq_b", "wkv", "wo_b")}
    err = _rel(window_attention(x, attn_w, lin, SMALL), ref.attention(x.double()))
    assert err.median() < 1e-3 and err.max() < 2e-2, (err.median(), err.max())
    gate = {
        "gate": w.tensor("ffn.gate.weight"),
        "bias": w.tensor("ffn.gate.bias"),
        "bias_vl": w.tensor("ffn.gate.bias_vl"),
    }
    shared = tuple(w.linear(f"ffn.shared_experts.{k}") for k in ("w1", "w2", "w3"))
    err = _rel(moe(x, gate, shared, w.expert, SMALL, types >= 0), ref.moe(x.double(), types >= 0))
    assert err.median() < 1e-3 and err.max() < 2e-2, (err.median(), err.max())


def test_block0_streams_and_layer1_gates_within_tolerance(folder, both, prompts):
    w, ref, x = both
    ids, types = prompts
    xr = ref.streams(ids, types >= 0)
    assert x.shape == (2, 24, SMALL.hc_mult, SMALL.dim) and x.dtype == torch.bfloat16
    err = _rel(x, xr)
    assert err.median() < 1e-3 and err.max() < 5e-2, (err.median(), err.max())
    ckpt = open_checkpoint(folder)
    mask = types < 0
    hashes = hash_prompt(ckpt.config, get_tokenizer(ckpt.config).token_map, ids, mask)
    engram = Engram.from_weights(ckpt.config, ckpt.layer(1), mode="fp8", device="cpu")
    gates = {}
    emb = w.embed(ids).unsqueeze(2).repeat(1, 1, SMALL.hc_mult, 1)
    for name, s in (("block0", x), ("f64", xr.float()), ("embedding", emb)):
        with engram.hook_gate.add_hook(lambda t, n, name=name: gates.__setitem__(name, t.clone())):
            engram(s, hashes[:, :, 0], mask)
    assert (gates["block0"] - gates["f64"]).abs().max() <= GATE_TOL
    assert (gates["embedding"] - gates["f64"]).abs()[mask].mean() > 5 * GATE_TOL  # the proxy is far off


def test_each_used_expert_is_read_once_per_batch(folder, prompts):
    w = open_block0(folder)
    ids, types = prompts
    block0_streams(w, ids, types >= 0)
    assert 0 < w.experts_read <= SMALL.n_routed_experts


def test_fp4_nibble_order_and_scales():
    packed = torch.tensor([[0x21, 0xF8]], dtype=torch.uint8)  # codes 1, 2, 8, 15 -> 0.5, 1.0, -0.0, -6.0
    scale = torch.full((1, 1), 128, dtype=torch.uint8).view(torch.float8_e8m0fnu)  # 2.0
    packed = torch.cat([packed, torch.zeros(1, 14, dtype=torch.uint8)], 1)
    out = fp4.dequantize_fp4(packed, scale)[0, :4]
    assert out.tolist() == [1.0, 2.0, -0.0, -12.0]
    x = torch.tensor([[0.25, 0.75, 1.75, -3.5, 5.0, 6.0] + [0.0] * 26])
    assert fp4.dequantize_fp4(fp4.encode_fp4(x), scale)[0, :6].tolist() == [0.0, 2.0, 4.0, -8.0, 8.0, 12.0]


def test_missing_or_wrong_block0_tensor_is_named(tmp_path, folder):
    plain = write_synthetic_checkpoint(tmp_path / "plain", "tiny", seed=0)
    with pytest.raises(CheckpointError, match=r"has no block-0 tensors .*layers\.0\.hc_attn_\*"):
        open_block0(plain, SMALL)
    more = replace(SMALL, n_routed_experts=SMALL.n_routed_experts + 1)  # expert 8 is not in the folder
    with pytest.raises(CheckpointError, match=r"6 of \d+ block-0 tensors are missing: 'layers\.0\.ffn\.experts\.8\.w1"):
        open_block0(folder, more)
