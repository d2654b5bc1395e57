"""The compiled group tally (``group_tally``, through ``bucket_passes``' column views) against Python
dicts of every key's bucket, in dense and sparse columns; the tables it fills against the numpy
path's; views kept across groups (whose bucket lists a later group overwrote); the order's keys
read packed (``order_keys``) against ``NgramCounts.ngrams``."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd
import pytest

from engram_viz.analysis.corpus import bucket_passes
from engram_viz.analysis.corpus.bucket_passes import iter_columns
from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.corpus.order_keys import OrderKeys
from engram_viz.analysis.row_stats.collisions import CollisionStats, analyse_together
from engram_viz.analysis.row_stats.usage import RowUsage
from engram_viz.config import load_config
from engram_viz.core.layout import EngramLayout

pytestmark = pytest.mark.unit

SPECIALS = np.array([0, 1, 2])  # BOS, EOS, pad


@pytest.fixture
def compiled(monkeypatch):
    """Every group through the compiled tally: from one key on, sparse columns too."""
    pytest.importorskip("numba")
    monkeypatch.setattr(bucket_passes, "TALLY_MIN", 0)
    monkeypatch.setattr(bucket_passes, "DENSE_RATIO", 10**9)


def _counts(cfg, n_seq: int, length: int, seed: int, vocab: int | None = None) -> NgramCounts:
    """Zipf-skewed ids (repeats, ties, BOS/EOS/pad among them) and uniform ones over the whole
    compressed vocabulary (4-gram keys in several groups), or over ``vocab`` ids, each sequence
    from position 0."""
    rng = np.random.default_rng(seed)
    vocab = cfg.engram_compressed_vocab_size if vocab is None else vocab
    counts = NgramCounts(cfg)
    for _ in range(n_seq):
        skewed = (rng.zipf(1.3, length) - 1) % vocab
        counts.add_compressed(np.where(rng.random(length) < 0.5, skewed, rng.integers(0, vocab, length)))
    return counts


def _python_buckets(layout: EngramLayout, view) -> list[int]:
    """Every key's bucket, in Python integers: XOR of id x multiplier over the look-backs (as int64:
    an id past the vocabulary can wrap a product), floor modulo the prime."""
    out = []
    for ngram in view.ngrams.tolist():
        h = 0
        for s, c in enumerate(reversed(ngram)):
            h ^= (c * int(layout.multipliers[view.layer_index, s])) % (1 << 64)
        out.append((h - (1 << 64) if h >= 1 << 63 else h) % view.prime)
    return out


def _check_view(layout: EngramLayout, view, rng) -> list[int]:
    """The view's figures against a dict bucket -> keys; returns the keys' buckets."""
    buckets = _python_buckets(layout, view)
    counts = view.counts.tolist()
    members: dict[int, list[int]] = defaultdict(list)
    for i, b in enumerate(buckets):
        members[b].append(i)
    occupied = sorted(members)
    s = view.stats()
    assert s.occupied.tolist() == occupied
    assert s.n_ngrams.tolist() == [len(members[b]) for b in occupied]
    assert s.hits.tolist() == [sum(counts[i] for i in members[b]) for b in occupied]
    assert s.per_key.tolist() == [len(members[b]) for b in buckets]
    assert view.buckets.tolist() == buckets
    some = rng.choice(len(buckets), size=min(7, len(buckets)), replace=False)
    assert view.buckets_at(some).tolist() == [buckets[i] for i in some]
    assert view.per_key_at(some).tolist() == [len(members[buckets[i]]) for i in some]
    asked = rng.choice(occupied, size=min(9, len(occupied)), replace=False).tolist() + [view.prime + 3, -1]
    want = sorted(i for b in asked if b in members for i in members[b])
    assert view.keys_in(np.array(asked)).tolist() == want
    keys, at = view.members_of(np.array(asked))
    assert sorted(zip(keys.tolist(), at.tolist())) == sorted((i, buckets[i]) for i in want)
    second = [sorted((counts[i] for i in members[b]), reverse=True) for b in occupied]
    assert view.second_largest(np.array(occupied)).tolist() == [c[1] if len(c) > 1 else -1 for c in second]
    only = [i for i, g in enumerate(view.ngrams.tolist()) if set(g) <= set(SPECIALS.tolist())]
    assert view.made_of(SPECIALS).tolist() == only
    return buckets


@pytest.mark.parametrize(
    ("n_seq", "length", "vocab"),
    [(20, 300, None), (2, 40, None), (4, 100, 1 << 17)],
    ids=["dense", "sparse", "ids-past-the-vocabulary"],
)
def test_group_tally_matches_python_dicts(compiled, n_seq, length, vocab):
    cfg = load_config("tiny")
    layout = EngramLayout(cfg)
    counts = _counts(cfg, n_seq, length, seed=n_seq, vocab=vocab)
    rng = np.random.default_rng(1)
    shared: dict[tuple[int, int], np.ndarray] = {}
    for view in iter_columns(layout, counts):
        assert view.group.tally() is not None  # the compiled path, not the numpy one
        buckets = np.array(_check_view(layout, view, rng))
        per_key = np.bincount(buckets)[buckets]
        key = (view.layer, view.order)
        shared[key] = shared.get(key, np.zeros(len(buckets), np.int64)) + (per_key >= 2)
        if view.head == layout.n_heads - 1:
            heads_shared, n_keys, n_pos = view.heads_shared()
            want = shared[key]
            assert heads_shared.tolist() == want.tolist()
            assert n_keys.tolist() == np.bincount(want, minlength=layout.n_heads + 1).tolist()
            positions = [int(view.counts[want == j].sum()) for j in range(layout.n_heads + 1)]
            assert n_pos.tolist() == positions


def _tables(counts: NgramCounts, cfg) -> dict[str, pd.DataFrame]:
    usage, collisions = RowUsage(cfg, counts), CollisionStats(cfg, counts)
    analyse_together(usage, collisions, top=20)
    tables = {f"usage_{k}": v for k, v in usage.to_frame(top=20, tokenizer=False).items()}
    tables |= {f"collisions_{k}": v for k, v in collisions.to_frame(tokenizer=False).items()}
    tables["hot_rows_with_specials"] = usage.hot_rows(top=20, tokenizer=False, specials=True)
    tables["top_ngrams_past_the_ranking"] = collisions.top_ngrams(300, tokenizer=False)  # ranked anew
    no_examples = CollisionStats(cfg, counts)
    no_examples.examples(n_examples=0, tokenizer=False)  # a pass that ranks nothing for the examples
    tables["top_ngrams_without_examples"] = no_examples.top_ngrams(tokenizer=False)
    pd.testing.assert_frame_equal(tables["top_ngrams_without_examples"], tables["collisions_top_ngrams"])
    return tables


def test_tables_equal_the_numpy_path(compiled, monkeypatch):
    cfg = load_config("tiny")
    counts = _counts(cfg, 30, 300, seed=5)
    fast = _tables(counts, cfg)
    monkeypatch.setattr(bucket_passes, "compiled_group_tally", lambda layout: None)  # as without numba
    slow = _tables(counts.copy(), cfg)
    assert sorted(fast) == sorted(slow)
    for name in fast:
        pd.testing.assert_frame_equal(fast[name], slow[name])
        assert fast[name].to_csv(index=False) == slow[name].to_csv(index=False)


def test_spilled_counts_give_the_same_tables(compiled, tmp_path):
    """Counts spilled to disk (the lists' buffer then grows order by order) against counts in memory."""
    cfg = load_config("tiny")
    rng = np.random.default_rng(4)
    ids = (rng.zipf(1.3, (12, 300)) - 1) % cfg.engram_compressed_vocab_size
    whole, spilled = NgramCounts(cfg), NgramCounts(cfg, memory_limit=100_000, spill_dir=tmp_path)
    for row in ids:
        whole.add_compressed(row)
        spilled.add_compressed(row)
    assert spilled.n_spills > 0
    a, b = _tables(whole, cfg), _tables(spilled, cfg)
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name])


