"""``ColumnView.stats()`` in both regimes (a dense column tallied per bucket, by bincounts or the
compiled tally, a sparse one by one sort of (bucket, count) pairs; V4.1's large primes by the
compiled radix sort where numba is installed) against ``np.unique``; the grouping by bucket (``order``, ``starts``)
asked for on demand; totals with some n-grams left out against a masked sum per bucket."""

from __future__ import annotations

import numpy as np
import pytest

from engram_viz.analysis.corpus import bucket_passes, top_k
from engram_viz.analysis.corpus.bucket_passes import iter_columns
from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.corpus.top_k import top_indices
from engram_viz.config import load_config
from engram_viz.core.layout import EngramLayout

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("tally_min", [1 << 60, 0], ids=["bincount", "compiled"])
@pytest.mark.parametrize("dense_ratio", [0, 8, 10**9], ids=["all-sorted", "default", "all-dense"])
@pytest.mark.parametrize("config", ["tiny", "v41-flash"])
def test_stats_match_numpy_unique_in_both_regimes(config, dense_ratio, tally_min, monkeypatch):
    if tally_min == 0:
        pytest.importorskip("numba")
    monkeypatch.setattr(bucket_passes, "DENSE_RATIO", dense_ratio)
    monkeypatch.setattr(bucket_passes, "TALLY_MIN", tally_min)
    cfg = load_config(config)
    rng = np.random.default_rng(7)
    counts = NgramCounts(cfg)
    ids = (rng.zipf(1.5, (40, 300)) - 1) % cfg.engram_compressed_vocab_size
    counts.add_compressed(ids)
    for view in iter_columns(EngramLayout(cfg), counts):
        s = view.stats()
        occupied, inverse, n = np.unique(view.buckets, return_inverse=True, return_counts=True)
        assert np.array_equal(s.occupied, occupied) and np.array_equal(s.n_ngrams, n)
        assert np.array_equal(s.hits, np.bincount(inverse, weights=view.counts).astype(np.int64))
        assert np.array_equal(s.per_key, n[inverse])
        assert np.array_equal(s.order, np.argsort(view.buckets, kind="stable"))
        assert np.array_equal(s.starts, np.r_[0, np.cumsum(n)[:-1]])
        left_out = rng.random(len(view.buckets)) < 0.05
        n_kept, hits_kept = s.totals_without(left_out, view.counts)
        assert np.array_equal(n_kept, np.bincount(inverse, weights=~left_out, minlength=len(n)).astype(np.int64))
        kept_counts = np.where(left_out, 0, view.counts)
        assert np.array_equal(hits_kept, np.bincount(inverse, weights=kept_counts, minlength=len(n)).astype(np.int64))
        some = occupied[::5]
        assert np.array_equal(view.keys_in(some), np.flatnonzero(np.isin(view.buckets, some)))
        assert view.keys_in(np.array([view.prime + 5, -1])).size == 0


@pytest.mark.parametrize("compiled_min", [1 << 60, 0], ids=["numpy", "compiled"])
def test_top_indices_keeps_the_order_of_a_full_sort(compiled_min, monkeypatch):
    if compiled_min == 0:
        pytest.importorskip("numba")
    monkeypatch.setattr(top_k, "COMPILED_MIN", compiled_min)
    rng = np.random.default_rng(3)
    cases = (rng.integers(0, 3, 5000), rng.zipf(1.3, 5000), np.full(50, 7), np.arange(10) * 2**40, np.array([3, -1, 3]))
    for values in cases:  # the last two outside [0, 2**31): the compiled heap hands them to numpy
        tiebreak = rng.permutation(len(values))
        want = np.lexsort((tiebreak, -values))
        by_index = np.lexsort((np.arange(len(values)), -values))
        for k in (0, 1, 5, 200, len(values), len(values) + 3):
            assert np.array_equal(top_indices(values, tiebreak, k), want[:k]), (k, values[:5])
            assert np.array_equal(top_indices(values, None, k), by_index[:k]), (k, values[:5])
