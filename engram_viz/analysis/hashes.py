"""The vectorised n-gram hash over windows and over distinct n-grams.

Every row id is a function of the key: ``hash = XOR_s window[s] * multiplier[layer, s]`` over the
n look-backs, ``row = hash % prime[layer, n-2, head] + offset``. :func:`rows_from_windows` is the
vectorised hasher over a stream (equal to :class:`~engram_viz.core.hashing.NgramHasher` bit for
bit, tested); :func:`ngram_hashes` hashes distinct keys, which is all the accumulators need.
"""

from __future__ import annotations

import numpy as np

from engram_viz.core.layout import EngramLayout


def rows_from_windows(layout: EngramLayout, windows: np.ndarray) -> np.ndarray:
    """The vectorised hash: windows ``[N, max_ngram]`` -> row ids int64 ``[N, n_layers, n_hash_cols]``,
    bit for bit those of ``NgramHasher``."""
    w = np.asarray(windows, dtype=np.int64)
    n = len(w)
    out = np.empty((n, len(layout.layer_ids), layout.n_hash_cols), dtype=np.int64)
    heads = layout.n_heads
    product = np.empty(n, dtype=np.int64)
    for li in range(len(layout.layer_ids)):
        mult = layout.multipliers[li]
        rolling = w[:, 0] * mult[0]
        for s in range(1, layout.max_ngram_size):
            np.multiply(w[:, s], mult[s], out=product)
            np.bitwise_xor(rolling, product, out=rolling)
            for head in range(heads):
                col = (s - 1) * heads + head
                view = out[:, li, col]
                np.remainder(rolling, layout.column_primes[li, col], out=view)
                view += layout.offsets[li, col]
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
