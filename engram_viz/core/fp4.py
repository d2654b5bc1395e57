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


FP4_MAX = 6.0
_FP4_MAX_INV = torch.tensor(1.0 / FP4_MAX, dtype=torch.float32)  # the kernel multiplies by this float32
_E2M1_MIDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])  # midpoints between grid values
_TIE_UP = torch.tensor([False, True, False, True, False, True, False])  # ties go to the even code


def _e2m1_round(v: torch.Tensor) -> torch.Tensor:
    """float32 in [-6, 6] -> the nearest e2m1 value (ties to the even code), sign kept."""
    mag = v.abs().unsqueeze(-1)
    mids, up = _E2M1_MIDS.to(v.device), _TIE_UP.to(v.device)
    code = (mag > mids).sum(-1) + ((mag == mids) & up).sum(-1)
    return torch.where(torch.signbit(v), -1.0, 1.0) * _TABLE.to(v.device)[code]


def fp4_act_round_trip(x: torch.Tensor, block: int = FP4_BLOCK, e4m3_scale: bool = False) -> torch.Tensor:
    """The reference ``fp4_act_quant(x, block, inplace=True)`` on bf16 ``x [..., K]``: per ``block`` values,
    e2m1 codes with a scale, dequantised, back to bf16. Scales: e8m0 (the indexer's q / k, groups of 32):
    the power of two at or above ``amax * fl32(1/6)``, amax floored at ``6 * 2^-126``; e4m3 (compressed KV,
    groups of 16): ``e4m3(amax / 6)``, amax floored at ``6 * 2^-9``."""
    g = x.float().unflatten(-1, (-1, block))
    amax = g.abs().amax(-1)
    if e4m3_scale:
        s = (amax.clamp_min(6 * 2.0**-9) / FP4_MAX).clamp(-fp8.E4M3_MAX, fp8.E4M3_MAX).to(torch.float8_e4m3fn).float()
    else:
        x32 = (amax.clamp_min(6 * 2.0**-126) * _FP4_MAX_INV.to(x.device)).contiguous()
        bits = x32.view(torch.int32)
        s = (((bits >> 23) + ((bits & ((1 << 23) - 1)) != 0).to(torch.int32)) << 23).view(torch.float32)
    v = (g / s.unsqueeze(-1)).clamp(-FP4_MAX, FP4_MAX)
    return (_e2m1_round(v) * s.unsqueeze(-1)).flatten(-2).to(x.dtype)


def linear_fp4(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The reference fp4 GEMM on a dequantised float32 weight ``[N, K]``: same as the fp8 one
    (activations quantised per 32 values, float32 accumulation, bf16 out)."""
    return fp8.linear_fp8_activations(x, weight)


def fp4_linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x [..., K]`` through an fp4 weight ``[N, K / 2]`` with e8m0 scales -> bf16 ``[..., N]``."""
    return linear_fp4(x, dequantize_fp4(packed, scale))


__all__ = [
    "E2M1_GRID",
    "FP4_BLOCK",
    "dequantize_fp4",
    "encode_fp4",
    "fp4_act_round_trip",
    "fp4_codes",
    "fp4_linear",
    "linear_fp4",
]
