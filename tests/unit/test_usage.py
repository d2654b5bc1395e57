"""RowUsage against brute-force counts of the reference hasher's rows; merge; tables."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pandas as pd
import pytest
from _brute import forced_config, random_sequences, ref_counts, ref_row, ref_row_hits_from_hasher

from engram_viz.analysis.row_stats.usage import RowUsage
from engram_viz.config import load_config
from engram_viz.core.layout import EngramLayout


def _raw_docs(tokenizer, seed, n_seq=6, alphabet=14):
    """Raw-id sequences whose compressed ids come from a small alphabet (so rows repeat)."""
    seqs, masks = random_sequences(seed, n_seq=n_seq, alphabet=alphabet, p_image=0.15)
    members = tokenizer.compressed_members
    raw = [[members[c][0] for c in s] for s in seqs]
    return raw, seqs, masks


def _usage(config, seqs, masks) -> RowUsage:
    u = RowUsage(config)
    for s, m in zip(seqs, masks):
        u.add_compressed(np.array(s), np.array(m))
    return u


@pytest.mark.parametrize("config_name", ["forced", "tiny", "v41-flash"])
def test_row_hits_equal_brute_force_over_hasher_rows(config_name, tokenizer):
    cfg = forced_config() if config_name == "forced" else load_config(config_name)
    raw, seqs, masks = _raw_docs(tokenizer, 11)
    usage = _usage(cfg, seqs, masks)
    ref = ref_row_hits_from_hasher(cfg, raw, masks, tokenizer.token_map)
    for layer in cfg.engram_layer_ids:
        rows, hits = usage.row_hits(layer)
        assert np.all(np.diff(rows) > 0)
        assert dict(zip(((layer, int(r)) for r in rows), hits.tolist())) == {
            k: v for k, v in ref.items() if k[0] == layer
        }
        probe = np.array([int(rows[0]), int(rows[-1]), 10**6 + 7])
        assert usage.hits_of(layer, probe).tolist() == [ref.get((layer, int(r)), 0) for r in probe]
    assert usage.n_positions == sum(sum(m) for m in masks)


def test_coverage_histogram_rank_frequency_match_brute_force():
    cfg = forced_config()
    layout = EngramLayout(cfg)
    seqs, masks = random_sequences(12, n_seq=8, alphabet=30)
    usage = _usage(cfg, seqs, masks)
    counts = ref_counts(cfg, seqs, masks)
    hits = defaultdict(int)  # (layer, order, head, row) -> hits
    for li, layer in enumerate(cfg.engram_layer_ids):
        for key, c in counts.items():
            for head in range(cfg.engram_n_heads):
                hits[(layer, len(key), head, ref_row(layout, li, key, head))] += c
    cov = usage.coverage()
    assert list(cov.columns) == [
        "layer",
        "order",
        "head",
        "column",
        "prime",
        "offset",
        "distinct_ngrams",
        "hits",
        "rows_touched",
        "coverage",
        "max_hits",
    ]
    assert len(cov) == cfg.n_engram_layers * cfg.n_hash_cols
    for r in cov.itertuples():
        mine = [v for (la, o, h, _), v in hits.items() if (la, o, h) == (r.layer, r.order, r.head)]
        assert r.rows_touched == len(mine) and r.hits == sum(mine) and r.max_hits == max(mine)
        assert r.coverage == pytest.approx(len(mine) / r.prime)
        assert r.distinct_ngrams == sum(1 for k in counts if len(k) == r.order)
    hist = usage.hit_histogram(specials=True)
    for (layer, order), grp in hist.groupby(["layer", "order"]):
        mine = [v for (la, o, _, _), v in hits.items() if (la, o) == (layer, order)]
        assert dict(zip(grp.hits, grp.rows)) == {v: mine.count(v) for v in set(mine)}
    rf = usage.rank_frequency(max_points=10_000, specials=True)
    for layer in cfg.engram_layer_ids:
        desc = sorted((v for (la, *_), v in hits.items() if la == layer), reverse=True)
        got = rf[rf.layer == layer]
        assert got["rank"].tolist() == list(range(1, len(desc) + 1))
        assert got["hits"].tolist() == desc
    sampled = usage.rank_frequency(max_points=16, specials=True)
    assert sampled.groupby("layer")["rank"].min().eq(1).all() and len(sampled) <= 32


def test_hot_rows_list_exactly_the_ngrams_landing_there():
    cfg = forced_config()
    layout = EngramLayout(cfg)
    seqs, masks = random_sequences(13, n_seq=8, alphabet=30)
    usage = _usage(cfg, seqs, masks)
    counts = ref_counts(cfg, seqs, masks)
    hot = usage.hot_rows(top=5, ngrams_per_row=3, tokenizer=False, specials=True)
    for layer in cfg.engram_layer_ids:
        li = layout.layer_index(layer)
        per_row = defaultdict(list)
        for key, c in counts.items():
            for head in range(cfg.engram_n_heads):
                per_row[ref_row(layout, li, key, head)].append((c, key))
        ranked = sorted(per_row, key=lambda r: (-sum(c for c, _ in per_row[r]), r))[:5]
        got = hot[hot.layer == layer]
        assert got.drop_duplicates("rank")["row"].tolist() == ranked
        for r in got.itertuples():
            owner = layout.owner(layer, r.row)
            assert (owner.order, owner.head, owner.bucket) == (r.order, r.head, r.bucket)
            assert r.hits == sum(c for c, _ in per_row[r.row]) and r.n_ngrams == len(per_row[r.row])
            key = tuple(int(x) for x in r.ngram_ids.split())
            assert (r.ngram_hits, key) in per_row[r.row]
        for row, grp in got.groupby("row"):
            best = sorted(per_row[row], key=lambda x: (-x[0], x[1]))[:3]
            assert grp.ngram_hits.tolist() == [c for c, _ in best]


@pytest.mark.parametrize("config_name", ["forced", "tiny"])
def test_layer_totals_count_each_ngram_once_against_an_independent_count(config_name):
    cfg = forced_config() if config_name == "forced" else load_config(config_name)
    seqs, masks = random_sequences(16, n_seq=10, alphabet=40)
    usage = _usage(cfg, seqs, masks)
    distinct = len(ref_counts(cfg, seqs, masks))  # distinct (order, n-gram) keys, by hand
    totals = usage.layer_totals()
    assert totals["layer"].tolist() == list(cfg.engram_layer_ids)
    assert totals["distinct_ngrams"].tolist() == [distinct] * len(cfg.engram_layer_ids)
    summed = usage.coverage().groupby("layer")["distinct_ngrams"].sum()  # what the report used to show
    assert summed.tolist() == [cfg.engram_n_heads * distinct] * len(cfg.engram_layer_ids)
    assert totals["row_reads"].tolist() == [24 * usage.n_positions] * len(cfg.engram_layer_ids)
    np.testing.assert_allclose(totals["coverage"], totals["rows_touched"] / totals["rows"])


def test_hot_rows_and_rank_frequency_leave_out_bos_and_pad_only_ngrams():
    cfg = forced_config()
    layout = EngramLayout(cfg)
    seqs, masks = random_sequences(17, n_seq=12, alphabet=30)
    seqs = [[0, *s] for s in seqs]  # every sequence starts with BOS: (pad, BOS), (pad, pad, BOS) ... are hottest
    masks = [[True, *m] for m in masks]
    usage = _usage(cfg, seqs, masks)
    special = {0, 1, 2}
    plain = {k: c for k, c in ref_counts(cfg, seqs, masks).items() if not set(k) <= special}
    kept = usage.hot_rows(top=5, tokenizer=False)
    every = usage.hot_rows(top=5, tokenizer=False, specials=True)
    ids = [tuple(int(x) for x in k.split()) for k in every["ngram_ids"]]
    assert any(set(k) <= special for k in ids)  # with the switch, the sequence starts are there
    assert not any({int(x) for x in k.split()} <= special for k in kept["ngram_ids"])
    for layer in cfg.engram_layer_ids:
        li = layout.layer_index(layer)
        per_row = defaultdict(int)
        for key, c in plain.items():
            for head in range(cfg.engram_n_heads):
                per_row[ref_row(layout, li, key, head)] += c
        ranked = sorted(per_row, key=lambda r: (-per_row[r], r))[:5]
        got = kept[kept.layer == layer].drop_duplicates("rank")
        assert got["row"].tolist() == ranked and got["hits"].tolist() == [per_row[r] for r in ranked]
        rf = usage.rank_frequency(max_points=10_000)
        assert rf[rf.layer == layer]["hits"].tolist() == sorted(per_row.values(), reverse=True)


def test_merge_of_shards_equals_whole():
    cfg = forced_config()
    seqs, masks = random_sequences(14, n_seq=10, alphabet=20)
    whole = _usage(cfg, seqs, masks)
    a, b = _usage(cfg, seqs[:4], masks[:4]), _usage(cfg, seqs[4:], masks[4:])
    merged = a.merge(b)
    fa, fw = merged.to_frame(top=5, tokenizer=False), whole.to_frame(top=5, tokenizer=False)
    for name in fw:
        pd.testing.assert_frame_equal(fa[name], fw[name])
    with pytest.raises(ValueError, match="different"):
        whole.merge(RowUsage(load_config("v41-flash")))


def test_column_stats_equal_numpy_unique():
    cfg = load_config("tiny")
    seqs, masks = random_sequences(15, n_seq=10, alphabet=200)
    usage = _usage(cfg, seqs, masks)
    from engram_viz.analysis.corpus.bucket_passes import iter_columns

    for view in iter_columns(usage.layout, usage.counts):
        s = view.stats()
        occupied, inverse, n = np.unique(view.buckets, return_inverse=True, return_counts=True)
        assert np.array_equal(s.occupied, occupied) and np.array_equal(s.n_ngrams, n)
        assert np.array_equal(s.hits, np.bincount(inverse, weights=view.counts).astype(np.int64))
        assert np.array_equal(s.per_key, n[inverse])
        some = occupied[::7]
        assert np.array_equal(view.keys_in(some), np.flatnonzero(np.isin(view.buckets, some)))
        assert view.keys_in(np.array([view.prime + 5])).size == 0


def test_image_positions_are_not_counted_and_tables_decode(tokenizer):
    cfg = load_config("tiny")
    ids = tokenizer.compress(tokenizer.encode("Alexander the Great"))
    mask = np.ones(len(ids), bool)
    u = RowUsage(cfg)
    u.add_compressed(ids, mask)
    all_dead = RowUsage(cfg)
    all_dead.add_compressed(ids, np.zeros(len(ids), bool))
    assert all_dead.n_positions == 0 and all_dead.counts.n_masked == len(ids)
    assert all_dead.coverage().rows_touched.sum() == 0
    hot = u.hot_rows(top=3, tokenizer=tokenizer)
    assert hot.ngram.str.len().gt(0).all()
    summary = u.summary()
    assert summary["positions"] == len(ids)
    assert summary["layers"]["1"]["rows_touched"] == u.coverage().query("layer == 1").rows_touched.sum()
