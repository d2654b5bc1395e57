"""The Engram module against an independent float64 computation of the seed's formula, its hook
points, wkv modes, devices, training, input errors and the ``params`` CLI."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from _reference_math import dequant_blocks, dequant_rows, engram_gate_math, engram_reference, gemm_orders_apart
from torch import nn

from engram_viz.cli import main as cli_main
from engram_viz.config import load_config
from engram_viz.core import fp8
from engram_viz.core.engram import (
    CPU_CUDA_GATE_ATOL,
    WKV_MODES,
    Engram,
    param_counts,
    tensor_shapes,
)
from engram_viz.core.hooks import HOOK_SITES

LAYER = 1
B, T = 2, 9


class SmallFp8Table:
    """A test-only fp8 table (rows e4m3 + e8m0 scales in memory); records where it was gathered."""

    label, synthetic = "test table", True

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor):
        self.weight, self.scale = weight, scale
        self.num_rows, self.head_dim = weight.shape
        self.devices: list[torch.device] = []

    def __call__(self, row_ids: torch.Tensor) -> torch.Tensor:
        self.devices.append(row_ids.device)
        return fp8.dequantize_rows(self.weight[row_ids], self.scale[row_ids])


@pytest.fixture(scope="module")
def weights():
    """Random tiny-preset weights for layer 1 in the checkpoint's formats (as EngramWeights)."""
    config = load_config("tiny")
    g = torch.Generator().manual_seed(0)
    rows = config.engram_num_embeddings[config.engram_layer_ids.index(LAYER)]
    # rows of very different magnitudes, so the per-32 scales vary
    raw = torch.randn(rows, config.engram_head_dim, generator=g) * torch.exp(2 * torch.randn(rows, 1, generator=g))
    table = SmallFp8Table(*fp8.quantize_rows(raw))
    n, k = config.dim * (config.hc_mult + 1), config.n_hash_cols * config.engram_head_dim
    wq, ws = fp8.quantize_matrix(torch.randn(n, k, generator=g) * k**-0.5)
    q = (1 + 0.3 * torch.randn(config.hc_mult, config.dim, generator=g)).to(torch.bfloat16)
    kw = (1 + 0.3 * torch.randn(config.hc_mult, config.dim, generator=g)).to(torch.bfloat16)
    return SimpleNamespace(layer_id=LAYER, table=table, wkv_weight=wq, wkv_scale=ws, q_weight=q, k_weight=kw)


@pytest.fixture(scope="module")
def inputs(weights):
    config = load_config("tiny")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, config.hc_mult, config.dim, generator=g) * 3
    ids = torch.randint(0, weights.table.num_rows, (B, T, config.n_hash_cols), generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, 2:5] = False  # an "image span"
    mask[1, 0] = False
    return x, ids, mask


