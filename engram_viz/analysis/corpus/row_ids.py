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
48 row ids a position, is the one cost the arithmetic does not set: a fresh one is page-faulted in
on first write, so the rows are int32 wherever they fit (:func:`row_dtype`: every preset), half
the bytes, a fresh output has its pages mapped in one call (:func:`fresh_rows`), and a caller hashing chunk after chunk passes ``out=`` and reuses one buffer
(``benchmarks/hash_kernel.py`` measures both against the literal reference).
"""

from __future__ import annotations

import math
import mmap

import numpy as np

from engram_viz.analysis.corpus.row_id_kernel import compiled_rows
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import InputError

COMPILED_MIN = 1 << 16  # positions from which the compiled kernel pays for its one-off compile
BLOCK = 8192  # positions per block: scratch of 48 x 8192 int64 (3 MiB) stays in L2/L3
POPULATE_MIN = 1 << 22  # bytes from which a fresh output is mapped with its pages populated up front


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


def row_dtype(layout: EngramLayout) -> np.dtype:
    """The dtype of :func:`rows_from_windows`' row ids under ``layout``: int32 when its largest row
    id (the last row of its last column) fits, as in every preset (V4.1: 384,016,681), else int64.
    Half the bytes of int64: a fresh output is page-faulted in, and that, not the arithmetic, is
    what a large one-off call costs."""
    largest = int((layout.offsets + layout.column_primes).max()) - 1
    return np.dtype(np.int32 if largest <= np.iinfo(np.int32).max else np.int64)


def fresh_rows(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A new C-contiguous array for row ids. From ``POPULATE_MIN`` bytes on (Linux) it is an
    anonymous mapping with its pages populated when mapped (``MAP_POPULATE``: one call into the
    kernel instead of a page fault per 4 KiB on first write). numpy's own large allocations ask for
    transparent huge pages (``madvise``), and where huge pages must first be compacted (the shared
    machines here) that first write costs several times more than populating base pages
    (``benchmarks/hash_kernel.py``). The mapping is released with the array."""
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < POPULATE_MIN or not hasattr(mmap, "MAP_POPULATE"):
        return np.empty(shape, dtype=dtype)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE
    return np.frombuffer(mmap.mmap(-1, nbytes, flags=flags), dtype=dtype).reshape(shape)


def _checked_out(out: np.ndarray | None, shape: tuple[int, int, int], dtype: np.dtype) -> np.ndarray:
    """``out`` when it can take the rows (``dtype``, C-contiguous, ``shape``), a fresh array when None."""
    if out is None:
        return fresh_rows(shape, dtype)
    if not isinstance(out, np.ndarray) or out.dtype != dtype or out.shape != shape or not out.flags.c_contiguous:
        got = f"{out.dtype} {list(out.shape)}" if isinstance(out, np.ndarray) else type(out).__name__
        raise InputError(f"out must be a C-contiguous {dtype} array of shape {list(shape)}, got {got}")
    return out


def rows_from_windows(layout: EngramLayout, windows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The vectorised hash: windows ``[N, max_ngram]`` -> row ids ``[N, n_layers, n_hash_cols]`` of
    dtype :func:`row_dtype` (int32 for every preset), equal to those of ``NgramHasher``. ``out``
    (optional, that shape and dtype, C-contiguous) is written in place and returned: a caller
    hashing chunk after chunk reuses one buffer, so a large call costs its arithmetic rather than
    the page faults of a fresh output (192 MB at 1M positions in int32)."""
    w = np.asarray(windows, dtype=np.int64)
    n, n_layers, cols = len(w), len(layout.layer_ids), layout.n_hash_cols
    dtype = row_dtype(layout)
    out = _checked_out(out, (n, n_layers, cols), dtype)
    kernel = compiled_rows(layout, dtype) if n >= COMPILED_MIN else None
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
