"""engram_viz.weights.tables: exact fp8 dequantisation (hand-picked bytes), the reference lookup, in-memory
vs lazy tables, bad row ids."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from weights_kit import (
    raw,
    write_tiny_table,
)

from engram_viz.core import fp8
from engram_viz.errors import CheckpointError, RowIdError
from engram_viz.weights.procedural import ProceduralTable
from engram_viz.weights.tables import InMemoryTable, LazyTable


@pytest.fixture(scope="module")
def tiny_table_file(tmp_path_factory) -> tuple[Path, torch.Tensor, torch.Tensor]:
    """A 5,000 x 64 table written by the safetensors library (an independent writer)."""
    return write_tiny_table(tmp_path_factory.mktemp("table"))


def e4m3_value(byte: int) -> float:
    """An e4m3fn byte decoded from its bit layout: sign | 4 exponent bits (bias 7) | 3 mantissa bits;
    exponent 0 is subnormal (m/8 * 2**-6); S.1111.111 is NaN (there is no infinity)."""
    sign = -1.0 if byte & 0x80 else 1.0
    exp, man = (byte >> 3) & 0xF, byte & 0x7
    if exp == 0xF and man == 0x7:
        return float("nan")
    if exp == 0:
        return sign * (man / 8) * 2.0**-6
    return sign * (1 + man / 8) * 2.0 ** (exp - 7)


def e8m0_value(byte: int) -> float:
    """An e8m0 byte: 2 ** (byte - 127); 255 is NaN."""
    return float("nan") if byte == 255 else 2.0 ** (byte - 127)


def _bytes(values, dtype) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8).view(dtype)


def test_e4m3_hand_picked_bytes():
    hand = {
        0x00: 0.0,
        0x38: 1.0,  # exponent 7 = bias, mantissa 0
        0x3C: 1.5,  # mantissa 100b = 0.5
        0x40: 2.0,
        0x7E: 448.0,  # 1.110b * 2**8, the largest finite value
        0x08: 2.0**-6,  # smallest normal
        0x01: 2.0**-9,  # smallest subnormal: 1/8 * 2**-6
        0x07: 7 / 8 * 2.0**-6,  # largest subnormal
        0xB8: -1.0,
        0xFE: -448.0,
        0x81: -(2.0**-9),
    }
    got = _bytes(list(hand), torch.float8_e4m3fn).float().tolist()
    assert got == list(hand.values())
    for byte, want in hand.items():
        assert e4m3_value(byte) == want
    # every non-NaN byte agrees with the bit-layout decoder
    all_bytes = [b for b in range(256) if b not in (0x7F, 0xFF)]
    assert _bytes(all_bytes, torch.float8_e4m3fn).float().tolist() == [e4m3_value(b) for b in all_bytes]
    assert torch.isnan(_bytes([0x7F, 0xFF], torch.float8_e4m3fn).float()).all()


def test_e8m0_hand_picked_bytes():
    hand = {127: 1.0, 130: 8.0, 128: 2.0, 126: 0.5, 120: 2.0**-7, 0: 2.0**-127, 254: 2.0**127}
    assert _bytes(list(hand), torch.float8_e8m0fnu).float().tolist() == list(hand.values())
    for byte, want in hand.items():
        assert e8m0_value(byte) == want


def test_table_lookup_gives_exact_floats():
    """Block 0 of row 0 has scale byte 130 (8.0): 0x38 (1.0) -> 8, 0x7E (448) -> 3584, the subnormal
    0x01 (2**-9) -> 2**-6, 0xB8 (-1.0) -> -8. Block 1 has 120 (2**-7). Row 1 has scale 2**-127:
    0x01 -> 2**-136 underflows bf16 (smallest subnormal 2**-133) to 0, 0x07 -> 7 * 2**-136 rounds
    up to 2**-133; with scale 2**127, 0x38 -> 2**127 (0x7E would overflow float32 to inf, as in the
    reference)."""
    d = 64
    w = np.zeros((2, d), dtype=np.uint8)
    s = np.zeros((2, d // 32), dtype=np.uint8)
    w[0, :4] = [0x38, 0x7E, 0x01, 0xB8]
    w[0, 32:35] = [0x38, 0x7E, 0x3C]
    s[0] = [130, 120]
    w[1, :2] = [0x01, 0x07]
    w[1, 40] = 0x38
    s[1] = [0, 254]
    table = InMemoryTable(torch.from_numpy(w).view(torch.float8_e4m3fn), torch.from_numpy(s).view(torch.float8_e8m0fnu))
    out = table(torch.tensor([0, 1]))
    assert out.dtype == torch.bfloat16 and out.shape == (2, d)
    assert out[0, :4].float().tolist() == [8.0, 3584.0, 2.0**-6, -8.0]
    assert out[0, 32:35].float().tolist() == [2.0**-7, 448 * 2.0**-7, 1.5 * 2.0**-7]
    assert out[0, 4:32].float().abs().sum() == 0
    assert out[1, :2].float().tolist() == [0.0, 2.0**-133]
    assert out[1, 40].item() == 2.0**127
    # the same numbers from the bit layouts, through float64 -> bf16
    want = [[e4m3_value(int(w[r, c])) * e8m0_value(int(s[r, c // 32])) for c in range(d)] for r in range(2)]
    assert torch.equal(out, torch.tensor(want, dtype=torch.float64).to(torch.bfloat16))


def test_lookup_equals_reference_formula(tiny_table_file):
    """table(ids) == fp8.dequantize_rows(*gather_fp8(ids)) == the seed's ParallelEmbedding forward."""
    path, w, s = tiny_table_file
    table = LazyTable.open(path, "t.weight", "t.scale")
    ids = torch.randint(0, w.shape[0], (3, 11, 24), generator=torch.Generator().manual_seed(1))
    out = table(ids)
    assert torch.equal(out, fp8.dequantize_rows(*table.gather_fp8(ids)))
    values = F.embedding(ids, w).float().unflatten(-1, (-1, 32)) * F.embedding(ids, s).float().unsqueeze(-1)
    assert torch.equal(out, values.flatten(-2).to(torch.bfloat16))


def test_in_memory_and_lazy_agree_and_materialize(tiny_table_file):
    path, w, s = tiny_table_file
    lazy = LazyTable.open(path, "t.weight", "t.scale", label="my table")
    mem = lazy.materialize()
    assert torch.equal(raw(mem.weight), raw(w)) and torch.equal(raw(mem.scale), raw(s))
    ids = torch.randint(0, 5000, (64, 24))
    assert torch.equal(lazy(ids), mem.to("cpu")(ids))
    assert (lazy.num_rows, lazy.head_dim, lazy.label, lazy.synthetic) == (5000, 64, "my table", False)


@pytest.mark.parametrize("make", ["memory", "lazy", "procedural"])
def test_bad_ids_raise_naming_id_and_range(tiny_table_file, make):
    path, w, s = tiny_table_file
    table = {
        "memory": lambda: InMemoryTable(w, s, label="mem"),
        "lazy": lambda: LazyTable.open(path, "t.weight", "t.scale"),
        "procedural": lambda: ProceduralTable(5000, 64, seed=1),
    }[make]()
    for bad in (-1, 5000, 10**12):
        for call in (table, table.gather_fp8):
            with pytest.raises(RowIdError, match=rf"row id {bad} out of range .*expected 0..4999") as info:
                call(torch.tensor([[3, bad, 4]]))
            assert isinstance(info.value, ValueError) and isinstance(info.value, CheckpointError)
    with pytest.raises(TypeError, match="integers"):
        table(torch.tensor([1.0]))
