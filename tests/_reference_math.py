"""Independent float64 re-statements of the reference formulas, written from the seed and the
e4m3 / e8m0 format definitions only (no engram_viz code), for tests/test_fp8.py and
tests/test_engram.py."""

from __future__ import annotations

import numpy as np
import torch

E4M3_MAX = 448.0
AMAX_FLOOR = 1e-4


def e4m3_round(v: np.ndarray) -> np.ndarray:
    """Round float64 values (|v| <= 448) to the nearest e4m3fn value, ties to even.

    e4m3fn: 3 mantissa bits, exponent bias 7, smallest normal 2**-6, subnormal step 2**-9."""
    v = np.asarray(v, dtype=np.float64)
    a = np.abs(v)
    if np.any(a > E4M3_MAX):
        raise ValueError("e4m3_round: value above 448")
    _, ex = np.frexp(np.where(a > 0, a, 1.0))  # a = m * 2**ex, m in [0.5, 1): floor(log2 a) = ex - 1
    e = np.maximum(ex - 1, -6)
    ulp = np.ldexp(1.0, e - 3)
    return np.copysign(np.round(a / ulp) * ulp, v)  # np.round: half to even


def e4m3_value(byte: int) -> float:
    """The float an e4m3fn byte encodes (0x7F / 0xFF are NaN)."""
    sign = -1.0 if byte & 0x80 else 1.0
    exp, man = (byte >> 3) & 0xF, byte & 0x7
    if exp == 0xF and man == 0x7:
        return float("nan")
    if exp == 0:
        return sign * man * 2.0**-9
    return sign * (1 + man / 8) * 2.0 ** (exp - 7)


def kernel_scale(amax: np.ndarray) -> np.ndarray:
    """The kernel's ``fast_round_scale`` of float32 ``amax``: x = amax * (1/448), both float32 and the
    product rounded to float32; the scale is the power of two at or above x, found exactly with
    frexp (x = m * 2**e, m in [0.5, 1): x itself when m == 0.5, else 2**e)."""
    x = (np.asarray(amax, dtype=np.float32) * np.float32(1.0 / E4M3_MAX)).astype(np.float64)
    m, e = np.frexp(x)
    return np.where(m == 0.5, x, np.ldexp(1.0, e))


def act_quant(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per 32 values along the last axis: the kernel's power-of-two scale s of max(amax, 1e-4)
    (``kernel_scale``), q = e4m3_round(a / s) with |a / s| saturated at 448. Returns (dequantised
    float64 [..., K], scales [..., K/32])."""
    a = np.asarray(a, dtype=np.float64)
    blocks = a.reshape(*a.shape[:-1], -1, 32)
    amax = np.maximum(np.abs(blocks).max(-1), np.float32(AMAX_FLOOR))
    scale = kernel_scale(amax)
    q = e4m3_round(np.clip(blocks / scale[..., None], -E4M3_MAX, E4M3_MAX))
    return (q * scale[..., None]).reshape(a.shape), scale


def dequant_rows(weight: torch.Tensor, scale: torch.Tensor) -> np.ndarray:
    """Table rows e4m3 [..., D] x e8m0 [..., D/32] in float64 (exact; representable in bf16)."""
    w = weight.float().double().numpy()
    s = scale.float().double().numpy()
    return (w.reshape(*w.shape[:-1], -1, 32) * s[..., None]).reshape(w.shape)


def dequant_blocks(weight: torch.Tensor, scale: torch.Tensor) -> np.ndarray:
    """A matrix e4m3 [N, K] with e8m0 32 x 32 block scales, float64."""
    w = weight.float().double().numpy()
    s = scale.float().double().numpy()
    n, k = w.shape
    return w * np.kron(s, np.ones((32, 32)))[:n, :k]


def gemm_orders_apart(rows: np.ndarray, w: np.ndarray) -> np.ndarray:
    """How far two float32 summation orders of ``rows @ w.T`` can land apart, per output element.

    The products of bf16 operands are exact in float32, so each order is within
    ``(K - 1) * 2**-24 * sum_k |rows_k * w_nk|`` of the exact sum (the classic gamma_K bound); two
    orders are within twice that. Where the sum cancels to near 0 this exceeds a bf16 ulp of the
    result, which is why a relative bound alone fails there. rows ``[..., K]``, w ``[N, K]``."""
    k = rows.shape[-1]
    return 2 * (k - 1) * 2.0**-24 * (np.abs(rows) @ np.abs(w).T)


def bf16_round(v: np.ndarray) -> np.ndarray:
    """Round float64 to bf16 (nearest, ties to even) by bit manipulation on the float32 image.

    Exact for the values tested here: float64 -> float32 first rounds (relative 2**-24), which
    can only matter on an exact bf16 tie, far rarer than the tolerances the tests use."""
    f = np.asarray(v, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (f + 0x7FFF + ((f >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32).astype(np.float64)


def engram_gate_math(
    x: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    eps: float,
    mask: np.ndarray | None,
) -> dict[str, np.ndarray]:
    """The seed's formula in float64. x [B,T,hc,dim], key [B,T,hc,dim], value [B,T,dim], q/k [hc,dim],
    mask [B,T] bool or None. Returns dot, gate [B,T,hc] and out [B,T,hc,dim]."""
    dim = x.shape[-1]
    w = q * k
    rstd = 1 / np.sqrt((x**2).mean(-1) + eps) / np.sqrt((key**2).mean(-1) + eps)
    dot = (x * w * key).sum(-1) * rstd / np.sqrt(dim)
    gate = 1 / (1 + np.exp(-np.copysign(np.sqrt(np.maximum(np.abs(dot), 1e-6)), dot)))
    if mask is not None:
        gate = np.where(mask[..., None], gate, 0.0)
    out = x + gate[..., None] * value[..., None, :]
    return {"dot": dot, "gate": gate, "out": out}


def engram_reference(
    x: np.ndarray,
    rows: np.ndarray,
    wkv: np.ndarray,
    q: np.ndarray,
    k: np.ndarray,
    eps: float,
    mask: np.ndarray | None,
    mode: str,
) -> dict[str, np.ndarray]:
    """Full path in float64 from dequantised rows [B,T,24,hd] and wkv [N,K]: activation
    quantisation ('fp8') or none ('bf16'), GEMM, bf16 rounding of kv, then the gate math.
    Also returns ``kv_exact`` (before the bf16 rounding) and ``act_abs_wkv`` (|a| @ |W|^T, for
    accumulation-error bounds)."""
    a = rows.reshape(*rows.shape[:-2], -1)
    if mode == "fp8":
        a, _ = act_quant(a)
    kv_exact = a @ wkv.T
    kv = bf16_round(kv_exact)
    hc, dim = q.shape
    key = kv[..., : hc * dim].reshape(*kv.shape[:-1], hc, dim)
    value = kv[..., hc * dim :]
    res = engram_gate_math(x, key, value, q, k, eps, mask)
    res.update(kv_exact=kv_exact, kv=kv, key=key, value=value, act_abs_wkv=np.abs(a) @ np.abs(wkv).T)
    return res
