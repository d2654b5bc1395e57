"""fp8 e4m3 values with e8m0 (power-of-two) scales: dequantise, quantise, and the fp8 linear.

Tables carry one scale per 32 features of a row; ``wkv`` carries one per 32 x 32 block. The
reference dequantises by multiplying in float32 and rounding to bf16 (tables) and runs ``wkv``
as an fp8 GEMM whose input activations are quantised per 32 values with power-of-two scales.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F

from engram_viz.errors import InputError, InputTypeError

BLOCK = 32
E4M3_MAX = 448.0  # largest finite float8_e4m3fn
AMAX_FLOOR = 1e-4  # keeps an all-zero block's scale finite (as the reference's act_quant)
_E4M3_MAX_INV = torch.tensor(1.0 / E4M3_MAX, dtype=torch.float32)  # the kernel multiplies by this float32
_MANTISSA_MASK = (1 << 23) - 1


def _check_fp8(name: str, t: torch.Tensor, dtype: torch.dtype) -> None:
    if t.dtype != dtype:
        raise InputTypeError(f"{name} must be {dtype}, got {t.dtype}")


def dequantize_rows(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Table rows: e4m3 ``[..., D]`` x e8m0 ``[..., D/32]`` -> bf16 ``[..., D]``: the float32 multiply,
    rounded to bf16; on the CPU its result is looked up per (scale byte, weight byte) pair instead."""
    _check_fp8("weight", weight, torch.float8_e4m3fn)
    _check_fp8("scale", scale, torch.float8_e8m0fnu)
    if weight.shape[-1] != scale.shape[-1] * BLOCK or weight.shape[:-1] != scale.shape[:-1]:
        raise InputError(
            f"row weight {list(weight.shape)} and scale {list(scale.shape)} do not pair (32 features per scale)"
        )
    on_cpu = weight.device.type == scale.device.type == "cpu"
    if on_cpu and not (weight.requires_grad or scale.requires_grad):
        return _rows_by_table(weight, scale)
    return _rows_by_arithmetic(weight, scale)


