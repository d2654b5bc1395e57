"""The vectorised n-gram hash over windows and over distinct n-grams.

Every row id is a function of the key: ``hash = XOR_s window[s] * multiplier[layer, s]`` over the
n look-backs, ``row = hash % prime[layer, n-2, head] + offset``. :func:`rows_from_windows` is the
vectorised hasher over a stream (equal to :class:`~engram_viz.core.hashing.NgramHasher` bit for
bit, tested); :func:`ngram_hashes` hashes distinct keys, which is all the accumulators need.

**Speed.** The 24 reductions per layer and position dominate. ``np.remainder`` on int64 runs a
hardware division per element, and writing each head's column into ``[N, n_layers, 24]`` strides
over the whole output once per column. :func:`reduce_mod` is division-free instead, and
:func:`rows_from_windows` works in blocks of ``BLOCK`` positions on contiguous
``[n_layers * 24, BLOCK]`` scratch that stays in cache, transposed into the output once. With
numba installed, inputs of ``COMPILED_MIN`` positions or more go through the compiled kernel of
``hash_kernel`` instead (the same arithmetic in one pass; speeds in
``benchmarks/results/corpus_throughput.txt``, from ``benchmarks/corpus_throughput.py``). The output,
48 int64 a position, is the one cost the arithmetic does not set: a fresh one is page-faulted in
on first write, so a caller hashing chunk after chunk passes ``out=`` and reuses one buffer
(``benchmarks/hash_kernel.py`` measures both against the literal reference).
"""

from __future__ import annotations

import numpy as np

from engram_viz.analysis.corpus.row_id_kernel import compiled_rows
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import InputError

COMPILED_MIN = 1 << 16  # positions from which the compiled kernel pays for its one-off compile
BLOCK = 8192  # positions per block: scratch of 48 x 8192 int64 (3 MiB) stays in L2/L3


def reduce_mod(x: np.ndarray, prime: int, out: np.ndarray) -> np.ndarray:
    """``out = x % prime`` for int64 ``x`` in ``[0, 2**63)`` and ``0 < prime < 2**62``, without a
    division per element: ``x - (x // prime) * prime``, where numpy's floor division by one
    scalar integer runs a precomputed multiply-high reciprocal (libdivide, numpy >= 1.22) chosen
    at the call so that the quotient is exact for every int64 ``x``. Bound: ``0 <= x // prime <=
    x``, so ``(x // prime) * prime <= x`` never overflows and the difference lies in ``[0,
    prime)``; the edges ``k * prime - 1, k * prime, k * prime + 1`` up to ``2**63 - 1`` are tested
    against Python's ``%`` (tests/unit/test_hashes.py). ``out`` may not alias ``x``."""
    np.floor_divide(x, prime, out=out)
    np.multiply(out, -prime, out=out)
    np.add(out, x, out=out)
    return out


def _checked_out(out: np.ndarray | None, shape: tuple[int, int, int]) -> np.ndarray:
    """``out`` when it can take the rows (int64, C-contiguous, ``shape``), a fresh array when None."""
    if out is None:
        return np.empty(shape, dtype=np.int64)
    if not isinstance(out, np.ndarray) or out.dtype != np.int64 or out.shape != shape or not out.flags.c_contiguous:
        got = f"{out.dtype} {list(out.shape)}" if isinstance(out, np.ndarray) else type(out).__name__
        raise InputError(f"out must be a C-contiguous int64 array of shape {list(shape)}, got {got}")
    return out


def rows_from_windows(layout: EngramLayout, windows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The vectorised hash: windows ``[N, max_ngram]`` -> row ids int64 ``[N, n_layers, n_hash_cols]``,
    bit for bit those of ``NgramHasher``. ``out`` (optional, that shape, int64, C-contiguous) is
    written in place and returned: a caller hashing chunk after chunk reuses one buffer, so a large
    call costs its arithmetic rather than the page faults of a fresh 384 MB (1M positions) output."""
    w = np.asarray(windows, dtype=np.int64)
    n, n_layers, cols = len(w), len(layout.layer_ids), layout.n_hash_cols
    out = _checked_out(out, (n, n_layers, cols))
    kernel = compiled_rows(layout) if n >= COMPILED_MIN else None
    if kernel is not None:
        kernel(np.ascontiguousarray(w), out.reshape(n, n_layers * cols))
        return out
    flat = out.reshape(n, n_layers * cols)
    columns = np.ascontiguousarray(w.T)  # [max_ngram, N]: one look-back contiguous
    scratch = np.empty((n_layers * cols, min(n, BLOCK)), dtype=np.int64)  # [layer * 24 + col, position]
    rolling, product = np.empty(min(n, BLOCK), np.int64), np.empty(min(n, BLOCK), np.int64)
    primes = [[int(p) for p in row] for row in layout.column_primes]  # Python ints: numpy's scalar path
    offsets = layout.offsets.reshape(-1, 1)
    for a in range(0, n, BLOCK):
        b = min(n, a + BLOCK)
        r, pr, sc = rolling[: b - a], product[: b - a], scratch[:, : b - a]
        for li in range(n_layers):
            mult = layout.multipliers[li]
            np.multiply(columns[0, a:b], mult[0], out=r)
            for s in range(1, layout.max_ngram_size):
                np.multiply(columns[s, a:b], mult[s], out=pr)
                np.bitwise_xor(r, pr, out=r)  # the hash of the (s+1)-gram
                for head in range(layout.n_heads):
                    col = (s - 1) * layout.n_heads + head
                    reduce_mod(r, primes[li][col], sc[li * cols + col])
        sc += offsets
        flat[a:b] = sc.T
    return out


def ngram_hashes(layout: EngramLayout, layer_index: int, ngrams: np.ndarray) -> np.ndarray:
    """Pre-modulo hashes int64 ``[U]`` of n-grams ``[U, n]`` (compressed ids, oldest first)."""
    g = np.asarray(ngrams, dtype=np.int64)
    n = g.shape[1]
    mult = layout.multipliers[layer_index]
    h = g[:, n - 1] * mult[0]
    for s in range(1, n):
        h = h ^ (g[:, n - 1 - s] * mult[s])
    return h
