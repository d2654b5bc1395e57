"""prefix_sort: counting a stream's raw ids by one compiled sort (``NgramCounts.add_tokens``) gives
the counts of the numpy path (windows, then a sort per order) and of brute force: sequence starts
inside and at chunk cuts, image (DEAD) positions, ids in the last 4-gram key group, chunks with
more distinct ids than the entries hold, max n-gram sizes 2 to 4."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from _brute import ref_counts

from engram_viz.analysis.corpus import prefix_sort
from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.corpus.windows import DEAD, StreamWindows, WindowContext, open_before
from engram_viz.config import load_config

pytest.importorskip("numba")


def _config(max_ngram: int):
    return dataclasses.replace(load_config("tiny"), engram_max_ngram_size=max_ngram)


def _token_map(cfg, rng) -> np.ndarray:
    """A raw -> compressed map reaching the largest compressed ids (the 4-grams' last key group)."""
    token_map = rng.integers(0, cfg.engram_compressed_vocab_size, cfg.vocab_size)
    token_map[: cfg.vocab_size // 4] = cfg.engram_compressed_vocab_size - 1 - np.arange(cfg.vocab_size // 4) % 200
    return token_map


def _both(cfg, token_map, pieces, monkeypatch, least: int = 1) -> tuple[NgramCounts, NgramCounts]:
    """``pieces`` [(raw, seq_start, token_mask)] of one stream counted by both paths (the compiled
    one from ``least`` positions a piece)."""
    monkeypatch.setattr(prefix_sort, "PREFIX_MIN", least)
    fast_stream, slow_stream = StreamWindows(cfg, token_map), StreamWindows(cfg, token_map)
    fast, slow = NgramCounts(cfg, fast_stream.pad_id), NgramCounts(cfg, slow_stream.pad_id)
    for raw, starts, mask in pieces:
        fast.add_tokens(fast_stream, raw, starts, mask)
        slow.add_windows(slow_stream(raw, starts, mask), mask)
    assert np.array_equal(fast_stream.context.tail, slow_stream.context.tail)
    assert fast_stream.context.run == slow_stream.context.run
    return fast, slow


@pytest.mark.parametrize("max_ngram", [2, 3, 4])
@pytest.mark.parametrize("seed", range(4))
def test_compiled_counts_equal_the_numpy_path_across_cuts(max_ngram, seed, monkeypatch):
    rng = np.random.default_rng(seed)
    cfg = _config(max_ngram)
    token_map = _token_map(cfg, rng)
    n = int(rng.integers(50, 4_000))
    raw = rng.integers(0, (5, 60, cfg.vocab_size, cfg.vocab_size // 8)[seed], 2 * n)[::2]  # repeats or not; strided
    starts = rng.random(n) < (0.0, 0.02, 0.3, 0.01)[seed]
    mask = rng.random(n) >= (0.0, 0.05, 0.3, 0.0)[seed] if seed != 3 else None
    cuts = np.r_[0, np.sort(rng.integers(0, n, 4)), n]
    pieces = [(raw[a:z], starts[a:z], None if mask is None else mask[a:z]) for a, z in itertools.pairwise(cuts)]
    fast, slow = _both(cfg, token_map, pieces, monkeypatch, least=(1, n // 5, 1, 1)[seed])  # 1: paths mixed
    assert fast == slow and fast.as_dict() == slow.as_dict()
    assert (fast.n_positions, fast.n_masked) == (slow.n_positions, slow.n_masked)


def test_compiled_counts_equal_brute_force(monkeypatch):
    """Sequences of compressed ids streamed as one (the token map the identity), each starting a
    sequence: the counts of ``_brute.ref_counts``, image positions left out."""
    rng = np.random.default_rng(11)
    cfg = load_config("tiny")
    token_map = np.minimum(np.arange(cfg.vocab_size), cfg.engram_compressed_vocab_size - 1)
    seqs = [rng.integers(0, 12, int(rng.integers(1, 30))).tolist() for _ in range(40)]
    seqs[3] = [cfg.engram_compressed_vocab_size - 1] * 9  # the last 4-gram key group
    masks = [(rng.random(len(s)) >= 0.15).tolist() for s in seqs]
    raw, mask = np.concatenate(seqs), np.concatenate(masks)
    starts = np.zeros(len(raw), bool)
    starts[np.cumsum([0] + [len(s) for s in seqs[:-1]])] = True
    fast, _ = _both(cfg, token_map, [(raw, starts, mask)], monkeypatch)
    assert fast.as_dict() == ref_counts(cfg, seqs, masks, pad=int(token_map[cfg.engram_pad_id]))


def test_a_chunk_with_more_distinct_ids_than_an_entry_holds_is_counted_in_pieces(monkeypatch):
    """4-grams of dense ids fit 64 bits for at most 2**15 distinct ids; 60,000 distinct ids in one
    chunk are counted in shorter pieces, with the same counts."""
    rng = np.random.default_rng(3)
    cfg = load_config("tiny")
    token_map = np.minimum(np.arange(cfg.vocab_size), cfg.engram_compressed_vocab_size - 1)
    raw = rng.permutation(cfg.engram_compressed_vocab_size)[:60_000]
    raw = np.r_[raw, raw[:5_000]]
    starts = rng.random(len(raw)) < 0.001
    fast, slow = _both(cfg, token_map, [(raw, starts, None)], monkeypatch)
    assert fast == slow


def test_without_numba_or_under_the_threshold_the_numpy_path_counts(monkeypatch):
    cfg = load_config("tiny")
    token_map = np.arange(cfg.vocab_size) % 50
    stream = StreamWindows(cfg, token_map)
    raw = np.arange(300) % 17
    assert prefix_sort.chunk_runs(stream, raw) is None  # under PREFIX_MIN
    monkeypatch.setattr(prefix_sort, "PREFIX_MIN", 1)
    monkeypatch.setattr(prefix_sort, "_kernels", lambda: None)
    assert prefix_sort.chunk_runs(stream, raw) is None and stream.context is None
    counts = NgramCounts(cfg, stream.pad_id)
    counts.add_tokens(stream, raw)
    assert counts.n_positions == 300 and counts.n_distinct(2) == 17 + 1  # and (pad, 0) at the start


def test_open_before_reads_the_rule_off_the_context():
    pad = 2
    assert open_before(WindowContext.first(4, pad)) == -1  # the stream's start
    assert open_before(WindowContext(np.array([5, 6, 7]), 10)) == 2  # deep in a sequence: all read
    assert open_before(WindowContext(np.array([5, 6, 7]), 2)) == 1  # the sequence began at 6
    assert open_before(WindowContext(np.array([5, DEAD, 7]), 10)) == 0  # DEAD just before
    assert open_before(WindowContext(np.array([5, 6, DEAD]), 10)) == -1  # DEAD itself
