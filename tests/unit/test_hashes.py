"""The division-free reduction and the blocked vectorised hash: exact at every edge."""

from __future__ import annotations

import numpy as np
import pytest

from engram_viz.analysis.corpus import row_ids
from engram_viz.analysis.corpus.row_ids import BLOCK, reduce_mod, rows_from_windows
from engram_viz.config import load_config
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import InputError

pytestmark = pytest.mark.unit

INT64_MAX = (1 << 63) - 1


def _edges(prime: int) -> list[int]:
    """``k * prime + {-1, 0, 1}`` for the smallest and largest quotients and powers of two between,
    plus 0, 1 and 2**63 - 1: every place a reciprocal's rounding could slip by one."""
    top = INT64_MAX // prime
    ks = {0, 1, 2, 3, top - 2, top - 1, top} | {1 << e for e in range(64) if (1 << e) <= top}
    xs = {0, 1, INT64_MAX, INT64_MAX - 1}
    for k in ks:
        xs |= {k * prime - 1, k * prime, k * prime + 1}
    return sorted(x for x in xs if 0 <= x <= INT64_MAX)


@pytest.mark.parametrize("config", ["tiny", "v41-flash"])
def test_reduce_mod_exact_at_the_edges_for_every_layout_prime(config):
    layout = EngramLayout(load_config(config))
    for prime in {int(p) for p in layout.column_primes.ravel()}:
        xs = _edges(prime)
        x = np.array(xs, dtype=np.int64)
        got = reduce_mod(x, prime, np.empty_like(x))
        assert got.tolist() == [v % prime for v in xs], prime


def test_reduce_mod_random_values():
    rng = np.random.default_rng(0)
    x = rng.integers(0, INT64_MAX, 200_000, dtype=np.int64, endpoint=True)
    for prime in (2, 3, 2003, 16000057, (1 << 61) - 1):
        assert np.array_equal(reduce_mod(x, prime, np.empty_like(x)), x % prime)


def test_rows_from_windows_blocks_change_nothing():
    """Across block cuts (N not a multiple of BLOCK) the rows equal the plain per-column formula."""
    cfg = load_config("v41-flash")
    layout = EngramLayout(cfg)
    rng = np.random.default_rng(1)
    w = rng.integers(0, cfg.engram_compressed_vocab_size, (BLOCK + 123, cfg.engram_max_ngram_size))
    rows = rows_from_windows(layout, w)
    for li in range(len(layout.layer_ids)):
        rolling = w[:, 0] * layout.multipliers[li, 0]
        for s in range(1, layout.max_ngram_size):
            rolling = rolling ^ (w[:, s] * layout.multipliers[li, s])
            for head in range(layout.n_heads):
                col = (s - 1) * layout.n_heads + head
                want = rolling % layout.column_primes[li, col] + layout.offsets[li, col]
                assert np.array_equal(rows[:, li, col], want)
    assert rows_from_windows(layout, w[:0]).shape == (0, len(layout.layer_ids), layout.n_hash_cols)


@pytest.mark.parametrize("config", ["tiny", "v41-flash"])
def test_compiled_kernel_equals_the_numpy_path(config, monkeypatch):
    """The numba kernel (taken for large inputs) gives the numpy path's rows bit for bit, at the
    largest ids too (the hash's top bits)."""
    pytest.importorskip("numba")
    cfg = load_config(config)
    layout = EngramLayout(cfg)
    rng = np.random.default_rng(2)
    top = cfg.engram_compressed_vocab_size - 1
    w = rng.integers(0, cfg.engram_compressed_vocab_size, (3000, cfg.engram_max_ngram_size))
    w[:50] = top
    w[50:60] = ([0, top] * cfg.engram_max_ngram_size)[: cfg.engram_max_ngram_size]
    want = rows_from_windows(layout, w)  # numpy: under COMPILED_MIN
    monkeypatch.setattr(row_ids, "COMPILED_MIN", 1)
    assert np.array_equal(rows_from_windows(layout, w), want)
    assert rows_from_windows(layout, w[:0]).shape == want[:0].shape


@pytest.mark.parametrize("compiled_min", [1, 1 << 40], ids=["compiled", "numpy"])
def test_rows_written_into_a_reused_output(compiled_min, monkeypatch):
    """``out=`` takes the rows in place, on both paths; a second call overwrites every cell; an
    array that cannot take them is refused with its dtype and shape."""
    if compiled_min == 1:
        pytest.importorskip("numba")
    monkeypatch.setattr(row_ids, "COMPILED_MIN", compiled_min)
    cfg = load_config("tiny")
    layout = EngramLayout(cfg)
    rng = np.random.default_rng(3)
    shape = (1000, len(layout.layer_ids), layout.n_hash_cols)
    out = np.full(shape, -7, dtype=np.int64)
    for seed in (4, 5):
        w = np.random.default_rng(seed).integers(0, cfg.engram_compressed_vocab_size, (1000, cfg.engram_max_ngram_size))
        assert rows_from_windows(layout, w, out=out) is out
        monkeypatch.setattr(row_ids, "COMPILED_MIN", 1 << 40)
        assert np.array_equal(out, rows_from_windows(layout, w))  # the numpy path into a fresh array
        monkeypatch.setattr(row_ids, "COMPILED_MIN", compiled_min)
    w = rng.integers(0, 10, (1000, cfg.engram_max_ngram_size))
    for bad in (out[:999], out.astype(np.int32), np.asfortranarray(out), [[0]]):
        with pytest.raises(InputError, match="out must be a C-contiguous int64 array of shape"):
            rows_from_windows(layout, w, out=bad)
