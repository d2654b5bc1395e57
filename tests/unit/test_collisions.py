"""CollisionStats against brute-force bucket sets (a forced-collision layout and real ones)."""

from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np
import pandas as pd
import pytest
from _brute import forced_config, random_sequences, ref_buckets, ref_counts, ref_row, ref_windows

from engram_viz.analysis.corpus.bucket_passes import ColumnView
from engram_viz.analysis.row_stats.collisions import (
    CollisionStats,
    _column_examples,
    expected_uniform,
    poisson_binomial,
)
from engram_viz.config import load_config
from engram_viz.core.layout import EngramLayout


def _stats(config, seqs, masks) -> CollisionStats:
    cs = CollisionStats(config)
    for s, m in zip(seqs, masks):
        cs.add_compressed(np.array(s), np.array(m))
    return cs


@pytest.mark.parametrize("config_name", ["forced", "tiny"])
def test_columns_equal_brute_force(config_name):
    cfg = forced_config() if config_name == "forced" else load_config(config_name)
    seqs, masks = random_sequences(21, n_seq=10, alphabet=40 if config_name == "forced" else 2000, max_len=60)
    cs = _stats(cfg, seqs, masks)
    counts = ref_counts(cfg, seqs, masks)
    buckets = ref_buckets(cfg, counts)
    cols = cs.columns()
    assert len(cols) == cfg.n_engram_layers * cfg.n_hash_cols
    total_colliding = 0
    for r in cols.itertuples():
        b = buckets[(r.layer, r.order, r.head)]
        keys = [k for k in counts if len(k) == r.order]
        colliding = [k for members in b.values() if len(members) >= 2 for k in members]
        total_colliding += len(colliding)
        assert r.distinct_ngrams == len(keys)
        assert r.occupied == len(b)
        assert r.shared_buckets == sum(1 for members in b.values() if len(members) >= 2)
        assert r.colliding_ngrams == len(colliding)
        assert r.positions == sum(counts[k] for k in keys)
        assert r.colliding_positions == sum(counts[k] for k in colliding)
        exp = expected_uniform(len(keys), r.prime)
        assert r.expected_occupied == pytest.approx(exp["occupied"])
    if config_name == "forced":
        assert total_colliding > 0  # primes of 11..239: collisions are certain


def test_expected_uniform_closed_forms_by_enumeration():
    for k, m in [(1, 5), (2, 3), (3, 4), (4, 3), (5, 2)]:
        occ = shared = coll = 0.0
        assignments = list(itertools.product(range(m), repeat=k))
        for a in assignments:
            sizes = [a.count(b) for b in range(m)]
            occ += sum(s > 0 for s in sizes)
            shared += sum(s >= 2 for s in sizes)
            coll += sum(s for s in sizes if s >= 2)
        n = len(assignments)
        e = expected_uniform(k, m)
        assert e["occupied"] == pytest.approx(occ / n)
        assert e["shared_buckets"] == pytest.approx(shared / n)
        assert e["colliding_ngrams"] == pytest.approx(coll / n)
    big = expected_uniform(780_078, 16_000_057)  # stable for real sizes
    assert 0 < big["shared_buckets"] < big["occupied"] < 780_078


def test_heads_shared_per_ngram_equal_brute_force():
    cfg = forced_config()
    seqs, masks = random_sequences(22, n_seq=10, alphabet=60, max_len=60)
    cs = _stats(cfg, seqs, masks)
    counts = ref_counts(cfg, seqs, masks)
    buckets = ref_buckets(cfg, counts)
    layout = EngramLayout(cfg)
    table = cs.heads_shared()
    for li, layer in enumerate(cfg.engram_layer_ids):
        for order in cfg.ngram_orders:
            ngrams, c, shared = cs.ngram_heads_shared(layer, order)
            for key, got, cnt in zip(map(tuple, ngrams.tolist()), shared.tolist(), c.tolist()):
                want = sum(
                    len(buckets[(layer, order, h)][ref_row(layout, li, key, h)]) >= 2 for h in range(cfg.engram_n_heads)
                )
                assert got == want and cnt == counts[key]
            sub = table[(table.layer == layer) & (table.order == order)]
            assert sub.heads_shared.tolist() == list(range(cfg.engram_n_heads + 1))
            assert sub.ngrams.tolist() == np.bincount(shared, minlength=cfg.engram_n_heads + 1).tolist()
            assert sub.ngrams.sum() == len(ngrams) and sub.expected_ngrams.sum() == pytest.approx(len(ngrams))


