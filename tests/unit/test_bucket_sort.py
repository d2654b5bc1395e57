"""The compiled radix sort of a column's n-grams by bucket (``bucket_sort``) against ``np.argsort``
(stable) and ``np.unique`` on small random columns; the members of asked buckets read from its
runs against a scan; column views through it (the size thresholds lowered) against Python dicts;
the tables it fills, under V4.1-Flash and under the tiny config, against the numpy path's."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd
import pytest

from engram_viz.analysis.corpus import bucket_passes, bucket_sort
from engram_viz.analysis.corpus.bucket_passes import iter_columns
from engram_viz.analysis.corpus.bucket_sort import sort_kernel, sort_tally, sorted_members, value_tally
from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.row_stats.collisions import CollisionStats, analyse_together
from engram_viz.analysis.row_stats.usage import RowUsage
from engram_viz.config import load_config
from engram_viz.core.layout import EngramLayout

pytestmark = pytest.mark.unit


@pytest.fixture
def kernel():
    pytest.importorskip("numba")
    return sort_kernel()


def _reference(buckets: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, ...]:
    occupied, inverse, n = np.unique(buckets, return_inverse=True, return_counts=True)
    hits = np.bincount(inverse, weights=counts, minlength=len(occupied)).astype(np.int64)
    return np.argsort(buckets, kind="stable"), occupied, n, hits, n[inverse]


@pytest.mark.parametrize(
    ("prime", "u"),
    [(16_000_057, 3000), (2_000_003, 50_000), (1 << 31, 500), (97, 2000), (5, 0), (3, 1), (1, 40)],
    ids=["v41-prime", "crowded", "31-bit", "small", "empty", "one", "one-bucket"],
)
def test_sort_tally_matches_a_stable_argsort_and_unique(kernel, prime, u):
    rng = np.random.default_rng(prime % 1000 + u)
    buckets = rng.integers(0, prime, u)
    buckets[: u // 4] = buckets[u // 2 : u // 2 + u // 4]  # shared buckets, their keys far apart
    counts = np.where(rng.random(u) < 0.1, rng.integers(1, 1 << 40, u), rng.integers(1, 5, u))
    got = sort_tally(kernel, buckets, counts, prime)
    want = _reference(buckets, counts)
    for name, a, b in zip(("order", "occupied", "n_ngrams", "hits", "per_key"), got, want):
        assert a.dtype == np.int64 and np.array_equal(a, b), name
    _, _, n, hits, per_key = want  # the shared buckets, their n-grams and positions: from the reference's runs
    assert got[5] == (np.count_nonzero(n >= 2), np.count_nonzero(per_key >= 2), int(hits[n >= 2].sum()))


@pytest.mark.parametrize("prime", [16_000_057, 2_000_003, (1 << 31) - 1, 4099, 4093, 97, 1])
def test_sort_tally_reduces_hashes_as_python_does(kernel, prime):
    rng = np.random.default_rng(prime)
    top = (1 << 63) - 1  # the edges k * prime + (-1, 0, 1) up to 2**63 - 1, and random hashes
    edges = [k * prime + d for k in (1, 2, 3, top // prime - 1, top // prime) for d in (-1, 0, 1)]
    hashes = np.concatenate([[e for e in edges if 0 <= e <= top], rng.integers(0, top, 3000, dtype=np.int64)])
    counts = rng.integers(1, 9, len(hashes))
    buckets = np.array([int(h) % prime for h in hashes], dtype=np.int64)
    got, want = sort_tally(kernel, hashes, counts, prime), _reference(buckets, counts)
    for name, a, b in zip(("order", "occupied", "n_ngrams", "hits", "per_key"), got, want):
        assert np.array_equal(a, b), name


def test_sort_tally_takes_read_only_inputs(kernel):
    buckets, counts = np.arange(20, dtype=np.int64)[::-1] % 7, np.ones(20, np.int64)
    buckets.setflags(write=False)
    counts.setflags(write=False)
    assert np.array_equal(sort_tally(kernel, buckets, counts, 7)[0], np.argsort(buckets, kind="stable"))


@pytest.mark.parametrize(("u", "compiled_from"), [(0, 0), (1, 0), (5000, 0), (5000, 1 << 18)])
def test_value_tally_matches_a_count_per_value(u, compiled_from, monkeypatch):
    monkeypatch.setattr(bucket_sort, "VALUE_KERNEL_MIN", compiled_from)  # 0: the compiled read where numba is
    rng = np.random.default_rng(u)
    values, counts = rng.integers(0, 9, u).astype(np.int8), rng.integers(1, 1 << 40, u)
    keys, positions = value_tally(values, counts, 10)
    assert keys.dtype == positions.dtype == np.int64
    assert keys.tolist() == [int(np.count_nonzero(values == v)) for v in range(10)]
    assert positions.tolist() == [sum(int(c) for c, x in zip(counts, values) if x == v) for v in range(10)]


def test_sorted_members_match_a_scan():
    rng = np.random.default_rng(2)
    buckets = rng.integers(0, 300, 1000)
    order, occupied, n_ngrams, _, _ = _reference(buckets, np.ones(1000, np.int64))
    starts = np.cumsum(n_ngrams) - n_ngrams
    for asked in (np.unique(rng.integers(0, 320, 40)), np.empty(0, np.int64), occupied, np.array([310, 400])):
        keys, at = sorted_members(occupied, n_ngrams, starts, order, asked)
        want = np.flatnonzero(np.isin(buckets, asked))
        assert np.array_equal(np.sort(keys), want) and np.array_equal(at, buckets[keys])
        assert np.all(np.diff(at) >= 0)  # bucket by bucket


@pytest.fixture
def sorting(monkeypatch):
    """Every column through the radix sort: from one key and any prime on."""
    pytest.importorskip("numba")
    monkeypatch.setattr(bucket_passes, "TALLY_MIN", 0)
    monkeypatch.setattr(bucket_passes, "SORT_PRIME_MIN", 0)
    monkeypatch.setattr(bucket_passes, "compiled_group_tally", lambda layout: None)


def _counts(cfg, n_seq: int, length: int, seed: int) -> NgramCounts:
    """Zipf-skewed ids (repeats, ties, BOS/EOS/pad among them) and uniform ones."""
    rng = np.random.default_rng(seed)
    vocab = cfg.engram_compressed_vocab_size
    counts = NgramCounts(cfg)
    for _ in range(n_seq):
        skewed = (rng.zipf(1.3, length) - 1) % vocab
        counts.add_compressed(np.where(rng.random(length) < 0.5, skewed, rng.integers(0, vocab, length)))
    return counts


@pytest.mark.parametrize("config", ["tiny", "v41-flash"])
def test_sorted_views_match_python_dicts(sorting, config):
    cfg = load_config(config)
    counts = _counts(cfg, 6, 200, seed=3)
    rng = np.random.default_rng(5)
    for view in iter_columns(EngramLayout(cfg), counts):
        s = view.stats()
        assert s.sorted  # the radix sort's path
        buckets, c = view.buckets.tolist(), view.counts.tolist()
        members: dict[int, list[int]] = defaultdict(list)
        for i, b in enumerate(buckets):
            members[b].append(i)
        occupied = sorted(members)
        assert s.occupied.tolist() == occupied and s.n_ngrams.tolist() == [len(members[b]) for b in occupied]
        assert s.hits.tolist() == [sum(c[i] for i in members[b]) for b in occupied]
        assert s.per_key.tolist() == [len(members[b]) for b in buckets]
        assert s.order.tolist() == [i for b in occupied for i in members[b]]
        asked = rng.choice(occupied, size=min(9, len(occupied)), replace=False).tolist() + [view.prime + 3, -1]
        want = sorted(i for b in asked if b in members for i in members[b])
        assert view.keys_in(np.array(asked)).tolist() == want
        assert view.keys_in(np.array(occupied)).tolist() == list(range(len(buckets)))  # many: a mask, not a sort
        keys, at = view.members_of(np.array(asked))
        assert sorted(zip(keys.tolist(), at.tolist())) == sorted((i, buckets[i]) for i in want)
        second = [sorted((c[i] for i in members[b]), reverse=True) for b in occupied]
        assert view.second_largest(np.array(occupied)).tolist() == [x[1] if len(x) > 1 else -1 for x in second]


def test_stats_kept_after_their_views_keep_their_values_and_buckets(sorting):
    cfg = load_config("v41-flash")
    layout, counts = EngramLayout(cfg), _counts(cfg, 4, 150, seed=4)
    kept = [view.stats() for view in iter_columns(layout, counts)]  # every view dropped as the pass goes on
    for view, s in zip(iter_columns(layout, counts), kept, strict=True):
        order, occupied, n_ngrams, hits, per_key = _reference(view.buckets, view.counts)
        assert np.array_equal(s.order, order) and np.array_equal(s.occupied, occupied)
        assert np.array_equal(s.n_ngrams, n_ngrams) and np.array_equal(s.hits, hits)
        assert np.array_equal(s.per_key, per_key) and np.array_equal(s.buckets, view.buckets)


def _tables(counts: NgramCounts, cfg) -> dict[str, str]:
    usage, collisions = RowUsage(cfg, counts), CollisionStats(cfg, counts)
    analyse_together(usage, collisions, top=20)
    tables = {f"usage_{k}": v for k, v in usage.to_frame(top=20, tokenizer=False).items()}
    tables |= {f"collisions_{k}": v for k, v in collisions.to_frame(tokenizer=False).items()}
    tables["hot_rows_with_specials"] = usage.hot_rows(top=20, tokenizer=False, specials=True)
    return {name: frame.to_csv(index=False) for name, frame in tables.items() if isinstance(frame, pd.DataFrame)}


@pytest.mark.parametrize("config", ["tiny", "v41-flash"])
def test_tables_equal_the_numpy_path(sorting, config, monkeypatch):
    cfg = load_config(config)
    counts = _counts(cfg, 30, 300, seed=8)
    fast = _tables(counts, cfg)
    monkeypatch.setattr(bucket_passes, "sort_kernel", lambda: None)  # as without numba
    monkeypatch.setattr(bucket_passes, "TALLY_MIN", 1 << 60)  # nor the dense compiled tally
    slow = _tables(counts.copy(), cfg)
    assert sorted(fast) == sorted(slow) and len(fast) >= 6
    for name in fast:
        assert fast[name] == slow[name], name
