"""keys: packed n-gram keys round-trip and sort as tuples; the hash of distinct n-grams."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engram_viz.analysis.corpus.keys import KEY_BITS, pack_ngrams, pack_windows, unpack_ngrams
from engram_viz.analysis.corpus.row_ids import ngram_hashes
from engram_viz.config import load_config
from engram_viz.core.layout import EngramLayout


@given(st.lists(st.tuples(*[st.integers(0, (1 << KEY_BITS) - 1)] * 4), min_size=1, max_size=30))
def test_pack_unpack_roundtrip_and_order(rows):
    g = np.array(rows, dtype=np.int64)
    for n in (2, 3, 4):
        sub = g[:, 4 - n :]
        group, lo = pack_ngrams(sub)
        back = np.empty_like(sub)
        for grp in np.unique(group):
            back[group == grp] = unpack_ngrams(grp, lo[group == grp], n)
        assert np.array_equal(back, sub)
        # sorting by (group, lo) is sorting the tuples
        order = np.lexsort((lo, group))
        assert [tuple(r) for r in sub[order].tolist()] == sorted(tuple(r) for r in sub.tolist())


@given(st.lists(st.tuples(*[st.integers(0, (1 << KEY_BITS) - 1)] * 4), min_size=0, max_size=30))
def test_pack_windows_equals_each_order_packed_on_its_own(rows):
    w = np.array(rows, dtype=np.int64).reshape(-1, 4)  # windows: look-back s in column s
    packed = pack_windows(w, (2, 3, 4))
    assert sorted(packed) == [2, 3, 4]
    for n, (group, lo) in packed.items():
        want_group, want_lo = pack_ngrams(w[:, n - 1 :: -1])  # the n-gram, oldest first
        assert group.dtype == want_group.dtype and lo.dtype == want_lo.dtype
        assert np.array_equal(group, want_group) and np.array_equal(lo, want_lo)


def test_pack_rejects_dead_and_long_orders():
    with pytest.raises(ValueError, match="DEAD"):
        pack_ngrams(np.array([[-1, 3]]))
    with pytest.raises(ValueError, match="order 5"):
        pack_ngrams(np.zeros((1, 5), dtype=np.int64))
    with pytest.raises(ValueError, match="DEAD"):
        pack_windows(np.array([[3, -1, 2, 2]]), (2, 3, 4))


def test_ngram_hashes_match_layout_rows():
    cfg = load_config("v41-flash")
    layout = EngramLayout(cfg)
    g = np.random.default_rng(4).integers(0, 99092, (20, 3))
    h = ngram_hashes(layout, 1, g)
    for row, hv in zip(g, h):
        expected = layout.ngram_rows(14, tuple(row))
        got = [hv % layout.column_primes[1, 8 + k] + layout.offsets[1, 8 + k] for k in range(8)]
        assert np.array_equal(got, expected)
