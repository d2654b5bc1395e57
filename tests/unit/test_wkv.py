"""The wkv GEMM on exact bf16 operands: the exactness claims, the accumulation probe, the fallbacks
and the tolerance against the float32 GEMM (and the float64-accumulated sum) at V4.1-Flash's K."""

from __future__ import annotations

import pytest
import torch

from engram_viz.config import load_config
from engram_viz.core import fp8, wkv
from engram_viz.core.engram import CPU_CUDA_DOT_ATOL, CPU_CUDA_GATE_ATOL, CPU_CUDA_GATE_P99, Engram, to_device
from engram_viz.core.wkv import Bf16GemmError, WkvLinear
from engram_viz.errors import EngramVizError

NATIVE = wkv.native_bf16(torch.device("cpu"))


def within_ulp(a: torch.Tensor, b: torch.Tensor) -> bool:
    """One bf16 ulp relative, plus 1e-6 absolute where a sum cancels to near 0 (docs/engram.md)."""
    return bool(((a.float() - b.float()).abs() <= 2.0**-7 * b.float().abs() + 1e-6).all())


def wide_randn(*shape, seed: int) -> torch.Tensor:
    """Values over many binades (blocks scaled 2**-20 .. 2**20), so the scales vary widely."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-20, 21, (*shape[:-1], 1), generator=g).float())


def test_dequantised_weight_and_fp8_activations_are_exact_in_bf16():
    w = fp8.dequantize_blocks(*fp8.quantize_matrix(wide_randn(256, 6144, seed=0)))
    assert torch.equal(w.to(torch.bfloat16).float(), w)
    a = fp8.fp8_activations(wide_randn(64, 6144, seed=1))
    assert torch.equal(a.to(torch.bfloat16).float(), a)
    tiny = fp8.fp8_activations(torch.full((2, 64), 1e-9))  # under the 1e-4 amax floor: scale 2**-22
    assert torch.equal(tiny.to(torch.bfloat16).float(), tiny)
    assert wkv.is_bf16_exact(w) and wkv.is_bf16_exact(a) and wkv.is_bf16_exact(w.to(torch.bfloat16))
    assert not wkv.is_bf16_exact(torch.tensor([1.0 + 2.0**-10]))
    assert not wkv.is_bf16_exact(torch.tensor([1.0 + 2.0**-30], dtype=torch.float64))


def test_accumulation_probe_tells_float32_from_bf16_accumulation():
    a, w, want = wkv.probe_operands("cpu")
    f32 = torch.nn.functional.linear(a.float(), w.float())
    assert bool((f32 == want).all())
    acc = torch.zeros(a.shape[0], dtype=torch.bfloat16)  # a bf16 accumulator, in order
    for j in range(a.shape[1]):
        acc = (acc + a[:, j] * w[0, j]).to(torch.bfloat16)
    assert not bool((acc.float() == want).any())
    if NATIVE:
        assert wkv.accumulates_in_float32(torch.device("cpu"))


def counted(monkeypatch) -> list:
    calls = []
    plain = wkv.linear_bf16
    monkeypatch.setattr(wkv, "linear_bf16", lambda a, w: calls.append(a.shape) or plain(a, w))
    return calls


@pytest.mark.skipif(not NATIVE, reason="this CPU has no oneDNN bf16 kernels: auto keeps float32")
def test_bf16_gemm_matches_the_float32_gemm_within_one_ulp(monkeypatch):
    """At V4.1-Flash's K (6144): bf16 operands give the float32 GEMM's bf16 outputs up to summation
    order: at most one bf16 ulp apart, nearly all bit-equal, as close to the float64 sum."""
    w = fp8.dequantize_blocks(*fp8.quantize_matrix(torch.randn(512, 6144, generator=torch.Generator().manual_seed(2))))
    rows = fp8.dequantize_rows(*fp8.quantize_rows(wide_randn(48, 24, 256, seed=3))).flatten(-2)
    lin = WkvLinear(w, mode="fp8", trainable=False)
    calls = counted(monkeypatch)
    got = lin(rows)
    assert calls and got.dtype == torch.bfloat16
    lin.gemm = "float32"
    ref = lin(rows)
    assert len(calls) == 1
    exact = (fp8.fp8_activations(rows).double() @ w.double().T).to(torch.bfloat16)
    assert within_ulp(got, ref) and float((got == ref).float().mean()) > 0.999
    assert within_ulp(got, exact) and float((got == exact).float().mean()) > 0.999


def test_fallbacks_and_errors(monkeypatch):
    w = fp8.dequantize_blocks(*fp8.quantize_matrix(torch.randn(64, 256)))
    a = fp8.dequantize_rows(*fp8.quantize_rows(torch.randn(5, 256))).float()
    with pytest.raises(ValueError, match="wkv gemm 'fp16' unknown"):
        WkvLinear(w, gemm="fp16")
    # the accumulation probe runs its own bf16 GEMM once per device: on a CPU without bf16 kernels
    # nothing earlier has run it, so run it (fresh) before counting the calls the layer makes
    wkv._accumulates_in_float32.cache_clear()
    wkv.accumulates_in_float32(torch.device("cpu"))
    calls = counted(monkeypatch)
    inexact = WkvLinear(w + 2.0**-12, mode="bf16", trainable=False)  # not a bf16 value
    assert torch.equal(inexact(a), torch.nn.functional.linear(a, inexact.weight).to(torch.bfloat16))
    inexact.gemm = "bf16"
    with pytest.raises(Bf16GemmError, match="weight is not exactly representable in bf16") as info:
        inexact(a)
    assert isinstance(info.value, EngramVizError) and "gemm='float32'" in str(info.value)
    lin = WkvLinear(w, mode="bf16", trainable=False, gemm="bf16")
    with pytest.raises(Bf16GemmError, match=r"activations \(bf16 mode\) are not exactly"):
        lin(a + 2.0**-20)
    train = WkvLinear(w, mode="fp8", trainable=True)  # training: float32 GEMM, float32 gradients
    out = train(a.requires_grad_())
    out.float().sum().backward()
    assert train.weight.grad is not None and a.grad is not None
    train.gemm = "bf16"
    with pytest.raises(Bf16GemmError, match="gradients are needed"):
        train(a)
    assert calls == [] and train.extra_repr().endswith("gemm='bf16'")
    if wkv.accumulates_in_float32(torch.device("cpu")):  # no gradients needed: the bf16 GEMM runs
        with torch.no_grad():
            got = train(a)
        ref = torch.nn.functional.linear(fp8.fp8_activations(a), w).to(torch.bfloat16)
        assert len(calls) == 1 and within_ulp(got, ref)


@pytest.mark.skipif(not NATIVE, reason="this CPU has no oneDNN bf16 kernels")
def test_bf16_copy_follows_the_weight():
    w = fp8.dequantize_blocks(*fp8.quantize_matrix(torch.randn(64, 256)))
    lin = WkvLinear(w, trainable=False)
    a = torch.randn(3, 256).to(torch.bfloat16)
    before = lin(a)
    with torch.no_grad():
        lin.weight.mul_(2)  # in place: a new version, exact still
    assert torch.equal(lin(a).float(), 2 * before.float())
    with torch.no_grad():
        lin.weight.add_(2.0**-12)  # no longer bf16: auto falls back to float32
    assert torch.equal(lin(a), torch.nn.functional.linear(fp8.fp8_activations(a), lin.weight).to(torch.bfloat16))


def engram_pair():
    config = load_config("tiny")
    g = torch.Generator().manual_seed(4)
    rows = config.engram_num_embeddings[0]
    q, s = fp8.quantize_rows(torch.randn(rows, config.engram_head_dim, generator=g))

    def table(ids):
        return fp8.dequantize_rows(q[ids], s[ids])

    table.num_rows = rows
    n, k = config.dim * (config.hc_mult + 1), config.n_hash_cols * config.engram_head_dim
    w = fp8.dequantize_blocks(*fp8.quantize_matrix(torch.randn(n, k, generator=g) * k**-0.5))
    make = lambda gemm: Engram(config, 1, table, w, mode="fp8", gemm=gemm, device="cpu", trainable=False)
    x = torch.randn(3, 40, config.hc_mult, config.dim, generator=g) * 3
    ids = torch.randint(0, rows, (3, 40, config.n_hash_cols), generator=g)
    mask = torch.ones(3, 40, dtype=torch.bool)
    mask[1, 5:12] = False
    return make, x, ids, mask


def capture(engram, *args):
    seen = {}
    for p in engram.hook_points().values():
        p.add_hook(lambda t, name: seen.__setitem__(name.split(".")[-1], t.clone()))
    out = engram(*args)
    return out, seen


def test_engram_gates_with_the_bf16_gemm_within_the_cpu_cuda_bounds():
    make, x, ids, mask = engram_pair()
    _, a = capture(make("float32"), x, ids, mask)
    out16, b = capture(make("bf16" if NATIVE else "auto"), x, ids, mask)
    assert torch.equal(a["hash_ids"], b["hash_ids"]) and torch.equal(a["rows"], b["rows"])
    assert within_ulp(b["key"], a["key"]) and within_ulp(b["value"], a["value"])
    gate = (a["gate"] - b["gate"]).abs()
    assert float((a["dot"] - b["dot"]).abs().max()) <= CPU_CUDA_DOT_ATOL
    assert float(gate.max()) <= CPU_CUDA_GATE_ATOL and float(gate.flatten().quantile(0.99)) <= CPU_CUDA_GATE_P99
    assert torch.equal(out16[~mask], x[~mask]) and bool((b["gate"][~mask] == 0).all())


def test_to_device_on_the_host_is_plain():
    t = torch.randn(3, 4)
    assert to_device(t, torch.device("cpu")) is t


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_gemm_and_pinned_rows():
    """On CUDA: auto is the bf16 GEMM (float32 accumulation, no reduced-precision split-K), within
    the stated bounds of the CPU float32 path; gathered rows arrive bit for bit through pinned memory."""
    dev = torch.device("cuda")
    assert wkv.native_bf16(dev) and wkv.accumulates_in_float32(dev)
    rows = torch.randn(64, 24, 256).to(torch.bfloat16)
    moved = to_device(rows, dev)
    torch.cuda.synchronize()
    assert moved.device.type == "cuda" and torch.equal(moved.cpu(), rows)
    make, x, ids, mask = engram_pair()
    _, a = capture(make("float32"), x, ids, mask)
    gpu = make("auto").to(dev)
    assert gpu.device.type == "cuda"
    out, b = capture(gpu, x.to(dev), ids, mask)
    b = {k: v.cpu() for k, v in b.items()}
    assert torch.equal(a["rows"], b["rows"]) and within_ulp(b["key"], a["key"])
    assert float((a["gate"] - b["gate"]).abs().max()) <= CPU_CUDA_GATE_ATOL
    assert torch.equal(out.cpu()[~mask], x[~mask])
