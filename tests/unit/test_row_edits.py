"""engram_viz.weights.row_edits: edits overlay any table in memory (in memory, lazy, procedural),
unedited rows come back bit for bit, nothing persists after the block, bad edits are named."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from weights_kit import write_tiny_table

from engram_viz.core import fp8
from engram_viz.errors import EngramVizError
from engram_viz.weights.procedural import ProceduralTable
from engram_viz.weights.row_edits import RowEditError, edit_rows, edit_tables
from engram_viz.weights.tables import InMemoryTable, LazyTable


@pytest.fixture(scope="module", params=["memory", "lazy", "procedural"])
def table(request, tmp_path_factory):
    if request.param == "procedural":
        return ProceduralTable(3000, 64, seed=3)
    path, w, s = write_tiny_table(tmp_path_factory.mktemp("edits"))
    if request.param == "memory":
        return InMemoryTable(w, s)
    return LazyTable.open(path, "t.weight", "t.scale")


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def test_edits_apply_and_leave_other_rows_bit_identical(table):
    ids = torch.tensor([[3, 7, 11, 3], [250, 7, 999, 12]])
    w0, s0 = table.gather_fp8(ids)
    new = torch.linspace(-2, 2, table.head_dim)
    with edit_rows(table, {7: "zero", 11: 250, 999: new}) as overlay:
        w1, s1 = table.gather_fp8(ids)
        rows = table(ids)
        assert overlay.covers(ids).tolist() == [[False, True, True, False], [False, True, True, False]]
    assert (rows[0, 1] == 0).all() and (rows[1, 1] == 0).all()
    assert torch.equal(_bytes(w1[0, 2]), _bytes(w0[1, 0])) and torch.equal(_bytes(s1[0, 2]), _bytes(s0[1, 0]))
    qw, qs = fp8.quantize_rows(new[None])
    torch.testing.assert_close(rows[1, 2].float(), fp8.dequantize_rows(qw, qs)[0].float(), atol=0, rtol=0)
    keep = ~torch.from_numpy(np.isin(ids.numpy(), [7, 11, 999]))
    assert torch.equal(_bytes(w1[keep]), _bytes(w0[keep])) and torch.equal(_bytes(s1[keep]), _bytes(s0[keep]))
    w2, s2 = table.gather_fp8(ids)  # after the block: as stored
    assert torch.equal(_bytes(w2), _bytes(w0)) and torch.equal(_bytes(s2), _bytes(s0))


def test_a_range_zeroes_a_block_and_edits_nest(table):
    ids = torch.arange(0, 40)
    base = table(ids)
    with edit_rows(table, range(10, 20)) as ov:
        assert ov.n_rows == 10
        with edit_rows(table, {25: 10, 30: 31}):  # source rows as the table reads them just before
            inner = table(ids)
        outer = table(ids)
    assert (inner[10:20] == 0).all() and (inner[25] == 0).all() and torch.equal(inner[30], base[31])
    assert torch.equal(outer[25], base[25]) and torch.equal(outer[:10], base[:10])
    assert torch.equal(table(ids), base)


def test_edit_tables(table):
    with edit_tables({1: table}, {1: np.array([5, 6])}) as ovs:
        assert ovs[1].covers([5, 6, 7]).tolist() == [True, True, False]
    with pytest.raises(RowEditError, match="layers \\[9\\]"), edit_tables({1: table}, {9: [1]}):
        pass


@pytest.mark.parametrize(
    "edits, match",
    [
        ({10**9: "zero"}, "out of range"),
        ({1: "erase"}, "unknown"),
        ({1: 10**9}, "source row"),
        ({1: torch.ones(3)}, "finite float tensor"),
        ({1: torch.full((64,), float("nan"))}, "finite float tensor"),
        (range(10**9), "range"),
    ],
)
def test_bad_edits_name_the_input(table, edits, match):
    with pytest.raises(RowEditError, match=match) as err, edit_rows(table, edits):
        pass
    assert isinstance(err.value, EngramVizError) and isinstance(err.value, ValueError)
    assert "_gather_unique" not in vars(table)


def test_only_fp8_tables():
    with pytest.raises(RowEditError, match="EngramTable"), edit_rows(torch.nn.Embedding(4, 4), {1: "zero"}):
        pass