def capture(engram: Engram, *args, **kwargs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    seen: dict[str, torch.Tensor] = {}
    handles = [
        p.add_hook(lambda t, name: seen.__setitem__(name.split(".")[-1], t.clone()))
        for p in engram.hook_points().values()
    ]
    try:
        out = engram(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return out, seen


def f64(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().double().numpy()


@pytest.mark.parametrize("mode", ["fp8", "bf16"])
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_forward_equals_float64_reference(weights, inputs, mode, x_dtype):
    config = load_config("tiny")
    x, ids, mask = inputs
    x = x.to(x_dtype)
    engram = Engram.from_weights(config, weights, mode=mode, device="cpu")
    out, seen = capture(engram, x, ids, mask)
    assert out.dtype == x_dtype and out.shape == x.shape

    rows64 = dequant_rows(weights.table.weight[ids], weights.table.scale[ids])
    wkv64 = dequant_blocks(weights.wkv_weight, weights.wkv_scale)
    q64, k64 = f64(weights.q_weight), f64(weights.k_weight)
    ref = engram_reference(f64(x), rows64, wkv64, q64, k64, config.norm_eps, mask.numpy(), mode)

    # rows: the exact dequantised values
    assert np.array_equal(f64(seen["rows"]), rows64)
    # key / value: one bf16 rounding of the float32-accumulated GEMM (float64 here)
    hc, dim = config.hc_mult, config.dim
    kv = np.concatenate([f64(seen["key"]).reshape(B, T, hc * dim), f64(seen["value"])], -1)
    assert np.all(np.abs(kv - ref["kv_exact"]) <= 2.0**-8 * np.abs(ref["kv_exact"]) + 1e-6 * ref["act_abs_wkv"])
    assert np.mean(kv == ref["kv"]) > 0.99  # nearly all equal the float64 value rounded once to bf16

    # dot, gate, out: the seed's formula in float64 on the module's own key and value
    own = engram_gate_math(f64(x), f64(seen["key"]), f64(seen["value"]), q64, k64, config.norm_eps, mask.numpy())
    np.testing.assert_allclose(f64(seen["dot"]), own["dot"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(f64(seen["gate"]), own["gate"], rtol=0, atol=1e-6)
    if x_dtype == torch.float32:
        np.testing.assert_allclose(f64(out), own["out"], rtol=1e-6, atol=1e-5)
    else:  # rounded once to bf16
        assert np.all(np.abs(f64(out) - own["out"]) <= 2.0**-8 * np.abs(own["out"]) + 1e-5)
    # end to end against the fully independent path (key/value rounding may differ by one bf16 ulp)
    assert np.max(np.abs(f64(seen["gate"]) - ref["gate"])) < 1e-3
    assert np.median(np.abs(f64(seen["gate"]) - ref["gate"])) < 1e-5

    # masked positions: gate exactly 0, streams pass through unchanged
    shut = ~mask
    assert torch.all(seen["gate"][shut] == 0)
    assert torch.equal(out[shut], x[shut])
    assert torch.all(seen["gate"][mask] > 0)


def test_fp8_mode_is_fp8_linear_with_cached_weight(weights, inputs, monkeypatch):
    x, ids, _ = inputs
    engram = Engram.from_weights("tiny", weights, mode="fp8", device="cpu", gemm="float32")  # bf16: test_wkv.py
    rows = weights.table(ids).flatten(-2)
    want = fp8.fp8_linear(rows, weights.wkv_weight, weights.wkv_scale)
    calls = []
    monkeypatch.setattr(fp8, "dequantize_blocks", lambda *a: calls.append(a))
    assert torch.equal(engram.wkv(rows), want)
    engram(x, ids)
    assert calls == []  # the weight was dequantised once, at construction


def test_modes_differ_only_by_activation_quantisation(weights, inputs):
    _, ids, _ = inputs
    engram = Engram.from_weights("tiny", weights, mode="bf16", device="cpu", gemm="float32")  # bf16: test_wkv.py
    rows = weights.table(ids).flatten(-2)
    w = fp8.dequantize_blocks(weights.wkv_weight, weights.wkv_scale)
    assert engram.mode == "bf16" and engram.wkv(rows).dtype == torch.bfloat16
    assert torch.equal(engram.wkv(rows), (rows.float() @ w.T).to(torch.bfloat16))
    engram.mode = "float32"
    assert torch.equal(engram.wkv(rows), rows.float() @ w.T)
    engram.mode = "fp8"
    a = fp8.dequantize_blockwise(*fp8.quantize_blockwise(rows))
    assert torch.equal(engram.wkv(rows), (a @ w.T).to(torch.bfloat16))
    with pytest.raises(ValueError, match="wkv mode 'fp4' unknown"):
        engram.mode = "fp4"
    assert WKV_MODES == ("fp8", "bf16", "float32")


def test_hook_points_names_shapes_and_dtypes(weights, inputs):
    config = load_config("tiny")
    x, ids, mask = inputs
    engram = Engram.from_weights(config, weights, device="cpu")
    assert set(engram.hook_points()) == {f"engram.L{LAYER}.{s}" for s in HOOK_SITES}
    _, seen = capture(engram, x.to(torch.bfloat16), ids, mask)
    hc, dim, hd = config.hc_mult, config.dim, config.engram_head_dim
    want = {
        "streams": ((B, T, hc, dim), torch.bfloat16),
        "token_mask": ((B, T), torch.bool),
        "hash_ids": ((B, T, 24), torch.int64),
        "rows": ((B, T, 24, hd), torch.bfloat16),
        "key": ((B, T, hc, dim), torch.float32),
        "value": ((B, T, dim), torch.float32),
        "dot": ((B, T, hc), torch.float32),
        "gate": ((B, T, hc), torch.float32),
        "out": ((B, T, hc, dim), torch.bfloat16),
    }
    assert {k: (tuple(v.shape), v.dtype) for k, v in seen.items()} == want
    assert torch.equal(seen["streams"], x.to(torch.bfloat16))  # the streams the layer was given, as given
    # no mask given: the mask hook sees all True
    _, seen = capture(engram, x, ids)
    assert seen["token_mask"].all()


def test_forced_gate_changes_output_as_the_formula_says(weights, inputs):
    x, ids, mask = inputs
    engram = Engram.from_weights("tiny", weights, device="cpu")
    plain, seen = capture(engram, x, ids, mask)
    forced = torch.zeros(B, T, 4)
    forced[..., 0] = 1.0  # open stream 0 fully everywhere (masked positions too), shut the others
    forced[1, 3, 2] = 0.25
    handle = engram.hook_gate.add_hook(lambda gate, name: forced)
    out = engram(x, ids, mask)
    handle.remove()
    want = f64(x) + f64(forced)[..., None] * f64(seen["value"])[..., None, :]
    np.testing.assert_allclose(f64(out), want, rtol=1e-6, atol=1e-6)
    assert torch.equal(out[..., 1, :], x[..., 1, :])  # gate 0: untouched
    # shutting every gate returns x exactly; removing the hook restores the plain output bitwise
    with engram.hook_gate.add_hook(lambda gate, name: torch.zeros_like(gate)):
        assert torch.equal(engram(x, ids, mask), x)
    assert torch.equal(engram(x, ids, mask), plain)


def test_hooks_observe_without_changing_and_reject_bad_replacements(weights, inputs):
    x, ids, mask = inputs
    engram = Engram.from_weights("tiny", weights, device="cpu")
    plain = engram(x, ids, mask)
    observed, _ = capture(engram, x, ids, mask)
    assert torch.equal(plain, observed)
    assert all(not p.fns for p in engram.hook_points().values())  # capture removed its hooks
    engram.hook_dot.add_hook(lambda t, name: t[..., :2])
    with pytest.raises(ValueError, match=r"hook on engram.L1.dot returned shape \[2, 9, 2\]; expected \[2, 9, 4\]"):
        engram(x, ids, mask)
    engram.hook_dot.remove_hooks()
    engram.hook_dot.add_hook(lambda t, name: 3)
    with pytest.raises(TypeError, match="returned int"):
        engram(x, ids, mask)
    engram.hook_dot.remove_hooks()
    # editing the token mask shuts the gate there; editing hash_ids redirects the rows
    engram.hook_token_mask.add_hook(lambda m, name: torch.zeros_like(m))
    assert torch.equal(engram(x, ids, mask), x)
    engram.hook_token_mask.remove_hooks()
    engram.hook_hash_ids.add_hook(lambda h, name: torch.zeros_like(h))
    _, seen = capture(engram, x, ids, mask)
    engram.hook_hash_ids.remove_hooks()
    assert torch.equal(seen["rows"], weights.table(torch.zeros_like(ids)))


def test_zero_stream_uses_eps_as_is_and_the_clamp(weights, inputs):
    """h = 0: rsqrt(0 + 1e-20) stays finite, dot = 0, gate = sigmoid(copysign(sqrt(1e-6), 0)) = sigmoid(1e-3)."""
    x, ids, _ = inputs
    engram = Engram.from_weights("tiny", weights, device="cpu")
    assert engram.eps == 1e-20
    x = x.clone()
    x[0, 0] = 0
    out, seen = capture(engram, x, ids)
    assert torch.all(seen["dot"][0, 0] == 0)
    assert torch.allclose(seen["gate"][0, 0], torch.sigmoid(torch.tensor(1e-3)))
    assert torch.isfinite(out).all()


def test_input_errors_name_the_input(weights, inputs):
    x, ids, mask = inputs
    engram = Engram.from_weights("tiny", weights, device="cpu")
    with pytest.raises(ValueError, match=r"x must have shape \[B, T, 4, 64\]"):
        engram(x[..., :32], ids)
    with pytest.raises(TypeError, match="x must be a floating tensor"):
        engram(x.long(), ids)
    with pytest.raises(ValueError, match=r"hash_ids must have shape \[2, 9, 24\]"):
        engram(x, ids[..., :8])
    with pytest.raises(TypeError, match="hash_ids must be an int64 tensor"):
        engram(x, ids.float())
    bad = ids.clone()
    bad[1, 1, 1] = weights.table.num_rows
    with pytest.raises(ValueError, match=f"hash_ids holds row {weights.table.num_rows}; the layer 1 table has rows"):
        engram(x, bad)
    with pytest.raises(TypeError, match="token_mask must be a bool tensor"):
        engram(x, ids, mask.long())
    with pytest.raises(ValueError, match=r"token_mask must have shape \[2, 9\]"):
        engram(x, ids, mask[:, :3])
    with pytest.raises(ValueError, match="layer 2 is not an Engram layer"):
        Engram("tiny", 2, weights.table)
    with pytest.raises(ValueError, match=r"q_weight has shape \[4, 32\]"):
        Engram("tiny", LAYER, weights.table, q_weight=torch.ones(4, 32))
    short = SimpleNamespace(
        **{**vars(weights), "table": SmallFp8Table(weights.table.weight[:10], weights.table.scale[:10])}
    )
    with pytest.raises(ValueError, match="table of layer 1 has 10 rows; config 'tiny' expects 50,148"):
        Engram.from_weights("tiny", short, device="cpu")


def test_from_weights_is_frozen_and_keeps_the_table_off_the_module(weights):
    engram = Engram.from_weights("tiny", weights, device="cpu")
    assert all(not p.requires_grad for p in engram.parameters())
    assert engram.wkv.weight.dtype == torch.float32 and engram.q_weight.dtype == torch.bfloat16
    assert engram.table is weights.table and engram.embed is weights.table
    assert {n for n, _ in engram.named_parameters()} == {"wkv.weight", "q_weight", "k_weight"}
    assert engram.device == torch.device("cpu")


def test_trainable_table_and_weights_receive_gradients():
    config = load_config("tiny")

    class FloatTable(nn.Module):
        def __init__(self, rows: int, dim: int):
            super().__init__()
            self.num_rows = rows
            self.weight = nn.Parameter(torch.randn(rows, dim) * 0.1)

        def forward(self, row_ids):
            return nn.functional.embedding(row_ids, self.weight)

    g = torch.Generator().manual_seed(5)
    table = FloatTable(config.engram_num_embeddings[0], config.engram_head_dim)
    engram = Engram(config, LAYER, table, mode="float32", device="cpu", generator=g)
    assert {n for n, _ in engram.named_parameters()} == {"table.weight", "wkv.weight", "q_weight", "k_weight"}
    x = torch.randn(B, T, 4, 64, generator=g)
    ids = torch.randint(0, table.num_rows, (B, T, 24), generator=g)
    out = engram(x, ids)
    assert out.dtype == torch.float32
    out.square().mean().backward()
    for name, p in engram.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    # bf16 mode trains too (the bf16 rounding passes gradients)
    engram.zero_grad()
    engram.mode = "bf16"
    engram(x, ids).square().mean().backward()
    assert engram.wkv.weight.grad.abs().sum() > 0


def test_a_plain_callable_table_and_default_init():
    config = load_config("tiny")
    table = lambda ids: torch.ones(*ids.shape, config.engram_head_dim, dtype=torch.bfloat16)
    engram = Engram(config, 3, table, device="cpu", trainable=False)
    assert torch.equal(engram.q_weight, torch.ones(4, 64)) and engram.layer_hash_index == 1
    out = engram(torch.randn(1, 3, 4, 64), torch.zeros(1, 3, 24, dtype=torch.int64))
    assert out.shape == (1, 3, 4, 64)


def test_param_counts_v41():
    counts = param_counts("v41-flash")
    assert counts[14] == {
        "table": 98_308_270_592,
        "wkv": 157_286_400,
        "gate_weights": 40_960,
        "total": 98_465_597_952,
        "scales_not_counted": 384_016_682 * 8 + 800 * 192,
    }
    assert counts[1]["table"] == 384_006_168 * 256 and counts[1]["wkv"] == 157_286_400
    shapes = tensor_shapes("v41-flash", 14)
    assert shapes["wkv.weight"] == ((25600, 6144), torch.float8_e4m3fn)
    assert shapes["wkv.scale"] == ((800, 192), torch.float8_e8m0fnu)


def test_params_cli(capsys):
    assert cli_main(["params", "--config", "v41-flash", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["layers"]["14"]["table"] == 98_308_270_592
    assert data["layers"]["14"]["wkv"] == 157_286_400
    assert data["layers"]["14"]["gate_weights"] == 40_960
    assert data["layers"]["14"]["total"] == 98_465_597_952
    assert cli_main(["params", "--config", "v41-flash"]) == 0
    text = capsys.readouterr().out
    for figure in ("98,308,270,592", "157,286,400", "40,960", "98,465,597,952"):
        assert figure in text
    assert cli_main(["params"]) == 0  # default config: the embedded default model's
    assert "layer 3" in capsys.readouterr().out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", ["fp8", "bf16"])
def test_cpu_and_cuda_agree_within_the_stated_tolerance(weights, inputs, mode):
    """Keys/values within their bf16 rounding plus the float32 summation-order bound; each device's dot and gate follow the formula on its own
    key/value; where the keys are bit-equal the gates agree to float32 rounding; all gates within
    the stated CPU_CUDA_GATE_ATOL (its p99 / dot figures are stated for v41-flash size and checked
    there by benchmarks/gpu_check.py: a one-ulp key flip moves dot ~9x more at this tiny dim)."""
    config = load_config("tiny")
    x, ids, mask = inputs
    cpu = Engram.from_weights(config, weights, mode=mode, device="cpu")
    gpu = Engram.from_weights(config, weights, mode=mode, device="cuda")
    weights.table.devices.clear()
    _, seen_c = capture(cpu, x, ids, mask)
    out_g, seen_g = capture(gpu, x.cuda(), ids, mask)
    assert all(d.type == "cpu" for d in weights.table.devices)  # gathered on the host
    assert out_g.device.type == "cuda" and seen_g["gate"].device.type == "cuda"
    seen_g = {k: v.cpu() for k, v in seen_g.items()}
    # each kv element: within its bf16 rounding on either side (half an ulp each) plus how far two
    # float32 summation orders can land apart, which dominates where the sum cancels to near 0
    kv_c = torch.cat([seen_c["key"].flatten(-2), seen_c["value"]], -1).double()
    kv_g = torch.cat([seen_g["key"].flatten(-2), seen_g["value"]], -1).double()
    apart = gemm_orders_apart(f64(seen_c["rows"].flatten(-2)), dequant_blocks(weights.wkv_weight, weights.wkv_scale))
    bound = 2.0**-8 * (kv_c.abs() + kv_g.abs()) + torch.from_numpy(apart)
    assert torch.all((kv_c - kv_g).abs() <= bound)
    assert (kv_c == kv_g).double().mean() > 0.99  # the orders differ in a few elements, not all
    q64, k64 = f64(weights.q_weight), f64(weights.k_weight)
    own = engram_gate_math(f64(x), f64(seen_g["key"]), f64(seen_g["value"]), q64, k64, config.norm_eps, mask.numpy())
    np.testing.assert_allclose(f64(seen_g["dot"]), own["dot"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(f64(seen_g["gate"]), own["gate"], rtol=0, atol=1e-6)
    diff = (seen_g["gate"] - seen_c["gate"]).abs()
    same_key = (seen_g["key"] == seen_c["key"]).all(-1)
    assert diff[same_key].max() <= 1e-5
    assert diff.max() <= CPU_CUDA_GATE_ATOL
    assert torch.equal(seen_g["gate"][~mask], seen_c["gate"][~mask])
    assert torch.equal(out_g.cpu()[~mask], x[~mask])


def test_end_to_end_on_the_synthetic_tiny_checkpoint():
    """The real pieces together: synthetic checkpoint (lazy fp8 table), hasher, embedding streams,
    Engram.from_weights - against the independent float64 path fed by the table's own fp8 bytes."""
    from engram_viz.core.hashing import hash_prompt
    from engram_viz.run.streams import embedding_streams
    from engram_viz.weights.synthetic import synthetic_checkpoint

    ckpt = synthetic_checkpoint("tiny")
    config = ckpt.config
    g = torch.Generator().manual_seed(7)
    raw = torch.randint(0, config.vocab_size, (2, 12), generator=g)
    types = torch.full((2, 12), -1)
    types[1, 4:8] = torch.tensor([0, 1, 2, 3])
    streams = embedding_streams(ckpt, raw, types)
    token_map = np.arange(config.vocab_size, dtype=np.int64) % config.engram_compressed_vocab_size
    ids = hash_prompt(config, token_map, raw, streams.token_mask)
    for li, layer_id in enumerate(config.engram_layer_ids):
        weights = ckpt.layer(layer_id)
        engram = Engram.from_weights(config, weights, mode="fp8", device="cpu")
        assert "SYNTHETIC" in weights.table.label and engram.table is weights.table
        out, seen = capture(engram, streams.x, ids[:, :, li], streams.token_mask)
        rows64 = dequant_rows(*weights.table.gather_fp8(ids[:, :, li]))
        assert np.array_equal(f64(seen["rows"]), rows64)
        ref = engram_reference(
            f64(streams.x),
            rows64,
            dequant_blocks(weights.wkv_weight, weights.wkv_scale),
            f64(weights.q_weight),
            f64(weights.k_weight),
            config.norm_eps,
            streams.token_mask.numpy(),
            "fp8",
        )
        assert np.max(np.abs(f64(seen["gate"]) - ref["gate"])) < 1e-3
        assert torch.equal(out[~streams.token_mask], streams.x[~streams.token_mask])
        assert out.dtype == torch.bfloat16
