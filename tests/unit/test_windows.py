"""windows: the blocked-window rule in numpy (== the torch NgramHasher's windows and rows), streams."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _brute import random_sequences, ref_windows

from engram_viz.analysis.corpus.row_ids import row_dtype, rows_from_windows
from engram_viz.analysis.corpus.windows import StreamWindows, sequence_blocked, sequence_windows, window_ngrams
from engram_viz.config import load_config
from engram_viz.core.hashing import NgramHasher, hash_prompt
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
    assert rows.dtype == row_dtype(layout) == np.int32 and rows.shape == (
        len(ids),
        cfg.n_engram_layers,
        cfg.n_hash_cols,
    )
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


def test_window_ngrams_oldest_first():
    w = np.array([[10, 11, 12, 13]])  # look-backs 0..3
    assert window_ngrams(w, 2).tolist() == [[11, 10]]
    assert window_ngrams(w, 4).tolist() == [[13, 12, 11, 10]]


@pytest.mark.parametrize("config_name", ["tiny", "v41-flash"])
def test_sequence_windows_equal_the_torch_hasher(config_name, tokenizer):
    """The two statements of the blocked-window rule agree: numpy ``sequence_windows`` of a batch
    of random raw ids with image masks hash (``rows_from_windows``) to the rows of the torch
    ``hash_prompt`` / ``NgramHasher`` on the same inputs, and the windows' blocked slots are the
    ones the hasher reads as pad."""
    cfg = load_config(config_name)
    rng = np.random.default_rng(11)
    ids = rng.integers(0, cfg.vocab_size, (5, 33))
    mask = rng.random((5, 33)) >= 0.2
    mask[1, :4] = False  # an image at the very start
    mask[2] = True
    compressed = np.asarray(tokenizer.token_map)[ids]
    windows, text = sequence_windows(
        compressed, int(tokenizer.token_map[cfg.engram_pad_id]), cfg.engram_max_ngram_size, mask
    )
    rows = rows_from_windows(EngramLayout(cfg), windows).reshape(5, 33, cfg.n_engram_layers, cfg.n_hash_cols)
    expected = hash_prompt(cfg, tokenizer.token_map, torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    assert np.array_equal(rows, expected) and np.array_equal(text, mask.reshape(-1))
    hasher = NgramHasher(cfg, tokenizer.token_map, max_batch=5, max_seq_len=33)
    assert np.array_equal(hasher(torch.from_numpy(ids), 0, torch.from_numpy(mask)).numpy(), expected)
    blocked = sequence_blocked(compressed, cfg.engram_max_ngram_size, mask)
    assert np.array_equal(windows[blocked], np.full(int(blocked.sum()), hasher.pad_id))
    assert (np.diff(blocked.astype(np.int8), axis=1) >= 0).all()  # sticky: once blocked, every longer look-back too


def test_sequence_blocked_matches_brute_force():
    seqs, masks = random_sequences(5, n_seq=10, p_image=0.2)
    for seq, mask in zip(seqs, masks):
        blocked = sequence_blocked(np.array(seq), 4, np.array(mask))
        ref = [[w == -1 for w in row] for row in ref_windows(seq, mask, -1, 4)]  # pad -1: blocked slots read -1
        assert blocked.tolist() == ref