def test_examples_are_real_collisions(tokenizer):
    cfg = forced_config()
    layout = EngramLayout(cfg)
    seqs, masks = random_sequences(23, n_seq=10, alphabet=60, max_len=60)
    cs = _stats(cfg, seqs, masks)
    counts = ref_counts(cfg, seqs, masks)
    ex = cs.examples(n_examples=2, ngrams_per_bucket=3, tokenizer=tokenizer)
    assert len(ex) and ex.n_ngrams.ge(2).all() and ex.ngram.str.len().gt(0).all()
    for r in ex.itertuples():
        key = tuple(int(x) for x in r.ngram_ids.split())
        li = layout.layer_index(r.layer)
        assert ref_row(layout, li, key, r.head) == r.row and counts[key] == r.count and len(key) == r.order
    for _, grp in ex.groupby(["layer", "order", "head", "example"]):
        assert grp.row.nunique() == 1 and grp["count"].is_monotonic_decreasing and len(grp) >= 2


@pytest.mark.parametrize("config_name", ["forced", "v41-flash"])
def test_exposure_equals_brute_force(config_name):
    cfg = forced_config() if config_name == "forced" else load_config(config_name)
    layout = EngramLayout(cfg)
    seqs, masks = random_sequences(24, n_seq=6, alphabet=50, max_len=40)
    population = _stats(cfg, seqs[:4], masks[:4])  # the last two sequences are queries outside it
    counts = ref_counts(cfg, seqs[:4], masks[:4])
    buckets = ref_buckets(cfg, counts)
    for s, m in zip(seqs, masks):
        shared = population.shared_rows(np.array(s), np.array(m))
        assert shared.shape == (len(s), cfg.n_engram_layers, cfg.n_hash_cols)
        for t, w in enumerate(ref_windows(s, m, 2, 4)):
            for li, layer in enumerate(cfg.engram_layer_ids):
                want = []
                for order in cfg.ngram_orders:
                    key = tuple(reversed(w[:order]))
                    for h in range(cfg.engram_n_heads):
                        members = buckets[(layer, order, h)].get(ref_row(layout, li, key, h), set())
                        want.append(m[t] and len(members - {key}) > 0)
                assert shared[t, li].tolist() == want
        assert np.array_equal(population.exposure(np.array(s), np.array(m)), shared.sum(-1))
    batch = np.array([seqs[0][:5], seqs[1][:5]])
    assert population.exposure(batch).shape == (2, 5, cfg.n_engram_layers)
    ragged = population.exposure_ragged([np.array(s) for s in seqs], [np.array(m) for m in masks])
    for s, m, got in zip(seqs, masks, ragged):
        assert np.array_equal(got, population.exposure(np.array(s), np.array(m)))
    with pytest.raises(ValueError, match="one per sequence"):
        population.exposure_ragged([np.array(seqs[0])], [])


def test_merge_of_shards_equals_whole():
    cfg = forced_config()
    seqs, masks = random_sequences(25, n_seq=10, alphabet=40)
    whole = _stats(cfg, seqs, masks)
    merged = _stats(cfg, seqs[:3], masks[:3]).merge(_stats(cfg, seqs[3:], masks[3:]))
    fw, fm = whole.to_frame(tokenizer=False), merged.to_frame(tokenizer=False)
    for name in fw:
        pd.testing.assert_frame_equal(fm[name], fw[name])
    assert merged.summary() == whole.summary()


def test_key_includes_pads_sequence_start_equals_after_image():
    """After an image the first text token hashes like a sequence start, so its n-grams are the
    same keys (pads included) as at position 0: they are one n-gram, counted twice."""
    cfg = load_config("tiny")
    cs = CollisionStats(cfg)
    cs.add_compressed(np.array([500, 600, 700]))
    cs.add_compressed(np.array([900, 900, 500, 600]), np.array([True, False, True, True]))
    ngrams, counts, _ = cs.ngram_heads_shared(1, 2)
    got = dict(zip(map(tuple, ngrams.tolist()), counts.tolist()))
    assert got[(2, 500)] == 2 and got[(500, 600)] == 2 and got[(2, 900)] == 1
    assert (900, 500) not in got  # the look-back into the image is blocked


