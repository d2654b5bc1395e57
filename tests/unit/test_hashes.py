"""The division-free reduction and the blocked vectorised hash: exact at every edge."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from engram_viz.analysis.corpus import row_ids
from engram_viz.analysis.corpus.row_ids import BLOCK, reduce_mod, row_dtype, rows_from_windows
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
    out = np.full(shape, -7, dtype=np.int32)
    for seed in (4, 5):
        w = np.random.default_rng(seed).integers(0, cfg.engram_compressed_vocab_size, (1000, cfg.engram_max_ngram_size))
        assert rows_from_windows(layout, w, out=out) is out
        monkeypatch.setattr(row_ids, "COMPILED_MIN", 1 << 40)
        assert np.array_equal(out, rows_from_windows(layout, w))  # the numpy path into a fresh array
        monkeypatch.setattr(row_ids, "COMPILED_MIN", compiled_min)
    w = rng.integers(0, 10, (1000, cfg.engram_max_ngram_size))
    for bad in (out[:999], out.astype(np.int64), np.asfortranarray(out), [[0]]):
        with pytest.raises(InputError, match="out must be a C-contiguous int32 array of shape"):
            rows_from_windows(layout, w, out=bad)


@pytest.mark.parametrize("config", ["tiny", "v41-flash"])
def test_row_ids_are_int32_where_every_row_fits(config, monkeypatch):
    """The dtype contract: ``row_dtype`` is int32 when the layout's last row (offset + prime - 1 of
    its last column) fits, as in every preset; a fresh output has it on both paths, large ones
    (past ``POPULATE_MIN``) in a populated mapping as well, with the same rows as int64 arithmetic."""
    cfg = load_config(config)
    layout = EngramLayout(cfg)
    largest = int((layout.offsets + layout.column_primes).max()) - 1
    assert largest < 2**31 and row_dtype(layout) == np.int32
    w = np.random.default_rng(6).integers(0, cfg.engram_compressed_vocab_size, (2000, cfg.engram_max_ngram_size))
    for compiled_min in (1 << 40, 1):
        monkeypatch.setattr(row_ids, "COMPILED_MIN", compiled_min)
        for populate_min in (1 << 40, 1):
            monkeypatch.setattr(row_ids, "POPULATE_MIN", populate_min)
            rows = rows_from_windows(layout, w)
            assert rows.dtype == np.int32 and rows.flags.c_contiguous and rows.flags.writeable
            assert rows.max() <= largest
            for li in range(len(layout.layer_ids)):  # int64 arithmetic, column by column
                h = w[:, 0] * layout.multipliers[li, 0]
                for s in range(1, layout.max_ngram_size):
                    h = h ^ (w[:, s] * layout.multipliers[li, s])
                    col = slice((s - 1) * layout.n_heads, s * layout.n_heads)
                    want = h[:, None] % layout.column_primes[li, col] + layout.offsets[li, col]
                    assert np.array_equal(rows[:, li, col], want)


def test_the_compiled_kernel_is_cached_across_processes(tmp_path):
    """The kernel compiles once per layout and machine: a second process with the same
    ``$ENGRAM_VIZ_CACHE`` loads it from numba's cache beside the generated source (a hit, no
    miss) and computes the same rows."""
    pytest.importorskip("numba")
    code = (
        "import json, numpy as np\n"
        "from engram_viz.analysis.corpus.row_id_kernel import compiled_rows\n"
        "from engram_viz.config import load_config\n"
        "from engram_viz.core.layout import EngramLayout\n"
        "kernel = compiled_rows(EngramLayout(load_config('tiny')), np.int32)\n"
        "w = np.arange(4000, dtype=np.int64).reshape(1000, 4)\n"
        "out = np.empty((1000, 48), dtype=np.int32)\n"
        "kernel(w, out)\n"
        "s = kernel.stats\n"
        "print(json.dumps([sum(s.cache_hits.values()), sum(s.cache_misses.values()), int(out.sum())]))\n"
    )
    env = {**os.environ, "ENGRAM_VIZ_CACHE": str(tmp_path)}
    runs = [
        json.loads(
            subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
        )
        for _ in range(2)
    ]
    assert runs[0][:2] == [0, 1] and runs[1][:2] == [1, 0]
    assert runs[0][2] == runs[1][2]
    assert list((tmp_path / "numba").glob("row_kernel_*.py")) and list(
        (tmp_path / "numba" / "__pycache__").glob("*.nbi")
    )
