"""engram_viz.weights.row_edits: edits of one table left in any order (an outer edit before an
inner one) restore the table exactly; while some are open the table reads as stored with the open
edits applied in the order they were entered (each resolved when entered)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from weights_kit import write_tiny_table

from engram_viz.core import fp8
from engram_viz.weights.procedural import ProceduralTable
from engram_viz.weights.row_edits import STACK_ATTR, edit_rows
from engram_viz.weights.tables import InMemoryTable, LazyTable

ROWS = 24  # edits and reads stay in rows 0..23, so edit sets overlap often
READ = torch.arange(ROWS)


def _table(kind: str, tmp_path_factory):
    if kind == "procedural":
        return ProceduralTable(3000, 64, seed=5)
    path, w, s = write_tiny_table(tmp_path_factory.mktemp("order"))
    return InMemoryTable(w, s) if kind == "memory" else LazyTable.open(path, "t.weight", "t.scale")


@pytest.fixture(scope="module", params=["memory", "lazy", "procedural"])
def table(request, tmp_path_factory):
    return _table(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    return {kind: _table(kind, tmp_path_factory) for kind in ("memory", "lazy", "procedural")}


def _read(table) -> tuple[np.ndarray, np.ndarray]:
    w, s = table.gather_fp8(READ)
    return w.view(torch.uint8).numpy().copy(), s.view(torch.uint8).numpy().copy()


class Model:
    """The documented semantics: stored rows with the open edits applied in entry order, each
    edit's bits fixed when it is entered (a source row read as the table read it then)."""

    def __init__(self, base):
        self.base = base
        self.open: list[tuple[int, dict[int, tuple[np.ndarray, np.ndarray]]]] = []

    def read(self):
        w, s = self.base[0].copy(), self.base[1].copy()
        for _, bits in self.open:
            for r, (rw, rs) in bits.items():
                w[r], s[r] = rw, rs
        return w, s

    def enter(self, key: int, edits, head_dim: int):
        w, s = self.read()
        if isinstance(edits, range):
            edits = dict.fromkeys(edits, "zero")
        bits = {}
        for r, spec in edits.items():
            if isinstance(spec, str):
                bits[r] = np.zeros(head_dim, np.uint8), np.full(head_dim // 32, 127, np.uint8)
            elif isinstance(spec, int):
                bits[r] = w[spec].copy(), s[spec].copy()
            else:
                qw, qs = fp8.quantize_rows(spec[None])
                bits[r] = qw[0].view(torch.uint8).numpy(), qs[0].view(torch.uint8).numpy()
        self.open.append((key, bits))

    def leave(self, key: int):
        self.open = [(k, b) for k, b in self.open if k != key]


def _run(table, edit_sets, exit_order):
    base = _read(table)
    model, cms = Model(base), []
    for key, edits in enumerate(edit_sets):
        cm = edit_rows(table, edits)
        cm.__enter__()
        model.enter(key, edits, table.head_dim)
        cms.append(cm)
        _assert_reads(table, model)
    for key in exit_order:
        cms[key].__exit__(None, None, None)
        model.leave(key)
        _assert_reads(table, model)
    w, s = _read(table)
    assert np.array_equal(w, base[0]) and np.array_equal(s, base[1])  # bit-identical to the start
    assert "_gather_unique" not in vars(table) and STACK_ATTR not in vars(table)


def _assert_reads(table, model):
    (w, s), (mw, ms) = _read(table), model.read()
    assert np.array_equal(w, mw) and np.array_equal(s, ms)


OVERLAPPING = [
    {3: "zero", 5: 9, 7: torch.linspace(-3, 3, 64)},
    range(4, 10),
    {5: "zero", 9: 3, 6: 5, 11: torch.full((64,), 0.5)},
]


@pytest.mark.parametrize("n", [2, 3])
def test_every_exit_order_restores_the_table(table, n):
    for order in itertools.permutations(range(n)):
        _run(table, OVERLAPPING[:n], order)


def test_outer_left_first_leaves_no_edit_behind(table):
    """The reported case: an outer edit left before an inner one left the table edited."""
    ids = torch.tensor([1, 2, 3])
    base = table(ids)
    outer, inner = edit_rows(table, [1, 2]), edit_rows(table, [2, 3])
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)
    assert (table(ids)[1:] == 0).all() and torch.equal(table(ids)[0], base[0])  # only the inner edit
    inner.__exit__(None, None, None)
    assert torch.equal(table(ids), base)


def test_a_gather_the_table_had_of_its_own_comes_back(tmp_path_factory):
    t = _table("memory", tmp_path_factory)
    own = t._gather_unique  # an instance attribute set by someone else before the edits
    t._gather_unique = own
    a, b = edit_rows(t, {1: "zero"}), edit_rows(t, {1: 2})
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)
    b.__exit__(None, None, None)
    assert vars(t)["_gather_unique"] is own and STACK_ATTR not in vars(t)


def _spec(draw):
    kind = draw(st.sampled_from(["zero", "source", "row"]))
    if kind == "zero":
        return "zero"
    if kind == "source":
        return draw(st.integers(0, ROWS - 1))
    return torch.tensor(draw(st.lists(st.floats(-500, 500, width=32), min_size=64, max_size=64)))


@st.composite
def edit_set(draw):
    if draw(st.integers(0, 4)) == 0:
        lo = draw(st.integers(0, ROWS - 1))
        return range(lo, draw(st.integers(lo, ROWS)))
    rows = draw(st.lists(st.integers(0, ROWS - 1), min_size=1, max_size=6, unique=True))
    return {r: _spec(draw) for r in rows}


@settings(max_examples=60)
@given(data=st.data())
def test_random_overlapping_edits_left_in_any_order(data, tables):
    table = tables[data.draw(st.sampled_from(sorted(tables)))]
    sets = data.draw(st.lists(edit_set(), min_size=2, max_size=4))
    order = data.draw(st.permutations(range(len(sets))))
    _run(table, sets, order)