def test_top_ngrams_and_summary():
    cfg = load_config("tiny")
    seqs, masks = random_sequences(26, n_seq=8, alphabet=12)
    cs = _stats(cfg, seqs, masks)
    top = cs.top_ngrams(top=3, tokenizer=False)
    assert set(top.layer) == set(cfg.engram_layer_ids) and top.groupby("order")["rank"].max().le(3).all()
    counts = ref_counts(cfg, seqs, masks)
    best2 = sorted((v for k, v in counts.items() if len(k) == 2), reverse=True)[:3]
    assert top[(top.order == 2) & (top.layer == 1)]["count"].tolist() == best2
    s = cs.summary()
    assert s["positions"] == sum(sum(m) for m in masks)
    per_order = defaultdict(int)
    for k in counts:
        per_order[len(k)] += 1
    assert {o: v["distinct_ngrams"] for o, v in s["layers"]["1"].items()} == {str(k): v for k, v in per_order.items()}


def test_analyse_together_equals_separate_passes():
    from engram_viz.analysis.row_stats.collisions import analyse_together
    from engram_viz.analysis.row_stats.usage import RowUsage

    cfg = load_config("tiny")
    seqs, masks = random_sequences(27, n_seq=10, alphabet=3000, max_len=60)
    shared = _stats(cfg, seqs, masks).counts
    usage, coll = RowUsage(cfg, shared), CollisionStats(cfg, shared)
    analyse_together(usage, coll, top=7)
    alone_u, alone_c = RowUsage(cfg, shared.copy()), CollisionStats(cfg, shared.copy())
    for a, b in (
        (usage.to_frame(top=7, tokenizer=False), alone_u.to_frame(top=7, tokenizer=False)),
        (coll.to_frame(tokenizer=False), alone_c.to_frame(tokenizer=False)),
    ):
        for name in a:
            pd.testing.assert_frame_equal(a[name], b[name])
    with pytest.raises(ValueError, match="same NgramCounts"):
        analyse_together(alone_u, alone_c)


def test_poisson_binomial():
    d = poisson_binomial(np.full(8, 0.3))
    from math import comb

    assert np.allclose(d, [comb(8, j) * 0.3**j * 0.7 ** (8 - j) for j in range(9)])
    assert np.isclose(poisson_binomial(np.array([0.1, 0.5, 0.9])).sum(), 1.0)


@pytest.mark.parametrize("frequent", [False, True], ids=["any-keys", "most-frequent-keys"])
def test_column_examples_against_sorting_every_candidate_bucket(frequent):
    """The example buckets (ranked by second largest count, positions, bucket; members by count
    then index) against plain Python sorts of every candidate bucket, ties in counts included:
    for any colliding keys, and for the most frequent ones (whose buckets' other keys are bounded)."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        u, prime = int(rng.integers(2, 2000)), int(rng.choice([3, 7, 101, 997]))
        counts = rng.integers(1, int(rng.choice([2, 4, 1000])), u).astype(np.int64)
        buckets = rng.integers(0, prime, u).astype(np.int64)
        ngrams = rng.integers(0, 1000, (u, 2))
        view = ColumnView(0, 0, 2, 0, 0, prime, 5, ngrams, counts, buckets)
        colliding = np.flatnonzero(view.occupancy()[2] >= 2)
        if not len(colliding):
            continue
        top = rng.permutation(colliding)[: int(rng.integers(1, 300))]
        if frequent:  # the k most frequent colliding keys, ties by index
            top = colliding[np.lexsort((colliding, -counts[colliding]))][: len(top)]
        members = defaultdict(list)
        for i in range(u):
            if buckets[i] in set(buckets[top].tolist()):
                members[int(buckets[i])].append(i)
        for b in members:
            members[b].sort(key=lambda i: (-counts[i], i))
        ranked = sorted(members, key=lambda b: (-counts[members[b][1]], -sum(counts[members[b]]), b))[:3]
        want = [
            (rank, b + 5, b, len(members[b]), j, tuple(ngrams[i].tolist()), int(counts[i]))
            for rank, b in enumerate(ranked, 1)
            for j, i in enumerate(members[b][:4], 1)
        ]
        got = _column_examples(view, top, 3, 4, frequent=frequent)
        keys = ("example", "row", "bucket", "n_ngrams", "ngram_rank", "ngram_ids", "count")
        assert [tuple(r[k] for k in keys) for r in got] == want
