"""ngrams: windows, packed keys, the vectorised stream hash (== NgramHasher bit for bit), NgramCounts."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _brute import forced_config, random_sequences, ref_counts, ref_windows
from hypothesis import given
from hypothesis import strategies as st

from engram_viz.analysis.ngrams import (
    KEY_BITS,
    NgramCounts,
    NgramDecoder,
    StreamWindows,
    ngram_hashes,
    pack_ngrams,
    poisson_binomial,
    rows_from_windows,
    sequence_windows,
    unpack_ngrams,
    window_ngrams,
)
from engram_viz.config import load_config
from engram_viz.core.hashing import hash_prompt
from engram_viz.core.layout import EngramLayout


def _docs(seed: int, n_docs: int = 12, max_len: int = 40, p_image: float = 0.15):
    rng = np.random.default_rng(seed)
    docs, masks = [], []
    for _ in range(n_docs):
        n = int(rng.integers(1, max_len))
        docs.append(rng.integers(0, 129280, n))
        masks.append(rng.random(n) >= p_image)
    return docs, masks


def test_sequence_windows_match_brute_force():
    seqs, masks = random_sequences(0, n_seq=10, p_image=0.2)
    for seq, mask in zip(seqs, masks):
        w, m = sequence_windows(np.array(seq), 2, 4, np.array(mask))
        assert [tuple(r) for r in w.tolist()] == ref_windows(seq, mask, 2, 4)
        assert m.tolist() == mask


@pytest.mark.parametrize("config_name", ["tiny", "v41-flash"])
def test_stream_hash_equals_ngram_hasher_bit_for_bit(config_name, tokenizer):
    """Documents laid end to end in one 1D stream, cut into chunks at random points (also inside
    documents), with image (masked) positions: the numpy rows equal hash_prompt per document."""
    cfg = load_config(config_name)
    layout = EngramLayout(cfg)
    docs, masks = _docs(1)
    ids, starts, mask = np.concatenate(docs), np.zeros(sum(map(len, docs)), bool), np.concatenate(masks)
    starts[np.cumsum([0] + [len(d) for d in docs[:-1]])] = True
    rng = np.random.default_rng(2)
    cuts = np.sort(rng.choice(np.arange(1, len(ids)), size=7, replace=False))
    sw = StreamWindows(cfg, tokenizer.token_map)
    windows = np.concatenate([sw(a, s, m) for a, s, m in zip(*(np.split(x, cuts) for x in (ids, starts, mask)))])
    rows = rows_from_windows(layout, windows)
    expected = np.concatenate(
        [
            hash_prompt(cfg, tokenizer.token_map, torch.tensor(d[None]), torch.tensor(m[None]))[0].numpy()
            for d, m in zip(docs, masks)
        ]
    )
    assert rows.dtype == np.int64 and rows.shape == (len(ids), cfg.n_engram_layers, cfg.n_hash_cols)
    assert np.array_equal(rows, expected)


def test_stream_without_starts_continues_one_sequence(tokenizer):
    cfg = load_config("tiny")
    ids = np.random.default_rng(3).integers(0, 129280, 50)
    sw = StreamWindows(cfg, tokenizer.token_map)
    chunked = np.concatenate([sw(ids[:1]), sw(ids[1:17]), sw(ids[17:])])
    whole = StreamWindows(cfg, tokenizer.token_map)(ids)
    assert np.array_equal(chunked, whole)
    expected = hash_prompt(cfg, tokenizer.token_map, torch.tensor(ids[None]))[0].numpy()
    assert np.array_equal(rows_from_windows(EngramLayout(cfg), whole), expected)


def test_stream_rejects_bad_ids(tokenizer):
    sw = StreamWindows("tiny", tokenizer.token_map)
    with pytest.raises(ValueError, match="129280"):
        sw(np.array([1, 129280]))
    with pytest.raises(TypeError, match="bool"):
        sw(np.array([1, 2]), seq_start=np.array([1, 0]))


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


def test_pack_rejects_dead_and_long_orders():
    with pytest.raises(ValueError, match="DEAD"):
        pack_ngrams(np.array([[-1, 3]]))
    with pytest.raises(ValueError, match="order 5"):
        pack_ngrams(np.zeros((1, 5), dtype=np.int64))


def test_ngram_hashes_match_layout_rows():
    cfg = load_config("v41-flash")
    layout = EngramLayout(cfg)
    g = np.random.default_rng(4).integers(0, 99092, (20, 3))
    h = ngram_hashes(layout, 1, g)
    for row, hv in zip(g, h):
        expected = layout.ngram_rows(14, tuple(row))
        got = [hv % layout.column_primes[1, 8 + k] + layout.offsets[1, 8 + k] for k in range(8)]
        assert np.array_equal(got, expected)


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


def test_window_ngrams_oldest_first():
    w = np.array([[10, 11, 12, 13]])  # look-backs 0..3
    assert window_ngrams(w, 2).tolist() == [[11, 10]]
    assert window_ngrams(w, 4).tolist() == [[13, 12, 11, 10]]


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


def test_poisson_binomial():
    d = poisson_binomial(np.full(8, 0.3))
    from math import comb

    assert np.allclose(d, [comb(8, j) * 0.3**j * 0.7 ** (8 - j) for j in range(9)])
    assert np.isclose(poisson_binomial(np.array([0.1, 0.5, 0.9])).sum(), 1.0)
