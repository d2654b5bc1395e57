"""The compressed attention of a kv + index source block (``core.compressed_attention``) against the
float64 formulation of tests/compressed_f64.py, on a 300-token input (past ``2 * index_topk``)."""

from __future__ import annotations

import pytest
import torch
from block0_kit import load_all
from blocks_kit import blocks_config, write
from compressed_f64 import F64CompressedAttention

from engram_viz.core.blocks import attention
from engram_viz.core.compressed_attention import SharedKV
from engram_viz.weights.blocks_reader import open_blocks

LAYER = 2  # a kv and index source


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    folder = write(tmp_path_factory.mktemp("f64") / "c", 64, 3)
    cfg = blocks_config(64)
    x = (torch.randn(1, 300, 64, generator=torch.Generator().manual_seed(5))).to(torch.bfloat16)
    shared = SharedKV()
    ours = attention(x, open_blocks(folder).layer(LAYER), cfg, LAYER, shared)
    f64 = F64CompressedAttention(load_all(folder), cfg, LAYER)
    want, chosen = f64.forward(x.double())
    return ours, shared.chosen, want, chosen, f64.scores


def test_output_equals_float64_where_the_same_positions_are_chosen(both):
    """Where the indexer chose what float64 scores choose, the output is float64's (the reference's bf16
    steps applied there too); elsewhere it attends to other positions, so it differs by O(1)."""
    ours, got, want, chosen, _ = both
    same = (got == chosen).all(-1)[0]
    err = (ours.double() - want).norm(dim=-1)[0] / want.norm(dim=-1)[0]
    assert float(same.float().mean()) >= 0.9
    assert float(err[same].max()) <= 1e-3, float(err[same].max())


def test_indexer_picks_differ_from_float64_only_at_bf16_ties(both):
    """The reference scores in bf16; a position ours keeps but float64 drops scores within a bf16 rounding
    (2^-8 relative, both sides' scores) of the last one float64 keeps."""
    _, got, _, want, scores = both
    assert got.shape == want.shape == (1, 300, 16)
    assert torch.equal(got < 0, want < 0)  # the same visible counts
    for q in torch.nonzero((got != want).any(-1)[0]).flatten().tolist():
        s = scores[0, q]
        kth = float(s[want[0, q][want[0, q] >= 0]].min())
        for j in set(got[0, q].tolist()) - set(want[0, q].tolist()):
            assert float(s[j]) >= kth - 2**-7 * abs(kth) - 1e-6, (q, j, float(s[j]), kth)
