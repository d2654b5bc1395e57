"""fp8: exact dequantisation of hand-picked bytes, the power-of-two activation quantiser and its
round-trip bound, block scales, and the emulated fp8 linear against an independent float64 path."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _reference_math import act_quant, bf16_round, dequant_blocks, e4m3_round, e4m3_value, kernel_scale
from hypothesis import given
from hypothesis import strategies as st

from engram_viz.core import fp8


def e4m3_bytes(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8).view(torch.float8_e4m3fn)


def e8m0_bytes(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8).view(torch.float8_e8m0fnu)


# byte -> value, worked out by hand from the e4m3fn layout (sign, 4 exponent bits bias 7, 3 mantissa bits)
E4M3_CASES = {
    0x00: 0.0,
    0x01: 2.0**-9,  # smallest subnormal
    0x07: 7 * 2.0**-9,  # largest subnormal
    0x08: 2.0**-6,  # smallest normal
    0x38: 1.0,
    0x39: 1.125,
    0x3F: 1.875,
    0x40: 2.0,
    0x7E: 448.0,  # largest finite
    0x80: -0.0,
    0xB8: -1.0,
    0xC4: -3.0,
    0xFE: -448.0,
}
E8M0_CASES = {0: 2.0**-127, 1: 2.0**-126, 120: 2.0**-7, 127: 1.0, 128: 2.0, 134: 128.0, 200: 2.0**73}


def test_e4m3_hand_picked_bytes():
    got = e4m3_bytes(list(E4M3_CASES)).float().tolist()
    assert got == list(E4M3_CASES.values())
    assert [e4m3_value(b) for b in E4M3_CASES] == list(E4M3_CASES.values())  # the test's own decoder agrees
    assert math.isnan(e4m3_bytes([0x7F]).float().item())


def test_e8m0_hand_picked_bytes():
    assert e8m0_bytes(list(E8M0_CASES)).float().tolist() == list(E8M0_CASES.values())


def test_dequantize_rows_hand_picked():
    # one row of 64 features = 2 blocks: block 0 scaled by 2**-7, block 1 by 2**3
    codes = [0x38, 0x39, 0x01, 0xC4, 0x7E, 0x08, 0x00, 0xB8] * 8
    weight = e4m3_bytes(codes).reshape(1, 64)
    scale = e8m0_bytes([120, 130]).reshape(1, 2)
    want = torch.tensor([e4m3_value(b) for b in codes], dtype=torch.float64)
    want[:32] *= 2.0**-7
    want[32:] *= 2.0**3
    got = fp8.dequantize_rows(weight, scale)
    assert got.dtype == torch.bfloat16 and got.shape == (1, 64)
    assert torch.equal(got.double(), want.reshape(1, 64))  # e4m3 x 2**k is exact in bf16


def test_dequantize_rows_rounds_through_float32_then_bf16():
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(5, 3, 96, generator=g).to(torch.float8_e4m3fn)
    scale = e8m0_bytes(torch.randint(100, 150, (5 * 3 * 3,), generator=g).tolist()).reshape(5, 3, 3)
    got = fp8.dequantize_rows(weight, scale)
    want = (weight.float().unflatten(-1, (3, 32)) * scale.float().unsqueeze(-1)).flatten(-2).to(torch.bfloat16)
    assert got.shape == (5, 3, 96) and torch.equal(got, want)


def test_dequantize_rows_every_weight_and_scale_byte():
    """All 65,536 (weight byte, scale byte) pairs, spread over leading dims, against the test's own
    decoder: the value times 2**(scale - 127), rounded to float32 and then to bf16; NaN bytes give NaN."""
    every = torch.arange(256, dtype=torch.uint8)
    weight = every.repeat(256, 1).reshape(16, 16, 256).view(torch.float8_e4m3fn)  # [scale byte, weight byte]
    scale = every.repeat_interleave(8).reshape(16, 16, 8).view(torch.float8_e8m0fnu)
    got = fp8.dequantize_rows(weight, scale).double().numpy().reshape(256, 256)
    exact = np.array([e4m3_value(b) for b in range(256)])[None, :] * 2.0 ** (np.arange(256)[:, None] - 127.0)
    exact[255] = np.nan  # e8m0 0xFF
    with np.errstate(over="ignore"):  # 448 * 2**127 is past float32: inf, as the float32 multiply gives
        want = bf16_round(exact)
    assert np.array_equal(got, want, equal_nan=True)


def test_dequantize_blocks_hand_picked_and_ragged_shape():
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(40, 70, generator=g).to(torch.float8_e4m3fn)  # 2 x 3 blocks, the last ragged
    scale = e8m0_bytes([120, 127, 130, 125, 126, 140]).reshape(2, 3)
    got = fp8.dequantize_blocks(weight, scale)
    assert got.dtype == torch.float32
    assert np.array_equal(got.double().numpy(), dequant_blocks(weight, scale))
    assert got[39, 69].item() == weight[39, 69].float().item() * 2.0**13  # block (1, 2): byte 140


@given(st.floats(min_value=-448, max_value=448, allow_nan=False, width=32))
def test_torch_e4m3_cast_is_round_to_nearest_even(v):
    """The test's own e4m3 rounding (from the format definition) equals torch's cast."""
    got = torch.tensor([v], dtype=torch.float32).to(torch.float8_e4m3fn).float().item()
    assert got == e4m3_round(np.array([v]))[0]


block_arrays = st.integers(1, 4).flatmap(
    lambda nb: st.lists(
        st.one_of(
            st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=32),
            st.floats(min_value=-(2.0**-20), max_value=2.0**-20, allow_nan=False, width=32),
            st.just(0.0),
        ),
        min_size=32 * nb,
        max_size=32 * nb,
    )
)


@given(block_arrays)
def test_quantize_blockwise_power_of_two_scales_and_bound(values):
    x = torch.tensor(values, dtype=torch.float32).reshape(1, -1)
    q, scale = fp8.quantize_blockwise(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape
    assert scale.dtype == torch.float32 and scale.shape == (1, x.shape[1] // 32)
    s = scale.double().numpy()[0]
    # power-of-two scales: log2 is an integer
    assert np.array_equal(np.log2(s), np.round(np.log2(s)))
    blocks = x.double().numpy()[0].reshape(-1, 32)
    amax = np.abs(blocks).max(-1)
    # the smallest such scale: amax / s <= 448 < 2 * amax / s (unless the 1e-4 amax floor applies), up to
    # the float32 rounding of amax * (1/448) in the kernel's rule
    assert np.all(amax / s <= 448 * (1 + 2.0**-22))
    floored = amax < fp8.AMAX_FLOOR
    assert np.all((2 * amax / s > 448) | floored)
    # the codes are the nearest e4m3 values of x / s (saturated at 448), and match the independent quantiser
    codes = e4m3_round(np.clip(blocks / s[:, None], -448, 448))
    assert np.array_equal(q.float().double().numpy()[0].reshape(-1, 32), codes)
    deq_ref, s_ref = act_quant(blocks.reshape(1, -1))
    assert np.array_equal(s_ref[0], s)
    deq = fp8.dequantize_blockwise(q, scale).double().numpy()[0].reshape(-1, 32)
    assert np.array_equal(deq, deq_ref[0].reshape(-1, 32))
    # the docstring's round-trip bound
    bound = np.maximum(2.0**-4 * np.abs(blocks), 2.0**-10 * s[:, None])
    assert np.all(np.abs(blocks - deq) <= bound)


def test_quantize_blockwise_bound_is_tight():
    """Half an ulp is reached: 1 + 2**-4 (a tie) and 1 + 3 * 2**-5 lose close to 2**-4 of |x|,
    and a subnormal code loses up to 2**-10 of its scale."""
    x = torch.zeros(1, 32)
    x[0, 0] = 448.0  # scale 1
    x[0, 1] = 1 + 2**-4  # tie between 1 and 1.125 -> 1.0 (even)
    x[0, 2] = 1.5 * 2**-9  # subnormal tie -> 2**-8 (even code 2)
    q, scale = fp8.quantize_blockwise(x)
    deq = fp8.dequantize_blockwise(q, scale)[0]
    assert scale.item() == 1.0
    assert deq[1].item() == 1.0 and abs(x[0, 1] - deq[1]).item() == 2**-4
    assert abs(x[0, 2] - deq[2]).item() == 2**-10


def test_quantize_blockwise_rejects_ragged_last_dim():
    with pytest.raises(ValueError, match="multiple of 32"):
        fp8.quantize_blockwise(torch.ones(2, 40))


def test_quantize_rows_round_trip_within_bound():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(50, 64, generator=g) * torch.logspace(-8, 8, 50).unsqueeze(-1)
    w, s = fp8.quantize_rows(x)
    assert w.dtype == torch.float8_e4m3fn and s.dtype == torch.float8_e8m0fnu and s.shape == (50, 2)
    back = fp8.dequantize_rows(w, s).double()  # exact: bf16 holds every e4m3 x 2**k
    sf = s.float().double().repeat_interleave(32, -1)
    assert torch.all((x.double() - back).abs() <= torch.maximum(2.0**-4 * x.double().abs(), 2.0**-10 * sf))


@pytest.mark.parametrize("shape", [(64, 96), (40, 70), (1, 33)])
def test_quantize_matrix_round_trip(shape):
    g = torch.Generator().manual_seed(3)
    w = torch.randn(*shape, generator=g) * 3
    q, s = fp8.quantize_matrix(w)
    assert q.shape == shape and s.shape == (-(-shape[0] // 32), -(-shape[1] // 32))
    back = fp8.dequantize_blocks(q, s).double()
    sf = torch.from_numpy(np.kron(s.float().double().numpy(), np.ones((32, 32)))[: shape[0], : shape[1]])
    assert torch.all((w.double() - back).abs() <= torch.maximum(2.0**-4 * w.double().abs(), 2.0**-10 * sf))


def test_fp8_linear_matches_independent_float64():
    g = torch.Generator().manual_seed(4)
    n, k = 96, 256
    wq, ws = fp8.quantize_matrix(torch.randn(n, k, generator=g) / 16)
    x = (torch.randn(3, 5, k, generator=g) * 2).to(torch.bfloat16)
    got = fp8.fp8_linear(x, wq, ws)
    assert got.dtype == torch.bfloat16 and got.shape == (3, 5, n)
    a, _ = act_quant(x.double().numpy())
    w64 = dequant_blocks(wq, ws)
    exact = a @ w64.T
    # one bf16 rounding of the float32-accumulated value: within a bf16 half-ulp of exact, plus
    # the float32 accumulation error, which can at most flip that rounding to the neighbour
    err = np.abs(got.double().numpy() - exact)
    assert np.all(err <= 2.0**-8 * np.abs(exact) + 1e-6 * (np.abs(a) @ np.abs(w64).T))
    assert np.mean(got.double().numpy() == bf16_round(exact)) > 0.99


def test_dtype_and_shape_errors_name_the_input():
    w = torch.zeros(2, 64, dtype=torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="scale must be torch.float8_e8m0fnu"):
        fp8.dequantize_rows(w, torch.ones(2, 2))
    with pytest.raises(TypeError, match="weight must be torch.float8_e4m3fn"):
        fp8.dequantize_rows(torch.zeros(2, 64), e8m0_bytes([127] * 4).reshape(2, 2))
    with pytest.raises(ValueError, match="do not pair"):
        fp8.dequantize_rows(w, e8m0_bytes([127] * 6).reshape(2, 3))
    with pytest.raises(ValueError, match="must have shape"):
        fp8.dequantize_blocks(torch.zeros(64, 64, dtype=torch.float8_e4m3fn), e8m0_bytes([127]).reshape(1, 1))


# ---------------------------------------------------------------- the kernel's scale rounding


def _ulps_from(value: float, steps: int) -> np.float32:
    """``value`` (as float32) moved ``steps`` float32 ulps up (positive) or down (negative)."""
    v = np.float32(value)
    for _ in range(abs(steps)):
        v = np.nextafter(v, np.float32(np.inf if steps > 0 else 0), dtype=np.float32)
    return v


# amax a few ulps either side of 448 * 2**k: where log2/ceil in floats and the kernel's bits part
near_boundaries = st.builds(_ulps_from, st.integers(-20, 20).map(lambda k: 448.0 * 2.0**k), st.integers(-6, 6))
any_float32 = st.floats(min_value=0.0, max_value=448.0 * 2.0**100, width=32, allow_nan=False, allow_infinity=False)


@given(st.lists(near_boundaries | any_float32, min_size=1, max_size=64))
def test_power_of_two_scale_is_the_kernels_fast_round_scale(amaxes):
    amax = np.asarray(amaxes, dtype=np.float32)
    got = fp8.power_of_two_scale(torch.from_numpy(amax)).double().numpy()
    want = kernel_scale(np.maximum(amax, np.float32(fp8.AMAX_FLOOR)))
    assert np.array_equal(got, want)


def test_scales_a_few_ulps_above_448_times_a_power_of_two():
    """Hand-checked: 448 * 2**-10 one ulp up, times fl32(1/448), rounds above 2**-10, so the kernel
    takes 2**-9 (float log2 + ceil gave 2**-10 here, and amax / s over 448)."""
    amax = _ulps_from(448.0 * 2.0**-10, 1)
    assert float(fp8.power_of_two_scale(torch.tensor([amax]))[0]) == 2.0**-9
    exact = np.float32(448.0 * 2.0**-10)
    assert float(fp8.power_of_two_scale(torch.tensor([exact]))[0]) == float(kernel_scale(exact))


def _checkpoint_row_blocks(scale: float) -> torch.Tensor:
    """Every pair (block max, other value) of non-negative e4m3 values as 32-value blocks of checkpoint
    rows (e4m3 x one e8m0 ``scale``), in bf16 as the table gathers them: ``[N, 32]`` float32."""
    codes = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 0 .. 448
    blocks = []
    for qmax in codes[1:]:
        others = codes[codes <= qmax]
        for i in range(0, len(others), 31):
            part = others[i : i + 31]
            blocks.append(torch.cat([qmax.view(1), part, torch.zeros(31 - len(part))]))
    return (torch.stack(blocks) * scale).to(torch.bfloat16).float()


@pytest.mark.parametrize("log2_scale", [-22, -10, 0, 20])
def test_fp8_activations_are_exact_on_checkpoint_rows(log2_scale):
    """docs/engram.md: the fp8 and bf16 wkv modes agree bit for bit on checkpoint rows: a block's
    activation scale is never above its table scale, so x / s is the e4m3 code times a power of two."""
    rows = _checkpoint_row_blocks(2.0**log2_scale)
    assert torch.equal(fp8.fp8_activations(rows), rows)


def test_fp8_activations_differ_below_the_amax_floor():
    """Table scales under 2**-22 (every |value| < 448 * 2**-23): the 1e-4 amax floor sets the activation
    scale 2**-22 above the table's, and small codes lose bits - the one case where the modes differ."""
    assert float(fp8.power_of_two_scale(torch.tensor([0.0]))) == 2.0**-22
    rows = _checkpoint_row_blocks(2.0**-23)
    assert not torch.equal(fp8.fp8_activations(rows), rows)
