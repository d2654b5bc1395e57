"""engram_viz.weights.procedural: the procedural table and embedding match their documented definition."""

from __future__ import annotations

import pytest
import torch
from weights_kit import (
    V41_ROWS,
    raw,
)

from engram_viz.core import fp8
from engram_viz.errors import RowIdError
from engram_viz.weights import procedural as P
from engram_viz.weights.procedural import ProceduralEmbedding, ProceduralTable


def _procedural_row_by_hand(seed: int, stream: int, row: int, cols: int) -> list[float]:
    """The documented definition in plain Python integers (no numpy): splitmix64 of a counter."""
    m = (1 << 64) - 1

    def mix(z):
        z &= m
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
        return z ^ (z >> 31)

    golden = 0x9E3779B97F4A7C15
    key = mix(((seed * golden) & m) ^ stream)
    words = cols // 2
    values = []
    for j in range(words):
        word = mix(key + (row * words + j) * golden)
        for h in range(2):
            k = sum((word >> (8 * (4 * h + b))) & 0xFF for b in range(4)) - 510
            values.append(k / 128)
    return values


def test_procedural_table_matches_its_definition():
    table = ProceduralTable(V41_ROWS, 256, seed=7)
    rows = [0, 1, 99_999, V41_ROWS - 1]
    w, s = table.gather_fp8(torch.tensor(rows))
    want = torch.tensor([_procedural_row_by_hand(7, P.STREAM_TABLE, r, 256) for r in rows], dtype=torch.float32)
    ww, ws = fp8.quantize_rows(want)
    assert torch.equal(raw(w), raw(ww)) and torch.equal(raw(s), raw(ws))
    assert table.synthetic and "synthetic" in table.label


def test_procedural_table_is_deterministic_and_order_free():
    a, b = ProceduralTable(V41_ROWS, 256, seed=3), ProceduralTable(V41_ROWS, 256, seed=3)
    ids = torch.randint(0, V41_ROWS, (2000,), generator=torch.Generator().manual_seed(0))
    ra = a(ids)
    assert torch.equal(ra, b(ids))
    perm = torch.randperm(len(ids))
    assert torch.equal(a(ids[perm]), ra[perm])
    assert torch.equal(a(ids[:5].reshape(5, 1)), ra[:5].reshape(5, 1, 256))
    assert not torch.equal(ProceduralTable(V41_ROWS, 256, seed=4)(ids), ra)
    values = ra.float()
    assert torch.isfinite(values).all()
    assert 1.0 < values.std() < 1.3 and values.mean().abs() < 0.02  # near N(0, 1.15), varied rows
    assert len(torch.unique(values[:, 0])) > 50


def test_procedural_embedding_matches_its_definition():
    emb = ProceduralEmbedding(129_280, 64, seed=2)
    out = emb.rows(torch.tensor([[5, 129_279]]))
    assert out.dtype == torch.bfloat16 and out.shape == (1, 2, 64)
    want = torch.tensor([_procedural_row_by_hand(2, P.STREAM_EMBED, r, 64) for r in (5, 129_279)]).to(torch.bfloat16)
    assert torch.equal(out[0], want)
    assert emb.synthetic
    with pytest.raises(RowIdError, match="129280"):
        emb.rows(torch.tensor([129_280]))
