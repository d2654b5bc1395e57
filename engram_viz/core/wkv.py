"""``wkv``, the Engram projection ``[..., 24 * head_dim] -> [..., (hc + 1) * dim]``: its modes and
its GEMM's operands.

Modes (:data:`WKV_MODES`, what is multiplied and how the result is rounded):

- ``fp8``: the reference path. The input activations are quantised per 32 values to e4m3 with
  power-of-two scales (``fp8.quantize_blockwise``), dequantised, multiplied by the dequantised
  weight with float32 accumulation, and the result rounded to bf16 - an exact emulation of the
  reference fp8 GEMM up to float32 summation order.
- ``bf16``: the same dequantised weight, no activation quantisation, output rounded to bf16.
- ``float32``: no quantisation and no rounding at all (for training; not a reference path).

GEMM operands (:data:`GEMMS`, how the fp8/bf16 modes' products are formed): exact bf16 copies
with float32 accumulation, or float32. Why bf16 operands are exact: bf16 is the top 16 bits of a
float32 (same exponent range, 7 mantissa bits). An e4m3 code has at most 4 significant bits, so a
code times a power-of-two scale is a bf16 value as long as it stays normal: the dequantised wkv
weight (e4m3 x e8m0 block scales) and the fp8-quantised activations (codes x scales >= 2**-22, so
>= 2**-31) convert to bf16 and back without changing a bit. A GEMM on those operands that
accumulates in float32 forms the same products (8 x 8 significant bits fit float32's 24 exactly)
and adds them in float32; only the order of the additions differs from the float32 GEMM's, the
same class of difference as CPU vs CUDA (``docs/engram.md``). Both round the float32 sum to bf16
once. Checked, never assumed (each check is cheap next to the GEMM it guards):

- the weight: every float32 element has its low 16 bits zero (:func:`is_bf16_exact`), once per
  version of the weight (``WkvLinear`` keeps the bf16 copy keyed by the tensor's version);
- the activations: the same check on every call (one pass over ``[n, K]``);
- the accumulation: :func:`accumulates_in_float32` multiplies a probe whose result is exact in any
  float32 summation order and wrong in any bf16 one (``1 + 2**-9`` is 1 in bf16), once per device;
- on CUDA, cuBLAS's reduced-precision (bf16) split-K reductions are switched off for the call.

``gemm='bf16'`` uses these operands (and raises :class:`Bf16GemmError` naming the check that
failed), ``'float32'`` never does, ``'auto'`` (default) does where they are exact and the device
multiplies bf16 natively (CUDA; a CPU where oneDNN has bf16 kernels) and falls back to float32
otherwise, also while gradients are needed (training keeps float32 gradients).
``torch._scaled_mm`` is not used: its fp8 scaling on Hopper is per 1 x 128 / 128 x 128 block, not
the checkpoint's per-32 (the per-32 e8m0 "MX" scaling needs Blackwell).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from engram_viz.core import fp8
from engram_viz.errors import Bf16GemmError, InputError, InputTypeError

WKV_MODES = ("fp8", "bf16", "float32")
GEMMS = ("auto", "bf16", "float32")
CHECK_CHUNK = 1 << 22  # elements per pass of the exactness check (bounds its int32 temporaries: 16 MB)
_LOW16 = 0xFFFF


def check_gemm(gemm: str) -> str:
    if gemm not in GEMMS:
        raise InputError(f"wkv gemm {gemm!r} unknown; expected one of {GEMMS}")
    return gemm


def is_bf16_exact(t: torch.Tensor) -> bool:
    """Whether every element of a float tensor is exactly a bf16 value (float32: low 16 bits zero;
    bf16: always; float64 and others: converted to float32 first, which must be exact too)."""
    if t.dtype == torch.bfloat16:
        return True
    flat = t.detach().reshape(-1)
    if t.dtype != torch.float32:
        as32 = flat.float()
        if not torch.equal(as32.to(t.dtype), flat):
            return False
        flat = as32
    flat = flat.contiguous()
    for a in range(0, flat.numel(), CHECK_CHUNK):
        if bool((flat[a : a + CHECK_CHUNK].view(torch.int32) & _LOW16).any()):
            return False
    return True


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` multiplies bf16 in hardware-backed kernels: CUDA, or a CPU where oneDNN
    reports bf16 support (AVX512-BF16 / AMX on x86, BF16 on Arm). Elsewhere torch's generic bf16
    GEMM is slower than float32, so ``auto`` keeps float32."""
    if device.type == "cuda":
        return True
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def linear_bf16(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``a [..., K] @ w [N, K].T`` on bf16 operands, float32 accumulation, bf16 out ``[..., N]``.
    On CUDA the reduced-precision (bf16) split-K reduction is disabled for the call."""
    if a.device.type != "cuda":
        return F.linear(a, w)
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_bf16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = False
    try:
        return F.linear(a, w)
    finally:
        matmul.allow_bf16_reduced_precision_reduction = before


PROBE_SHAPE = (32, 6144, 64)  # (M, K, N): the wkv GEMM's K, a prefill-sized M


def probe_operands(device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``(a [M, K], w [N, K], want)``: every output element is ``want = 3 * 2**-9`` when the GEMM
    accumulates in float32 (each partial sum ``1 + j * 2**-9`` needs 10 bits), in any order; in bf16
    the 1 meets a ``2**-9`` before the ``-1`` far away and swallows it (bf16's ulp at 1 is 2**-7)."""
    m, k, n = PROBE_SHAPE
    a = torch.zeros(m, k)
    a[:, 0], a[:, 1:4], a[:, -1] = 1.0, 2.0**-9, -1.0
    w = torch.ones(n, k)
    return a.to(device, torch.bfloat16), w.to(device, torch.bfloat16), 3 * 2.0**-9


@functools.cache
def _accumulates_in_float32(device: str) -> bool:
    a, w, want = probe_operands(device)
    return bool((linear_bf16(a, w).float() == want).all())


def accumulates_in_float32(device: torch.device) -> bool:
    """Whether the bf16 GEMM on ``device`` accumulates in float32 (:func:`probe_operands`; once per device)."""
    return _accumulates_in_float32(str(device))


class WkvLinear(nn.Module):
    """``wkv``: ``[..., 24 * head_dim] -> [..., (hc + 1) * dim]``, no bias, in one of :data:`WKV_MODES`.

    ``weight`` is the dequantised float32 matrix ``[N, K]``, kept once (never re-dequantised per call).
    ``gemm`` (:data:`GEMMS`) picks the GEMM's operands in the ``fp8``/``bf16``
    modes: ``auto`` (default) multiplies exact bf16 copies with float32 accumulation where that is
    exact and the device has bf16 kernels (CUDA; a CPU with oneDNN bf16), else float32; the bf16
    weight copy (half the float32's size) is made on first use and kept while the weight is unchanged.
    Both give the same products and differ only in float32 summation order (module docstring).
    """

    def __init__(self, weight: torch.Tensor, mode: str = "fp8", trainable: bool = True, gemm: str = "auto"):
        super().__init__()
        if (
            weight.dim() != 2
            or not weight.is_floating_point()
            or weight.dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu)
        ):
            raise InputTypeError(
                f"wkv weight must be a dequantised float matrix [N, K], got {weight.dtype} {list(weight.shape)}"
            )
        self.weight = nn.Parameter(weight.detach().to(torch.float32), requires_grad=trainable)
        self.mode = mode
        self.gemm = gemm
        self._w16: tuple[tuple, torch.Tensor | None] | None = None  # (weight's identity, bf16 copy or None)

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        if mode not in WKV_MODES:
            raise InputError(f"wkv mode {mode!r} unknown; expected one of {WKV_MODES}")
        self._mode = mode

    @property
    def gemm(self) -> str:
        return self._gemm

    @gemm.setter
    def gemm(self, gemm: str) -> None:
        self._gemm = check_gemm(gemm)

    def inputs(self, a: torch.Tensor) -> torch.Tensor:
        """The activations the GEMM multiplies, float32 ``[..., K]``: e4m3-rounded per 32 values in
        ``fp8`` mode (``fp8.fp8_activations``), ``a`` itself otherwise. Every 32-block lies inside one
        row (``head_dim`` is a multiple of 32), so each row's activations depend on that row alone."""
        return fp8.fp8_activations(a) if self._mode == "fp8" else a.float()

    @property
    def out_dtype(self) -> torch.dtype:
        """What the float32 GEMM output is rounded to: bf16, except in ``float32`` mode."""
        return torch.float32 if self._mode == "float32" else torch.bfloat16

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        x = self.inputs(a)
        w16 = self.bf16_weight(x)
        if w16 is not None:
            return linear_bf16(x.to(torch.bfloat16), w16)
        return F.linear(x, self.weight).to(self.out_dtype)

    def bf16_weight(self, x: torch.Tensor) -> torch.Tensor | None:
        """The bf16 weight when the GEMM on activations ``x`` (:meth:`inputs`) runs on bf16 operands,
        else None (float32 GEMM). ``gemm='bf16'`` raises ``Bf16GemmError`` naming what is not exact."""
        if self._mode == "float32" or self._gemm == "float32":
            return None
        device = self.weight.device
        if self._gemm == "auto" and not native_bf16(device):
            return None
        why = self._not_exact(x)
        if why is None:
            w16 = self._bf16_copy()
            why = None if w16 is not None else "the weight is not exactly representable in bf16"
        if why is None:
            return w16
        if self._gemm == "bf16":
            raise Bf16GemmError(f"wkv gemm='bf16' on {device}: {why}; use gemm='float32' or 'auto'")
        return None

    def _not_exact(self, x: torch.Tensor) -> str | None:
        if torch.is_grad_enabled() and (self.weight.requires_grad or x.requires_grad):
            return "gradients are needed (training keeps the float32 GEMM)"
        if not accumulates_in_float32(self.weight.device):
            return "torch's bf16 GEMM there does not accumulate in float32"
        if not is_bf16_exact(x):
            return f"the activations ({self._mode} mode) are not exactly representable in bf16"
        return None

    def _bf16_copy(self) -> torch.Tensor | None:
        w = self.weight
        try:
            version = w._version
        except RuntimeError:  # an inference tensor keeps no version counter (and cannot change in place)
            version = None
        key = (w.data_ptr(), version, w.device, tuple(w.shape))
        if self._w16 is None or self._w16[0] != key:
            self._w16 = None  # free the stale copy before making the new one
            exact = is_bf16_exact(w)
            self._w16 = (key, w.detach().to(torch.bfloat16) if exact else None)
        return self._w16[1]

    def extra_repr(self) -> str:
        return f"in={self.weight.shape[1]}, out={self.weight.shape[0]}, mode={self._mode!r}, gemm={self._gemm!r}"