def _rows_by_arithmetic(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    values = weight.float().unflatten(-1, (-1, BLOCK)) * scale.float().unsqueeze(-1)
    return values.flatten(-2).to(torch.bfloat16)


@functools.cache
def _pair_values() -> np.ndarray:
    """bf16 bits (int16) ``[256 * 256]``: ``_rows_by_arithmetic`` of every (scale byte, weight byte)
    pair, at ``scale_byte * 256 + weight_byte`` (128 KiB)."""
    every = torch.arange(256, dtype=torch.uint8)
    weight = every.repeat(256, 1).view(torch.float8_e4m3fn)  # row i: every weight byte
    scale = every.repeat_interleave(256 // BLOCK).reshape(256, -1).view(torch.float8_e8m0fnu)  # row i: byte i
    return _rows_by_arithmetic(weight, scale).view(torch.int16).numpy().reshape(-1)


def _rows_by_table(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``_rows_by_arithmetic`` looked up: one table read per value instead of two casts and a multiply
    (faster on a CPU, where torch casts e4m3 element by element: ``benchmarks/results/table_lookup.txt``)."""
    w = weight.contiguous().view(torch.uint8).numpy().reshape(*scale.shape, BLOCK)
    at = (scale.contiguous().view(torch.uint8).numpy().astype(np.uint16)[..., None] << 8) | w
    return torch.from_numpy(np.take(_pair_values(), at).reshape(weight.shape)).view(torch.bfloat16)


def dequantize_blocks(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """A matrix with 32 x 32 block scales: e4m3 ``[N, K]`` x e8m0 ``[ceil(N/32), ceil(K/32)]`` -> float32."""
    _check_fp8("weight", weight, torch.float8_e4m3fn)
    _check_fp8("scale", scale, torch.float8_e8m0fnu)
    n, k = weight.shape
    want = (-(-n // BLOCK), -(-k // BLOCK))
    if tuple(scale.shape) != want:
        raise InputError(f"block scale of weight {[n, k]} must have shape {list(want)}, got {list(scale.shape)}")
    full = scale.float().repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]
    return weight.float() * full


def power_of_two_scale(amax: torch.Tensor) -> torch.Tensor:
    """The kernel's ``fast_round_scale``: ``2 ** ceil(log2(x))`` with ``x = amax * fl32(1 / 448)`` in
    float32 (amax floored at 1e-4), the exponent read from x's bits: x's own power of two when its
    mantissa bits are all zero, else the next one. Bit for bit the kernel's ue8m0 scale for every
    float32 amax; ``log2``/``ceil`` in floats differ from it a few ulps above ``448 * 2**k``."""
    x = (amax.float().clamp_min(AMAX_FLOOR) * _E4M3_MAX_INV).contiguous()
    bits = x.view(torch.int32)  # x > 0: sign bit 0, biased exponent in bits 23..30, mantissa below
    exponent = (bits >> 23) + ((bits & _MANTISSA_MASK) != 0).to(torch.int32)
    return (exponent << 23).view(torch.float32)


def quantize_blockwise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per 32 values along the last dim: e4m3 ``[..., K]`` and float32 power-of-two scales ``[..., K/32]``.

    Scales are the kernel's (:func:`power_of_two_scale`): the power of two at or above
    ``amax * fl32(1/448)`` (amax floored at 1e-4), so ``amax / scale <= 448`` up to a float32 ulp;
    a value that lands a few ulps over 448 saturates to 448, as in the kernel.
    Round trip error is at most half an e4m3 ulp: ``|x - deq| <= max(2**-4 * |x|, 2**-10 * scale)``
    (relative 2**-4 where ``x / scale`` is a normal e4m3 value, >= 2**-6; absolute ``2**-10 * scale``
    where it is subnormal). Both bounds are reached on ties (tests/test_fp8.py).
    """
    if x.shape[-1] % BLOCK:
        raise InputError(f"last dim {x.shape[-1]} must be a multiple of {BLOCK} to quantise per block")
    blocks = x.float().unflatten(-1, (-1, BLOCK))
    scale = power_of_two_scale(blocks.abs().amax(-1))
    q = _to_e4m3(blocks / scale.unsqueeze(-1))
    return q.flatten(-2), scale


def _to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """float32 -> e4m3, round to nearest even, saturating at +-448 like the kernel's ``satfinite``
    conversion (a plain cast would give NaN above 464)."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def dequantize_blockwise(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of ``quantize_blockwise`` in float32."""
    return (q.float().unflatten(-1, (-1, BLOCK)) * scale.float().unsqueeze(-1)).flatten(-2)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Table rows to the checkpoint format: e4m3 ``[..., D]`` and e8m0 scales ``[..., D/32]``."""
    q, scale = quantize_blockwise(x)
    return q, scale.to(torch.float8_e8m0fnu)


def quantize_matrix(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight matrix ``[N, K]`` to e4m3 with e8m0 32 x 32 block scales ``[ceil(N/32), ceil(K/32)]``."""
    n, k = w.shape
    pn, pk = -(-n // BLOCK) * BLOCK, -(-k // BLOCK) * BLOCK
    padded = torch.zeros(pn, pk, dtype=torch.float32, device=w.device)
    padded[:n, :k] = w.float()
    blocks = padded.unflatten(0, (-1, BLOCK)).unflatten(-1, (-1, BLOCK))  # [N/32, 32, K/32, 32]
    scale = power_of_two_scale(blocks.abs().amax(dim=(1, 3)))
    q = _to_e4m3((blocks / scale[:, None, :, None]).flatten(2).flatten(0, 1)[:n, :k])
    return q, scale.to(torch.float8_e8m0fnu)


def fp8_activations(x: torch.Tensor) -> torch.Tensor:
    """The activations the emulated fp8 GEMM multiplies: ``x [..., K]`` quantised per 32 values
    with power-of-two scales and dequantised, float32 ``[..., K]``."""
    return dequantize_blockwise(*quantize_blockwise(x))


def linear_fp8_activations(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The reference fp8 GEMM, emulated, on an already dequantised float32 weight ``[N, K]``:
    activations quantised per 32 values with power-of-two scales and dequantised, fp32
    accumulation, bf16 out. ``x [..., K]`` -> ``[..., N]``."""
    return F.linear(fp8_activations(x), weight).to(torch.bfloat16)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """The reference fp8 GEMM on the checkpoint's operands: e4m3 ``weight [N, K]`` with e8m0 32 x 32
    block scales, dequantised, then :func:`linear_fp8_activations`."""
    return linear_fp8_activations(x, dequantize_blocks(weight, weight_scale))
