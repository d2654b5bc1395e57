"""counts: NgramCounts against brute force, merging, flushing, persistence; the n-gram decoder."""

from __future__ import annotations

import numpy as np
import pytest
from _brute import forced_config, random_sequences, ref_counts

from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.corpus.ngram_text import NgramDecoder
from engram_viz.config import load_config


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_counts_equal_brute_force(seed):
    cfg = forced_config()
    seqs, masks = random_sequences(seed)
    counts = NgramCounts(cfg)
    for s, m in zip(seqs, masks):
        counts.add_compressed(np.array(s), np.array(m))
    assert counts.as_dict() == ref_counts(cfg, seqs, masks)
    assert counts.n_positions == sum(sum(m) for m in masks)
    assert counts.n_masked == sum(len(m) - sum(m) for m in masks)


def test_counts_batch_equals_one_by_one_and_merge_equals_whole():
    cfg = load_config("tiny")
    seqs, masks = random_sequences(5, n_seq=8, max_len=30, alphabet=99092)
    width = max(map(len, seqs))
    batch = np.full((len(seqs), width), 7)
    bmask = np.zeros((len(seqs), width), bool)  # padding masked out
    for i, (s, m) in enumerate(zip(seqs, masks)):
        batch[i, : len(s)], bmask[i, : len(s)] = s, m
    whole, a, b = NgramCounts(cfg), NgramCounts(cfg), NgramCounts(cfg)
    for s, m in zip(seqs, masks):
        whole.add_compressed(np.array(s), np.array(m))
    batched = NgramCounts(cfg)
    batched.add_compressed(batch, bmask)
    assert batched.as_dict() == whole.as_dict()
    for i, (s, m) in enumerate(zip(seqs, masks)):
        (a if i % 2 else b).add_compressed(np.array(s), np.array(m))
    merged = a.copy().merge(b)
    assert merged == whole and merged.as_dict() == ref_counts(cfg, seqs, masks)
    assert b.merge(a) == whole  # order does not matter


def test_counts_flush_boundaries_change_nothing(monkeypatch):
    cfg = load_config("tiny")
    seqs, masks = random_sequences(6, n_seq=20, alphabet=30)
    ref = NgramCounts(cfg)
    for s, m in zip(seqs, masks):
        ref.add_compressed(np.array(s), np.array(m))
    monkeypatch.setattr(NgramCounts, "FLUSH_MIN", 3)
    small = NgramCounts(cfg)
    for s, m in zip(seqs, masks):
        small.add_compressed(np.array(s), np.array(m))
    assert small == ref


def test_counts_save_load_count_of(tmp_path):
    cfg = load_config("tiny")
    seqs, masks = random_sequences(7)
    counts = NgramCounts(cfg)
    for s, m in zip(seqs, masks):
        counts.add_compressed(np.array(s), np.array(m))
    counts.save(tmp_path / "c.npz")
    assert NgramCounts.load(tmp_path / "c.npz", cfg) == counts
    assert [p.name for p in tmp_path.iterdir()] == ["c.npz"]
    ref = ref_counts(cfg, seqs, masks)
    some = [k for k in ref if len(k) == 3][:5]
    q = np.array(some + [(98000, 98001, 98002)])
    assert counts.count_of(q).tolist() == [ref[k] for k in some] + [0]
    with pytest.raises(ValueError, match="unreadable"):
        (tmp_path / "bad.npz").write_text("nope")
        NgramCounts.load(tmp_path / "bad.npz", cfg)


def test_decoder(tokenizer):
    dec = NgramDecoder(tokenizer)
    c_the = int(tokenizer.compress(tokenizer.encode(" the"))[0])
    assert dec.pieces([2, -1]) == ["<pad>", "<DEAD>"]
    assert dec.text([c_the]).strip().lower() == "the"
    raw_counts = np.zeros(len(tokenizer.token_map), np.int64)
    raw_counts[tokenizer.encode(" the")[0]] = 5
    assert NgramDecoder(tokenizer, raw_counts=raw_counts).text([c_the]) == " the"
    with pytest.raises(ValueError, match="out of range"):
        dec.pieces([10**6])


def test_counts_alone_and_chosen_rows_equal_the_whole_listing():
    """``ngram_counts`` and ``ngrams_at`` are the columns and rows of ``ngrams``, across the
    4-gram key groups (ids reaching the top bits) and at both ends."""
    rng = np.random.default_rng(7)
    counts = NgramCounts("tiny")
    w = rng.integers(0, 99_092, (5_000, 4))
    w[:300, 3] = 99_091  # the oldest id of these 4-grams lands in the last key group
    counts.add_windows(w)
    for n in counts.orders:
        ids, c = counts.ngrams(n)
        assert np.array_equal(counts.ngram_counts(n), c)
        idx = np.r_[len(c) - 1, 0, rng.choice(len(c), 40, replace=False)]
        assert np.array_equal(counts.ngrams_at(n, idx), ids[idx])
        assert counts.ngrams_at(n, idx[:0]).shape == (0, n)
