"""fp4 e2m1 weights with e8m0 scales (the routed experts): unpack, dequantise, the fp4 linear.

Storage: ``[out, in / 2]`` bytes (``torch.float4_e2m1fn_x2`` or uint8), two values a byte, the even
element in the low nibble; a 4-bit code is sign (bit 3) + a magnitude from :data:`E2M1_GRID`. One
e8m0 scale per 32 values along ``in``: ``[out, in / 32]``. The reference's fp4 GEMM quantises the
activations per 32 values to e4m3 with power-of-two scales (as every fp8 GEMM,
:func:`engram_viz.core.fp8.quantize_blockwise`), multiplies the exact block products and sums in
float32; the emulation dequantises both operands and multiplies in float32 (only the order of the
float32 sum differs), output bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engram_viz.core import fp8
from engram_viz.errors import InputError, InputTypeError

FP4_BLOCK = 32
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitude by 3-bit code
_TABLE = torch.tensor(E2M1_GRID + tuple(-v for v in E2M1_GRID), dtype=torch.float32)  # by 4-bit code
_BYTES = torch.arange(256)
_PAIRS = torch.stack([_TABLE[_BYTES & 0x0F], _TABLE[_BYTES >> 4]], dim=-1)  # [256, 2]: a byte's two values


def fp4_codes(packed: torch.Tensor) -> torch.Tensor:
    """Packed ``[..., K / 2]`` (float4_e2m1fn_x2 or uint8) -> 4-bit codes uint8 ``[..., K]``."""
    b = packed.view(torch.uint8) if packed.dtype != torch.uint8 else packed
    return torch.stack([b & 0x0F, b >> 4], dim=-1).flatten(-2)


def dequantize_fp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp4 weight ``[N, K / 2]`` x e8m0 scale ``[N, K / 32]`` -> float32 ``[N, K]`` (exact)."""
    if scale.dtype != torch.float8_e8m0fnu:
        raise InputTypeError(f"fp4 scale must be float8_e8m0fnu, got {scale.dtype}")
    n, half = packed.shape
    if tuple(scale.shape) != (n, 2 * half // FP4_BLOCK):
        raise InputError(
            f"fp4 weight [{n}, {2 * half}] needs a scale of shape [{n}, {2 * half // FP4_BLOCK}], got {list(scale.shape)}"
        )
    b = packed.view(torch.uint8) if packed.dtype != torch.uint8 else packed
    values = F.embedding(b.long(), _PAIRS.to(packed.device)).flatten(-2)  # [N, K / 2, 2] -> [N, K], one lookup a byte
    return (values.unflatten(-1, (-1, FP4_BLOCK)) * scale.float().unsqueeze(-1)).flatten(-2)


def encode_fp4(x: torch.Tensor) -> torch.Tensor:
    """float ``[..., K]`` already in e2m1 range -> packed uint8 ``[..., K / 2]``, nearest code (ties to
    the even code). For writing synthetic experts; not on the reference path."""
    mag = x.abs().float().unsqueeze(-1)
    grid = _TABLE[:8].to(x.device)
    dist = (mag - grid).abs()
    code = torch.argmin(dist + (torch.arange(8, device=x.device) % 2) * 1e-7, dim=-1).to(torch.uint8)
    code = code | (torch.signbit(x).to(torch.uint8) << 3)
    return (code[..., 0::2] | (code[..., 1::2] << 4)).contiguous()


def linear_fp4(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The reference fp4 GEMM on a dequantised float32 weight ``[N, K]``: same as the fp8 one
    (activations quantised per 32 values, float32 accumulation, bf16 out)."""
    return fp8.linear_fp8_activations(x, weight)


def fp4_linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x [..., K]`` through an fp4 weight ``[N, K / 2]`` with e8m0 scales -> bf16 ``[..., N]``."""
    return linear_fp4(x, dequantize_fp4(packed, scale))


__all__ = ["E2M1_GRID", "FP4_BLOCK", "dequantize_fp4", "encode_fp4", "fp4_codes", "fp4_linear", "linear_fp4"]