def test_views_kept_across_groups_read_their_own_lists(compiled):
    """Every view kept, then read last group first: a group whose lists a later group's tally
    overwrote tallies again (the lists share one buffer)."""
    cfg = load_config("tiny")
    layout = EngramLayout(cfg)
    counts = _counts(cfg, 10, 200, seed=9)
    views = list(iter_columns(layout, counts))
    for view in reversed(views):
        b = view.buckets
        some = np.unique(b)[::5]
        assert np.array_equal(view.keys_in(some), np.flatnonzero(np.isin(b, some)))
        occupied, n = np.unique(b, return_counts=True)
        assert np.array_equal(view.stats().n_ngrams, n) and np.array_equal(view.stats().occupied, occupied)


def test_order_keys_read_packed_equal_the_unpacked_ngrams():
    cfg = load_config("tiny")
    counts = _counts(cfg, 8, 300, seed=2)
    rng = np.random.default_rng(0)
    for order in cfg.ngram_orders:
        ngrams, c = counts.ngrams(order)
        keys = OrderKeys(counts, order)
        if order == 4:
            assert len(keys.gvals) > 1  # 4-gram keys in several groups
        some = rng.integers(0, len(c), 50)
        assert np.array_equal(keys.ngrams_at(some), ngrams[some])  # before and after unpacking all
        assert np.array_equal(keys.counts, c) and keys.positions == int(c.sum())
        for ids in (SPECIALS, np.array([2]), np.array([5, 70_000])):
            want = [i for i, g in enumerate(ngrams.tolist()) if set(g) <= set(ids.tolist())]
            assert keys.made_of(ids).tolist() == want
        assert np.array_equal(keys.ngrams(), ngrams)
        assert np.array_equal(keys.ngrams_at(some), ngrams[some])
